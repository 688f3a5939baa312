-- roofline_spec.lua — the bench report's roofline (scripts/bench/roofline.lua): decode bytes and
-- the bound of a row from hand-derived figures, and the FLOPs a Winograd conv performs against
-- the direct count (keng.flop_count_performed vs keng.flop_count).
local keng = require "keng"
local bench = require "keng.bench"

local root = debug.getinfo(1, "S").source:match("^@(.*)/tests/lua/roofline_spec.lua$") or "."
package.path = root .. "/scripts/?.lua;" .. package.path
local roofline = require "bench.roofline"

describe("roofline.decode_bytes", function()
  -- 1 layer, 1 KV head of dim 2, vocab 10 x hidden 4, 100 parameters, bf16; B = 2, prompt 3,
  -- max_length 6: 3 passes; per attended position 1 layer x (K, V) x 1 head x 2 dims x 2 bytes x
  -- 2 rows = 16 bytes; the decode steps attend L = 4 and 5 positions
  local cfg = {vocab = 10, hidden = 4, layers = 1, kv_heads = 1, head_dim = 2, tie = false}

  it("untied: the embedding table is gathered, not read", function()
    local bytes, weights = roofline.decode_bytes(cfg, 100, 2, 3, 6, 2)
    assert.are.equal((100 - 40) * 2, weights)
    assert.are.equal(3 * 120 + 16 * (4 + 5), bytes)
  end)

  it("tied: the embedding is read whole as the LM head", function()
    local tied = {vocab = 10, hidden = 4, layers = 1, kv_heads = 1, head_dim = 2, tie = true}
    assert.are.equal(3 * 200 + 16 * 9, (roofline.decode_bytes(tied, 100, 2, 3, 6, 2)))
  end)

  it("a sliding window caps the attended positions", function()
    local w = {vocab = 10, hidden = 4, layers = 1, kv_heads = 1, head_dim = 2, window = 4}
    assert.are.equal(3 * 120 + 16 * (4 + 4), (roofline.decode_bytes(w, 100, 2, 3, 6, 2)))
  end)

  it("names a missing config field and a max_length that leaves nothing to decode", function()
    local ok, err = pcall(roofline.decode_bytes, {vocab = 10}, 100, 1, 3, 6, 2)
    assert.is_false(ok)
    assert.truthy(err:find("cfg.hidden must be a number", 1, true), err)
    ok, err = pcall(roofline.decode_bytes, cfg, 100, 1, 6, 6, 2)
    assert.truthy(err:find("max_length must exceed the prompt length", 1, true), err)
  end)
end)

describe("roofline.classify", function()
  it("compute-bound: performed FLOPs against the peak, bytes not counted", function()
    -- 2 GFLOP performed at 0.1 TFLOP/s = 20 ms of a 100 ms step
    local r = roofline.classify({flops_performed_per_step = 2e9, flops_per_step = 4e9, mean_ms = 100}, 0.1, 20)
    assert.are.equal("compute", r.bound)
    assert.near(20, r.roofline_ms, 1e-9)
    assert.near(20, r.pct_roofline, 1e-9)
    assert.truthy(r.bound_basis:find("bytes not counted", 1, true))
  end)

  it("memory-bound when the bytes take longer than the FLOPs", function()
    -- 1 GB at 20 GB/s = 50 ms > 20 ms of FLOPs
    local r = roofline.classify({flops_performed_per_step = 2e9, bytes_per_step = 1e9, mean_ms = 100}, 0.1, 20)
    assert.are.equal("memory", r.bound)
    assert.near(50, r.pct_roofline, 1e-9)
    -- 0.2 GB = 10 ms < 20 ms: compute again, with both counted
    r = roofline.classify({flops_performed_per_step = 2e9, bytes_per_step = 2e8, mean_ms = 100}, 0.1, 20)
    assert.are.equal("compute", r.bound)
    assert.are.equal("flops / peak > bytes / bandwidth", r.bound_basis)
  end)

  it("falls back to the direct count, and leaves a row with no figures alone", function()
    local r = roofline.classify({flops_per_step = 1e9, mean_ms = 100}, 0.1, nil)
    assert.near(10, r.pct_roofline, 1e-9)
    r = roofline.classify({mean_ms = 100}, nil, nil)
    assert.is_nil(r.bound)
    assert.is_nil(r.pct_roofline)
  end)
end)

describe("FLOPs performed vs the direct count", function()
  it("a Winograd-size conv performs 36 products per 6x6 tile, a matmul its direct count", function()
    -- [1, 16, 10, 10] * [32, 16, 3, 3], padding 1: 10x10 outputs, 3x3 tiles of 4x4
    local x, w = keng.randn({1, 16, 10, 10}), keng.randn({32, 16, 3, 3})
    local f0, p0 = keng.flop_count(), keng.flop_count_performed()
    keng.no_grad(function() return keng.conv2d(x, w, nil, {padding = 1}) end)
    local direct, performed = keng.flop_count() - f0, keng.flop_count_performed() - p0
    assert.are.equal(2 * 32 * 16 * 9 * 10 * 10, direct)
    -- the Winograd path needs AVX2 + FMA; elsewhere the direct kernel performs the direct count
    local wino = 2 * 36 * 32 * 16 * 3 * 3
    assert.is_true(performed == wino or performed == direct, "performed " .. performed)
    local a, b = keng.randn({8, 16}), keng.randn({16, 4})
    f0, p0 = keng.flop_count(), keng.flop_count_performed()
    a:matmul(b)
    assert.are.equal(2 * 8 * 16 * 4, keng.flop_count() - f0)
    assert.are.equal(2 * 8 * 16 * 4, keng.flop_count_performed() - p0)
  end)

  it("keng.bench reports both per step", function()
    local x, w = keng.randn({1, 16, 10, 10}), keng.randn({32, 16, 3, 3})
    local r = keng.no_grad(function()
      return bench.run(function() return keng.conv2d(x, w, nil, {padding = 1}) end, {steps = 2, warmup = 1})
    end)
    assert.are.equal(2 * 32 * 16 * 9 * 10 * 10, r.flops_per_step)
    assert.is_true(r.flops_performed_per_step <= r.flops_per_step)
  end)
end)
