-- gemm_f32_bench.lua — the f32 linears of BERT fit/predict and SAM predict/fit through keng's
-- own ops (forward x·wᵀ + b, dx = g·w, dW = gᵀ·x), GFLOP/s from the fastest of `runs` wall-clock
-- calls. A/B against the previous paths (short-K kernel / OpenBLAS) with KENG_GEMM_F32=0:
--   KENG_NUM_THREADS=1 keng tests/lab/gemm_f32_bench.lua [runs]
--   KENG_NUM_THREADS=1 KENG_GEMM_F32=0 keng tests/lab/gemm_f32_bench.lua [runs]
-- The f32 FMA peak these figures compare with: build/lab_gemm_f32 --peak.
local keng = require "keng"
local runs = tonumber(arg[1]) or 9
local time = require("keng.bench").timer(runs)
keng.manual_seed(0)
print(string.format("keng %d threads, KENG_GEMM_F32=%s (GFLOP/s, fastest of %d wall-clock calls)", keng.num_threads(),
  os.getenv("KENG_GEMM_F32") or "2", runs))
-- {name, N rows, K in-features, M out-features}
local shapes = {
  {"bert qkv/out", 4096, 128, 128}, {"bert fc1", 4096, 128, 512}, {"bert fc2", 4096, 512, 128},
  {"sam mlp1", 1024, 192, 768}, {"sam mlp2", 1024, 768, 192}, {"sam qkv", 1764, 192, 576},
  {"sam neck", 1024, 256, 128},
}
print(string.format("%-14s %-22s %9s %9s %9s", "linear", "[N, K] x [M, K]ᵀ", "fwd+b", "dx=g·w", "dW=gᵀ·x"))
for _, s in ipairs(shapes) do
  local name, N, K, M = s[1], s[2], s[3], s[4]
  local x, w, b, g = keng.randn({N, K}), keng.randn({M, K}), keng.randn({M}), keng.randn({N, M})
  local flop = 2 * N * K * M
  local _, tf = time(function() return keng.linear(x, w, b) end)
  local _, tx = time(function() return g:matmul(w) end)
  local _, tw = time(function() return g.T:matmul(x) end)
  print(string.format("%-14s %-22s %9.1f %9.1f %9.1f", name, string.format("[%d,%d] x [%d,%d]ᵀ", N, K, M, K),
    flop / tf * 1e-9, flop / tx * 1e-9, flop / tw * 1e-9))
end
