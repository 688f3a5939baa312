-- hostile_messages_spec.lua — errors speak the 1-based API the user wrote (issue 16, items 11
-- and 12): t[4] on a [3] tensor said "index 3 ... dim 0"; positions and dims are 1-based in
-- messages, ids stored in index tensors stay 0-based. A wrongly typed argument names the
-- function and the argument, never "attempt to index a nil value".
local keng = require "keng"
local H = require "helper"

describe("1-based positions in messages", function()
  local t3 = keng.zeros({3})
  local t23 = keng.zeros({2, 3})

  it("indexing and select name the position and dim as written", function()
    H.raises(function() return t3[4] end, "select: index 4 out of range for dim 1 of size 3")
    H.raises(function() return t3[-4] end, "select: index -4 out of range for dim 1 of size 3")
    H.raises(function() return t23:select(2, 5) end, "select: index 5 out of range for dim 2 of size 3")
    H.raises(function() t23[3] = 1 end, "index 3 out of range for dim 1 of size 2")
  end)

  it("narrow names the 1-based start and dim", function()
    H.raises(function() return t3:narrow(1, 3, 2) end, "narrow: start 3 with length 2 does not fit in size 3 of dim 1")
    H.raises(function() return t23:narrow(2, -1, 2) end, "narrow: start -1 with length 2 does not fit in size 3 of dim 2")
  end)

  it("bad dims are reported as written, naming the function", function()
    H.raises(function() return t23:sum(3) end, "to 'sum' (dim 3 out of range for a tensor of 2 dims")
    H.raises(function() return t23:sum({1, "a"}) end, "to 'sum' (dim must be an integer, got string)")
    H.raises(function() return t23:sum({1, 1}) end, "dim 1 appears twice")
    H.raises(function() return t23:sum(1.5) end, "dim must be an integer, got a fraction")
    H.raises(function() return t23:permute{1, 3} end, "permute: dim 3 out of range")
    H.raises(function() return t23:permute{1, 1} end, "permute: dims must be a permutation of 2 dims of [2,3] (bad or repeated dim 1)")
    H.raises(function() return t23:transpose(1, 3) end, "dim 3 out of range")
    H.raises(function() return t23:unsqueeze(4) end, "unsqueeze: dim 4 out of range")
    H.raises(function() return t23:squeeze(3) end, "dim 3 out of range")
    H.raises(function() return keng.cat({t23, t23}, 3) end, "dim 3 out of range")
    H.raises(function() return keng.stack({t23, t23}, 4) end, "dim 4 out of range")
    H.raises(function() return t23:softmax(-3) end, "dim -3 out of range")
    H.raises(function() return keng.cat({t23, keng.zeros({2, 4})}, 1) end,
      "cat: tensor 2 [2,4] does not match tensor 1 [2,3] outside dim 1")
  end)

  it("ids in index tensors stay 0-based", function()
    local ids = keng.tensor({0, 3}, {dtype = "i64"})
    H.raises(function() return t23:index_select(2, ids) end, "index_select: index 3 out of range for dim 2 of size 3")
  end)
end)

describe("wrongly typed arguments", function()
  local t = keng.zeros({2, 3})
  it("name the function and the argument", function()
    H.raises(function() return t:reshape{2, "x"} end, "to 'reshape' (shape entry 2 is not an integer (string))")
    H.raises(function() return t + "x" end, "bad argument")
    H.raises(function() return keng.cat({t, "x"}) end, "to 'cat' (element 2 of the list is not a tensor (string))")
    H.raises(function() return keng.zeros({2}, {dtype = "f33"}) end, "unknown dtype 'f33'")
    H.raises(function() return t:narrow(1, "a", 1) end, "to 'narrow'")
    H.raises(function() return t:clamp("lo") end, "to 'clamp'")
    H.raises(function() return t:matmul({}) end, "to 'matmul'")
    H.raises(function() t[1] = "x" end, "tensor, number or boolean expected")
  end)

  it("options tables refuse unknown keys and non-tables (were silently ignored)", function()
    H.raises(function() return keng.zeros({2}, {dtyp = "f64"}) end, "zeros: unknown option 'dtyp' (valid: dtype, device, requires_grad)")
    H.raises(function() return t:topk(1, 2, {larges = false}) end, "topk: unknown option 'larges' (valid: largest, sorted)")
    H.raises(function() return t:topk(1, 2, false) end, "table of options expected, got boolean")
    H.raises(function() return t:var(1, false, {correction = "a"}) end, "var: option 'correction' must be an integer in [0, 1073741824], got a")
    H.raises(function() return t:var(1, false, {correction = 0 / 0}) end, "var: option 'correction' must be an integer")
    H.raises(function() return t:to{dtype = "f64", devise = "cpu"} end, "to: unknown option 'devise'")
    H.raises(function() t:sum():backward{retain = true} end, "backward: unknown option 'retain'")
    H.raises(function() return keng.interpolate(keng.zeros({1, 1, 2, 2}), {scale = 1e300}) end, "interpolate: scale")
    H.raises(function() return t:split({2, 1 << 62}, 2) end, "split: size 2")
    assert.equal(2, #t:chunk(math.maxinteger, 1)) -- ceil(2 / n) = 1 per chunk, without wrapping
  end)
end)
