-- gemm_bf16_bench.lua — times the bf16 products of the LLM fit rows and 2048³ through the ops
-- (a:matmul(b), keng.linear(x, W), gᵀ:matmul(x) for dW), for A/B runs of engine/cpu/gemm_bf16.c
-- (not a test). The PyTorch peer is gemm_bf16_bench.py (same rows, same output format).
-- Usage: keng tests/lab/gemm_bf16_bench.lua [threads=1] [runs=5] [row filter, a plain substring]
-- Prints per row: median ms of `runs` calls after one warm-up, GFLOP/s.
local keng = keng or require "keng"
local th, runs, which = tonumber(arg and arg[1]) or 1, tonumber(arg and arg[2]) or 5, arg and arg[3]
keng.set_num_threads(th)
keng.manual_seed(0)

local time = require("keng.bench").timer(runs, keng.time)      -- wall clock: the runs use threads

-- name, shape of a, shape of b, kind: "mm" a @ b, "lin" linear(a, b) = a @ bᵀ, "tn" aᵀ @ b
-- (a transposed view: dW = gᵀ x with g = a [N, O], x = b [N, I])
local rows = {
  {"mm 2048^3", {2048, 2048}, {2048, 2048}, "mm"},
  {"mm [1024,256]x[256,768]", {1024, 256}, {256, 768}, "mm"},
  {"mm [1024,768]x[768,256]", {1024, 768}, {768, 256}, "mm"},
  {"mm [1024,256]x[256,32000]", {1024, 256}, {256, 32000}, "mm"},
  {"lin [1024,256]x[768,256]T", {1024, 256}, {768, 256}, "lin"},
  {"lin [1024,256]x[32000,256]T", {1024, 256}, {32000, 256}, "lin"},
  {"lin 2048^3", {2048, 2048}, {2048, 2048}, "lin"},
  {"mm [1024,32000]x[32000,256]", {1024, 32000}, {32000, 256}, "mm"},
  {"mm [1024,1024]x[1024,256]", {1024, 1024}, {1024, 256}, "mm"},
  {"dW gT[256,1024]x[1024,768]", {1024, 256}, {1024, 768}, "tn"},
  {"dW gT[768,1024]x[1024,256]", {1024, 768}, {1024, 256}, "tn"},
  {"dW gT[32000,1024]x[1024,256]", {1024, 32000}, {1024, 256}, "tn"},
}
for _, r in ipairs(rows) do
  if not which or r[1]:find(which, 1, true) then
    local a = keng.randn(r[2]):to("bf16")
    local b = keng.randn(r[3]):to("bf16")
    local fn, N, K, M
    if r[4] == "mm" then
      fn, N, K, M = function() return a:matmul(b) end, r[2][1], r[2][2], r[3][2]
    elseif r[4] == "lin" then
      fn, N, K, M = function() return keng.linear(a, b) end, r[2][1], r[2][2], r[3][1]
    else
      local at = a:transpose(1, 2)
      fn, N, K, M = function() return at:matmul(b) end, r[2][2], r[2][1], r[3][2]
    end
    local m = time(fn)
    print(string.format("%-32s %d thr: %8.2f ms  %6.1f GFLOP/s", r[1], th, m * 1e3, 2 * N * M * K / m / 1e9))
  end
end
