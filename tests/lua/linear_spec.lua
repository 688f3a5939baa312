-- linear_spec.lua — keng.linear (y = x·wᵀ + b) as one op: values against an f64 triple loop for
-- each float dtype, with and without a bias, 1-D/2-D/3-D x, every CPU path of the product
-- (direct bf16 rows, converted column blocks, whole converted weight, unfoldable batches),
-- non-contiguous x, w and b, an empty inner dim, gradients of x, w and b against finite
-- differences (f64), the error messages, and KENG_DEBUG showing a single `linear` op.
local keng = require "keng"
local H = require "helper"

-- y[r][o] = sum_i x[r][i] w[o][i] + b[o] in f64 from the tensors' own (rounded) values; x is
-- flattened to rows, the result has x's leading dims
local function ref(x, w, b)
  local I, O = w.shape[2], w.shape[1]
  local xs = x:double():contiguous():reshape{-1, I}:tolist()
  local ws = w:double():contiguous():tolist()
  local bs = b and b:double():contiguous():tolist()
  local rows = {}
  for r = 1, #xs do
    local row = {}
    for o = 1, O do
      local s = bs and bs[o] or 0
      for i = 1, I do s = s + xs[r][i] * ws[o][i] end
      row[o] = s
    end
    rows[r] = row
  end
  local shape = {}
  for d = 1, x.ndim - 1 do shape[d] = x.shape[d] end
  shape[#shape + 1] = O
  return keng.tensor(rows, {dtype = "f64"}):reshape(shape)
end

local TOL = {f32 = 1e-5, f64 = 1e-12, bf16 = 1e-2, f16 = 2e-3}
local DTYPES = {"f32", "f64", "bf16", "f16"}

describe("linear values", function()
  it("match an f64 reference in every float dtype, with and without a bias, 1-D/2-D/3-D x", function()
    keng.manual_seed(11)
    for _, dt in ipairs(DTYPES) do
      local w, b = keng.randn({6, 8}):to(dt), keng.randn({6}):to(dt)
      for _, shape in ipairs({{8}, {5, 8}, {2, 3, 8}}) do
        local x = keng.randn(shape):to(dt)
        local msg = dt .. " x[" .. table.concat(shape, ",") .. "]"
        local y = keng.linear(x, w, b)
        assert.are.equal(dt, y.dtype, msg)
        H.close(y, ref(x, w, b), TOL[dt], msg .. " with bias")
        H.close(keng.linear(x, w), ref(x, w), TOL[dt], msg .. " without bias")
      end
    end
  end)

  it("every product path (few rows, column blocks, whole weight, mixed dtypes) adds the bias", function()
    keng.manual_seed(12)
    for _, rows in ipairs({3, 40, 130}) do -- bf16 direct rows (<= 32), blocked (< 128), whole
      for _, dt in ipairs(DTYPES) do
        local x, w, b = keng.randn({rows, 16}):to(dt), keng.randn({20, 16}):to(dt), keng.randn({20}):to(dt)
        H.close(keng.linear(x, w, b), ref(x, w, b), TOL[dt], dt .. " rows " .. rows)
      end
      -- an f32 x against a bf16 or f16 weight: f32 out, the weight converted (or read as bf16)
      for _, wdt in ipairs({"bf16", "f16"}) do
        local x, w, b = keng.randn({rows, 16}), keng.randn({20, 16}):to(wdt), keng.randn({20}):to(wdt)
        local y = keng.linear(x, w, b)
        assert.are.equal("f32", y.dtype)
        H.close(y, ref(x, w, b), 1e-5, "f32 x, " .. wdt .. " w, rows " .. rows)
      end
    end
  end)

  it("a tall product (>= 4096 rows) split by rows among the threads: bias, transposed x, f32/f64", function()
    keng.manual_seed(15)
    local nt = keng.num_threads()
    keng.set_num_threads(3)                                      -- an odd split of 4101 rows
    for _, dt in ipairs({"f32", "f64"}) do
      local w, b = keng.randn({40, 32}):to(dt), keng.randn({40}):to(dt)
      local x = keng.randn({4101, 32}):to(dt)
      local xt = keng.randn({32, 4101}):to(dt):transpose()             -- rows strided: a transposed A
      H.close(keng.linear(x, w, b), ref(x, w, b), TOL[dt], dt .. " tall x with bias")
      H.close(keng.linear(xt, w, b), ref(xt, w, b), TOL[dt], dt .. " tall transposed x with bias")
      H.close(keng.linear(xt, w), ref(xt, w), TOL[dt], dt .. " tall transposed x without bias")
    end
    keng.set_num_threads(nt)
  end)

  it("a small output with a long K (weight-gradient shapes) on 2 and 3 threads: bias, transposed x", function()
    keng.manual_seed(16)
    local nt = keng.num_threads()
    for _, threads in ipairs({2, 3}) do
      keng.set_num_threads(threads)
      for _, dt in ipairs({"f32", "f64"}) do
        local w, b = keng.randn({40, 2001}):to(dt), keng.randn({40}):to(dt)
        local x = keng.randn({50, 2001}):to(dt)
        local xt = keng.randn({2001, 50}):to(dt):transpose()       -- the weight-gradient layout gᵀ·x
        local msg = dt .. " " .. threads .. " threads"
        H.close(keng.linear(x, w, b), ref(x, w, b), TOL[dt] * 4, msg .. " with bias")
        H.close(keng.linear(xt, w), ref(xt, w), TOL[dt] * 4, msg .. " transposed x without bias")
      end
    end
    keng.set_num_threads(nt)
  end)

  it("a short K (<= 128) against <= 256 columns (the AVX-512 short-K kernel): row and column tails, strided rows", function()
    keng.manual_seed(17)
    local nt = keng.num_threads()
    local function f64ref(x, w, b) return keng.linear(x:double(), w:double(), b and b:double()) end
    for _, threads in ipairs({1, 3}) do
      keng.set_num_threads(threads)
      for _, K in ipairs({1, 32, 64, 128}) do            -- M 256 with K >= 32: gemm_f32.c
        for _, M in ipairs({1, 16, 17, 33, 256}) do
          local N = M == 256 and 3001 or M == 17 and 1003 or 67       -- not whole 6-row blocks; 3001: threaded
          local w, b = keng.randn({M, K}), keng.randn({M})
          local x = keng.randn({N, K + 3}):narrow(2, 2, K)             -- rows strided (row stride K + 3)
          local msg = string.format("[%d, %d] x [%d, %d]ᵀ on %d threads", N, K, M, K, threads)
          local tol = K > 32 and 4e-5 or 1e-5                         -- f32 sums of up to 128 terms
          H.close(keng.linear(x, w, b), f64ref(x, w, b), tol, msg .. " with bias")
          H.close(keng.linear(x, w), f64ref(x, w), tol, msg .. " without bias")
        end
      end
    end
    keng.set_num_threads(nt)
    -- the UNet's shapes against the triple loop; a 3-D x, a bf16 weight, and matmul with a plain b
    local x, w, b = keng.randn({2, 40, 32}), keng.randn({40, 32}), keng.randn({40})
    H.close(keng.linear(x, w, b), ref(x, w, b), 1e-5, "3-D x")
    H.close(keng.linear(x, w:bf16(), b), ref(x, w:bf16(), b), 1e-5, "bf16 w")
    local x2, bm = keng.randn({70, 20}), keng.randn({20, 24})
    H.close(x2:matmul(bm), ref(x2, bm.T:contiguous()), 1e-5, "matmul [70, 20] @ [20, 24]")
  end)

  it("mid-size f32 products (keng's AVX-512 GEMM, gemm_f32.c): odd N/M/K, layouts, bias, threads, gradients", function()
    keng.manual_seed(23)
    local nt = keng.num_threads()
    -- worst |got - want| / (1 + |want|) against an f64 product of the same values, in keng ops (no
    -- Lua tables: the products have up to 10^6 elements)
    local function check(got, want, tol, msg)
      local err = ((got:double() - want):abs() / (want:abs() + 1)):max():item()
      assert(err <= tol, string.format("%s: worst error %.3g > %.3g", msg, err, tol))
    end
    local function f64ref(x, w, b) return keng.linear(x:double(), w:double(), b and b:double()) end
    for _, threads in ipairs({1, 2, 3}) do
      keng.set_num_threads(threads)
      -- row tails of the 6-row tile, column tails of the 64- and 16-column panels, K blocks of 128
      for _, d in ipairs({{64, 64, 32}, {67, 65, 33}, {301, 130, 129}, {97, 200, 300}, {4099, 128, 128},
                         {1031, 79, 512}}) do
        local N, M, K = d[1], d[2], d[3]
        local w, b = keng.randn({M, K}), keng.randn({M})
        local x = keng.randn({N, K})
        local msg = string.format("[%d, %d] x [%d, %d]ᵀ on %d threads", N, K, M, K, threads)
        local tol = 2e-6 * math.sqrt(K) + 1e-6                     -- f32 sums of K terms
        check(keng.linear(x, w, b), f64ref(x, w, b), tol, msg .. " with bias")
        check(keng.linear(x, w), f64ref(x, w), tol, msg .. " without bias")
        local xs = keng.randn({N, K + 5}):narrow(2, 3, K)          -- rows strided
        check(keng.linear(xs, w, b), f64ref(xs, w, b), tol, msg .. " strided rows")
        local xt = keng.randn({K, N}).T                             -- x transposed (the dW layout gᵀ·x)
        check(keng.linear(xt, w, b), f64ref(xt, w, b), tol, msg .. " transposed x")
        local wc = keng.randn({K, M}).T                             -- w column-major
        check(keng.linear(x, wc, b), f64ref(x, wc, b), tol, msg .. " column-major w")
        local wn = keng.randn({M, 2 * K}):narrow(2, 1, K)           -- w rows strided
        check(keng.linear(x, wn), f64ref(x, wn), tol, msg .. " strided w")
        -- matmul: x @ b with b row-major (dx = g·w), strided columns of b, gᵀ·x (dW)
        local bm = keng.randn({K, M})
        check(x:matmul(bm), x:double():matmul(bm:double()), tol, msg .. " matmul")
        local bs = keng.randn({K, 2 * M}):narrow(2, 2, M)
        check(x:matmul(bs), x:double():matmul(bs:double()), tol, msg .. " matmul strided b")
        local g = keng.randn({K, M})                               -- [rows, out] of a dW = gᵀ·x with N = K rows
        local xk = keng.randn({K, N})
        check(g.T:matmul(xk), g.T:double():matmul(xk:double()), 2e-6 * math.sqrt(N) + 1e-6, msg .. " gᵀ·x")
      end
    end
    keng.set_num_threads(nt)
    -- the gradients of a BERT-shaped f32 linear (dx = g·w and dw = gᵀ·x on the kernel) against f64
    local x, w, b = keng.randn({2, 130, 96}), keng.randn({192, 96}), keng.randn({192})
    local g = keng.randn({2, 130, 192})
    local function grads(dt)
      local xl, wl, bl = x:to(dt):detach(), w:to(dt):detach(), b:to(dt):detach()
      xl.requires_grad, wl.requires_grad, bl.requires_grad = true, true, true
      (keng.linear(xl, wl, bl) * g:to(dt)):sum():backward()
      return xl.grad, wl.grad, bl.grad
    end
    local dx, dw, db = grads("f32")
    local dx64, dw64, db64 = grads("f64")
    check(dx, dx64, 3e-5, "dx")
    check(dw, dw64, 5e-5, "dw")
    check(db, db64, 5e-5, "db")
  end)

  it("bf16 past 32 rows, or 16 with a small weight (the packed vdpbf16ps kernel with AVX512_BF16)", function()
    keng.manual_seed(13)
    for _, shape in ipairs({{33, 37}, {100, 257}, {3, 50, 300}, {24, 37}, {2, 9, 64}}) do
      local I = shape[#shape]
      local x, w, b = keng.randn(shape):to("bf16"), (keng.randn({45, I}) * 0.1):to("bf16"), keng.randn({45}):to("bf16")
      local msg = "bf16 x[" .. table.concat(shape, ",") .. "]"
      H.close(keng.linear(x, w, b), ref(x, w, b), TOL.bf16, msg .. " with bias")
      H.close(keng.linear(x, w), ref(x, w), TOL.bf16, msg .. " without bias")
      local xf = x:float()                                        -- f32 out: bias added in f32
      H.close(keng.linear(xf, w, b), ref(xf, w, b), 1e-5, msg .. " f32 x")
    end
  end)

  it("bf16 gradient of x past 32 rows (g @ w on the packed kernel) matches f64", function()
    keng.manual_seed(14)
    local x, w = keng.randn({70, 33}):to("bf16"), (keng.randn({50, 33}) * 0.1):to("bf16")
    x.requires_grad = true
    local g = keng.randn({70, 50}):to("bf16")
    keng.linear(x, w):backward(g)
    local want = g:double():matmul(w:double())
    H.close(x.grad, want, TOL.bf16, "x.grad")
  end)

  it("non-contiguous x, w and b give the same values", function()
    keng.manual_seed(13)
    for _, dt in ipairs(DTYPES) do
      local x, w, b = keng.randn({7, 9}):to(dt), keng.randn({5, 9}):to(dt), keng.randn({5}):to(dt)
      local want = ref(x, w, b)
      local wt = w.T:contiguous().T -- w's values laid out column-major
      assert.is_false(wt.is_contiguous)
      H.close(keng.linear(H.noncontig(x), wt, H.noncontig(b)), want, TOL[dt], dt .. " noncontig")
      H.close(keng.linear(x, wt, b), want, TOL[dt], dt .. " transposed w")
      -- a 3-D x whose batch dims do not fold into rows: one product per batch entry
      local x3 = keng.randn({4, 2, 9}):to(dt):transpose(1, 2)
      assert.is_false(x3.is_contiguous)
      H.close(keng.linear(x3, w, b), ref(x3, w, b), TOL[dt], dt .. " unfoldable batch")
    end
  end)

  it("an empty inner dim gives the bias; empty rows give an empty result", function()
    local b = keng.tensor({1, 2, 3}, {dtype = "f32"})
    H.close(keng.linear(keng.zeros({2, 0}), keng.zeros({3, 0}), b), {{1, 2, 3}, {1, 2, 3}}, 0)
    H.close(keng.linear(keng.zeros({2, 0}):bf16(), keng.zeros({3, 0}):bf16(), b:bf16()), {{1, 2, 3}, {1, 2, 3}}, 0)
    H.close(keng.linear(keng.zeros({2, 0}), keng.zeros({3, 0})), {{0, 0, 0}, {0, 0, 0}}, 0)
    assert.are.same({0, 3}, keng.linear(keng.zeros({0, 4}), keng.zeros({3, 4}), b).shape)
  end)

  it("with a bias equals matmul + add, without one equals matmul (f32, small K)", function()
    keng.manual_seed(14)
    local x, w, b = keng.randn({2, 3, 8}), keng.randn({5, 8}), keng.randn({5})
    H.close(keng.linear(x, w, b), x:matmul(w.T) + b, 0)
    H.close(keng.linear(x, w), x:matmul(w.T), 0)
  end)
end)

describe("linear gradients", function()
  it("of x, w and b match finite differences (2-D, 3-D, 1-D x, no bias)", function()
    local lin = function(p, q, r) return keng.linear(p, q, r) end
    H.gradcheck(lin, {H.leaf({3, 4}), H.leaf({5, 4}), H.leaf({5})})
    H.gradcheck(lin, {H.leaf({2, 3, 4}), H.leaf({5, 4}), H.leaf({5})})
    H.gradcheck(lin, {H.leaf({4}), H.leaf({5, 4}), H.leaf({5})})
    H.gradcheck(function(p, q) return keng.linear(p, q) end, {H.leaf({3, 4}), H.leaf({5, 4})})
  end)

  it("through non-contiguous x and a transposed w", function()
    H.gradcheck(function(p, q, r) return keng.linear(p:transpose(2, 3), q.T, r) end,
      {H.leaf({2, 4, 3}), H.leaf({4, 5}), H.leaf({5})})
    H.gradcheck(function(p, q) return keng.linear(p.T, q) end, {H.leaf({4, 2}), H.leaf({5, 4})})
  end)

  it("only for the inputs that ask, in their own dtype", function()
    keng.manual_seed(15)
    local x = keng.randn({3, 4})
    local w = keng.randn({2, 4}):bf16()
    w.requires_grad = true
    local b = keng.randn({2})
    keng.linear(x, w, b):sum():backward()
    assert.are.equal("bf16", w.grad.dtype)
    assert.is_nil(x.grad)
    assert.is_nil(b.grad)
    -- d sum(y) / dw[o][i] = sum over rows of x[r][i]
    local want = x:sum(1):reshape{1, 4}:expand{2, 4}
    H.close(w.grad, want, 1e-2)
  end)
end)

describe("linear errors", function()
  it("name linear and the shapes", function()
    local x, w = keng.randn({2, 3, 4}), keng.randn({5, 4})
    local err = H.raises(function() keng.linear(x, keng.randn({5, 3})) end, "x's last dim must equal w's in-features 3")
    assert.truthy(err:find("linear", 1, true), err)
    H.raises(function() keng.linear(x, w, keng.randn({4})) end, "bias [4] must be [5]")
    H.raises(function() keng.linear(x, w, keng.randn({1, 5})) end, "bias [1,5] must be [5]")
    H.raises(function() keng.linear(x, keng.randn({4})) end, "weight [4] must be 2-D [out, in]")
    H.raises(function() keng.linear(keng.arange(4), keng.randn({5, 4})) end, "floating point")
    -- an integer bias is added as before (promoted)
    H.close(keng.linear(keng.ones({1, 4}), keng.ones({2, 4}), keng.tensor({1, 2})), {{5, 6}}, 0)
  end)
end)

describe("linear under KENG_DEBUG", function()
  it("logs one linear op, no matmul or add", function()
    local bin = H.keng_bin()
    if not bin then return pending("no keng binary (set KENG_BIN)") end
    local script = "local keng = require 'keng'; keng.linear(keng.randn({4, 3, 8}), keng.randn({6, 8}), keng.randn({6}))"
    local p = io.popen("KENG_DEBUG=1 '" .. bin .. "' -e \"" .. script .. "\" 2>&1")
    local log = p:read("a")
    p:close()
    local ops = {}
    for name in log:gmatch("%[keng%] (%S+)") do ops[name] = (ops[name] or 0) + 1 end
    assert.are.equal(1, ops.linear, log)
    assert.is_nil(ops.matmul, log)
    assert.is_nil(ops.add, log)
  end)
end)
