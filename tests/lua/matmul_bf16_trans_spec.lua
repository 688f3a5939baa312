-- matmul_bf16_trans_spec.lua — bf16 products whose left operand is a transposed bf16 tensor
-- (unit row stride), as gᵀ in the weight gradient dW = gᵀ x: past 32 rows, on a CPU with
-- AVX512_BF16, engine/cpu/gemm_bf16.c's packed kernel reads gᵀ as it lies (it packs its columns);
-- elsewhere they take convert + sgemm. Shapes: g [K, N] (gᵀ [N, K]), W [K, M] or [M, K].
-- Reference: the naive sum in f64 of the same bf16 values; the result is bf16, so the tolerance
-- is its rounding (2^-8 relative) plus f32 sums.
local keng = require "keng"
local H = require "helper"

local TOL = 5e-3

local function ref(a, b) return (a:double():unsqueeze(-1) * b:double():unsqueeze(-3)):sum(-2) end
local function bf16(shape, scale) return (keng.randn(shape) * (scale or 1)):to("bf16") end

local function check(a, b, msg)
  local y = a:matmul(b)
  assert.are.equal("bf16", y.dtype)
  H.close(y, ref(a, b), TOL, msg)
end

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
