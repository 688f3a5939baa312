-- stream.lua — the memory roofline of this machine (keng.memory_bandwidth): a read-only sum and
-- the STREAM triad, GB/s (1e9 B/s), at 1 and 2 threads (or --threads N), over a buffer well past
-- the last-level cache (--mib, default 1024) and over a cache-sized one (--cache-mib, default 16:
-- the tiny presets' LM head). Decode rows quote their weight GB/s against the read column.
-- --gemv 1: then the bf16 GEMV (keng.linear of one bf16 row against a bf16 weight, batch-1
-- decode's product) per shape of the ~1B Mistral and the tiny presets' LM head, GB/s of weight
-- read and its % of the read figure of the same thread count measured in the same run (DRAM
-- shapes cycle through copies past --mib so no cache holds the weight; the 256-wide head is
-- L3-resident, against the --cache-mib read).
--
--   keng scripts/bench/stream.lua [--mib 1024] [--cache-mib 16] [--threads N] [--reps 5] [--gemv 0|1]
--        [--format text|json]
local here = (arg and arg[0] or ""):match("^(.*)/bench/[^/]*$")
if here then package.path = here .. "/?.lua;" .. here .. "/lib/?.lua;" .. package.path end
local keng = require "keng"

local o = {mib = 1024, ["cache-mib"] = 16, reps = 5, gemv = 0, format = "text"}
local i = 1
while i <= #arg do
  local key = arg[i]:match("^%-%-([%w_-]+)$")
  local v = arg[i + 1]
  if not key or (o[key] == nil and key ~= "threads") or v == nil then
    io.stderr:write("usage: keng scripts/bench/stream.lua [--mib 1024] [--cache-mib 16] [--threads N] [--reps 5] [--gemv 0|1] [--format text|json]\n")
    os.exit(2)
  end
  o[key] = key == "format" and v or math.tointeger(tonumber(v))
  if o[key] == nil then io.stderr:write("stream.lua: --" .. key .. " must be an integer\n") os.exit(2) end
  if key == "gemv" and o.gemv ~= 0 and o.gemv ~= 1 then io.stderr:write("stream.lua: --gemv must be 0 or 1\n") os.exit(2) end
  i = i + 2
end

local threads = o.threads and {o.threads} or {1, 2}
local rows = {}
for _, t in ipairs(threads) do
  for _, mib in ipairs({o.mib, o["cache-mib"]}) do
    local r = keng.memory_bandwidth{threads = t, mib = mib, reps = o.reps}
    rows[#rows + 1] = {threads = t, mib = mib, read = r.read, triad = r.triad}
  end
end

-- GEMV shapes {name, K, M, dram}: the 1B model's products (q and o [2048 -> 2048], k and v
-- [2048 -> 256], gate+up in one [2048 -> 11264], down [5632 -> 2048], LM head [2048 -> 32000])
-- and the tiny presets' head [256 -> 32000] (16 MiB, cache-resident)
local SHAPES = {
  {"q/o 2048->2048", 2048, 2048, true}, {"k/v 2048->256", 2048, 256, true},
  {"gate+up 2048->11264", 2048, 11264, true}, {"down 5632->2048", 5632, 2048, true},
  {"head 2048->32000", 2048, 32000, true}, {"tiny head 256->32000", 256, 32000, false},
}
local gemv = {}
if o.gemv ~= 0 then
  local read = {} -- [threads][dram] = read GB/s of this run
  for _, r in ipairs(rows) do
    read[r.threads] = read[r.threads] or {}
    read[r.threads][r.mib == o.mib] = r.read
  end
  keng.manual_seed(0)
  local prev = keng.num_threads()
  for _, sh in ipairs(SHAPES) do
    local name, K, M, dram = sh[1], sh[2], sh[3], sh[4]
    local one = K * M * 2
    local ncp = dram and o.mib * 1048576 // one + 1 or 1
    local ws = {}
    for c = 1, ncp do ws[c] = keng.full({M, K}, 0.01, {dtype = "bf16"}) end -- values do not change the speed
    local x = keng.randn({1, K}):to("bf16")
    for _, t in ipairs(threads) do
      keng.set_num_threads(t)
      keng.no_grad(function()
        for c = 1, ncp do keng.linear(x, ws[c]) end -- warm-up: page in, thread start
        local best = math.huge
        for _ = 1, (dram and o.reps or 20 * o.reps) do
          local t0 = keng.time()
          for c = 1, ncp do keng.linear(x, ws[c]) end
          best = math.min(best, (keng.time() - t0) / ncp)
        end
        local gbs = one / best / 1e9
        local ref = read[t] and read[t][dram]
        gemv[#gemv + 1] = {shape = name, K = K, M = M, threads = t, dram = dram, copies = ncp, us = best * 1e6,
                           gb_per_s = gbs, read = ref, pct = ref and 100 * gbs / ref}
      end)
    end
    ws = nil
    collectgarbage()
  end
  keng.set_num_threads(prev)
end

if o.format == "json" then
  print(require("keng.json").encode({schema = "keng-stream/1", rows = rows, gemv = #gemv > 0 and gemv or nil}))
else
  print("| threads | buffer MiB | read GB/s | triad GB/s |\n|---|---|---|---|")
  for _, r in ipairs(rows) do print(string.format("| %d | %d | %.1f | %.1f |", r.threads, r.mib, r.read, r.triad)) end
  if #gemv > 0 then
    print("\n| bf16 GEMV [1, K] x [M, K]^T | threads | us/call | weight GB/s | read GB/s | % of read |\n|---|---|---|---|---|---|")
    for _, g in ipairs(gemv) do
      print(string.format("| %s%s | %d | %.1f | %.1f | %s | %s |", g.shape, g.dram and "" or " (cache)", g.threads, g.us,
        g.gb_per_s, g.read and string.format("%.1f", g.read) or "-", g.pct and string.format("%.0f", g.pct) or "-"))
    end
  end
end
