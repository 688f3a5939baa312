-- memory_spec.lua — keng.memory_stats / keng.empty_cache and the collector's pacing, on the cpu.
-- The device side (cuda storages reported to the collector, trims, the OOM retry and message)
-- runs without a GPU in tests/c/test_memory.c, through a fake device.
local keng = require "keng"
local H = require "helper"

local MiB = 1 << 20

local function settle() collectgarbage() collectgarbage() end

describe("keng.memory_stats", function()
  it("reports allocated, cached, peak and graph bytes for each device", function()
    for _, dev in ipairs({"cpu", "meta", "cuda"}) do
      local s = keng.memory_stats(dev)
      for _, k in ipairs({"allocated", "cached", "peak", "graph"}) do
        assert.are.equal("integer", math.type(s[k]), dev .. "." .. k)
        assert.is_true(s[k] >= 0, dev .. "." .. k)
      end
      assert.is_true(s.peak >= s.allocated, dev)
    end
    assert.are.same({allocated = 0, cached = 0, peak = 0, graph = 0}, keng.memory_stats("meta"))
    assert.are.equal(0, keng.memory_stats().graph)
    if not keng.cuda.is_available() then
      assert.are.same({allocated = 0, cached = 0, peak = 0, graph = 0}, keng.memory_stats("cuda"))
    end
    H.raises(function() keng.memory_stats("tpu") end, "unknown device 'tpu'")
  end)

  it("counts a tensor while it lives", function()
    settle()
    local before = keng.memory_stats().allocated
    local t = keng.zeros({MiB // 4}, {dtype = "f32"})
    assert.is_true(keng.memory_stats().allocated - before >= MiB)
    t = nil
    settle()
    assert.are.equal(before, keng.memory_stats().allocated)
  end)
end)

describe("keng.reset_peak_memory_stats", function()
  it("restarts the peak at what is allocated now", function()
    settle()
    local t = keng.empty({4 * MiB}, {dtype = "u8"})
    t = nil
    settle()
    local s = keng.memory_stats()
    assert.is_true(s.peak >= s.allocated + 4 * MiB)
    keng.reset_peak_memory_stats()
    s = keng.memory_stats("cpu")
    assert.are.equal(s.allocated, s.peak)
    keng.reset_peak_memory_stats("meta") -- nothing to reset
    H.raises(function() keng.reset_peak_memory_stats("tpu") end, "unknown device 'tpu'")
  end)
end)

describe("keng.empty_cache", function()
  it("collects dead tensors and gives the cached blocks back", function()
    settle()
    local before = keng.memory_stats().allocated
    local t = keng.ones({3 * MiB // 8}, {dtype = "f64"})
    t = nil -- garbage the collector has not seen yet
    keng.empty_cache()
    local s = keng.memory_stats()
    assert.are.equal(before, s.allocated)
    assert.are.equal(0, s.cached)
  end)
end)

describe("the collector", function()
  it("runs as tensors are made and dropped, so garbage stays bounded", function()
    settle()
    local before, high = keng.memory_stats().allocated, 0
    for _ = 1, 200 do                   -- 1.6 GB made in all
      local t = keng.empty({MiB}, {dtype = "f64"})
      high = math.max(high, keng.memory_stats().allocated - before)
    end
    -- garbage stays under the threshold (1/16 of what lives, at least 32 MiB), plus the tensors
    -- still on the stack; without the collector it would reach 1600 MiB
    local threshold = math.max(32 * MiB, (before + 8 * MiB) // 16)
    assert.is_true(high <= threshold + 64 * MiB, string.format("%.0f MiB held at once", high / MiB))
  end)
end)
