-- profile_spec.lua — keng.profile (the engine's op profile, keng.debug.profile_start/stop): which
-- ops ran, how often, with which shapes and FLOPs; start clears, stop stops; weighted combination
-- (per step, the difference rule); an error inside profile.run stops the profile; bench.run and
-- bench.run_diff attach one step's profile.
local keng = require "keng"
local profile = require "keng.profile"
local bench = require "keng.bench"
local H = require "helper"

local function find(p, line)
  for _, e in ipairs(p.entries) do if e.line == line then return e end end
end

describe("keng.profile", function()
  it("counts each op line's calls, time and FLOPs, and sums them per op", function()
    local a, b = keng.randn({8, 16}), keng.randn({16, 4})
    local p = profile.run(function()
      for _ = 1, 3 do a:matmul(b) end
      local c = a + a
      return c + 1
    end)
    local mm = find(p, "matmul f32[8,16] f32[16,4] -> f32[8,4]")
    assert.is_table(mm, "matmul line missing")
    assert.are.equal(3, mm.calls)
    assert.are.equal(3 * 2 * 8 * 16 * 4, mm.flops)
    assert.is_true(mm.ms > 0)
    local add = find(p, "add f32[8,16] f32[8,16] -> f32[8,16]")
    assert.are.equal(1, add and add.calls, "add of two tensors")
    local ops = {}
    for _, o in ipairs(p.ops) do ops[o.op] = o end
    assert.are.equal(3, ops.matmul.calls)
    assert.are.equal(2, ops.add.calls)                              -- a + a and c + 1
    local sum = 0
    for _, e in ipairs(p.entries) do sum = sum + e.ms end
    assert.is_true(math.abs(sum - p.total_ms) < 1e-9)
    for i = 2, #p.entries do assert.is_true(p.entries[i - 1].ms >= p.entries[i].ms, "entries by time") end
    for i = 2, #p.ops do assert.is_true(p.ops[i - 1].ms >= p.ops[i].ms, "ops by time") end
  end)

  it("returns fn's results, clears on start, counts nothing once stopped", function()
    local x = keng.ones({3})
    local p, y, tag = profile.run(function() return x * 2, "tag" end)
    assert.are.equal("tag", tag)
    H.close(y, keng.full({3}, 2), 0, "result")
    assert.is_table(find(p, "mul f32[3] f32[] -> f32[3]"))
    assert.is_table(find(p, "fill -> f32[]"))                        -- the scalar 2 as a tensor
    local _ = x * 3                                                  -- not profiled
    profile.start()
    local _ = x - x
    local q = profile.stop()
    assert.are.equal(1, #q.entries)
    assert.are.equal("sub", q.entries[1].op)
    assert.are.equal(0, #profile.stop().entries)                    -- stop hands over and clears
  end)

  it("stops when fn raises and passes the error on", function()
    H.raises(function() profile.run(function() keng.ones({2}):matmul(keng.ones({3})) end) end, "matmul")
    local _ = keng.ones({2}) + keng.ones({2})
    assert.are.equal(0, #profile.stop().entries, "still profiling after an error")
  end)

  it("keeps at most 4096 lines: later new lines are counted under (other)", function()
    local p = profile.run(function() for i = 1, 4200 do local _ = keng.ones({i}) end end)
    assert.are.equal(4096, #p.entries)
    local other
    for _, e in ipairs(p.entries) do if e.op == "(other)" then other = e end end
    assert.are.equal(4200 - 4095, other and other.calls)
    assert.are.equal(3, #profile.run(function() for i = 1, 3 do local _ = keng.ones({i}) end end).entries)
  end)

  it("combines profiles with weights (per step, the difference rule) and drops lines left at zero", function()
    local x = keng.ones({4})
    local short = profile.run(function() local _ = x + x; local _ = x * x end)
    local long = profile.run(function() local _ = x + x; for _ = 1, 3 do local _ = x * x end end)
    local d = profile.combine({{long, 1 / 2}, {short, -1 / 2}})    -- (3 - 1) muls over 2 steps
    assert.are.equal(1, #d.entries)
    assert.are.equal("mul", d.entries[1].op)
    assert.is_true(math.abs(d.entries[1].calls - 1) < 1e-12)
    local report = profile.report(d, {top = 5})
    assert.is_truthy(report:find("mul f32[4] f32[4] -> f32[4]", 1, true), report)
    assert.is_truthy(report:find("(all ops)", 1, true), report)
  end)

  it("bench.run and bench.run_diff attach the profile of one step", function()
    local a, b = keng.randn({4, 4}), keng.randn({4, 4})
    local r = bench.run(function() a:matmul(b); a:matmul(b) end, {steps = 3, warmup = 1, profile = true})
    assert.are.equal(2, r.profile.ops[1].calls)                     -- per step, warm-up excluded
    assert.are.equal("matmul", r.profile.ops[1].op)
    local d = bench.run_diff(function(k) for _ = 1, k do a:matmul(b) end; a:add(b) end,
      {short = 1, steps = 4, repeats = 2, profile = true})
    assert.are.equal(1, #d.profile.entries)                         -- the fixed add cancels
    assert.is_true(math.abs(d.profile.entries[1].calls - 1) < 1e-12)
    assert.is_nil(bench.run(function() end, {steps = 1}).profile)
  end)
end)
