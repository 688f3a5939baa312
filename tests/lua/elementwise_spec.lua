-- elementwise_spec.lua — unary and binary ops, clamp, where, in-place arithmetic, matmul and
-- linear: values against plain Lua (math library, triple loops over :tolist()), gradients
-- against finite differences in f64, non-contiguous inputs, bf16 against f32, and errors.
-- Shape letters: B batch, N rows, K reduction, M columns.
local keng = require "keng"
local H = require "helper"

-- ---- plain Lua references ------------------------------------------------------------------

local function erf(x) -- Maclaurin series; exact to ~1e-14 for |x| <= 3
  local sum, term, n = x, x, 0
  repeat
    n = n + 1
    term = -term * x * x / n
    local add = term / (2 * n + 1)
    sum = sum + add
  until math.abs(add) < 1e-17 or n > 200
  return 2 / math.sqrt(math.pi) * sum
end
local function tanh(x) local e = math.exp(2 * x); return (e - 1) / (e + 1) end
local function sigmoid(x) return 1 / (1 + math.exp(-x)) end

local unary = {
  neg = function(x) return -x end,
  exp = math.exp,
  log = math.log,
  sqrt = math.sqrt,
  rsqrt = function(x) return 1 / math.sqrt(x) end,
  abs = math.abs,
  sin = math.sin,
  cos = math.cos,
  tanh = tanh,
  sigmoid = sigmoid,
  relu = function(x) return x > 0 and x or 0 end,
  silu = function(x) return x * sigmoid(x) end,
  gelu = function(x) return 0.5 * x * (1 + erf(x / math.sqrt(2))) end,
  quick_gelu = function(x) return x * sigmoid(1.702 * x) end,
  softplus = function(x) -- PyTorch: beta 1, threshold 20; log(1 + u) by its series for small u
    if x > 20 then return x end
    local u = math.exp(x)
    return u < 1e-4 and u - u * u / 2 + u * u * u / 3 or math.log(1 + u)
  end,
}
local function gelu_tanh(x)
  return 0.5 * x * (1 + tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ^ 3)))
end
local positive_only = {log = true, sqrt = true, rsqrt = true}
-- every unary op of the op table (engine/ops/elementwise.def) runs the generic test below
-- against its reference above, except those with their own tests here
local own_test = {gelu_tanh = true, logical_not = true}
local unary_names = {}
for _, op in ipairs(keng.ops()) do
  if op.kind == "unary" and not own_test[op.name] then unary_names[#unary_names + 1] = op.name end
end

-- values in [-2.4, 2.4] that stay away from 0 (the kinks of abs and relu) and from each other
local function inputs(n, positive)
  local v = {}
  for i = 1, n do
    local x = 0.3 + 2.1 * ((i * 0.618034) % 1)
    if not positive and i % 2 == 0 then x = -x end
    v[i] = x
  end
  return v
end

local function map(list, f)
  local out = {}
  for i, v in ipairs(list) do out[i] = type(v) == "table" and map(v, f) or f(v) end
  return out
end

-- a (shape of a) broadcast with b: element lookup for 2-D lists with size-1 dims
local function bget(l, i, j)
  if type(l) ~= "table" then return l end
  local row = l[#l == 1 and 1 or i]
  if type(row) ~= "table" then return row end -- 1-D list: broadcast over rows
  return row[#row == 1 and 1 or j]
end
local function broadcast2(a, b, n, m, f)
  local out = {}
  for i = 1, n do
    out[i] = {}
    for j = 1, m do out[i][j] = f(bget(a, i, j), bget(b, i, j)) end
  end
  return out
end
-- bget for a 1-D list means "the row broadcast": index j
local function row(l) return {l} end

local function matmul_ref(a, b) -- a [N][K], b [K][M]
  local out = {}
  for i = 1, #a do
    out[i] = {}
    for j = 1, #b[1] do
      local s = 0
      for k = 1, #b do s = s + a[i][k] * b[k][j] end
      out[i][j] = s
    end
  end
  return out
end

-- ---- unary ------------------------------------------------------------------------------------

describe("unary ops", function()
  it("every unary op of the op table has a reference in this spec", function()
    for _, name in ipairs(unary_names) do
      assert(unary[name], name .. ": no reference function in elementwise_spec.lua's `unary` table")
    end
    assert.truthy(#unary_names >= 15)
  end)

  for _, name in ipairs(unary_names) do
    local f = unary[name]
    it(name .. ": values, non-contiguous input, bf16, gradient", function()
      assert(f, name .. ": no reference function in elementwise_spec.lua's `unary` table")
      local v = inputs(12, positive_only[name])
      local x = keng.tensor(v):reshape{3, 4}
      local y = x[name](x)
      assert.are.equal("f32", y.dtype)
      assert.are.same({3, 4}, y.shape)
      H.close(y, map(x:tolist(), f), 1e-5, name)
      H.close(keng[name](x), y, 0, "keng." .. name)
      -- non-contiguous input: same values
      local nc = H.noncontig(x)
      assert.is_false(nc.is_contiguous)
      H.close(nc[name](nc), y, 1e-6, name .. " non-contiguous")
      -- bf16 in and out, close to f32
      local yb = x:bf16()[name](x:bf16())
      assert.are.equal("bf16", yb.dtype)
      H.close(yb, map(x:bf16():tolist(), f), 2e-2, name .. " bf16")
      -- f64 computes in f64
      local xd = x:double()
      H.close(xd[name](xd):tolist(), map(xd:tolist(), f), 1e-12, name .. " f64") -- lists: H.close reads tensors as f32
      -- gradient
      local leaf = keng.tensor(inputs(6, positive_only[name]), {dtype = "f64"}):reshape{2, 3}:detach()
      leaf.requires_grad = true
      H.gradcheck(function(t) return t[name](t) end, {leaf})
    end)
  end

  it("gelu{approximate='tanh'} and its gradient", function()
    local x = keng.tensor(inputs(10))
    H.close(x:gelu{approximate = "tanh"}, map(x:tolist(), gelu_tanh), 1e-5)
    H.close(x:gelu("tanh"), map(x:tolist(), gelu_tanh), 1e-5)
    H.close(x:gelu{approximate = "none"}, map(x:tolist(), unary.gelu), 1e-5)
    -- the two forms differ (the test can tell them apart)
    local d = (x:gelu{approximate = "tanh"} - x:gelu()):abs():sum():item()
    assert.truthy(d > 1e-5)
    local leaf = H.leaf({2, 3})
    H.gradcheck(function(t) return t:gelu{approximate = "tanh"} end, {leaf})
    H.raises(function() x:gelu{approximate = "cubic"} end, "gelu")
  end)

  it("softplus: PyTorch's threshold 20, tails, special values, gradient at the threshold", function()
    local v = {-100, -30, -20, -1e-3, 0, 1e-3, 15, 19.99, 20, 20.01, 30, 100}
    for _, dt in ipairs({"f32", "f64"}) do
      local y = keng.tensor(v, {dtype = dt}):softplus():tolist()
      for i, x in ipairs(v) do
        local r = unary.softplus(x)
        assert(math.abs(y[i] - r) <= (dt == "f64" and 1e-15 or 1e-6) * math.max(math.abs(r), 1e-30),
          string.format("softplus(%g) %s: %.17g vs %.17g", x, dt, y[i], r))
      end
    end
    local nan = 0 / 0
    local s = keng.tensor({nan, -math.huge, math.huge}):softplus():tolist()
    assert.is_true(s[1] ~= s[1])
    assert.are.same({0, math.huge}, {s[2], s[3]})
    -- the gradient is sigmoid(x) up to the threshold and exactly 1 above it
    local leaf = keng.tensor({0, 19.5, 20, 20.5, -50}, {dtype = "f64"}):detach()
    leaf.requires_grad = true
    leaf:softplus():sum():backward()
    local g = leaf.grad:tolist()
    assert.are.equal(0.5, g[1])
    assert.truthy(math.abs(g[2] - sigmoid(19.5)) < 1e-15 and math.abs(g[3] - sigmoid(20)) < 1e-15)
    assert.are.equal(1, g[4])
    assert.truthy(math.abs(g[5] - sigmoid(-50)) < 1e-30)
    H.raises(function() keng.softplus("x") end, "tensor expected")
  end)

  it("softplus{beta =, threshold =} vs torch: f64 and f32 values, f64 gradient, finite differences", function()
    local DIR = "tests/fixtures/softplus"
    local G, cases = keng.load(DIR .. "/golden.safetensors"), dofile(DIR .. "/cases.lua")
    for k, o in ipairs(cases) do
      local what = string.format("beta %g threshold %g", o.beta, o.threshold)
      local x = G.x:clone()
      x.requires_grad = true
      local y = x:softplus(o)
      H.close(y, G["y" .. k], 1e-15, what .. " y")
      local loss = (y * G.g):sum()
      loss:backward()
      H.close(x.grad, G["dx" .. k], 1e-15, what .. " dx")
      H.close(keng.softplus(G.x:float(), o), G["yf" .. k], 1e-6, what .. " f32")
    end
    -- finite differences away from the kinks at the thresholds (beta x = 3, 20, 25)
    local leaf = keng.tensor({-4, -0.7, 0.3, 1.1, 5.5, 9, 40}, {dtype = "f64"}):detach()
    leaf.requires_grad = true
    for _, o in ipairs({{beta = 2, threshold = 3}, {beta = 0.5, threshold = 25}, {beta = -0.8}}) do
      H.gradcheck(function(t) return t:softplus(o) end, {leaf})
    end
  end)

  it("softplus{beta =, threshold =}: non-contiguous, integer and bf16 input, errors", function()
    local base = keng.tensor({{-3, 1, 30}, {0.5, 22, -0.2}}, {dtype = "f64"})
    local t = base:transpose(1, 2)                                      -- [3, 2], not contiguous
    assert.is_false(t.is_contiguous)
    H.close(t:softplus{beta = 2, threshold = 30}, t:contiguous():softplus{beta = 2, threshold = 30}, 0, "view")
    -- 2 log1p(e^2) / 2 = softplus(2): the options reach the composed path
    local i = keng.tensor({1, 2}, {dtype = "i64"}):softplus{beta = 2}
    assert.are.equal("f32", i.dtype)
    H.close(i, keng.tensor({2, 4}):softplus() / 2, 1e-6, "i64")
    local b = keng.tensor({-1, 0.5, 12}, {dtype = "bf16"}):softplus{beta = 3, threshold = 30}
    assert.are.equal("bf16", b.dtype)
    H.close(b:float(), keng.tensor({-3, 1.5, 36}):softplus() / 3, 4e-3, "bf16")
    H.raises(function() t:softplus{betta = 2} end, "softplus: unknown option 'betta' (valid: beta, threshold)")
    H.raises(function() t:softplus{beta = 0} end, "softplus: beta must be a finite non-zero number, got 0")
    H.raises(function() t:softplus{beta = 0 / 0} end, "softplus: beta must be a finite non-zero number, got nan")
    H.raises(function() t:softplus{threshold = 0 / 0} end, "softplus: threshold must be a number, got nan")
    H.raises(function() t:softplus{beta = {}} end, "softplus: option 'beta' must be a number, got table")
    H.raises(function() keng.softplus(t, 20) end, "table of options expected")
    H.close(keng.tensor({true, false}):softplus{beta = 2}, keng.tensor({2, 0}):softplus() / 2, 1e-6, "bool")
  end)

  it("logical_not gives bool", function()
    local x = keng.tensor({0, 1.5, -2, 0})
    local y = x:logical_not()
    assert.are.equal("bool", y.dtype)
    assert.are.same({true, false, false, true}, y:tolist())
    assert.are.same({false, true}, keng.tensor({true, false}):logical_not():tolist())
  end)

  it("neg, abs, relu keep integer dtypes; others make integers float", function()
    local i = keng.tensor({-2, 3})
    assert.are.equal("i64", (-i).dtype)
    assert.are.same({2, -3}, (-i):tolist())
    assert.are.same({2, 3}, i:abs():tolist())
    assert.are.same({0, 3}, i:relu():tolist())
    assert.are.equal("f32", i:exp().dtype)
    H.close(i:exp(), {math.exp(-2), math.exp(3)}, 1e-6)
  end)

  -- float exp, sigmoid, silu, quick_gelu (and the backward of the last two) run a libm-free
  -- formula (8 lanes, scalar tail); f64 stays on libm, so f64 is the reference here
  it("float exp family (and exact gelu) matches f64 to a few ulp over the whole range, grads too", function()
    local rel_v
    -- quick_gelu rounds its argument 1.702 x to float: |1.702 x| 2^-24 more relative error
    local function rel_close(a, b, tol, msg)
      local fa, fb = a:tolist(), b:tolist()
      for i = 1, #fa do
        local x, y = fa[i], fb[i]
        local t = msg:find("quick_gelu") and tol + 6e-8 * math.abs(1.702 * rel_v[i]) or tol
        local ok = (x ~= x and y ~= y) or x == y or math.abs(x - y) <= t * math.abs(y) + 1e-37
        assert(ok, string.format("%s: element %d: %.9g vs %.9g", msg, i, x, y))
      end
    end
    -- 1003 points (not a multiple of 8) from -95 to 95, plus the edges of exp's range
    local v = {}
    rel_v = v
    for i = 0, 1002 do v[#v + 1] = -95 + 190 * i / 1002 end
    for _, e in ipairs({88.72, 88.73, 89, -87.3, -103.9, -104.5, -200, 0, -0.0, 1e-30, math.huge, -math.huge}) do
      v[#v + 1] = e
    end
    local x = keng.tensor(v)
    local xd = x:double()
    for _, name in ipairs({"exp", "sigmoid", "silu", "quick_gelu"}) do
      rel_close(x[name](x), xd[name](xd):float(), 5e-7, name)
      local nc = H.noncontig(x)
      rel_close(nc[name](nc), xd[name](xd):float(), 5e-7, name .. " non-contiguous")
    end
    -- exact gelu: an erfc fit (relative error < 1.2e-7) keeps the x << 0 tail, where
    -- 1 + erf(x / sqrt 2) cancels; the exp argument x^2/2 rounds, so 2e-7 |x|^2 relative there
    local gv = x:gelu():tolist()
    local gr = xd:gelu():tolist()
    for i = 1, #v do
      local t = 4e-7 + 1.2e-7 * v[i] * v[i]
      if v[i] == v[i] and math.abs(v[i]) <= 5 then -- beyond, f64's own 1 + erf cancels
        assert(math.abs(gv[i] - gr[i]) <= t * math.abs(gr[i]) + 1e-37,
          string.format("gelu at %.9g: %.9g vs %.9g", v[i], gv[i], gr[i]))
      end
    end
    -- the tail: Phi(-10) = 7.6198530241605e-24 (erfc(10 / sqrt 2) / 2)
    local tail = keng.full({9}, -10, {dtype = "f32"}):gelu():tolist()
    for _, t in ipairs(tail) do
      assert(math.abs(t / -7.6198530241605e-23 - 1) < 3e-5, string.format("gelu(-10) = %.9g", t))
    end
    local nan = keng.tensor({0 / 0, 1, 0 / 0, 2, 3, 4, 5, 6, 0 / 0})
    for _, name in ipairs({"exp", "sigmoid", "silu", "quick_gelu", "gelu"}) do
      local y = nan[name](nan):tolist()
      assert.is_true(y[1] ~= y[1] and y[3] ~= y[3] and y[9] ~= y[9], name .. " keeps NaN")
    end
    assert.are.equal(math.huge, keng.tensor({89}):exp():item())
    assert.are.equal(0, keng.tensor({-104}):exp():item())
    -- backward in f32 against the f64 backward, inputs of moderate size (grads are O(1))
    local g = {}
    for i = 0, 300 do g[#g + 1] = -30 + 60 * i / 300 end
    for _, name in ipairs({"silu", "quick_gelu", "sigmoid", "exp", "gelu"}) do
      local a = keng.tensor(g):detach()
      a.requires_grad = true
      a[name](a):sum():backward()
      local b = keng.tensor(g):double():detach() -- the same (float) inputs
      b.requires_grad = true
      b[name](b):sum():backward()
      local ga, gb = a.grad:tolist(), b.grad:tolist()
      for i = 1, #ga do
        assert(math.abs(ga[i] - gb[i]) <= 5e-7 * math.max(1, math.abs(gb[i])),
          string.format("%s grad at %.4g: %.9g vs %.9g", name, g[i], ga[i], gb[i]))
      end
    end
  end)

  it("special values", function()
    local y = keng.tensor({0, -1, 4}):sqrt():tolist()
    assert.are.equal(0, y[1])
    assert.is_true(y[2] ~= y[2])
    assert.are.equal(2, y[3])
    assert.are.equal(-math.huge, keng.tensor({0}):log():item())
    assert.are.equal(1, keng.tensor({100}):sigmoid():item())
    assert.truthy(keng.tensor({-100}):sigmoid():item() < 1e-40)
  end)
end)

-- ---- binary ----------------------------------------------------------------------------------

local arith = {
  add = function(a, b) return a + b end,
  sub = function(a, b) return a - b end,
  mul = function(a, b) return a * b end,
  div = function(a, b) return a / b end,
  pow = function(a, b) return a ^ b end,
  maximum = function(a, b) return a > b and a or b end,
  minimum = function(a, b) return a < b and a or b end,
}
local compare = {
  eq = function(a, b) return a == b end,
  ne = function(a, b) return a ~= b end,
  lt = function(a, b) return a < b end,
  le = function(a, b) return a <= b end,
  gt = function(a, b) return a > b end,
  ge = function(a, b) return a >= b end,
}
local metamethod = {
  add = function(a, b) return a + b end,
  sub = function(a, b) return a - b end,
  mul = function(a, b) return a * b end,
  div = function(a, b) return a / b end,
  pow = function(a, b) return a ^ b end,
}

describe("binary ops", function()
  -- a: [3,4] positive (pow's base), b: [4] broadcast over rows, c: [3,1] broadcast over columns
  local a = keng.tensor(inputs(12, true)):reshape{3, 4}
  local b = keng.tensor({0.5, -1.25, 2, 1.5})
  local c = keng.tensor({{0.75}, {-0.5}, {1.25}})

  for _, name in ipairs({"add", "sub", "mul", "div", "pow", "maximum", "minimum"}) do
    local f = arith[name]
    it(name .. ": broadcasting, numbers on either side, non-contiguous, bf16, gradient", function()
      local al, bl, cl = a:tolist(), b:tolist(), c:tolist()
      local y = a[name](a, b)
      assert.are.same({3, 4}, y.shape)
      H.close(y, broadcast2(al, row(bl), 3, 4, f), 1e-5, name .. " [3,4] [4]")
      H.close(keng[name](c, b), broadcast2(cl, row(bl), 3, 4, f), 1e-5, name .. " [3,1] [4]")
      if metamethod[name] then
        H.close(metamethod[name](a, b), y, 0, name .. " operator")
        H.close(metamethod[name](a, 2), map(al, function(x) return f(x, 2) end), 1e-5, name .. " t op 2")
        H.close(metamethod[name](2, a), map(al, function(x) return f(2, x) end), 1e-5, name .. " 2 op t")
      end
      H.close(keng[name](a, 1.5), map(al, function(x) return f(x, 1.5) end), 1e-5, name .. " (t, 1.5)")
      H.close(keng[name](1.5, a), map(al, function(x) return f(1.5, x) end), 1e-5, name .. " (1.5, t)")
      H.close(H.noncontig(a)[name](H.noncontig(a), b), y, 1e-6, name .. " non-contiguous")
      local yb = a:bf16()[name](a:bf16(), b:bf16())
      assert.are.equal("bf16", yb.dtype)
      H.close(yb, y, 3e-2, name .. " bf16 vs f32")
      assert.are.equal("f32", a[name](a, b:bf16()).dtype) -- f32 wins over bf16
      assert.are.equal("f64", a[name](a, b:double()).dtype)
      -- gradient through both inputs (broadcast one), away from ties for max/min
      local x1 = H.leaf({2, 3})
      local x2 = H.leaf({3})
      if name == "pow" then
        x1 = keng.tensor(inputs(6, true), {dtype = "f64"}):reshape{2, 3}:detach()
        x1.requires_grad = true
      end
      if name == "div" then
        x2 = keng.tensor({0.7, -1.3, 1.9}, {dtype = "f64", requires_grad = true})
      end
      H.gradcheck(function(p, q) return p[name](p, q) end, {x1, x2})
    end)
  end

  it("maximum/minimum split the gradient on ties and propagate NaN", function()
    local x = keng.tensor({1, 2}, {dtype = "f64", requires_grad = true})
    local y = keng.tensor({1, 3}, {dtype = "f64", requires_grad = true})
    keng.maximum(x, y):sum():backward()
    H.close(x.grad, {0.5, 0})
    H.close(y.grad, {0.5, 1})
    local m = keng.maximum(keng.tensor({0 / 0, 1}), keng.tensor({1, 0 / 0})):tolist()
    assert.is_true(m[1] ~= m[1] and m[2] ~= m[2])
  end)

  for _, name in ipairs({"eq", "ne", "lt", "le", "gt", "ge"}) do
    local f = compare[name]
    it(name .. " gives bool with broadcasting", function()
      local x = keng.tensor({{1, 2, 3}, {3, 2, 1}})
      local y = keng.tensor({2, 2, 2})
      local r = x[name](x, y)
      assert.are.equal("bool", r.dtype)
      assert.are.same(broadcast2(x:tolist(), row(y:tolist()), 2, 3, f), r:tolist())
      assert.are.same(broadcast2(x:tolist(), 2, 2, 3, f), x[name](x, 2):tolist())
      assert.are.same(broadcast2(2, x:tolist(), 2, 3, f), keng[name](2, x):tolist())
      local xf = x:float()
      assert.are.same(r:tolist(), H.noncontig(xf)[name](H.noncontig(xf), y:bf16()):tolist())
      -- comparisons record no gradient
      local g = keng.ones({3}, {requires_grad = true})
      assert.is_false(g[name](g, 1).requires_grad)
    end)
  end

  it("integer arithmetic and promotion", function()
    local i = keng.tensor({1, 2, 3})
    assert.are.equal("i64", (i + 1).dtype)
    assert.are.same({2, 3, 4}, (i + 1):tolist())
    assert.are.equal("f32", (i + 0.5).dtype)
    assert.are.equal("f32", (i / 2).dtype)
    H.close(i / 2, {0.5, 1, 1.5})
    assert.are.equal("f32", (i * keng.tensor({1.5})).dtype)
    assert.are.same({7, 4, 1}, (10 - 3 * i):tolist())
  end)

  it("bad broadcasts raise with the op and shapes", function()
    local x, y = keng.zeros({2, 3}), keng.zeros({4})
    local err = H.raises(function() return x + y end, "add")
    assert.truthy(err:find("[2,3]", 1, true) and err:find("[4]", 1, true), err)
    H.raises(function() return x * keng.zeros({3, 2}) end, "mul")
    H.raises(function() return keng.maximum(x, y) end, "maximum")
    H.raises(function() return x:lt(y) end, "lt")
    H.raises(function() return x + "a" end, "tensor or number")
  end)
end)

-- ---- clamp, where, in place --------------------------------------------------------------

describe("clamp and where", function()
  it("clamp values, one-sided bounds, gradient", function()
    local x = keng.tensor(inputs(10))
    local l = x:tolist()
    H.close(x:clamp(-1, 0.5), map(l, function(v) return math.max(-1, math.min(0.5, v)) end), 1e-6)
    H.close(x:clamp(nil, 0), map(l, function(v) return math.min(0, v) end), 1e-6)
    H.close(x:clamp{min = 0.25}, map(l, function(v) return math.max(0.25, v) end), 1e-6)
    H.close(keng.clamp(H.noncontig(x), -1, 0.5), x:clamp(-1, 0.5), 0)
    H.close(x:bf16():clamp(-1, 0.5), x:clamp(-1, 0.5), 1e-2)
    H.raises(function() x:clamp(1, -1) end, "clamp")
    local leaf = keng.tensor(inputs(6), {dtype = "f64", requires_grad = true})
    H.gradcheck(function(t) return t:clamp(-1, 1) end, {leaf})
  end)

  it("where with broadcasting and numbers, gradient to both branches", function()
    local cond = keng.tensor({{true, false, true}, {false, false, true}})
    local a = keng.tensor({1, 2, 3}, {dtype = "f32"})
    local b = keng.tensor({{-1}, {-2}})
    local r = keng.where(cond, a, b)
    assert.are.same({2, 3}, r.shape)
    H.close(r, {{1, -1, 3}, {-2, -2, 3}})
    H.close(keng.where(cond, a, 0), {{1, 0, 3}, {0, 0, 3}})
    H.close(keng.where(cond, 5, a), {{5, 2, 5}, {1, 2, 5}})
    H.close(keng.where(a:gt(1.5), a, -a), {-1, 2, 3})
    H.close(keng.where(H.noncontig(cond:float()):bool(), a, b), r, 0)
    local x, y = H.leaf({2, 3}), H.leaf({3})
    H.gradcheck(function(p, q) return keng.where(cond, p, q) end, {x, y})
    H.raises(function() keng.where(keng.zeros({2}, {dtype = "bool"}), keng.zeros({3}), 0) end, "where")
  end)

  it("add_, sub_, mul_, div_ in place", function()
    local t = keng.tensor({{1, 2}, {3, 4}}, {dtype = "f32"})
    local st = t
    assert.are.equal(st, t:add_(keng.tensor({10, 20})))
    H.close(t, {{11, 22}, {13, 24}})
    t:mul_(2)
    H.close(t, {{22, 44}, {26, 48}})
    t:sub_(keng.tensor({{2}, {6}}))
    H.close(t, {{20, 42}, {20, 42}})
    t:div_(4)
    H.close(t, {{5, 10.5}, {5, 10.5}})
    t:transpose(1, 2):add_(keng.tensor({1, 2})) -- through a strided view: adds by column of tᵀ
    H.close(t, {{6, 11.5}, {7, 12.5}})
    H.raises(function() t:add_(keng.zeros({2, 2, 2})) end, "add")
    local g = keng.ones({2}, {requires_grad = true})
    H.raises(function() g:mul_(2) end, "mul")
    keng.no_grad(function() g:mul_(3) end)
    H.close(g, {3, 3})
  end)
end)

-- ---- matmul and linear --------------------------------------------------------------------

describe("matmul and linear", function()
  it("2-D values against a triple loop, transposed operands too", function()
    keng.manual_seed(7)
    local a, b = keng.randn({4, 5}), keng.randn({5, 3})
    local want = matmul_ref(a:tolist(), b:tolist())
    H.close(a:matmul(b), want, 1e-5)
    H.close(keng.matmul(a, b), want, 1e-5)
    local at, bt = a.T:contiguous().T, b.T:contiguous().T -- same values, transposed layouts
    assert.is_false(at.is_contiguous)
    H.close(at:matmul(bt), want, 1e-5)
    H.close(H.noncontig(a):matmul(b), want, 1e-5)
    H.close(a:bf16():matmul(b:bf16()), want, 5e-2)
    assert.are.equal("bf16", a:bf16():matmul(b:bf16()).dtype)
    H.close(a:double():matmul(b:double()):tolist(), matmul_ref(a:double():tolist(), b:double():tolist()), 1e-12)
  end)

  it("batched with broadcast leading dims", function()
    keng.manual_seed(8)
    local a, b = keng.randn({2, 1, 3, 4}), keng.randn({3, 4, 2})
    local y = a:matmul(b)
    assert.are.same({2, 3, 3, 2}, y.shape)
    for i = 1, 2 do
      for j = 1, 3 do
        H.close(y[i][j], matmul_ref(a[i][1]:tolist(), b[j]:tolist()), 1e-5, "batch " .. i .. "," .. j)
      end
    end
    local x = keng.randn({2, 3, 4})
    local w = keng.randn({4, 5})
    local z = x:matmul(w) -- [2,3,4] @ [4,5]
    assert.are.same({2, 3, 5}, z.shape)
    H.close(z[2], matmul_ref(x[2]:tolist(), w:tolist()), 1e-5)
  end)

  it("1-D operands as in PyTorch", function()
    local v = keng.tensor({1, 2, 3}, {dtype = "f64"})
    local m = keng.tensor({{1, 2}, {3, 4}, {5, 6}}, {dtype = "f64"})
    local vm = v:matmul(m)
    assert.are.same({2}, vm.shape)
    H.close(vm, {22, 28})
    local mv = m.T:matmul(v)
    assert.are.same({2}, mv.shape)
    H.close(mv, {22, 28})
    local dot = v:matmul(v)
    assert.are.equal(0, dot.ndim)
    assert.are.equal(14, dot:item())
    local bv = keng.ones({4, 2, 3}, {dtype = "f64"}):matmul(v) -- batched matrix @ vector
    assert.are.same({4, 2}, bv.shape)
    H.close(bv[4], {6, 6})
  end)

  it("gradients (2-D, batched broadcast, 1-D)", function()
    H.gradcheck(function(p, q) return p:matmul(q) end, {H.leaf({3, 4}), H.leaf({4, 2})})
    H.gradcheck(function(p, q) return p:matmul(q) end, {H.leaf({2, 1, 3, 4}), H.leaf({3, 4, 2})})
    H.gradcheck(function(p, q) return p:matmul(q) end, {H.leaf({4}), H.leaf({4, 3})})
    H.gradcheck(function(p, q) return p:matmul(q) end, {H.leaf({4}), H.leaf({4})})
    H.gradcheck(function(p, q) return p.T:matmul(q) end, {H.leaf({4, 3}), H.leaf({4, 2})})
  end)

  it("linear = x·wᵀ + b, with gradient", function()
    keng.manual_seed(9)
    local x, w, b = keng.randn({2, 3, 4}), keng.randn({5, 4}), keng.randn({5})
    local y = keng.linear(x, w, b)
    assert.are.same({2, 3, 5}, y.shape)
    local ref = matmul_ref(x[2]:tolist(), w.T:contiguous():tolist())
    local bl = b:tolist()
    for i = 1, 3 do for j = 1, 5 do ref[i][j] = ref[i][j] + bl[j] end end
    H.close(y[2], ref, 1e-5)
    H.close(keng.linear(x, w), x:matmul(w.T), 1e-6)
    H.gradcheck(function(p, q, r) return keng.linear(p, q, r) end, {H.leaf({3, 4}), H.leaf({5, 4}), H.leaf({5})})
    H.raises(function() keng.linear(x, keng.randn({5, 3})) end, "linear")
    H.raises(function() keng.linear(x, w, keng.randn({4})) end, "bias")
  end)

  it("errors name matmul and both shapes", function()
    local err = H.raises(function() keng.zeros({2, 3}):matmul(keng.zeros({2, 3})) end, "matmul")
    assert.truthy(err:find("[2,3] @ [2,3]", 1, true), err)
    err = H.raises(function() keng.zeros({2, 2, 3}):matmul(keng.zeros({3, 3, 4})) end, "matmul")
    assert.truthy(err:find("batch", 1, true), err)
    H.raises(function() keng.tensor(1):matmul(keng.zeros({1})) end, "matmul")
    H.raises(function() keng.arange(3):matmul(keng.arange(3)) end, "floating")
  end)
end)

describe("f32 runs with broadcast inputs (computed in place, the broadcast value expanded)", function()
  it("outer sums and scalar-broadcast runs longer than a chunk match f64", function()
    keng.manual_seed(3)
    local cases = {
      {{3, 5, 16, 1}, {3, 5, 1, 16}},   -- SAM's decomposed relative-position bias
      {{2, 300, 1}, {2, 1, 300}},       -- runs longer than one 256-element chunk
      {{4, 1}, {4, 700}},               -- a per-row value against long rows
      {{700}, {3, 700}},                -- a row vector against a matrix
    }
    for _, c in ipairs(cases) do
      local a, b = keng.randn(c[1]), keng.randn(c[2]) + 3
      for _, op in ipairs({"add", "sub", "mul", "div", "maximum", "pow"}) do
        local x, y = op == "pow" and a:abs() or a, b
        local want = keng[op](x:to("f64"), y:to("f64"))
        H.close(keng[op](x, y), want, 1e-5, op .. " " .. table.concat(c[1], ",") .. " with " .. table.concat(c[2], ","))
        H.close(keng[op](y, x), keng[op](y:to("f64"), x:to("f64")), 1e-5, op .. " swapped")
      end
    end
  end)
end)
