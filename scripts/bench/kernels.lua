-- kernels.lua — micro-benchmarks of two hot kernels, f32 on the CPU (not a test):
--   matmul [2048, 2048] @ [2048, 2048]            -> GFLOP/s (2·N³ / median time)
--   scaled_dot_product_attention q, k, v [8, 8, 512, 64] (B, H, T/S, D), forward -> ms
-- Usage: keng scripts/bench/kernels.lua [runs=5] [threads]
-- The peer with PyTorch is tests/fixtures/gen/bench_torch.py.
local keng = keng or require "keng"
local runs = tonumber(arg and arg[1]) or 5
if arg and arg[2] then keng.set_num_threads(tonumber(arg[2])) end

local function median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) // 2] or (xs[n // 2] + xs[n // 2 + 1]) / 2
end

-- median wall-clock seconds of fn over `runs` calls, after one warm-up call
local function time(fn)
  fn()
  local ts = {}
  for i = 1, runs do
    collectgarbage()
    local t0 = keng.time()
    fn()
    ts[i] = keng.time() - t0
  end
  return median(ts)
end

keng.manual_seed(0)
print(string.format("keng %s, %d threads, median of %d runs", keng.version, keng.num_threads(), runs))

local N = 2048
local a, b = keng.randn({N, N}), keng.randn({N, N})
local tm = time(function() return a:matmul(b) end)
print(string.format("matmul f32 %dx%dx%d: %.1f ms, %.1f GFLOP/s", N, N, N, tm * 1e3, 2 * N ^ 3 / tm / 1e9))

local q, k, v = keng.randn({8, 8, 512, 64}), keng.randn({8, 8, 512, 64}), keng.randn({8, 8, 512, 64})
keng.no_grad(function()
  local ts = time(function() return keng.scaled_dot_product_attention(q, k, v) end)
  local tc = time(function() return keng.scaled_dot_product_attention(q, k, v, {causal = true}) end)
  print(string.format("sdpa f32 [8,8,512,64] forward: %.1f ms (causal %.1f ms), %.1f GFLOP/s", ts * 1e3, tc * 1e3,
    4 * 8 * 8 * 512 * 512 * 64 / ts / 1e9))
end)
