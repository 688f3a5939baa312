-- roofline.lua — each benchmark row's bound (compute or memory) and its % of that roofline.
--
-- A row's step needs at least max(flops / peak, bytes / bandwidth) seconds: the larger term is
-- its bound and that time over the measured one is its % of roofline.
--   flops: what the CPU performs (keng.flop_count_performed: Winograd convs count their 36
--          products per 6x6 tile, not the direct 9 per output), the direct count kept beside
--   bytes: counted for decode only (generate rows, roofline.decode_bytes): the weights once per
--          forward pass plus the KV cache each step attends. Fit and predict rows are batched
--          GEMMs and convolutions far above the machine's ridge point; their bytes are not
--          counted and they are marked compute-bound, with `bound_basis` saying so.
--   peak:  the CPU's best 1024³ matmul in the row's dtype (all.lua, cached), a GPU's datasheet
--   bandwidth: keng.memory_bandwidth's read-only STREAM figure when the engine has it, else
--          the stand-in of roofline.measure_bandwidth below; GB/s = 1e9 B/s.
-- Shape letters: B batch, P prompt tokens, L attended positions.
local keng = require "keng"

local roofline = {}

-- Bytes one generate() call reads (greedy, no early stop): max_length - P forward passes (the
-- prefill and each decode step but the last token's), each reading every weight once, and
-- the decode steps reading the K and V cache of the L = P + 1 .. max_length - 1 positions they
-- attend (at most `window` of them). An untied embedding table is only gathered (B rows), so
-- it is left out; a tied one is read whole as the LM head. Writes (new cache rows, logits) are
-- small and not counted. Returns the bytes and the weight bytes of one pass (the working set the
-- bandwidth is measured over: the tiny presets' ~20 MB stay in cache, a 1B model's do not).
--   cfg: {vocab, hidden, layers, kv_heads, head_dim, tie, window}; params: parameter count;
--   elem: bytes per weight and cache element (2 for bf16)
function roofline.decode_bytes(cfg, params, B, P, max_length, elem)
  for _, k in ipairs({"vocab", "hidden", "layers", "kv_heads", "head_dim"}) do
    if type(cfg[k]) ~= "number" then error("roofline.decode_bytes: cfg." .. k .. " must be a number", 2) end
  end
  if max_length <= P then error("roofline.decode_bytes: max_length must exceed the prompt length", 2) end
  local weights = (cfg.tie and params or params - cfg.vocab * cfg.hidden) * elem
  local kv_per_position = cfg.layers * 2 * cfg.kv_heads * cfg.head_dim * elem * B
  local bytes = (max_length - P) * weights
  for L = P + 1, max_length - 1 do bytes = bytes + kv_per_position * math.min(L, cfg.window or L) end
  return bytes, weights
end

-- Read bandwidth in GB/s and where it came from. keng.memory_bandwidth (the STREAM benchmark of
-- scripts/bench/stream.lua) when this build has it; else a stand-in: the best of `reps`
-- bf16 matrix-vector products [1, 4096] x [R, 4096]^T over a `mib` MiB matrix (past the caches),
-- which read every byte once — keng's own decode kernel, so a lower bound of what the memory
-- gives (x:sum() reached only 2.4 GB/s where this reads 22).
function roofline.measure_bandwidth(opts)
  opts = opts or {}
  local mib, reps = opts.mib or 1024, opts.reps or 5
  if keng.memory_bandwidth then
    local r = keng.memory_bandwidth{mib = mib, reps = reps}
    return r.read, roofline.bandwidth_source(mib)
  end
  local K = 4096
  local w = keng.ones({mib * 1024 * 1024 // 2 // K, K}, {dtype = "bf16"})  -- [R, K] bf16
  local x = keng.ones({1, K}, {dtype = "bf16"})
  local best = math.huge
  keng.no_grad(function()
    keng.linear(x, w)
    for _ = 1, reps do
      local t0 = keng.time()
      keng.linear(x, w)
      best = math.min(best, keng.time() - t0)
    end
  end)
  return mib * 1024 * 1024 / best / 1e9, roofline.bandwidth_source(mib)
end

-- what measure_bandwidth will use, in words (for the report)
function roofline.bandwidth_source(mib)
  mib = mib or 1024
  return keng.memory_bandwidth and ("keng.memory_bandwidth (STREAM read-only) over " .. mib .. " MiB")
    or ("stand-in: keng's bf16 GEMV over " .. mib .. " MiB, a lower bound (keng.memory_bandwidth not in this build)")
end

-- Fills r.bound ("compute" | "memory"), r.bound_basis, r.roofline_ms and r.pct_roofline from
-- r.flops_performed_per_step (else r.flops_per_step), r.bytes_per_step (nil: not counted) and
-- r.mean_ms, against peak_tflops and bandwidth_gbs (either may be nil). Returns r.
function roofline.classify(r, peak_tflops, bandwidth_gbs)
  local flops = r.flops_performed_per_step or r.flops_per_step
  local t_flops = (peak_tflops and flops and flops > 0) and flops / (peak_tflops * 1e12) or nil
  local t_bytes = (bandwidth_gbs and r.bytes_per_step) and r.bytes_per_step / (bandwidth_gbs * 1e9) or nil
  local t
  if t_bytes and (not t_flops or t_bytes >= t_flops) then
    r.bound, t = "memory", t_bytes
    r.bound_basis = "bytes / bandwidth >= flops / peak"
  elseif t_flops then
    r.bound, t = "compute", t_flops
    r.bound_basis = t_bytes and "flops / peak > bytes / bandwidth" or "flops / peak; bytes not counted (batched GEMM/conv)"
  end
  if t then
    r.roofline_ms = t * 1e3
    r.pct_roofline = r.mean_ms and r.mean_ms > 0 and 100 * r.roofline_ms / r.mean_ms or nil
  end
  return r
end

return roofline
