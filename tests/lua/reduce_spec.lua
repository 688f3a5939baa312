-- reduce_spec.lua — reductions (sum, mean, var, max, min, argmax, argmin), scans (cumsum),
-- topk, softmax and log_softmax: values against plain Lua references, gradients against
-- finite differences, non-contiguous and bf16 inputs, and error messages.
local keng = require "keng"
local H = require "helper"

-- The rows of t along dim (1-based, may be negative): a list of {row = values, off = flat
-- offset of the row's first element}, in the row-major order of the other dims; and the
-- flat stride along dim.
local function rows_along(t, dim)
  local shape, flat = t.shape, H.flat(t)
  local nd = #shape
  if dim < 0 then dim = dim + nd + 1 end
  local strides, s = {}, 1
  for d = nd, 1, -1 do strides[d] = s; s = s * shape[d] end
  local n = shape[dim]
  local rows = {}
  for r = 0, #flat // n - 1 do
    local off, rem = 0, r
    for d = nd, 1, -1 do
      if d ~= dim then off = off + (rem % shape[d]) * strides[d]; rem = rem // shape[d] end
    end
    local row = {}
    for j = 0, n - 1 do row[#row + 1] = flat[off + j * strides[dim] + 1] end
    rows[#rows + 1] = {row = row, off = off}
  end
  return rows, strides[dim]
end

-- applies fn(row) -> number to each row along dim; the flat results
local function reduce_ref(t, dim, fn)
  local out = {}
  for _, r in ipairs(rows_along(t, dim)) do out[#out + 1] = fn(r.row) end
  return out
end

-- applies fn(row) -> list of the row's length to each row; the flat result shaped like t
local function map_ref(t, dim, fn)
  local rows, stride = rows_along(t, dim)
  local out = {}
  for _, r in ipairs(rows) do
    for j, v in ipairs(fn(r.row)) do out[r.off + (j - 1) * stride + 1] = v end
  end
  return out
end

local function lsum(r) local s = 0; for _, v in ipairs(r) do s = s + v end; return s end
local function lmean(r) return lsum(r) / #r end
local function lvar(r, corr) local m, s = lmean(r), 0; for _, v in ipairs(r) do s = s + (v - m) ^ 2 end; return s / (#r - corr) end
local function largmax(r) local b = 1; for i = 2, #r do if r[i] > r[b] then b = i end end; return b - 1 end
local function largmin(r) local b = 1; for i = 2, #r do if r[i] < r[b] then b = i end end; return b - 1 end
local function lsoftmax(r)
  local m = -math.huge
  for _, v in ipairs(r) do m = math.max(m, v) end
  local s, out = 0, {}
  for i, v in ipairs(r) do out[i] = math.exp(v - m); s = s + out[i] end
  for i = 1, #out do out[i] = out[i] / s end
  return out
end
local function llog_softmax(r)
  local p, out = lsoftmax(r), {}
  for i, v in ipairs(p) do out[i] = math.log(v) end
  return out
end

local function shape_is(t, shape)
  assert(#t.shape == #shape, "ndim " .. #t.shape .. " vs " .. #shape)
  for i = 1, #shape do assert(t.shape[i] == shape[i], "shape [" .. table.concat(t.shape, ",") .. "]") end
end


-- the scalar reference of max/min along a row: the first NaN wins, else the first of equal extremes
local function first_extremes(row)
  local bmax, bmin = 1, 1
  for j = 2, #row do
    if row[bmax] == row[bmax] and (row[j] ~= row[j] or row[j] > row[bmax]) then bmax = j end
    if row[bmin] == row[bmin] and (row[j] ~= row[j] or row[j] < row[bmin]) then bmin = j end
  end
  return bmax, bmin
end

describe("sum, mean, var", function()
  keng.manual_seed(1)
  local x = keng.randn({2, 3, 4})

  it("match a reference over one dim, a list of dims and all dims", function()
    H.close(x:sum(2), reduce_ref(x, 2, lsum), 1e-5, "sum dim 2")
    shape_is(x:sum(2), {2, 4})
    shape_is(x:sum(2, true), {2, 1, 4})
    H.close(x:mean(-1), reduce_ref(x, 3, lmean), 1e-5, "mean dim -1")
    H.close(x:var(1), reduce_ref(x, 1, function(r) return lvar(r, 1) end), 1e-5, "var dim 1")
    H.close(x:var(1, false, {correction = 0}), reduce_ref(x, 1, function(r) return lvar(r, 0) end), 1e-5, "var biased")
    local all = lsum(H.flat(x))
    H.close(x:sum(), all, 1e-5, "sum all")
    shape_is(x:sum(), {})
    H.close(x:mean(), all / 24, 1e-5, "mean all")
    -- {1, 3}: reduce dims 1 and 3, leaving dim 2
    local want = {}
    for j = 1, 3 do want[j] = lsum(H.flat(x:select(2, j))) end
    H.close(x:sum({1, 3}), want, 1e-5, "sum over {1,3}")
    shape_is(x:mean({1, 3}, true), {1, 3, 1})
    H.close(x:mean({1, 3}), x:sum({1, 3}) / 8, 1e-6, "mean over {1,3}")
  end)

  -- sums over leading dims of a contiguous tensor add whole rows (blocks of 512 columns, one
  -- per thread): more than one block, a ragged last block, integers and bf16, against the
  -- column-by-column walk of a non-contiguous copy
  it("over leading dims match the strided walk", function()
    keng.manual_seed(9)
    local x = keng.randn({3, 7, 1100})
    local ref = {}
    for j = 1, 1100 do ref[j] = 0 end
    local xl = x:tolist()
    for a = 1, 3 do for b = 1, 7 do for j = 1, 1100 do ref[j] = ref[j] + xl[a][b][j] end end end
    H.close(x:sum({1, 2}), ref, 1e-5, "sum over {1,2}")
    shape_is(x:sum({1, 2}, true), {1, 1, 1100})
    H.close(x:sum(1), H.noncontig(x):sum(1), 1e-6, "sum over dim 1")
    local i = keng.arange(3 * 600):reshape{3, 600}
    assert.are.equal("i64", i:sum(1).dtype)
    assert.are.same(i:double():sum(1):tolist(), i:sum(1):double():tolist())
    local b = x:bf16()
    H.close(b:sum(1):float(), b:float():sum(1), 2e-2, "bf16")
  end)

  it("integer sums are i64; non-contiguous and bf16 inputs work", function()
    local i = keng.tensor({{1, 2}, {3, 4}}, {dtype = "i32"})
    assert.are.equal("i64", i:sum().dtype)
    assert.are.equal(10, i:sum():item())
    H.close(H.noncontig(x:select(1, 1)):sum(1), x:select(1, 1):sum(1), 1e-6, "non-contiguous")
    local b = x:bf16()
    assert.are.equal("bf16", b:sum(3).dtype)
    H.close(b:sum(3):float(), b:float():sum(3), 2e-2, "bf16 sum")
  end)

  it("gradients match finite differences", function()
    local a = H.leaf({3, 4})
    H.gradcheck(function(t) return t:sum(1) end, {a})
    H.gradcheck(function(t) return t:mean({1, 2}, true) end, {a})
    H.gradcheck(function(t) return t:var(2) end, {a})
  end)

  it("rejects bad input", function()
    H.raises(function() keng.tensor({1, 2}, {dtype = "i64"}):mean() end, "mean")
    H.raises(function() x:sum(4) end, "out of range")
  end)
end)

describe("max, min, argmax, argmin", function()
  keng.manual_seed(2)
  local x = keng.randn({3, 5, 4})

  it("match a reference along each dim", function()
    for _, d in ipairs({1, 2, -1}) do
      local v, i = x:max(d)
      H.close(v, reduce_ref(x, d, function(r) return r[largmax(r) + 1] end), 1e-6, "max values dim " .. d)
      H.close(i, reduce_ref(x, d, largmax), 0, "max indices dim " .. d)
      assert.are.equal("i64", i.dtype)
      local mv, mi = x:min(d)
      H.close(mv, reduce_ref(x, d, function(r) return r[largmin(r) + 1] end), 1e-6, "min values dim " .. d)
      H.close(mi, reduce_ref(x, d, largmin), 0, "min indices dim " .. d)
      H.close(x:argmax(d), i, 0, "argmax dim " .. d)
      H.close(x:argmin(d), mi, 0, "argmin dim " .. d)
    end
    local v, i = x:max(2, true)
    shape_is(v, {3, 1, 4})
    shape_is(i, {3, 1, 4})
    shape_is(x:argmin(3, true), {3, 5, 1})
  end)

  it("with no dim reduce everything", function()
    local f = H.flat(x)
    local m = x:max()
    shape_is(m, {})
    H.close(m, f[largmax(f) + 1], 1e-6, "max all")
    H.close(x:min(), f[largmin(f) + 1], 1e-6, "min all")
    assert.are.equal(largmax(f), x:argmax():item())
    assert.are.equal(largmin(f), x:argmin():item())
  end)

  it("pick the first of equal values and keep the dtype", function()
    local t = keng.tensor({{1, 7, 7, 0}, {3, 3, 3, 3}}, {dtype = "i32"})
    local v, i = t:max(2)
    assert.are.equal("i32", v.dtype)
    assert.are.same({7, 3}, v:tolist())
    assert.are.same({1, 0}, i:tolist())
    assert.are.same({3, 0}, t:argmin(2):tolist())
  end)

  it("work on non-contiguous and bf16 input", function()
    local m = x:select(1, 2)
    local v, i = H.noncontig(m):max(1)
    local v2, i2 = m:max(1)
    H.close(v, v2, 0, "non-contiguous values")
    H.close(i, i2, 0, "non-contiguous indices")
    local b = m:bf16()
    local bv, bi = b:min(2)
    assert.are.equal("bf16", bv.dtype)
    H.close(bv:float(), b:float():min(2), 0, "bf16 min")
    H.close(bi, b:float():argmin(2), 0, "bf16 argmin")
  end)

  it("route the gradient to the selected element", function()
    local a = H.leaf({3, 4})
    H.gradcheck(function(t) return (t:max(2)) end, {a})
    H.gradcheck(function(t) return (t:min(1, true)) end, {a})
    H.gradcheck(function(t) return t:max() end, {a})
    local l = H.leaf({4})
    local want = l:argmax():item()
    l:max():backward()
    local g = l.grad:tolist()
    for k = 1, 4 do assert.are.equal(k - 1 == want and 1 or 0, g[k]) end
  end)

  it("rejects an empty dim", function()
    H.raises(function() keng.zeros({2, 0}):max(2) end, "max")
    H.raises(function() keng.zeros({0}):argmin() end, "argmin")
  end)
end)

describe("cumsum", function()
  keng.manual_seed(3)
  local x = keng.randn({3, 4, 2})

  local function lcumsum(r)
    local s, out = 0, {}
    for i, v in ipairs(r) do s = s + v; out[i] = s end
    return out
  end

  it("matches a reference along each dim", function()
    for _, d in ipairs({1, 2, -1}) do
      H.close(x:cumsum(d), map_ref(x, d, lcumsum), 1e-5, "cumsum dim " .. d)
    end
    local i = keng.tensor({1, 2, 3, 4}, {dtype = "i32"}):cumsum(1)
    assert.are.equal("i64", i.dtype)
    assert.are.same({1, 3, 6, 10}, i:tolist())
  end)

  it("works on non-contiguous and bf16 input", function()
    local m = x:select(3, 1)
    H.close(H.noncontig(m):cumsum(2), m:cumsum(2), 1e-6, "non-contiguous")
    local b = m:bf16():cumsum(1)
    assert.are.equal("bf16", b.dtype)
    H.close(b:float(), m:bf16():float():cumsum(1), 1e-2, "bf16")
  end)

  it("gradient is the reverse cumsum", function()
    H.gradcheck(function(t) return t:cumsum(2) end, {H.leaf({3, 5})})
    H.gradcheck(function(t) return t:cumsum(1) end, {H.leaf({4, 2})})
  end)

  it("rejects a bad dim", function()
    H.raises(function() x:cumsum(4) end, "out of range")
  end)
end)

describe("topk", function()
  keng.manual_seed(4)
  local x = keng.randn({3, 6})

  local function ref(r, k, largest)
    local idx = {}
    for i = 1, #r do idx[i] = i end
    table.sort(idx, function(a, b) if largest then return r[a] > r[b] end return r[a] < r[b] end)
    local v, i = {}, {}
    for j = 1, k do v[j] = r[idx[j]]; i[j] = idx[j] - 1 end
    return v, i
  end

  it("matches a sorting reference, largest and smallest", function()
    for _, largest in ipairs({true, false}) do
      local v, i = x:topk(3, -1, {largest = largest})
      shape_is(v, {3, 3})
      assert.are.equal("i64", i.dtype)
      local rows = x:tolist()
      local vl, il = v:tolist(), i:tolist()
      for r = 1, 3 do
        local rv, ri = ref(rows[r], 3, largest)
        H.close(vl[r], rv, 1e-6, "values row " .. r)
        assert.are.same(ri, il[r])
      end
    end
  end)

  it("works along dim 1, with the default dim, and on non-contiguous input", function()
    local v, i = x:topk(2, 1)
    local vt, it_ = x:transpose(1, 2):contiguous():topk(2)
    H.close(v, vt:transpose(1, 2), 0, "dim 1 values")
    H.close(i, it_:transpose(1, 2), 0, "dim 1 indices")
    local nv, ni = H.noncontig(x):topk(4)
    local cv, ci = x:topk(4)
    H.close(nv, cv, 0, "non-contiguous values")
    H.close(ni, ci, 0, "non-contiguous indices")
    local bv = x:bf16():topk(2)
    assert.are.equal("bf16", bv.dtype)
    H.close(bv:float(), (x:bf16():float():topk(2)), 0, "bf16")
  end)

  it("gradient scatters into zeros", function()
    H.gradcheck(function(t) return (t:topk(2, 2)) end, {H.leaf({3, 5})})
    H.gradcheck(function(t) return (t:topk(3, 1, {largest = false})) end, {H.leaf({4, 2})})
  end)

  it("rejects k larger than the dim", function()
    H.raises(function() x:topk(7) end, "topk")
  end)
end)

describe("softmax, log_softmax", function()
  keng.manual_seed(5)
  local x = keng.randn({2, 3, 5}, {dtype = "f64"})

  it("match a reference along each dim", function()
    for _, d in ipairs({1, 2, -1}) do
      H.close(x:softmax(d), map_ref(x, d, lsoftmax), 1e-6, "softmax dim " .. d)
      H.close(keng.log_softmax(x, d), map_ref(x, d, llog_softmax), 1e-6, "log_softmax dim " .. d)
    end
    H.close(keng.softmax(x), x:softmax(-1), 0, "default dim is -1")
    H.close(x:log_softmax(), x:log_softmax(3), 0, "default dim is -1")
  end)

  it("are stable for large logits", function()
    local big = keng.tensor({{1000, 1001, 1002}, {-1000, -1000, -1000}}, {dtype = "f32"})
    H.close(big:softmax(), {lsoftmax({0, 1, 2}), {1 / 3, 1 / 3, 1 / 3}}, 1e-6, "softmax")
    H.close(big:log_softmax(), {llog_softmax({0, 1, 2}), llog_softmax({0, 0, 0})}, 1e-5, "log_softmax")
  end)

  it("work on non-contiguous, f32 and bf16 input", function()
    local m = x:select(1, 1)
    H.close(H.noncontig(m):softmax(1), m:softmax(1), 1e-12, "non-contiguous")
    local f = m:float():log_softmax(2)
    assert.are.equal("f32", f.dtype)
    H.close(f, m:log_softmax(2), 1e-5, "f32")
    local b = m:bf16():softmax(2)
    assert.are.equal("bf16", b.dtype)
    H.close(b:float(), m:softmax(2), 1e-2, "bf16")
  end)

  it("gradients match finite differences", function()
    H.gradcheck(function(t) return t:softmax(2) end, {H.leaf({3, 4})})
    H.gradcheck(function(t) return t:softmax(1) end, {H.leaf({3, 4})})
    H.gradcheck(function(t) return t:log_softmax(-1) end, {H.leaf({2, 3, 4})})
    H.gradcheck(function(t) return keng.log_softmax(t, 1) end, {H.leaf({3, 2})})
  end)

  -- float rows run a libm-free exp and sum over float lanes in blocks (256 on the direct path,
  -- 128 on the buffered one): rows longer than a block with a ragged tail, -inf entries and a wide spread, against f64 on the same values
  it("f32 on long rows matches f64", function()
    keng.manual_seed(8)
    local x32 = keng.randn({5, 301}) * 20
    x32[2][7] = -math.huge
    x32[3]:fill_(-math.huge)
    local x64 = x32:double()
    H.close(x32:softmax(-1):double(), x64:softmax(-1), 1e-6, "softmax")
    H.close(x32:log_softmax(-1):double(), x64:log_softmax(-1), 1e-5, "log_softmax")
    H.close(x32:softmax(1):double(), x64:softmax(1), 1e-6, "softmax dim 1")
    -- a NaN anywhere in a row makes the whole row NaN (as PyTorch), other rows are untouched
    local xn = x32:clone()
    xn[4][200] = 0 / 0
    for _, name in ipairs({"softmax", "log_softmax"}) do
      local y = xn[name](xn, -1)
      for j = 1, 301, 50 do assert.is_true(y[4][j]:item() ~= y[4][j]:item(), name .. " NaN row") end
      H.close(y[5], x32[name](x32, -1)[5], 0, name .. " other rows")
    end
    local g = keng.randn({5, 301})
    for _, name in ipairs({"softmax", "log_softmax"}) do
      local a, b = x32:detach(), x64:detach()
      a.requires_grad, b.requires_grad = true, true
      a[name](a, -1):backward(g)
      b[name](b, -1):backward(g:double())
      H.close(a.grad:double(), b.grad, 1e-5, name .. " backward")
    end
  end)

  -- the backward is one fused kernel per form (softmax_backward, log_softmax_backward): check
  -- it against the formulas written out in Lua, for every dim, non-contiguous and broadcast
  -- (expanded, stride-0) gradients, 0-d input, and f32 / bf16 against f64
  it("backward matches y * (g - sum(g y)) and g - exp(y) sum(g) along any dim", function()
    keng.manual_seed(7)
    -- H.close reads tensors through f32: compare f64 results as lists
    local function close64(a, b, tol, msg)
      return H.close(keng.is_tensor(a) and a:tolist() or a, keng.is_tensor(b) and b:tolist() or b, tol, msg)
    end
    local function ref_grad(y, g, d, log_form)
      local s = log_form and g:sum(d, true) or (g * y):sum(d, true)
      return log_form and g - y:exp() * s or y * (g - s)
    end
    for _, log_form in ipairs({false, true}) do
      local name = log_form and "log_softmax" or "softmax"
      for _, d in ipairs({1, 2, 3, -1}) do
        local t = keng.randn({3, 4, 5}, {dtype = "f64"}):detach()
        t.requires_grad = true
        local y = t[name](t, d)
        local g = keng.randn({3, 4, 5}, {dtype = "f64"})
        y:backward(g)
        close64(t.grad, ref_grad(y:detach(), g, d, log_form), 1e-12, name .. " dim " .. d)
        -- a non-contiguous gradient and a broadcast one
        t.grad = nil
        t[name](t, d):backward(H.noncontig(g))
        close64(t.grad, ref_grad(y:detach(), g, d, log_form), 1e-12, name .. " non-contiguous g, dim " .. d)
        t.grad = nil
        local gb = keng.randn({1, 4, 1}, {dtype = "f64"}):expand({3, 4, 5})
        t[name](t, d):backward(gb)
        close64(t.grad, ref_grad(y:detach(), gb:contiguous(), d, log_form), 1e-12, name .. " expanded g, dim " .. d)
      end
      -- f32 and bf16 compute in f32: close to f64
      local x64 = keng.randn({6, 33}, {dtype = "f64"})
      local g64 = keng.randn({6, 33}, {dtype = "f64"})
      local want = ref_grad(x64[name](x64, 2), g64, 2, log_form)
      for _, dt in ipairs({"f32", "bf16"}) do
        local xt = x64:to(dt):detach()
        xt.requires_grad = true
        xt[name](xt, 2):backward(g64:to(dt))
        assert.are.equal(dt, xt.grad.dtype)
        H.close(xt.grad:double(), want, dt == "f32" and 1e-5 or 3e-2, name .. " " .. dt)
      end
      -- 0-d input: the gradient of a one-element softmax
      local z = keng.tensor(0.5, {dtype = "f64"}):detach()
      z.requires_grad = true
      z[name](z, -1):backward()
      close64(z.grad, 0, 1e-12, name .. " 0-d")
    end
  end)

  it("reject integer input", function()
    H.raises(function() keng.tensor({1, 2}, {dtype = "i64"}):softmax() end, "softmax")
    H.raises(function() keng.tensor({1, 2}, {dtype = "i64"}):log_softmax() end, "log_softmax")
  end)
end)

-- contiguous f32 rows along the last dim run a direct kernel (no row buffer, AVX2 max / sums);
-- other layouts and dtypes the buffered one: both against f64 at the lengths that exercise
-- the 8-lane loops, their tails and the 256-element blocks
describe("row kernels on contiguous f32 rows", function()
  local lens = {1, 7, 33, 1000}

  it("softmax and log_softmax match f64 forward and backward; strided rows agree", function()
    keng.manual_seed(31)
    for _, n in ipairs(lens) do
      local x32 = (keng.randn({3, n}) * 8):detach()
      local g = keng.randn({3, n})
      for _, name in ipairs({"softmax", "log_softmax"}) do
        local a, b = x32:detach(), x32:double():detach()
        a.requires_grad, b.requires_grad = true, true
        local ya, yb = a[name](a, -1), b[name](b, -1)
        H.close(ya:double(), yb, name == "softmax" and 1e-6 or 1e-5, name .. " n " .. n)
        ya:backward(g)
        yb:backward(g:double())
        H.close(a.grad:double(), b.grad, 1e-5, name .. " backward n " .. n)
        -- a non-contiguous copy takes the buffered kernel: the same values to rounding
        if n > 1 then
          local s = H.noncontig(x32)
          H.close(s[name](s, -1), ya, 1e-6, name .. " strided n " .. n)
        end
        local h = x32:bf16()[name](x32:bf16(), -1)
        H.close(h:float(), ya, 2e-2, name .. " bf16 n " .. n)
      end
    end
    -- along a middle dim of a contiguous f32 tensor: the column kernel (64 columns at a time)
    for _, n in ipairs(lens) do
      local x32 = (keng.randn({2, n, 67}) * 8):detach()
      local g = keng.randn({2, n, 67})
      for _, name in ipairs({"softmax", "log_softmax"}) do
        local a, b = x32:detach(), x32:double():detach()
        a.requires_grad, b.requires_grad = true, true
        local ya, yb = a[name](a, 2), b[name](b, 2)
        H.close(ya:double(), yb, name == "softmax" and 1e-6 or 1e-5, name .. " dim 2 n " .. n)
        ya:backward(g)
        yb:backward(g:double())
        H.close(a.grad:double(), b.grad, 1e-5, name .. " dim 2 backward n " .. n)
      end
    end
    H.gradcheck(function(t) return t:softmax(-1) end, {H.leaf({2, 33})})
    H.gradcheck(function(t) return t:log_softmax(-1) end, {H.leaf({2, 7})})
  end)

  it("max, min, argmax, argmin find the first extreme; NaN wins; bf16 too", function()
    keng.manual_seed(32)
    for _, n in ipairs(lens) do
      for _, dt in ipairs({"f32", "bf16"}) do
        local x = (keng.randn({4, n}) * 50):to(dt)
        if n > 2 then
          x[2][n] = 500; x[2][n // 2 + 1] = 500       -- a tie: the first wins
          x[2][2] = -500; x[2][n - 1] = -500
        end
        x[3]:fill_(-math.huge)
        x[4][n] = 0 / 0
        local rows = x:float():tolist()
        local v, i = x:max(-1)
        local vm, im = x:min(-1)
        local am, an = x:argmax(-1), x:argmin(-1)
        for r = 1, 4 do
          local row = rows[r]
          local bmax, bmin = first_extremes(row)
          local msg = dt .. " n " .. n .. " row " .. r
          assert.are.equal(bmax - 1, i[r]:item(), "max index " .. msg)
          assert.are.equal(bmax - 1, am[r]:item(), "argmax " .. msg)
          assert.are.equal(bmin - 1, im[r]:item(), "min index " .. msg)
          assert.are.equal(bmin - 1, an[r]:item(), "argmin " .. msg)
          local want = row[bmax]
          if want == want then assert.are.equal(want, v[r]:item(), "max value " .. msg)
          else assert.is_true(v[r]:item() ~= v[r]:item(), "max NaN " .. msg) end
          assert.are.equal(dt, v.dtype)
        end
        -- a strided view takes the general path and agrees
        if n > 1 then H.close(H.noncontig(x):argmax(-1), am, 0, "strided argmax " .. dt .. " n " .. n) end
      end
    end
  end)

  -- bf16 rows take a 32-lane kernel on the bf16 bits where the CPU has AVX-512 BW (blocks of 512):
  -- planted ties across vector and block edges, -0 against +0, rows of negatives ending in a
  -- partial vector, a negative NaN, NaN only in the tail; indices and values against a scalar
  -- reference, and the f32 and strided (general) paths
  it("bf16 argmax / argmin / max / min: ties, signed zeros, NaN at vector and block edges", function()
    keng.manual_seed(7)
    for _, n in ipairs({1, 31, 32, 33, 511, 512, 513, 1100, 32000}) do
      local x = (keng.randn({8, n}) * 10):to("bf16")
      if n > 2 then
        x[1][n] = 99; x[1][(n + 1) // 2] = 99; x[1][1] = -99; x[1][n - 1] = -99     -- ties: the first wins
      end
      if n > 513 then x[2][513] = 120; x[2][n] = 120; x[2][512] = -120; x[2][514] = -120 end -- across blocks
      x[3]:fill_(-3); x[3][n] = -2                                                 -- negatives, a tail
      x[4]:fill_(0); x[4][n] = -0.0; if n > 1 then x[4][1] = -0.0 end             -- -0 == +0: the first
      x[5]:fill_(-1); if n > 1 then x[5][n] = -0.0; x[5][n // 2 + 1] = 0 end
      x[6][n] = 0 / 0                                                              -- NaN in the tail
      x[7][math.max(1, n // 3)] = -(0 / 0); x[7][n] = math.huge                    -- a negative NaN first
      x[8]:fill_(math.huge); x[8][n] = -math.huge
      local rows = x:float():tolist()
      local v, i = x:max(-1)
      local vm, im = x:min(-1)
      local am, an = x:argmax(-1), x:argmin(-1)
      local fam, fan = x:float():argmax(-1), x:float():argmin(-1)
      local sx = n > 1 and H.noncontig(x) or x                                     -- [8, 1] is contiguous
      local sam, san = sx:argmax(-1), sx:argmin(-1)
      for r = 1, 8 do
        local row = rows[r]
        local bmax, bmin = first_extremes(row)
        local msg = "n " .. n .. " row " .. r
        assert.are.equal(bmax - 1, am[r]:item(), "argmax " .. msg)
        assert.are.equal(bmin - 1, an[r]:item(), "argmin " .. msg)
        assert.are.equal(bmax - 1, i[r]:item(), "max index " .. msg)
        assert.are.equal(bmin - 1, im[r]:item(), "min index " .. msg)
        assert.are.equal(fam[r]:item(), am[r]:item(), "argmax f32 path " .. msg)
        assert.are.equal(fan[r]:item(), an[r]:item(), "argmin f32 path " .. msg)
        assert.are.equal(sam[r]:item(), am[r]:item(), "argmax strided " .. msg)
        assert.are.equal(san[r]:item(), an[r]:item(), "argmin strided " .. msg)
        for _, c in ipairs({{v, bmax, "max"}, {vm, bmin, "min"}}) do
          local got, want = c[1][r]:item(), row[c[2]]
          if want ~= want then assert.is_true(got ~= got, c[3] .. " NaN " .. msg)
          else
            assert.are.equal(want, got, c[3] .. " value " .. msg)
            assert.are.equal(1 / want, 1 / got, c[3] .. " sign of zero " .. msg)
          end
        end
      end
    end
  end)
end)
