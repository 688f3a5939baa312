-- hostile_types_spec.lua — integer and bool arithmetic as in PyTorch, or refused clearly
-- (issue 16, item 10): integer 2 ^ -1 gave 0, bool + bool gave a u8 2, -mask gave 255.
local keng = require "keng"
local H = require "helper"

describe("integer and bool arithmetic", function()
  it("an integer tensor to a negative integer power is refused (PyTorch too)", function()
    local i = keng.tensor({2, 3}, {dtype = "i64"})
    H.raises(function() return i ^ -1 end, "pow: an integer tensor (i64) to a negative integer power (-1) is not allowed")
    H.raises(function() return keng.tensor({2}, {dtype = "i32"}):pow(-2) end, "negative integer power")
    H.close(i ^ 2, {4, 9})
    assert.equal("i64", (i ^ 2).dtype)
    H.close(i:double() ^ -1, {0.5, 1 / 3})
    H.close(i ^ 0.5, {math.sqrt(2), math.sqrt(3)}) -- a fractional power gives floats
  end)

  it("bool + bool is logical or, bool * bool logical and; sub, pow and neg are refused", function()
    local a, b = keng.tensor({true, true, false, false}), keng.tensor({true, false, true, false})
    assert.equal("bool", (a + b).dtype)
    assert.same({true, true, true, false}, (a + b):tolist())
    assert.same({true, false, false, false}, (a * b):tolist())
    assert.same({true, true, true, true}, (b + true):tolist())
    assert.same({true, true, true, false}, a:maximum(b):tolist())
    H.raises(function() return a - b end, "sub: not supported for two bool tensors")
    H.raises(function() return a ^ b end, "pow: not supported for two bool tensors")
    H.raises(function() return -a end, "neg: not supported for a bool tensor; to invert a mask use logical_not()")
    H.raises(function() return a:relu() end, "relu: not supported for a bool tensor")
    H.raises(function() a:sub_(b) end, "sub")
    -- a number with a bool tensor is an integer, as in PyTorch
    assert.equal("i64", (a + 1).dtype)
    H.close(a + 1, {2, 2, 1, 1})
    H.close(1 - a, {0, 0, 1, 1})
    assert.equal("f32", (a / b).dtype)
  end)

  it("in-place results must fit the destination's kind (were truncated: i64:add_(0.5))", function()
    local i = keng.tensor({1, 2}, {dtype = "i64"})
    H.raises(function() i:add_(0.5) end, "add_: the result type f32 cannot be stored in the destination of type i64")
    H.raises(function() i:div_(2) end, "div_: the result type f32")
    H.raises(function() i:mul_(keng.tensor({1.5, 1})) end, "mul_:")
    H.raises(function() keng.tensor({true}):add_(1) end, "add_: the result type i64 cannot be stored in the destination of type bool")
    H.close(i, {1, 2}) -- untouched
    i:add_(3)
    H.close(i, {4, 5})
    local f = keng.zeros({2}, {dtype = "bf16"})
    f:add_(keng.tensor({1, 2}, {dtype = "f64"})) -- float into float narrows, as in PyTorch
    H.close(f, {1, 2})
  end)

  it("numbers that do not fit an integer dtype promote instead of wrapping", function()
    assert.equal("f32", (keng.tensor({1}, {dtype = "i64"}) + 1e30).dtype)
    H.close(keng.tensor({1}, {dtype = "u8"}) + 300, {301})
    assert.equal("f32", (keng.tensor({1}, {dtype = "i32"}) * math.huge).dtype)
  end)

  it("a closed tensor is refused by name, never passed on", function()
    local t = keng.zeros({2})
    local u = keng.ones({2})
    getmetatable(t).__gc(t)
    H.raises(function() return u + t end, "tensor was closed")
    H.raises(function() return t + 1 end, "tensor was closed")
    H.raises(function() u[1] = t end, "tensor was closed")
  end)
end)
