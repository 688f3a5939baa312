-- hostile_sizes_spec.lua — sizes near 2^62 never wrap: every op that computes a shape refuses
-- one past 2^59 elements (issue 16, item 1). Before the fix reshape{2^62 + 1, 4} of a
-- [4] tensor succeeded (the count wrapped to 4) and indexing it read outside the storage.
local keng = require "keng"
local H = require "helper"

local HUGE = 1 << 62

describe("huge sizes", function()
  it("reshape and view refuse a shape whose element count wraps", function()
    local x = keng.zeros({4})
    H.raises(function() x:reshape{HUGE + 1, 4} end, "reshape: shape [4611686018427387905,4] is too large")
    H.raises(function() x:view{HUGE + 1, 4} end, "view: shape [4611686018427387905,4] is too large")
    H.raises(function() x:reshape{-1, HUGE, 4} end, "is too large")
    H.raises(function() x:reshape{HUGE, HUGE, 0} end, "is too large")
    H.raises(function() keng.zeros({0}):reshape{HUGE, 4, 0} end, "is too large")
    -- a shape whose sizes multiply to the right count still works, and so does an empty one
    assert.same({2, 2}, x:reshape{2, -1}.shape)
    assert.same({0, 5}, keng.zeros({0}):reshape{0, 5}.shape)
  end)

  it("expand refuses a view larger than 2^59 elements", function()
    local x = keng.zeros({1, 1})
    H.raises(function() x:expand{HUGE, 4} end, "expand: shape [4611686018427387904,4] is too large")
    H.raises(function() x:expand{1 << 40, 1 << 40} end, "is too large")
    assert.same({1 << 20, 1 << 20}, x:expand{1 << 20, 1 << 20}.shape) -- large but fine: a view
  end)

  it("cat of huge expanded views refuses the summed size", function()
    local e = keng.zeros({1}):expand{1 << 58}
    H.raises(function() keng.cat({e, e, e, e}, 1) end, "cat: the sizes along dim 1 add up to more than 2^59")
    H.raises(function() keng.stack({e, e}, 1) end, "too large")
  end)

  it("repeat_interleave refuses a repeat count that overflows", function()
    H.raises(function() keng.zeros({2}):repeat_interleave(HUGE) end, "repeat_interleave: 4611686018427387904 repeats")
    H.raises(function() keng.zeros({2, 3}):repeat_interleave(HUGE, 2) end, "of dim 2 of [2,3]")
    H.close(keng.tensor({1, 2}):repeat_interleave(2), {1, 1, 2, 2})
  end)

  it("pad refuses pads that overflow and crops that pass zero", function()
    local x = keng.zeros({2, 3})
    H.raises(function() keng.pad(x, {HUGE, HUGE}) end, "pad: pads 4611686018427387904, 4611686018427387904 of dim 2")
    H.raises(function() keng.pad(x, {math.maxinteger, 1}) end, "larger than 2^59")
    H.raises(function() keng.pad(x, {math.mininteger, 0}) end, "pad")
  end)

  it("narrow with a huge length is refused, not wrapped", function()
    local x = keng.zeros({5})
    H.raises(function() x:narrow(1, 3, math.maxinteger) end, "narrow:")
    H.raises(function() x:narrow(1, 2, HUGE) end, "does not fit in size 5 of dim 1")
  end)

  it("creation refuses huge shapes", function()
    H.raises(function() keng.zeros({HUGE, 4}) end, "too large")
    H.raises(function() keng.empty({1 << 31, 1 << 31}) end, "too large")
    H.raises(function() keng.arange(0, 1e300) end, "arange")
  end)
end)
