-- kernels.lua — micro-benchmarks of the hot kernels on the CPU (not a test):
--   matmul f32 [2048, 2048] @ [2048, 2048]        -> GFLOP/s (2·N³ / median time)
--   the same in bf16 (matmul and linear, x @ Wᵀ), and a bf16 decode linear [1,4096] x
--   [16384,4096]ᵀ (a 128 MiB weight streamed from DRAM) -> GB/s of weight read
--   scaled_dot_product_attention q, k, v [8, 8, 512, 64] (B, H, T/S, D), f32 forward -> ms
--   then a table of attention shapes (the headline one and the CPU-tier models' own, from
--   scripts/models/*.lua) in f32 and bf16: forward, and forward + backward (gradients of q, k,
--   v for a fixed random upstream gradient) -> ms
-- Usage: keng scripts/bench/kernels.lua [runs=5] [threads] [cpu]
--   cpu: time with process CPU time (os.clock) instead of wall-clock, for one thread on a shared
--   machine (with more threads it sums them)
-- The peer with PyTorch is scripts/bench/peers/bench_torch.py.
local keng = keng or require "keng"
local runs = tonumber(arg and arg[1]) or 5
if arg and arg[2] then keng.set_num_threads(tonumber(arg[2])) end
local clock = arg and arg[3] == "cpu" and os.clock or keng.time

local time = require("keng.bench").timer(runs, clock)

keng.manual_seed(0)
print(string.format("keng %s, %d threads, median of %d runs%s", keng.version, keng.num_threads(), runs,
  clock == os.clock and ", process CPU time" or ""))

local N = 2048
local a, b = keng.randn({N, N}), keng.randn({N, N})
local tm = time(function() return a:matmul(b) end)
print(string.format("matmul f32 %dx%dx%d: %.1f ms, %.1f GFLOP/s", N, N, N, tm * 1e3, 2 * N ^ 3 / tm / 1e9))
-- bf16 in, f32 accumulate, bf16 out; x @ Wᵀ is the nn.Linear layout (the bf16 kernels' own)
local a16, w16 = a:to("bf16"), b:to("bf16")
tm = time(function() return a16:matmul(w16) end)
print(string.format("matmul bf16 %dx%dx%d: %.1f ms, %.1f GFLOP/s", N, N, N, tm * 1e3, 2 * N ^ 3 / tm / 1e9))
tm = time(function() return keng.linear(a16, w16) end)
print(string.format("linear bf16 [%d,%d] x [%d,%d]ᵀ: %.1f ms, %.1f GFLOP/s", N, N, N, N, tm * 1e3, 2 * N ^ 3 / tm / 1e9))
local x1 = keng.randn({1, 4096}):to("bf16")
local wd = keng.randn({16384, 4096}):to("bf16")   -- 128 MiB: a decode step's weight read from DRAM
tm = time(function() return keng.linear(x1, wd) end)
print(string.format("linear bf16 decode [1,4096] x [16384,4096]ᵀ: %.2f ms, %.1f GB/s of weight", tm * 1e3,
  16384 * 4096 * 2 / tm / 1e9))

local q, k, v = keng.randn({8, 8, 512, 64}), keng.randn({8, 8, 512, 64}), keng.randn({8, 8, 512, 64})
keng.no_grad(function()
  local ts = time(function() return keng.scaled_dot_product_attention(q, k, v) end)
  local tc = time(function() return keng.scaled_dot_product_attention(q, k, v, {causal = true}) end)
  print(string.format("sdpa f32 [8,8,512,64] forward: %.1f ms (causal %.1f ms), %.1f GFLOP/s", ts * 1e3, tc * 1e3,
    4 * 8 * 8 * 512 * 512 * 64 / ts / 1e9))
end)

-- attention table: name, q [B, H, T, D], k/v [B, Hkv, S, D], options; the mask (sam's
-- additive bias, [B, H, T, S] f32) is made per row
local shapes = {
  {"headline", {8, 8, 512, 64}, {8, 8, 512, 64}, {}},
  {"headline causal", {8, 8, 512, 64}, {8, 8, 512, 64}, {causal = true}},
  {"bert_tiny", {32, 2, 128, 64}, {32, 2, 128, 64}, {}},
  {"gemma_tiny fit", {8, 4, 128, 64}, {8, 4, 128, 64}, {causal = true}},
  {"mistral_tiny fit", {8, 8, 128, 32}, {8, 2, 128, 32}, {causal = true}},
  {"sam_tiny windowed", {25, 3, 49, 64}, {25, 3, 49, 64}, {bias = true}},
  {"sam_tiny global", {1, 3, 256, 64}, {1, 3, 256, 64}, {bias = true}},
  {"sd_tiny self", {26, 2, 256, 32}, {26, 2, 256, 32}, {}},
}
print("sdpa table: ms, median (fastest) of forward | of forward + backward")
for _, dt in ipairs({"f32", "bf16"}) do
  for _, row in ipairs(shapes) do
    local name, qs, ks, o = row[1], row[2], row[3], row[4]
    local q, k, v = keng.randn(qs):to(dt), keng.randn(ks):to(dt), keng.randn(ks):to(dt)
    local opts = {causal = o.causal}
    if o.bias then opts.mask = keng.randn({qs[1], qs[2], qs[3], ks[3]}) end
    local tf, tf_min
    keng.no_grad(function()
      tf, tf_min = time(function() return keng.scaled_dot_product_attention(q, k, v, opts) end)
    end)
    for _, t in ipairs({q, k, v}) do t.requires_grad = true end
    local g = keng.randn(qs):to(dt)
    local tb, tb_min = time(function()
      q.grad, k.grad, v.grad = nil, nil, nil
      keng.scaled_dot_product_attention(q, k, v, opts):backward(g)
    end)
    print(string.format("sdpa %-4s %-18s q [%s] kv [%s]%s: %7.2f (%7.2f) | %7.2f (%7.2f)", dt, name,
      table.concat(qs, ","), table.concat(ks, ","), o.causal and " causal" or "", tf * 1e3, tf_min * 1e3, tb * 1e3,
      tb_min * 1e3))
  end
end
