-- hostile_nan_spec.lua — NaN propagates through every op as in PyTorch (issue 16, item 7).
-- Before the fix relu turned NaN into 0 (f32, bf16, f64) and clamp ignored a NaN bound.
local keng = require "keng"
local H = require "helper"

local nan = 0 / 0
local FLOATS = {"f32", "f64", "bf16", "f16"}

local function isnan(v) return v ~= v end
local function all_nan(t)
  for _, v in ipairs(H.flat(t)) do if not isnan(v) then return false end end
  return true
end

describe("NaN propagation", function()
  it("relu keeps NaN (forward) and passes the gradient through it", function()
    for _, dt in ipairs(FLOATS) do
      local y = H.flat(keng.tensor({1, nan, -2, 0}, {dtype = dt}):relu())
      assert.equal(1, y[1]); assert.is_true(isnan(y[2]), dt); assert.equal(0, y[3]); assert.equal(0, y[4])
    end
    local x = keng.tensor({nan, -1, 2}, {dtype = "f64", requires_grad = true})
    x:relu():sum():backward()
    H.close(x.grad, {1, 0, 1}) -- PyTorch: the gradient passes where relu's output is not <= 0
  end)

  it("clamp: a NaN element stays NaN, a NaN bound makes everything NaN", function()
    for _, dt in ipairs(FLOATS) do
      local x = keng.tensor({1, nan, -2, 3}, {dtype = dt})
      local y = H.flat(x:clamp(0, 2))
      assert.equal(1, y[1]); assert.is_true(isnan(y[2])); assert.equal(0, y[3]); assert.equal(2, y[4])
      assert.is_true(all_nan(x:clamp(nan, 2)), dt)
      assert.is_true(all_nan(x:clamp(0, nan)), dt)
      assert.is_true(all_nan(x:clamp{max = nan}), dt)
    end
    -- absent bounds are still absent
    H.close(keng.tensor({-5, 5}):clamp(nil, 1), {-5, 1})
    H.close(keng.tensor({-5, 5}):clamp{min = 0}, {0, 5})
    -- an integer tensor with a NaN or fractional bound gives floats, as with a number
    local i = keng.tensor({1, 2, 3}, {dtype = "i64"})
    assert.equal("i64", i:clamp(1, 2).dtype)
    assert.equal("f32", i:clamp(1.5, 2).dtype)
    assert.is_true(all_nan(i:clamp(nan)))
    H.raises(function() i:clamp{mni = 1} end, "clamp: unknown option 'mni' (valid: min, max)")
  end)

  it("reductions and selections put NaN first, on every row length and position", function()
    for _, n in ipairs({1, 7, 9, 64, 300}) do
      for _, pos in ipairs({1, (n + 1) // 2, n}) do
        local v = {}
        for j = 1, n do v[j] = math.sin(j) end
        v[pos] = nan
        for _, dt in ipairs({"f32", "bf16", "f64"}) do
          local x = keng.tensor({v}, {dtype = dt})
          local what = string.format("%s n=%d pos=%d", dt, n, pos)
          assert.is_true(isnan(x:max():item()) and isnan(x:min():item()), what)
          assert.equal(pos - 1, x:argmax(2):item(), what)
          assert.equal(pos - 1, x:argmin(2):item(), what)
          assert.is_true(isnan(x:sum():item()) and isnan(x:mean():item()), what)
          assert.is_true(all_nan(x:softmax(2)) and all_nan(x:log_softmax(2)), what)
          local vals, idx = x:topk(1, 2)
          assert.is_true(isnan(vals:item()) and idx:item() == pos - 1, what)
          assert.is_true(all_nan(keng.rms_norm(x, keng.ones({n}, {dtype = dt}))), what)
          assert.is_true(isnan(x:matmul(keng.ones({n, 1}, {dtype = dt})):item()), what)
        end
      end
    end
  end)

  it("maximum and minimum propagate NaN from either side", function()
    local a, b = keng.tensor({nan, 1, 2}), keng.tensor({0, nan, 1})
    for _, y in ipairs({a:maximum(b), b:maximum(a), a:minimum(b), b:minimum(a)}) do
      local f = H.flat(y)
      assert.is_true(isnan(f[1]) and isnan(f[2]))
    end
    H.close(a:maximum(b):narrow(1, 3, 1), {2})
  end)

  it("NaN cannot be written into an integer tensor", function()
    local t = keng.zeros({3}, {dtype = "i64"})
    H.raises(function() t:fill_(nan) end, "fill_: value NaN cannot be stored in a tensor of dtype i64")
    H.raises(function() t[2] = nan end, "fill_: value NaN")
    H.raises(function() t[2] = math.huge end, "value inf")
    H.raises(function() keng.zeros({2}, {dtype = "u8"}):fill_(300) end, "value 300 cannot be stored in a tensor of dtype u8")
    H.raises(function() keng.full({2}, nan, {dtype = "i32"}) end, "value NaN")
    H.close(t, {0, 0, 0})
    -- a cast is defined even where a C cast is not: NaN -> 0, out of range saturates
    local c = keng.tensor({nan, 1e30, -1e30, 2.7}, {dtype = "f64"}):to("i64")
    assert.same({0, math.maxinteger, math.mininteger, 2}, c:tolist())
  end)
end)
