-- pool_shapes.lua — the f32 products of SAM predict and BERT fit (the bulk of those rows), one
-- at a time: median ms of R calls each, then keng's pool counters (keng.thread_policy().pool).
-- Used for docs/kernels.md, "keng's pool"; with a busy core: scripts/bench/busy.sh's setting.
--   keng scripts/bench/pool_shapes.lua [R]
local shapes = {
  {"4096x128x512", {4096, 128}, {128, 512}},  -- BERT linears, forward
  {"128x4096x128", {128, 4096}, {4096, 128}}, -- BERT weight gradients
  {"512x4096x128", {512, 4096}, {4096, 128}},
  {"1024x768x192", {1024, 768}, {768, 192}},  -- SAM MLP
  {"1764x192x576", {1764, 192}, {192, 576}},  -- SAM windowed qkv
  {"1024x256x128", {1024, 256}, {256, 128}},  -- SAM neck
}
local R = tonumber(arg and arg[1]) or 30
for _, s in ipairs(shapes) do
  local a, b = keng.randn(s[2]), keng.randn(s[3])
  local t = {}
  for i = 1, R do
    local t0 = keng.time()
    a:matmul(b)
    t[i] = keng.time() - t0
  end
  table.sort(t)
  io.write(string.format("%-14s %7.3f ms\n", s[1], t[R // 2 + 1] * 1e3))
end
local p = keng.thread_policy()
io.write(string.format("threads %d (%s)", p.current, p.source))
if p.pool then -- absent before keng's pool
  io.write(string.format("; pool: loops %d, worker chunks %d, waits > 0.1 ms %d (%.1f ms)", p.pool.loops,
    p.pool.worker_chunks, p.pool.long_waits, p.pool.long_wait_ms))
end
io.write("\n")
