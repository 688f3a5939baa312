-- matmul_batch_spec.lua — batched products of small f32/f64 matrices (attention-style
-- [b, n, k] @ [b, k, m], sam's relative-position terms): engine/cpu/matmul.c runs their batch
-- entries in parallel, one single-threaded GEMM each, when every operand goes to BLAS as it
-- lies; transposed and strided operands, broadcast batch dims and 1, 2 and 3 threads must agree.
-- Reference: the naive sum (a:unsqueeze(-1) * b:unsqueeze(-3)):sum(-2) in f64.
local keng = require "keng"
local H = require "helper"

local function ref(a, b) return (a:double():unsqueeze(-1) * b:double():unsqueeze(-3)):sum(-2) end

describe("batched small matmul", function()
  local threads
  before_each(function() keng.manual_seed(11); threads = keng.num_threads() end)
  after_each(function() keng.set_num_threads(threads) end)

  it("matches f64 for sam's shapes, odd sizes, transposed and strided operands, 1, 2 and 3 threads", function()
    for _, nt in ipairs({1, 2, 3}) do
      keng.set_num_threads(nt)
      for _, s in ipairs({{7, 756, 64, 7}, {16, 192, 64, 16}, {5, 33, 17, 3}, {2, 100, 9, 40}, {64, 40, 13, 5}}) do
        local B, N, K, M = s[1], s[2], s[3], s[4]
        local tag = string.format("threads=%d [%d,%d,%d] @ [%d,%d,%d]", nt, B, N, K, B, K, M)
        local a, b = keng.randn{B, N, K}, keng.randn{B, K, M}
        H.close(a:matmul(b), ref(a, b), 1e-4, tag)
        local bt = keng.randn{B, M, K}:transpose(2, 3)              -- b read transposed
        H.close(a:matmul(bt), ref(a, bt), 1e-4, tag .. " b^T")
        local at = keng.randn{B, K, N}:transpose(2, 3)              -- a read transposed
        H.close(at:matmul(b), ref(at, b), 1e-4, tag .. " a^T")
        local wide = keng.randn{B, N, K + 5}:narrow(3, 3, K)         -- row stride K + 5
        H.close(wide:matmul(b), ref(wide, b), 1e-4, tag .. " strided a")
        local ad = a:double()
        H.close(ad:matmul(b:double()), ref(a, b), 1e-10, tag .. " f64")
      end
    end
  end)

  it("broadcast batch dims and non-contiguous batch strides", function()
    keng.set_num_threads(2)
    local a, b = keng.randn{4, 3, 50, 20}, keng.randn{3, 20, 6}         -- b broadcast over dim 1
    H.close(a:matmul(b), ref(a, b), 1e-4, "b broadcast")
    local a2 = keng.randn{3, 4, 50, 20}:transpose(1, 2)                -- batch dims out of order
    H.close(a2:matmul(b), ref(a2, b), 1e-4, "permuted batch")
    local b2 = keng.randn{4, 1, 20, 6}                                  -- a size-1 batch dim
    H.close(a:matmul(b2), ref(a, b2), 1e-4, "size-1 batch dim")
  end)
end)
