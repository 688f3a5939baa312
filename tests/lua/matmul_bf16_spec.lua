-- matmul_bf16_spec.lua — bf16 matmul with few rows (decode: x [N, K] against a bf16 weight), the
-- path that reads the weight directly (engine/cpu/gemm_bf16.c, up to 32 rows on CPUs with AVX2)
-- and, past 32 rows, convert + sgemm, or with AVX512_BF16 and a bf16 x gemm_bf16.c's packed
-- vdpbf16ps kernel (training rows, both layouts; the "many rows" block), also with a transposed
-- left operand (gᵀ in the weight gradient dW = gᵀ x, read as it lies: the last block).
-- Shapes: x [N, K], W [M, K] (nn.Linear) or [K, M]; g [K, N].
-- Reference: the naive sum (a:unsqueeze(-1) * b:unsqueeze(-3)):sum(-2) in f64 of the same bf16
-- values. The result is bf16, so the tolerance is its rounding (2^-8 relative) plus f32 sums.
local keng = require "keng"
local H = require "helper"

local TOL = 5e-3

local function ref(a, b)                                            -- [..., N, K] @ [..., K, M] in f64
  return (a:double():unsqueeze(-1) * b:double():unsqueeze(-3)):sum(-2)
end

local function bf16(shape, scale) return (keng.randn(shape) * (scale or 1)):to("bf16") end

local function check(a, b, msg)
  local y = a:matmul(b)
  assert.are.equal("bf16", y.dtype)
  H.close(y, ref(a, b), TOL, msg)
end

describe("bf16 matmul, few rows", function()
  before_each(function() keng.manual_seed(7) end)

  it("x @ W^T and x @ W match f64 at every edge of N, K (not a multiple of 8) and M", function()
    for _, N in ipairs({1, 2, 3, 4, 5, 31, 32, 33}) do
      for _, K in ipairs({1, 7, 8, 9, 17, 100, 256, 300}) do
        for _, M in ipairs({1, 3, 5, 16, 17, 130}) do
          local x = bf16({N, K})
          local tag = string.format("N=%d K=%d M=%d", N, K, M)
          check(x, bf16({M, K}, 0.1):transpose(1, 2), "x @ W^T " .. tag)
          check(x, bf16({K, M}, 0.1), "x @ W " .. tag)
        end
      end
    end
  end)

  it("takes non-contiguous x and weights with padded rows", function()
    local N, K, M = 5, 37, 29
    local x = H.noncontig(bf16({N, K}))
    assert.is_false(x.is_contiguous)
    local wt = bf16({M, K + 11}, 0.1):narrow(2, 4, K)                -- W [M, K], row stride K + 11
    check(x, wt:transpose(1, 2), "x @ W^T, padded W")
    local w = bf16({K, M + 9}, 0.1):narrow(2, 2, M)                  -- W [K, M], row stride M + 9
    check(x, w, "x @ W, padded W")
    check(bf16({K, N}):transpose(1, 2), w, "x transposed")          -- x with unit row stride
    local strided = bf16({K, 2 * M}, 0.1):view{K, M, 2}:select(3, 1)  -- W [K, M], strides (2M, 2)
    check(x, strided, "weight with no unit stride")
  end)

  it("batches: folded rows, one weight per entry, broadcast x", function()
    local B, N, K, M = 3, 4, 33, 21
    local w = bf16({M, K}, 0.1)
    check(bf16({B, N, K}), w:transpose(1, 2), "[B, N, K] @ W^T")
    check(bf16({B, N, K}), bf16({B, M, K}, 0.1):transpose(2, 3), "[B, N, K] @ [B, K, M] (W^T per entry)")
    check(bf16({B, N, K}), bf16({B, K, M}, 0.1), "[B, N, K] @ [B, K, M]")
    check(bf16({N, K}), bf16({B, K, M}, 0.1), "x broadcast over the weights")
    check(bf16({2, 1, N, K}), bf16({3, K, M}, 0.1), "[2, 1, N, K] @ [3, K, M]")
  end)

  it("matches keng.linear and splits big products among the threads", function()
    local x, w = bf16({4, 256}), bf16({5000, 256}, 0.1)             -- 10 MFLOP: threaded
    H.close(keng.linear(x, w), ref(x, w:transpose(1, 2)), TOL, "linear")
    H.close(x:matmul(w:transpose(1, 2)), keng.linear(x, w), 0, "linear = matmul")
    check(bf16({3, 256}), bf16({256, 5000}, 0.1), "x @ W, threaded")
  end)

  -- batch-1 decode's GEMV: chunks taken first come, first served by the threads, and threaded
  -- from 1 MiB of weight ([2048 -> 256] is exactly 1 MiB, 255 rows just under it); the bits do
  -- not depend on the thread count, and odd M leaves a partial 8-row tile
  it("GEMV (1-2 rows): the same bits at 1 and 2 threads, at the threading edge and odd M", function()
    local prev = keng.num_threads()
    for _, s in ipairs({{2048, 256}, {2048, 255}, {2048, 1029}, {300, 3001}}) do
      local K, M = s[1], s[2]
      local w = bf16({M, K}, 0.1)
      for _, N in ipairs({1, 2}) do
        local x = bf16({N, K})
        local ys = {}
        for t = 1, 2 do
          keng.set_num_threads(t)
          ys[t] = keng.linear(x, w)
        end
        local tag = string.format("N=%d K=%d M=%d", N, K, M)
        H.close(ys[1], ref(x, w:transpose(1, 2)), TOL, "GEMV " .. tag)
        H.close(ys[2], ys[1], 0, "GEMV 2 threads = 1 thread " .. tag)
      end
    end
    keng.set_num_threads(prev)
  end)

  it("keeps f32 x in f32 against a bf16 weight (x is not rounded to bf16)", function()
    -- a bf16 x may be multiplied as bf16 pairs (AVX512_BF16), an f32 x must not be
    for _, N in ipairs({1, 4, 32}) do
      local x, w = keng.randn({N, 300}), bf16({40, 300}, 0.1)
      local y = x:matmul(w:transpose(1, 2))
      assert.are.equal("f32", y.dtype)
      H.close(y, ref(x, w:transpose(1, 2)), 1e-5, "f32 x, N=" .. N)
    end
  end)

  it("keeps rows apart: a NaN or inf in one row of x spoils that row only", function()
    local N, K, M = 4, 20, 9
    local x = bf16({N, K})
    x:select(1, 2):select(1, 5):fill_(0 / 0)
    x:select(1, 4):select(1, 20):fill_(math.huge)
    local w = bf16({M, K}, 0.1)
    local y = x:matmul(w:transpose(1, 2)):double():tolist()
    for m = 1, M do
      assert.is_true(y[2][m] ~= y[2][m], "NaN row")
      assert.is_true(y[4][m] == math.huge or y[4][m] == -math.huge, "inf row")
      assert.is_true(y[1][m] == y[1][m] and math.abs(y[1][m]) < math.huge, "row 1 finite")
      assert.is_true(y[3][m] == y[3][m] and math.abs(y[3][m]) < math.huge, "row 3 finite")
    end
  end)

  it("gives bitwise the same result for the same row alone or in a batch of rows", function()
    -- each output is one dot product accumulated in the same order whatever the other rows
    local K, M = 300, 70
    local x, w = bf16({7, K}), bf16({M, K}, 0.1):transpose(1, 2)
    local all = x:matmul(w)
    for n = 1, 7 do H.close(x:narrow(1, n, 1):matmul(w), all:narrow(1, n, 1), 0, "row " .. n) end
  end)
end)

describe("bf16 matmul, many rows (the packed vdpbf16ps kernel on CPUs with AVX512_BF16)", function()
  before_each(function() keng.manual_seed(9) end)

  it("x @ W^T and x @ W match f64 past 32 rows: row tile, panel and K edges (odd K, K blocks)", function()
    local Ns, Ks, Ms = {33, 40, 63, 64, 65, 100, 129, 257}, {1, 2, 3, 31, 33, 256, 257, 300, 513}, {1, 17, 31, 32, 33, 100}
    local i = 0
    for _, N in ipairs(Ns) do
      for _, K in ipairs(Ks) do
        for _, M in ipairs(Ms) do
          i = i + 1
          if (i % 3 == 0) or N * K * M < 2e6 then                  -- every small one, a third of the big
            local x = bf16({N, K})
            local tag = string.format("N=%d K=%d M=%d", N, K, M)
            check(x, bf16({M, K}, 0.1):transpose(1, 2), "x @ W^T " .. tag)
            check(x, bf16({K, M}, 0.1), "x @ W " .. tag)
          end
        end
      end
    end
  end)

  it("takes non-contiguous x, padded weights and folded batches", function()
    local N, K, M = 70, 45, 37
    local x = H.noncontig(bf16({N, K}))
    check(x, bf16({M, K + 11}, 0.1):narrow(2, 4, K):transpose(1, 2), "x @ W^T, padded W")
    check(x, bf16({K, M + 9}, 0.1):narrow(2, 2, M), "x @ W, padded W")
    local xp = bf16({N, K + 5}):narrow(2, 3, K)                    -- rows padded: read as it lies
    check(xp, bf16({M, K}, 0.1):transpose(1, 2), "padded x @ W^T")
    check(xp, bf16({K, M}, 0.1), "padded x @ W")
    check(bf16({3, 20, K}), bf16({M, K}, 0.1):transpose(1, 2), "[3, 20, K] @ W^T: 60 folded rows")
    check(bf16({2, 40, K}), bf16({2, K, M}, 0.1), "[2, 40, K] @ [2, K, M]")
  end)

  it("the LM-head shape splits among the threads and keeps rows apart", function()
    local N, K, M = 48, 64, 3000
    local x, w = bf16({N, K}), bf16({M, K}, 0.1)
    x:select(1, 40):select(1, 7):fill_(0 / 0)
    local y = x:matmul(w:transpose(1, 2))
    local yl = y:double():tolist()
    for m = 1, M, 97 do assert.is_true(yl[40][m] ~= yl[40][m], "NaN row") end
    x:select(1, 40):fill_(0)
    H.close(x:matmul(w:transpose(1, 2)), ref(x, w:transpose(1, 2)), TOL, "threaded LM head")
    local g = bf16({N, M})
    H.close(g:matmul(w), ref(g, w), TOL, "g @ W (K = 3000, K blocks)")
  end)

  it("f32 x against a bf16 weight stays f32 past 32 rows (never rounded to bf16)", function()
    local x, w = keng.randn({80, 300}), bf16({40, 300}, 0.1)
    local y = x:matmul(w:transpose(1, 2))
    assert.are.equal("f32", y.dtype)
    H.close(y, ref(x, w:transpose(1, 2)), 1e-5, "f32 x, N=80")
  end)
end)

describe("bf16 matmul with a transposed left operand", function()
  before_each(function() keng.manual_seed(21) end)

  it("gᵀ @ W and gᵀ @ Wᵀ match f64 at row tile, panel and K edges (odd K, K blocks)", function()
    for _, N in ipairs({1, 9, 33, 63, 65, 130}) do
      for _, K in ipairs({1, 2, 3, 33, 257, 300}) do
        for _, M in ipairs({1, 17, 33, 70}) do
          local gt = bf16({K, N}):transpose(1, 2)                      -- [N, K], unit row stride
          if N > 1 and K > 1 then assert.is_false(gt.is_contiguous) end
          local tag = string.format("N=%d K=%d M=%d", N, K, M)
          check(gt, bf16({K, M}, 0.1), "gT @ W " .. tag)
          check(gt, bf16({M, K}, 0.1):transpose(1, 2), "gT @ W^T " .. tag)
        end
      end
    end
  end)

  it("reads a padded transposed operand as it lies", function()
    local N, K, M = 70, 45, 37
    local gt = bf16({K, N + 6}):narrow(2, 4, N):transpose(1, 2)        -- column stride N + 6
    check(gt, bf16({K, M}, 0.1), "padded gT @ W")
  end)

  it("the bf16 weight gradient of linear past 32 rows (dW = gᵀ x) matches f64", function()
    local x, w = bf16({70, 33}), bf16({50, 33}, 0.1)
    w.requires_grad = true
    local g = bf16({70, 50})
    keng.linear(x, w):backward(g)
    H.close(w.grad, g:double():transpose(1, 2):matmul(x:double()), TOL, "w.grad")
    local x3, g3 = bf16({2, 35, 33}), bf16({2, 35, 50})                -- leading dims folded into K
    w.grad = nil
    keng.linear(x3, w):backward(g3)
    H.close(w.grad, g3:reshape({70, 50}):double():transpose(1, 2):matmul(x3:reshape({70, 33}):double()), TOL,
      "w.grad, 3-D x")
  end)
end)
