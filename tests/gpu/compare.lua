-- compare.lua — CPU-vs-CUDA check of every op that has a CUDA kernel (the CPU is the oracle).
-- Each case builds inputs on the CPU from a fixed seed, runs the op on the CPU and on cuda:0
-- (inputs copied over, plus a non-contiguous or broadcast layout where it matters), brings the
-- CUDA result back and prints the worst error |gpu - cpu| / (1 + |cpu|) against a tolerance
-- for the dtype. Exits 1 on any mismatch or error, 0 when all agree.
--
--   keng tests/gpu/compare.lua              -- needs a GPU; skips (exit 0) without one
--   KENG_COMPARE_DEVICE=cpu keng tests/gpu/compare.lua   -- self-test: CPU against CPU
--   KENG_COMPARE_TIER=small ...              -- the GPU-tier shape cases (at the end) shrunk
local keng = require "keng"

local DEV = os.getenv("KENG_COMPARE_DEVICE") or "cuda"
if DEV ~= "cpu" and not keng.cuda.is_available() then
  print("compare.lua: skipped — keng.cuda.is_available() is false (no CUDA driver or GPU here)")
  return
end

local TOL = {f64 = 1e-10, f32 = 2e-5, bf16 = 1.6e-2, f16 = 2e-3, i32 = 0, i64 = 0, bool = 0, u8 = 0, i8 = 0}
local failed, total = 0, 0

-- worst relative error of a (device result) against b (cpu result), NaNs equal to NaNs; large
-- results (the GPU-tier shapes) are compared with tensor ops instead of Lua lists
local function worst_big(a, b)
  local x, y = a:cpu():double(), b:double()
  local nx, ny = x:ne(x), y:ne(y)
  if nx:ne(ny):sum():item() > 0 then return math.huge end
  local zero = keng.zeros({}, {dtype = "f64"})
  x, y = keng.where(nx, zero, x), keng.where(ny, zero, y)
  local e = keng.where(x:eq(y), zero, (x - y):abs() / (y:abs() + 1))
  local w = e:max():item()
  return w == w and w or math.huge
end

local function worst(a, b)
  if b:numel() > 100000 then return worst_big(a, b) end
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
-- x on dev as a fresh leaf that requires grad (detach: the copy is not part of the tape)
local function on_dev(x, dev, no_grad)
  local t = x:to(dev):detach()
  if not no_grad then t:requires_grad_(true) end
  return t
end
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
-- every unary op of the op table (engine/ops/elementwise.def); the domain of those that need one
local UNARY = {log = positive, sqrt = positive, rsqrt = positive}
local UNARY_NAMES, DIFF = {}, {}
for _, op in ipairs(keng.ops()) do
  if op.kind == "unary" then
    UNARY_NAMES[#UNARY_NAMES + 1] = op.name
    if op.differentiable then DIFF[#DIFF + 1] = op.name end
  end
end
DIFF[#DIFF + 1] = "clamp"
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
  -- the two-stage paths (engine/cuda/reduce_plan.h): a full sum split over ranges, and a
  -- coalesced column sum split over row ranges (the bias gradient's shape)
  local flat, cols = input({1000000}, "f32"), input({4096, 1024}, "f32")
  check("sum all of [1e6] (two-stage)", "f32", function(dev) return on(flat, dev):sum() end, 1e-5)
  check("sum dim 1 of [4096,1024] (column ranges)", "f32", function(dev) return on(cols, dev):sum(1) end, 1e-5)
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
  -- cuBLASLt strided batches (both operands batched), a transposed batched operand, a shared
  -- left operand (the cuBLAS fallback) and a misaligned start (alignment is part of the cache key)
  local sa, sb = input({4, 16, 24}, dt), input({4, 24, 8}, dt)
  check("matmul batched both (cuBLASLt strided)", dt, function(dev) return on(sa, dev):matmul(on(sb, dev)) end, MMTOL[dt])
  check("matmul batched, a transposed", dt, function(dev)
    return on(sa, dev):transpose(2, 3):contiguous():transpose(2, 3):matmul(on(sb, dev))
  end, MMTOL[dt])
  local la = input({16, 24}, dt)
  check("matmul shared a @ batched b (fallback)", dt, function(dev) return on(la, dev):matmul(on(sb, dev)) end, MMTOL[dt])
  local ma, mb = input({1 + 13 * 20}, dt), input({20, 9}, dt)
  check("matmul misaligned a", dt, function(dev)
    return on(ma, dev):narrow(1, 2, 13 * 20):reshape{13, 20}:matmul(on(mb, dev))
  end, MMTOL[dt])
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

-- ---- along one dim: max/min/argmax/argmin, cumsum, topk, softmax ------------------------
local function ints(shape, lo, hi, dt)
  seed = seed + 1
  keng.manual_seed(seed)
  return keng.randint(lo, hi, shape, {dtype = dt or "i64"})
end
for _, dt in ipairs(FLOATS) do
  local x = ints({6, 50, 7}, -4, 5, "f64"):to(dt) -- many ties: the first index must win
  for _, op in ipairs({"max", "min"}) do
    check(op .. " dim 2 (ties)", dt, function(dev) return {on(x, dev)[op](on(x, dev), 2)} end)
    check(op .. " dim 3 keepdim (non-contiguous)", dt, function(dev) return {nc(on(x, dev))[op](nc(on(x, dev)), 3, true)} end)
  end
  check("argmax dim 1", dt, function(dev) return on(x, dev):argmax(1) end)
  check("argmin dim -1", dt, function(dev) return on(x, dev):argmin(-1) end)
  local r = input({5, 300}, dt)
  check("argmax dim 2 of [5,300] (block per row)", dt, function(dev) return on(r, dev):argmax(2) end)
  check("cumsum dim 2", dt, function(dev) return on(r, dev):cumsum(2) end)
  check("cumsum dim 1 (non-contiguous)", dt, function(dev) return nc(on(r, dev)):cumsum(1) end)
  check("topk 7 of [5,300]", dt, function(dev) return {on(r, dev):topk(7, 2)} end)
  check("softmax dim -1", dt, function(dev) return keng.softmax(on(r, dev), -1) end)
  check("softmax dim 1 (strided rows)", dt, function(dev) return keng.softmax(on(r, dev), 1) end)
  check("log_softmax dim -1", dt, function(dev) return keng.log_softmax(on(r, dev), -1) end)
  check("log_softmax (non-contiguous)", dt, function(dev) return keng.log_softmax(nc(on(r, dev)), 1) end)
end
do
  local x = input({4, 5000}, "f32")
  check("topk 5 of [4,5000] (selection passes)", "f32", function(dev) return {on(x, dev):topk(5, 2)} end)
  -- long rows asking for more than 64: the bitonic network in global memory, a launch per step
  check("topk 100 of [4,5000] (global sort)", "f32", function(dev) return {on(x, dev):topk(100, 2)} end)
  local tie = ints({2, 70000}, -3, 4, "f64"):to("bf16")           -- ties everywhere: index order decides
  local function second(a, b) return b end                        -- the indices alone, compared exactly
  check("topk all of [2,70000] smallest, indices", "i64", function(dev)
    return second(on(tie, dev):topk(70000, 2, {largest = false}))
  end)
  check("topk 3000 of [70000,2] dim 1 (strided), indices", "i64", function(dev)
    return second(on(tie, dev):transpose(1, 2):topk(3000, 1))
  end)
  check("max dim 2 of [4,5000]", "f32", function(dev) return {on(x, dev):max(2)} end)
  local n = input({3, 9}, "f32")
  n = keng.where(n:gt(keng.full({}, 1.0)), keng.full({}, 0 / 0), n)
  check("max with NaN (NaN wins)", "f32", function(dev) return {on(n, dev):max(2)} end)
end

-- ---- int8 / int4 weight-only ops (quant.cu): the codes and scales exactly, the GEMVs within the
-- dtype's tolerance (a warp tree sums where the CPU sums in order); both sides get the CPU's codes
do
  for _, wdt in ipairs({"f32", "bf16"}) do
    local w = input({37, 96}, wdt)                                  -- 37 rows: a partial block of 8 warps
    check("quantize_q8 codes (w " .. wdt .. ")", "i8", function(dev) return ({keng.quantize_q8(on(w, dev))})[1] end)
    check("quantize_q8 scales (w " .. wdt .. ")", "f32", function(dev) return ({keng.quantize_q8(on(w, dev))})[2] end)
    check("quantize_q4 codes (w " .. wdt .. ")", "u8", function(dev) return ({keng.quantize_q4(on(w, dev))})[1] end)
    check("quantize_q4 scales (w " .. wdt .. ")", "f16", function(dev) return ({keng.quantize_q4(on(w, dev))})[2] end)
  end
  local w, b = input({37, 96}, "f32"), input({37}, "f32")
  local q8, s8 = keng.quantize_q8(w)
  local q4, s4 = keng.quantize_q4(w)
  check("dequantize_q4", "f32", function(dev) return keng.dequantize_q4(on(q4, dev), on(s4, dev)) end)
  for _, dt in ipairs(FLOATS) do
    local x = input({2, 3, 96}, dt)                                 -- K % 16 == 0: 16 codes a lane a load
    check("linear_q8 [2,3,96] + b", dt, function(dev)
      return keng.linear_q8(on(x, dev), on(q8, dev), on(s8, dev), on(b, dev):to(dt))
    end, dt == "f32" and 1e-4 or nil)
    check("linear_q4 [2,3,96] + b", dt, function(dev)
      return keng.linear_q4(on(x, dev), on(q4, dev), on(s4, dev), on(b, dev):to(dt))
    end, dt == "f32" and 1e-4 or nil)
  end
  local xn = input({96, 5}, "f32")                                  -- x with a strided last dim: no vector loads
  check("linear_q8 (non-contiguous x)", "f32", function(dev)
    return keng.linear_q8(on(xn, dev):transpose(1, 2), on(q8, dev), on(s8, dev))
  end, 1e-4)
  local w40 = input({9, 40}, "f32")                                 -- K = 40: not a multiple of 16
  local q40, s40 = keng.quantize_q8(w40)
  local x40 = input({4, 40}, "f32")
  check("linear_q8 K=40", "f32", function(dev) return keng.linear_q8(on(x40, dev), on(q40, dev), on(s40, dev)) end, 1e-4)
end

-- ---- decode_qkv (decode.cu): RoPE with a scaled RoPE's inv_freq and scale, k and v into the cache
-- at columns taken modulo L; q and both caches compared ([B, T] positions, T = 3, a column past L)
for _, dt in ipairs({"f32", "f64", "bf16"}) do
  local B, T, H, Hkv, D, L = 2, 3, 4, 2, 64, 20
  local qkv = input({B, T, (H + 2 * Hkv) * D}, dt)
  local ck, cv = input({B, Hkv, L, D}, dt), input({B, Hkv, L, D}, dt)
  local pos = keng.tensor({{7, 8, 9}, {30, 31, 32}}, {dtype = "i64"})
  local col = keng.tensor({18, 19, 21}, {dtype = "i64"})            -- 21 mod 20 = column 1
  local freq = keng.tensor((function()
    local f = {}
    for i = 1, D // 2 do f[i] = 10000 ^ (-2 * (i - 1) / D) / (i % 3 + 1) end
    return f
  end)(), {dtype = "f64"})
  for _, o in ipairs({{}, {inv_freq = true, scale = 0.87}}) do
    check("decode_qkv" .. (o.inv_freq and " inv_freq, scale" or "") .. " [2,3] positions", dt, function(dev)
      local k, v = on(ck, dev):clone(), on(cv, dev):clone()
      local q = keng.decode_qkv(on(qkv, dev), on(pos, dev), k, v, on(col, dev),
        {heads = H, kv_heads = Hkv, inv_freq = o.inv_freq and on(freq, dev) or nil, scale = o.scale})
      return {q, k, v}
    end)
  end
end

-- ---- losses --------------------------------------------------------------------------------
for _, dt in ipairs({"f32", "f64", "bf16"}) do
  local logits, t = input({16, 10}, dt), ints({16}, 0, 10)
  local ti = t:clone()
  ti:narrow(1, 3, 2):fill_(-100)
  for _, red in ipairs({"mean", "sum", "none"}) do
    check("cross_entropy " .. red, dt, function(dev)
      return keng.cross_entropy(on(logits, dev), on(t, dev), {reduction = red})
    end, dt == "bf16" and 2e-2 or 1e-5)
  end
  check("cross_entropy ignore_index", dt, function(dev)
    return keng.cross_entropy(on(logits, dev), on(ti, dev), {ignore_index = -100})
  end, dt == "bf16" and 2e-2 or 1e-5)
  check("grad cross_entropy (mean, ignore)", dt, function(dev)
    local l = on(logits, dev):detach()
    l:requires_grad_(true)
    keng.cross_entropy(l, on(ti, dev), {ignore_index = -100}):backward()
    return l.grad
  end, dt == "bf16" and 2e-2 or 1e-5)
end

-- ---- indexing ------------------------------------------------------------------------------
for _, dt in ipairs({"f32", "bf16", "i64"}) do
  local a, b = input({3, 4, 5}, dt, function(t) return t * 10 end), input({3, 2, 5}, dt, function(t) return t * 10 end)
  check("cat dim 2", dt, function(dev) return keng.cat({on(a, dev), on(b, dev)}, 2) end)
  check("cat dim 3 (non-contiguous)", dt, function(dev) return keng.cat({nc(on(a, dev)), nc(on(a, dev))}, 3) end)
  check("pad {1,2,-1,3}", dt, function(dev) return keng.pad(on(a, dev), {1, 2, -1, 3}, 7) end)
  local idx = ints({3, 4, 2}, 0, 5)
  check("gather dim 3", dt, function(dev) return on(a, dev):gather(3, on(idx, dev)) end)
  local sel = ints({6}, 0, 4)
  check("index_select dim 2", dt, function(dev) return on(a, dev):index_select(2, on(sel, dev)) end)
  check("index_select dim 3 (non-contiguous)", dt, function(dev) return nc(on(a, dev)):index_select(3, on(sel, dev)) end)
end
for _, dt in ipairs({"f32", "f64", "bf16"}) do
  local tbl, ids = input({50, 24}, dt), ints({3, 7}, 0, 50)
  check("embedding", dt, function(dev) return keng.embedding(on(ids, dev), on(tbl, dev)) end)
  check("grad embedding (index_add_)", dt, function(dev)
    local t = on(tbl, dev):detach()
    t:requires_grad_(true)
    ;(keng.embedding(on(ids, dev), t) * 3):sum():backward()
    return t.grad
  end)
  local src, idx = input({6, 40}, dt), ints({6, 40}, 0, 9)
  check("scatter_add_ dim 1 (duplicates)", dt, function(dev)
    local d = keng.zeros({9, 40}, {dtype = dt, device = dev})
    return d:scatter_add_(1, on(idx, dev), on(src, dev))
  end, dt == "bf16" and 5e-2 or TOL[dt])
  local big_idx, big_src = ints({5000, 1}, 0, 3), input({5000, 1}, dt)
  check("scatter_add_ few lines (atomic path)", dt, function(dev)
    local d = keng.zeros({3, 1}, {dtype = dt, device = dev})
    return d:scatter_add_(1, on(big_idx, dev), on(big_src, dev))
  end, dt == "bf16" and 1e-1 or dt == "f32" and 1e-4 or 1e-10)
  local isrc, iidx = input({5, 8, 3}, dt), ints({8}, 0, 4)
  check("index_add_ dim 2", dt, function(dev)
    local d = keng.zeros({5, 4, 3}, {dtype = dt, device = dev})
    return d:index_add_(2, on(iidx, dev), on(isrc, dev))
  end, dt == "bf16" and 5e-2 or TOL[dt])
end
do -- errors are raised as on the cpu
  local tbl, bad = input({5, 4}, "f32"), keng.tensor({1, 7, 2}, {dtype = "i64"})
  total = total + 1
  local ok1, e1 = pcall(keng.embedding, bad, tbl)
  local ok2, e2 = pcall(keng.embedding, on(bad, DEV), on(tbl, DEV))
  local same = not ok1 and not ok2 and e1 == e2
  if not same then failed = failed + 1 end
  print(string.format("%-34s %-5s %s (%s | %s)", "embedding index out of range", "f32", same and "ok" or "FAIL",
    tostring(e1), tostring(e2)))
end

-- ---- normalisation ---------------------------------------------------------------------------
local NTOL = {f32 = 1e-4, f64 = 1e-10, bf16 = 3e-2, f16 = 5e-3}
for _, dt in ipairs(FLOATS) do
  local x, w, b, g = input({6, 40}, dt), input({40}, dt), input({40}, dt), input({6, 40}, dt)
  local function grads(dev, f)
    local xl, wl, bl = on(x, dev):detach(), on(w, dev):detach(), on(b, dev):detach()
    xl:requires_grad_(true); wl:requires_grad_(true); bl:requires_grad_(true)
    local y = f(xl, wl, bl)
    local outs = {y:detach()}
    ;(y * on(g, dev)):sum():backward()
    outs[#outs + 1] = xl.grad
    outs[#outs + 1] = wl.grad
    if bl.grad then outs[#outs + 1] = bl.grad end
    return outs
  end
  check("layer_norm + grads", dt, function(dev) return grads(dev, function(a, w1, b1) return keng.layer_norm(a, w1, b1, 1e-5) end) end, NTOL[dt])
  check("rms_norm + grads", dt, function(dev) return grads(dev, function(a, w1) return keng.rms_norm(a, w1, 1e-6) end) end, NTOL[dt])
  check("rms_norm unit_offset + grads", dt, function(dev)
    return grads(dev, function(a, w1) return keng.rms_norm(a, w1, 1e-6, {unit_offset = true}) end)
  end, NTOL[dt])
  if dt == "f32" then                                   -- dw/db as split coalesced column sums
    local lx, lw, lb, lg = input({512, 768}, dt), input({768}, dt), input({768}, dt), input({512, 768}, dt)
    check("layer_norm [512,768] + grads", dt, function(dev)
      local xl, wl, bl = on(lx, dev):detach(), on(lw, dev):detach(), on(lb, dev):detach()
      xl:requires_grad_(true); wl:requires_grad_(true); bl:requires_grad_(true)
      local y = keng.layer_norm(xl, wl, bl, 1e-5)
      local yd = y:detach()
      ;(y * on(lg, dev)):sum():backward()
      return {yd, xl.grad, wl.grad, bl.grad}
    end, 1e-3)
  end
  local gx, gw, gb, gg = input({2, 8, 5, 3}, dt), input({8}, dt), input({8}, dt), input({2, 8, 5, 3}, dt)
  check("group_norm 4 groups + grads", dt, function(dev)
    local xl, wl, bl = on(gx, dev):detach(), on(gw, dev):detach(), on(gb, dev):detach()
    xl:requires_grad_(true); wl:requires_grad_(true); bl:requires_grad_(true)
    local y = keng.group_norm(xl, 4, wl, bl, 1e-5)
    local yd = y:detach()
    ;(y * on(gg, dev)):sum():backward()
    return {yd, xl.grad, wl.grad, bl.grad}
  end, NTOL[dt])
end

-- ---- convolution and resampling --------------------------------------------------------------
local CTOL = {f32 = 1e-4, f64 = 1e-10, bf16 = 3e-2, f16 = 5e-3}
for _, dt in ipairs(FLOATS) do
  local x, w, b = input({2, 4, 9, 8}, dt), input({6, 2, 3, 3}, dt), input({6}, dt)
  local opts = {stride = 2, padding = 1, dilation = 1, groups = 2}
  check("conv2d + grads (groups 2, stride 2)", dt, function(dev)
    local xl, wl, bl = on(x, dev):detach(), on(w, dev):detach(), on(b, dev):detach()
    xl:requires_grad_(true); wl:requires_grad_(true); bl:requires_grad_(true)
    local y = keng.conv2d(xl, wl, bl, opts)
    local yd = y:detach()
    ;(y * y:detach()):sum():backward()
    return {yd, xl.grad, wl.grad, bl.grad}
  end, CTOL[dt])
  local tw = input({4, 3, 3, 3}, dt)
  check("conv_transpose2d + grads", dt, function(dev)
    local xl, wl = on(x, dev):detach(), on(tw, dev):detach()
    xl:requires_grad_(true); wl:requires_grad_(true)
    local y = keng.conv_transpose2d(xl, wl, nil, {stride = 2, padding = 1})
    local yd = y:detach()
    ;(y * y:detach()):sum():backward()
    return {yd, xl.grad, wl.grad}
  end, CTOL[dt])
  check("interpolate x2 + grad", dt, function(dev)
    local xl = on(x, dev):detach()
    xl:requires_grad_(true)
    local y = keng.interpolate(xl, {scale = 2, mode = "nearest"})
    local yd = y:detach()
    ;(y * y:detach()):sum():backward()
    return {yd, xl.grad}
  end)
  for _, o in ipairs{{mode = "bilinear", size = {13, 7}, align_corners = true}, {mode = "bicubic", scale = 1.7},
                     {mode = "bilinear", size = {3, 2}, antialias = true}, {mode = "bicubic", scale = {0.4, 1.5}, antialias = true}} do
    check("interpolate " .. o.mode .. (o.antialias and " antialias" or "") .. " + grad", dt, function(dev)
      local xl = on(x, dev):detach()
      xl:requires_grad_(true)
      local y = keng.interpolate(xl, o)
      local yd = y:detach()
      ;(y * y:detach()):sum():backward()
      return {yd, xl.grad}
    end, CTOL[dt])
  end
end

-- ---- randomness ------------------------------------------------------------------------------
for _, dt in ipairs(FLOATS) do
  local x = input({33, 65}, dt)
  check("dropout p=0.3 (same Philox words)", dt, function(dev)
    keng.manual_seed(77)
    return keng.dropout(on(x, dev), 0.3, true)
  end)
end
do
  local p = input({3, 40}, "f32", function(t) return t:abs() end)
  check("multinomial with replacement", "i64", function(dev)
    keng.manual_seed(5)
    return keng.multinomial(on(p, dev), 12, {replacement = true})
  end)
  check("multinomial without replacement", "i64", function(dev)
    keng.manual_seed(6)
    return keng.multinomial(on(p, dev), 10)
  end)
  local q = input({2, 3000}, "f32", function(t) return t:abs() end)
  check("multinomial 100 of 3000 without replacement", "i64", function(dev)  -- its keys ranked by a global sort
    keng.manual_seed(7)
    return keng.multinomial(on(q, dev), 100)
  end)
end

-- ---- attention -------------------------------------------------------------------------------
local ATOL = {f32 = 1e-4, f64 = 1e-10, bf16 = 3e-2, f16 = 5e-3}
for _, dt in ipairs(FLOATS) do
  local x, pos = input({2, 3, 10, 8}, dt), keng.arange(3, 13, 1, {dtype = "i64"})
  check("rope + grad", dt, function(dev)
    local xl = on(x, dev):detach()
    xl:requires_grad_(true)
    local y = keng.rope(xl, on(pos, dev), {base = 10000})
    local yd = y:detach()
    ;(y * y:detach()):sum():backward()
    return {yd, xl.grad}
  end, ATOL[dt])
  local q, k, v = input({2, 4, 37, 16}, dt), input({2, 2, 45, 16}, dt), input({2, 2, 45, 16}, dt)
  local fmask = input({37, 45}, dt)
  local bmask = input({2, 1, 37, 45}, "f64"):gt(keng.full({}, -1.0, {dtype = "f64"}))
  local cases = {
    {"sdpa", {}}, {"sdpa causal", {causal = true}}, {"sdpa causal window 8", {causal = true, window = 8}},
    {"sdpa float mask", {mask = fmask}}, {"sdpa bool mask, scale", {mask = bmask, scale = 0.3}},
  }
  for _, c in ipairs(cases) do
    check(c[1] .. " + grads (GQA)", dt, function(dev)
      local o = {}
      for key, val in pairs(c[2]) do o[key] = keng.is_tensor(val) and on(val, dev) or val end
      local ql, kl, vl = on(q, dev):detach(), on(k, dev):detach(), on(v, dev):detach()
      ql:requires_grad_(true); kl:requires_grad_(true); vl:requires_grad_(true)
      local y = keng.scaled_dot_product_attention(ql, kl, vl, o)
      local yd = y:detach()
      ;(y * y:detach()):sum():backward()
      return {yd, ql.grad, kl.grad, vl.grad}
    end, ATOL[dt])
  end
end
do
  local q, k = input({1, 2, 5, 64}, "f32"), input({1, 2, 300, 64}, "f32")
  check("sdpa T=5 S=300 causal (KV cache)", "f32", function(dev)
    return keng.scaled_dot_product_attention(on(q, dev), on(k, dev), on(k, dev), {causal = true})
  end, 1e-4)
  local q2 = input({1, 1, 40, 256}, "f32")
  check("sdpa D=256", "f32", function(dev) return keng.scaled_dot_product_attention(on(q2, dev), on(q2, dev), on(q2, dev)) end, 1e-4)
end

-- ---- cuDNN fused attention vs keng's flash kernel vs the cpu ----------------------------------
-- bf16 / f16 calls cuDNN takes (sdpa_plan.h): each shape runs with keng.backends.cudnn_sdpa on
-- (cuDNN) and off (flash kernel), both against the cpu, gradients included (the backward reads
-- cuDNN's lse). Then keng.backends.cudnn_sdpa_stats must show cuDNN ran: a refused plan is a
-- failure here, with the fallback reasons printed.
local function with_sdpa(on, fn)
  local was = keng.backends.cudnn_sdpa
  keng.backends.cudnn_sdpa = on
  local ok, r = pcall(fn)
  keng.backends.cudnn_sdpa = was
  if not ok then error(r, 0) end
  return r
end
do
  local stats0 = keng.backends.cudnn_sdpa_stats
  local shapes = { -- B, H, Hkv, T, S, D, causal
    {2, 8, 8, 128, 128, 64, false}, {2, 8, 2, 128, 128, 64, true}, {1, 4, 1, 77, 200, 128, true},
    {3, 2, 2, 1, 300, 64, true}, {2, 4, 4, 64, 48, 32, false}, {1, 2, 2, 40, 40, 8, true},
  }
  for _, dt in ipairs({"bf16", "f16"}) do
    for _, sh in ipairs(shapes) do
      local B, H, Hkv, T, S, D, causal = table.unpack(sh)
      local q, k, v = input({B, H, T, D}, dt), input({B, Hkv, S, D}, dt), input({B, Hkv, S, D}, dt)
      local name = string.format("sdpa %dx%d/%dx%dx%dx%d%s", B, H, Hkv, T, S, D, causal and " causal" or "")
      for _, on in ipairs({true, false}) do
        check(name .. (on and " cudnn" or " flash") .. " + grads", dt, function(dev)
          return with_sdpa(on, function()
            local ql, kl, vl = on_dev(q, dev), on_dev(k, dev), on_dev(v, dev)
            local y = keng.scaled_dot_product_attention(ql, kl, vl, {causal = causal})
            local yd = y:detach()
            ;(y * y:detach()):sum():backward()
            return {yd, ql.grad, kl.grad, vl.grad}
          end)
        end, ATOL[dt])
      end
      check(name .. " cudnn vs flash (gpu only)", dt, function(dev)
        local function run(on)
          return with_sdpa(on, function()
            return keng.scaled_dot_product_attention(on_dev(q, DEV, true), on_dev(k, DEV, true), on_dev(v, DEV, true),
              {causal = causal})
          end)
        end
        if dev == "cpu" then return run(false):cpu() end             -- the flash kernel as the oracle
        return run(true)
      end, ATOL[dt])
    end
  end
  -- a transposed (non-contiguous, [B, T, H, D] storage) q also goes to cuDNN
  local qt = input({2, 64, 4, 32}, "bf16")
  check("sdpa q as a [B,T,H,D] view cudnn", "bf16", function(dev)
    local ql = on(qt, dev):transpose(2, 3)
    return keng.scaled_dot_product_attention(ql, ql, ql, {causal = true})
  end, ATOL.bf16)
  total = total + 1
  local st = keng.backends.cudnn_sdpa_stats
  local ran = st.cudnn - stats0.cudnn
  local reasons = {}
  for r, n in pairs(st.reasons) do if n > 0 then reasons[#reasons + 1] = r .. "=" .. n end end
  table.sort(reasons)
  local line = string.format("cudnn sdpa: %d calls, %d plans, %d build failures, %d exec failures; fallbacks %s",
    ran, st.plans - stats0.plans, st.build_failures - stats0.build_failures, st.exec_failures - stats0.exec_failures,
    table.concat(reasons, " "))
  if DEV ~= "cpu" and (ran == 0 or st.build_failures > stats0.build_failures or st.exec_failures > stats0.exec_failures) then
    failed = failed + 1
    print(line .. "  FAIL (cuDNN should have taken these calls)")
  else
    print(line .. "  ok")
  end
end

-- ---- the linear op (cuBLASLt bias epilogue, training too; fallback: matmul + bias add) ---------
do
  for _, dt in ipairs({"f32", "bf16", "f16"}) do
    local x, w, b = input({4, 9, 48}, dt), input({40, 48}, dt), input({40}, dt)
    check("linear + bias fused (no_grad)", dt, function(dev)
      return keng.no_grad(function() return keng.linear(on(x, dev), on(w, dev), on(b, dev)) end)
    end, MMTOL[dt])
    check("linear + bias, x non-contiguous (fallback)", dt, function(dev)
      return keng.no_grad(function() return keng.linear(nc(on(x, dev)), on(w, dev), on(b, dev)) end)
    end, MMTOL[dt])
    check("linear + bias, w transposed view, 1-D x (fallback)", dt, function(dev)
      local wt = on(w, dev).T:contiguous().T
      return {keng.linear(on(x, dev), wt, on(b, dev)), keng.linear(on(x, dev)[1][1], on(w, dev), on(b, dev))}
    end, MMTOL[dt])
    check("linear + bias + grads (fused forward)", dt, function(dev)
      local xl, wl, bl = on_dev(x, dev), on_dev(w, dev), on_dev(b, dev)
      local y = keng.linear(xl, wl, bl)
      ;(y * y:detach()):sum():backward()
      return {y:detach(), xl.grad, wl.grad, bl.grad}
    end, dt == "f32" and 1e-3 or MMTOL[dt] * 4)
  end
  local x, w, b = input({4, 9, 48}, "f32"), input({40, 48}, "bf16"), input({40}, "bf16")
  check("linear, f32 x + bf16 w and bias (fallback)", "f32", function(dev)
    return keng.linear(on(x, dev), on(w, dev), on(b, dev))
  end, 1e-4)
end

-- ---- the numerics guard on cuda ---------------------------------------------------------------
do
  total = total + 1
  local ok, err = pcall(function()
    local x = keng.tensor({1, -1, 4, -4, 9}):to(DEV)
    local was = keng.debug.check_numerics(true)
    local ok1, e1 = pcall(function() return x:sqrt() end)
    local ok2 = pcall(function() return x:abs():sqrt() end)
    local ok3, e3 = pcall(function() return (x:to("bf16") / 0):to("f32") end)
    keng.debug.check_numerics(was)
    assert(not ok1 and tostring(e1):find("check_numerics: output 1", 1, true), "sqrt(-1) not caught: " .. tostring(e1))
    assert(tostring(e1):find("2 NaN and 0 Inf values (first at flat index 1)", 1, true), tostring(e1))
    assert(ok2, "finite output raised")
    assert(not ok3 and tostring(e3):find("Inf", 1, true), "x / 0 not caught: " .. tostring(e3))
  end)
  if not ok then failed = failed + 1 end
  print(string.format("%-34s %-5s %s", "check_numerics on " .. DEV, "f32", ok and "ok" or ("FAIL " .. tostring(err))))
end

-- ---- the GPU-tier shapes the benchmark rows run ----------------------------------------------
-- Attention at head dims 256 (Gemma 7B: fit, and one decode step against a 50-token cache) and
-- 512 (one head: the SD VAE mid-block at 64x64 latents = 4096 tokens), SD's UNet attention at
-- 4096 tokens (self, and cross to the 77-token context), Gemma's 256000-row embedding (forward
-- and the index_add_ gradient) and its tied LM head (linear over the whole table, f32 logits,
-- argmax, cross_entropy with grads). KENG_COMPARE_TIER=small runs the same cases at small sizes
-- (the dry run of tests/gpu/run.sh on a CPU); the default is the GPU-tier sizes.
local SMALL = os.getenv("KENG_COMPARE_TIER") == "small"
local function big_input(shape, dt)              -- straight in dtype dt: no f64 copy of a 1.5 GB table
  seed = seed + 1
  keng.manual_seed(seed)
  return keng.randn(shape, {dtype = dt})
end
local function sdpa_case(name, dt, B, H, Hkv, T, S, D, o, grads, tol)
  local q, k, v = big_input({B, H, T, D}, dt), big_input({B, Hkv, S, D}, dt), big_input({B, Hkv, S, D}, dt)
  check(string.format("tier %s %dx%d/%dx%dx%dx%d%s", name, B, H, Hkv, T, S, D, grads and " + grads" or ""), dt,
    function(dev)
      local ql, kl, vl = on_dev(q, dev, not grads), on_dev(k, dev, not grads), on_dev(v, dev, not grads)
      if not grads then
        return keng.no_grad(function() return keng.scaled_dot_product_attention(ql, kl, vl, o) end)
      end
      local y = keng.scaled_dot_product_attention(ql, kl, vl, o)
      local yd = y:detach()
      ;(y * y:detach()):sum():backward()
      return {yd, ql.grad, kl.grad, vl.grad}
    end, tol or ATOL[dt])
end
do
  local s = SMALL and 8 or 1                   -- divides token counts and the vocabulary
  -- Gemma 7B fit: B 8, 16 heads, T 128, D 256, causal, bf16, with grads; decode T 1 against S 50
  sdpa_case("gemma fit sdpa causal", "bf16", SMALL and 1 or 8, SMALL and 2 or 16, SMALL and 2 or 16, 128, 128, 256,
    {causal = true}, true)
  sdpa_case("gemma decode sdpa", "bf16", SMALL and 2 or 32, SMALL and 2 or 16, SMALL and 2 or 16, 1, 50, 256,
    {causal = true}, false)
  -- Mistral 7B fit: 32 heads over 8 KV heads, D 128, window 4096 >= the 128 keys
  sdpa_case("mistral fit sdpa causal window", "bf16", SMALL and 1 or 8, SMALL and 4 or 32, SMALL and 1 or 8, 128, 128,
    128, {causal = true, window = 4096}, true)
  -- SD VAE mid-block: one head of 512 over the 64x64 latent (4096 tokens), f32, with grads (fit)
  sdpa_case("sd vae mid sdpa", "f32", 1, 1, 1, 4096 // s, 4096 // s, 512, {}, true, 1e-4)
  -- SD UNet, first level at 64x64: 8 heads of 40, self-attention and cross-attention to 77 tokens
  sdpa_case("sd unet self sdpa", "f32", 2, 8, 8, 4096 // s, 4096 // s, 40, {}, false, 1e-4)
  sdpa_case("sd unet cross sdpa", "f32", 2, 8, 8, 4096 // s, 77, 40, {}, true, 1e-4)

  -- Gemma's vocabulary: the embedding over 256000 rows (ids at both ends and past 2^16) and
  -- its gradient (index_add_ into the whole table; the touched rows, one untouched row)
  local V, C = 256000 // s, SMALL and 64 or 3072
  local tbl = big_input({V, C}, "bf16")
  local idl = {0, V - 1, V // 2, 65536 % V, 65537 % V, 1, V - 2, 12345 % V}
  local ids = keng.cat({keng.tensor(idl, {dtype = "i64"}), ints({120}, 0, V)}, 1):reshape{1, 128}
  local touched = keng.cat({ids:reshape{-1}, keng.tensor({3}, {dtype = "i64"})}, 1)  -- + a likely untouched row
  check(string.format("tier embedding [%d,%d] + grad", V, C), "bf16", function(dev)
    local t = on_dev(tbl, dev)
    local y = keng.embedding(on(ids, dev), t)                     -- [1, 128, C]
    ;(y * 2):sum():backward()
    return {y:detach(), t.grad:index_select(1, on(touched, dev))}
  end)
  -- the tied LM head: linear over the whole table in bf16, logits cast to f32 (CausalLM:head);
  -- decode batches 1 and 32 (with the greedy argmax), and fit rows with the CE loss and dx
  for _, N in ipairs({1, 32}) do
    local h = big_input({N, C}, "bf16")
    check(string.format("tier lm head [%d,%d]x[%d,%d]^T + max", N, C, V, C), "bf16", function(dev)
      return keng.no_grad(function()
        local y = keng.linear(on(h, dev), on(tbl, dev))
        return {y:float(), (y:float():max(-1))}     -- the greedy pick's value (indices can tie)
      end)
    end, 3e-2)
  end
  local hf, yf = big_input({16, C}, "bf16"), ints({16}, 0, V)
  check(string.format("tier lm head [16,%d] + cross_entropy + grad", C), "bf16", function(dev)
    local x = on_dev(hf, dev)
    local loss = keng.cross_entropy(keng.linear(x, on(tbl, dev)):float(), on(yf, dev))
    loss:backward()
    return {loss:detach(), x.grad}
  end, 3e-2)
end

print(string.format("\n%d cases on %s: %d passed, %d failed", total, DEV, total - failed, failed))
if failed > 0 then os.exit(1) end
