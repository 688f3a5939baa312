-- compare.lua — CPU-vs-CUDA check of every op that has a CUDA kernel (the CPU is the oracle).
-- Each case builds inputs on the CPU from a fixed seed, runs the op on the CPU and on cuda:0
-- (inputs copied over, plus a non-contiguous or broadcast layout where it matters), brings the
-- CUDA result back and prints the worst error |gpu - cpu| / (1 + |cpu|) against a tolerance
-- for the dtype. Exits 1 on any mismatch or error, 0 when all agree.
--
--   keng tests/gpu/compare.lua              -- needs a GPU; skips (exit 0) without one
--   KENG_COMPARE_DEVICE=cpu keng tests/gpu/compare.lua   -- self-test: CPU against CPU
local keng = require "keng"

local DEV = os.getenv("KENG_COMPARE_DEVICE") or "cuda"
if DEV ~= "cpu" and not keng.cuda.is_available() then
  print("compare.lua: skipped — keng.cuda.is_available() is false (no CUDA driver or GPU here)")
  return
end

local TOL = {f64 = 1e-10, f32 = 2e-5, bf16 = 1.6e-2, f16 = 2e-3, i32 = 0, i64 = 0, bool = 0, u8 = 0}
local failed, total = 0, 0

-- worst relative error of a (device result) against b (cpu result), NaNs equal to NaNs
local function worst(a, b)
  local fa = a:cpu():double():contiguous():reshape{-1}:tolist()
  local fb = b:double():contiguous():reshape{-1}:tolist()
  if #fa ~= #fb then return math.huge end
  local w = 0
  for i = 1, #fa do
    local x, y = fa[i], fb[i]
    local e
    if x ~= x or y ~= y then e = (x ~= x and y ~= y) and 0 or math.huge
    elseif x == y then e = 0
    else e = math.abs(x - y) / (1 + math.abs(y)) end
    if e ~= e then e = math.huge end
    if e > w then w = e end
  end
  return w
end

local function same_shape(a, b)
  local sa, sb = a.shape, b.shape
  if #sa ~= #sb then return false end
  for i = 1, #sa do if sa[i] ~= sb[i] then return false end end
  return a.dtype == b.dtype
end

-- run(dev) returns the op's result (or a list of results) computed on device dev
local function check(name, dtype, run, tol)
  total = total + 1
  tol = tol or TOL[dtype] or 1e-5
  local ok, msg = pcall(function()
    local rc, rg = run("cpu"), run(DEV)
    if keng.is_tensor(rc) then rc, rg = {rc}, {rg} end
    local w = 0
    for i = 1, #rc do
      if not same_shape(rc[i], rg[i]) then error("shape or dtype differs from the cpu result") end
      if not rg[i].device:find(DEV == "cpu" and "cpu" or "cuda", 1, true) then error("result is on " .. rg[i].device) end
      w = math.max(w, worst(rg[i], rc[i]))
    end
    return w
  end)
  local line
  if not ok then
    line = string.format("%-34s %-5s ERROR %s", name, dtype, tostring(msg))
    failed = failed + 1
  else
    local bad = not (msg <= tol)
    if bad then failed = failed + 1 end
    line = string.format("%-34s %-5s max err %-10.3g tol %-8.2g %s", name, dtype, msg, tol, bad and "FAIL" or "ok")
  end
  print(line)
end

-- a fresh CPU input in dtype dt (seeded), then moved to dev
local seed = 1000
local function input(shape, dt, f)
  seed = seed + 1
  keng.manual_seed(seed)
  local x = keng.randn(shape, {dtype = "f64"})
  if f then x = f(x) end
  return x:to(dt)
end
local function on(x, dev) return x:to(dev) end
-- the same values with transposed strides (last two dims)
local function nc(x) return x:transpose(-1, -2):contiguous():transpose(-1, -2) end

local FLOATS = {"f32", "f64", "bf16", "f16"}

-- ---- creation ----------------------------------------------------------------------------
for _, dt in ipairs({"f32", "f64", "bf16", "f16", "i32", "i64", "bool", "u8"}) do
  check("full", dt, function(dev) return keng.full({3, 70}, dt == "bool" and 1 or 2.5, {dtype = dt, device = dev}) end)
  check("fill_ (strided view)", dt, function(dev)
    local t = keng.zeros({5, 6}, {dtype = dt, device = dev})
    t:narrow(2, 2, 3):fill_(dt == "bool" and 1 or 7)
    return t
  end)
end
for _, dt in ipairs({"f32", "f64", "bf16", "i64", "i32"}) do
  local a, b, s = 0, 300, 1
  if dt ~= "i64" and dt ~= "i32" then a, b, s = -3.5, 12, 0.25 end
  check("arange", dt, function(dev) return keng.arange(a, b, s, {dtype = dt, device = dev}) end)
end
for _, dt in ipairs(FLOATS) do
  check("rand", dt, function(dev) keng.manual_seed(7); return keng.rand({33, 65}, {dtype = dt, device = dev}) end)
  check("randn", dt, function(dev) keng.manual_seed(8); return keng.randn({1001}, {dtype = dt, device = dev}) end,
    dt == "f64" and 1e-12 or TOL[dt])
end
for _, dt in ipairs({"i64", "i32", "f32"}) do
  check("randint", dt, function(dev) keng.manual_seed(9); return keng.randint(-5, 17, {40, 25}, {dtype = dt, device = dev}) end)
end
for _, k in ipairs({-1, 0, 2}) do
  for _, dt in ipairs({"f32", "bf16", "i64"}) do
    local x = input({2, 5, 7}, dt, function(t) return t * 10 end)
    check("tril k=" .. k, dt, function(dev) return on(x, dev):tril(k) end)
    check("triu k=" .. k .. " (non-contiguous)", dt, function(dev) return nc(on(x, dev)):triu(k) end)
  end
end

-- ---- copies and casts ------------------------------------------------------------------
local casts = {"f32", "f64", "bf16", "f16", "i32", "i64", "bool", "u8"}
for _, from in ipairs({"f32", "bf16", "i64"}) do
  local x = input({6, 9}, from, function(t) return (t * 20):abs() end)
  for _, to in ipairs(casts) do
    check("cast " .. from .. "->" .. to, to, function(dev) return on(x, dev):to(to) end)
  end
  check("contiguous (transposed)", from, function(dev) return on(x, dev):transpose(1, 2):contiguous() end)
end
do
  local src = input({4, 1}, "f32")
  check("copy_ broadcast [4,1]->[3,4,5]", "f32", function(dev)
    local d = keng.zeros({3, 4, 5}, {device = dev})
    d:copy_(on(src, dev))
    return d
  end)
  local src64 = input({4, 5}, "f64")
  check("copy_ across dtypes into a view", "bf16", function(dev)
    local d = keng.zeros({4, 8}, {dtype = "bf16", device = dev})
    d:narrow(2, 3, 5):copy_(on(src64, dev))
    return d
  end)
end

-- ---- elementwise -------------------------------------------------------------------------
local positive = function(t) return t:abs() + 0.1 end
local UNARY = {
  neg = false, exp = false, log = positive, sqrt = positive, rsqrt = positive, abs = false, sin = false,
  cos = false, tanh = false, sigmoid = false, relu = false, silu = false, gelu = false, gelu_tanh = false,
  quick_gelu = false, logical_not = false,
}
local UNARY_NAMES = {}
for k in pairs(UNARY) do UNARY_NAMES[#UNARY_NAMES + 1] = k end
table.sort(UNARY_NAMES)
local function apply(x, op)
  if op == "gelu_tanh" then return x:gelu{approximate = "tanh"} end
  return x[op](x)
end
for _, op in ipairs(UNARY_NAMES) do
  for _, dt in ipairs(FLOATS) do
    local x = input({17, 33}, dt, UNARY[op] or nil)
    check(op, dt, function(dev) return apply(on(x, dev), op) end)
  end
  local x = input({8, 12}, "f32", UNARY[op] or nil)
  check(op .. " (non-contiguous)", "f32", function(dev) return apply(nc(on(x, dev)), op) end)
end
for _, dt in ipairs({"i32", "i64"}) do
  local x = input({5, 6}, dt, function(t) return t * 10 end)
  check("neg", dt, function(dev) return -on(x, dev) end)
  check("abs", dt, function(dev) return on(x, dev):abs() end)
end
for _, dt in ipairs(FLOATS) do
  local x = input({9, 31}, dt)
  check("clamp(-0.5, 0.7)", dt, function(dev) return on(x, dev):clamp(-0.5, 0.7) end)
  check("clamp(0, nil)", dt, function(dev) return on(x, dev):clamp(0, nil) end)
  check("clamp(nil, 0.2) (non-contiguous)", dt, function(dev) return nc(on(x, dev)):clamp(nil, 0.2) end)
end

local BINARY = {"add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"}
local function binop(op, a, b)
  if op == "add" then return a + b elseif op == "sub" then return a - b
  elseif op == "mul" then return a * b elseif op == "div" then return a / b
  elseif op == "pow" then return a ^ b end
  return a[op](a, b)
end
for _, op in ipairs(BINARY) do
  for _, dt in ipairs(FLOATS) do
    local fa = op == "pow" and positive or nil
    local a, b = input({4, 1, 33}, dt, fa), input({3, 33}, dt)
    if op:match("^[engl][eqt]$") then b = (a:select(2, 1):narrow(1, 1, 3) * 0 + b):to(dt) end
    check(op .. " broadcast [4,1,33]x[3,33]", dt, function(dev) return binop(op, on(a, dev), on(b, dev)) end)
  end
  local a, b = input({12, 10}, "f32", op == "pow" and positive or nil), input({12, 10}, "f32")
  check(op .. " (non-contiguous)", "f32", function(dev) return binop(op, nc(on(a, dev)), on(b, dev)) end)
  check(op .. " with a number", "f32", function(dev) return binop(op, on(a, dev), on(keng.full({}, 0.5), dev)) end)
end
do
  local a, b = input({6, 7}, "i32", function(t) return t * 10 end), input({7}, "i32", function(t) return t * 10 end)
  for _, op in ipairs({"add", "sub", "mul", "maximum", "minimum", "lt", "eq"}) do
    check(op .. " int", "i32", function(dev) return binop(op, on(a, dev), on(b, dev)) end)
  end
  local x, y = input({6, 7}, "f32"), input({6, 7}, "bf16")
  check("add mixed f32+bf16", "f32", function(dev) return on(x, dev) + on(y, dev) end)
end
for _, dt in ipairs(FLOATS) do
  local c = input({5, 1, 8}, "f64"):gt(keng.zeros({1}, {dtype = "f64"}))
  local a, b = input({4, 8}, dt), input({5, 4, 1}, dt)
  check("where broadcast", dt, function(dev) return keng.where(on(c, dev), on(a, dev), on(b, dev)) end)
end

-- gradients run UNARY_BACKWARD (and the copies, fills and sums of the tape) on the device
local DIFF = {"exp", "log", "sqrt", "rsqrt", "abs", "sin", "cos", "tanh", "sigmoid", "relu", "silu", "gelu",
  "gelu_tanh", "quick_gelu", "clamp"}
for _, op in ipairs(DIFF) do
  for _, dt in ipairs({"f32", "f64", "bf16"}) do
    local f = (op == "log" or op == "sqrt" or op == "rsqrt") and positive or nil
    local x, g = input({7, 19}, dt, f), input({7, 19}, dt)
    check("grad " .. op, dt, function(dev)
      local xl = on(x, dev):detach()
      xl:requires_grad_(true)
      local y = op == "clamp" and xl:clamp(-0.3, 0.4) or apply(xl, op)
      local loss = (y * on(g, dev)):sum()
      loss:backward()
      return xl.grad
    end)
  end
end

-- ---- reductions ------------------------------------------------------------------------
for _, dt in ipairs({"f32", "f64", "bf16", "f16"}) do
  local x = input({6, 50, 7}, dt)
  local tol = (dt == "bf16" or dt == "f16") and TOL[dt] or 1e-6
  if dt == "f64" then tol = 1e-12 end
  check("sum all", dt, function(dev) return on(x, dev):sum() end, tol)
  check("sum dim 2", dt, function(dev) return on(x, dev):sum(2) end, tol)
  check("sum dim -1 keepdim", dt, function(dev) return on(x, dev):sum(-1, true) end, tol)
  check("sum dims {1,3}", dt, function(dev) return on(x, dev):sum({1, 3}) end, tol)
  check("sum dim 1 (non-contiguous)", dt, function(dev) return nc(on(x, dev)):sum(1) end, tol)
end
do
  local big = input({3000, 40}, "f32")
  check("sum dim 1 of [3000,40] (thread per output)", "f32", function(dev) return on(big, dev):sum(1) end, 1e-6)
  check("sum dim 2 of [3000,40]", "f32", function(dev) return on(big, dev):sum(2) end, 1e-6)
  local ints = input({9, 11}, "i32", function(t) return t * 100 end)
  check("sum int -> i64", "i64", function(dev) return on(ints, dev):sum(2) end)
end

-- ---- matmul ------------------------------------------------------------------------------
local MMTOL = {f32 = 1e-4, f64 = 1e-10, bf16 = 2e-2, f16 = 4e-3}
for _, dt in ipairs(FLOATS) do
  local a, b = input({37, 64}, dt), input({64, 29}, dt)
  check("matmul [37,64]@[64,29]", dt, function(dev) return on(a, dev):matmul(on(b, dev)) end, MMTOL[dt])
  check("matmul transposed operands", dt, function(dev)
    return nc(on(a, dev)):matmul(nc(on(b, dev)))
  end, MMTOL[dt])
  local ba, bb = input({2, 3, 16, 24}, dt), input({24, 8}, dt)
  check("matmul batched, b broadcast", dt, function(dev) return on(ba, dev):matmul(on(bb, dev)) end, MMTOL[dt])
  local pa, pb = input({2, 1, 5, 12}, dt), input({3, 12, 6}, dt)
  check("matmul batch broadcast both (packed)", dt, function(dev) return on(pa, dev):matmul(on(pb, dev)) end, MMTOL[dt])
  local va, vb = input({12}, dt), input({4, 12, 5}, dt)
  check("matmul 1-D @ batched", dt, function(dev) return on(va, dev):matmul(on(vb, dev)) end, MMTOL[dt])
end
do
  local a, b = input({9, 16}, "f32"), input({16, 10}, "bf16")
  check("matmul mixed f32@bf16", "f32", function(dev) return on(a, dev):matmul(on(b, dev)) end, 1e-4)
  local e1, e2 = input({4, 0}, "f32"), input({0, 3}, "f32")
  check("matmul K=0", "f32", function(dev) return on(e1, dev):matmul(on(e2, dev)) end)
  local x, w = input({5, 16}, "f32"), input({7, 16}, "f32")
  check("linear (matmul with a transposed weight)", "f32", function(dev) return keng.linear(on(x, dev), on(w, dev)) end, 1e-4)
  local xl, wl = input({8, 12}, "f64"), input({12, 6}, "f64")
  check("grad matmul", "f64", function(dev)
    local a1, b1 = on(xl, dev):detach(), on(wl, dev):detach()
    a1:requires_grad_(true)
    b1:requires_grad_(true)
    a1:matmul(b1):sum():backward()
    return {a1.grad, b1.grad}
  end)
end

print(string.format("\n%d cases on %s: %d passed, %d failed", total, DEV, total - failed, failed))
if failed > 0 then os.exit(1) end
