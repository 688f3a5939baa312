-- stream.lua — the memory roofline of this machine (keng.memory_bandwidth): a read-only sum and
-- the STREAM triad, GB/s (1e9 B/s), at 1 and 2 threads (or --threads N), over a buffer well past
-- the last-level cache (--mib, default 1024) and over a cache-sized one (--cache-mib, default 16:
-- the tiny presets' LM head). Decode rows quote their weight GB/s against the read column.
--
--   keng scripts/bench/stream.lua [--mib 1024] [--cache-mib 16] [--threads N] [--reps 5] [--format text|json]
local here = (arg and arg[0] or ""):match("^(.*)/bench/[^/]*$")
if here then package.path = here .. "/?.lua;" .. here .. "/lib/?.lua;" .. package.path end
local keng = require "keng"

local o = {mib = 1024, ["cache-mib"] = 16, reps = 5, format = "text"}
local i = 1
while i <= #arg do
  local key = arg[i]:match("^%-%-([%w_-]+)$")
  local v = arg[i + 1]
  if not key or (o[key] == nil and key ~= "threads") or v == nil then
    io.stderr:write("usage: keng scripts/bench/stream.lua [--mib 1024] [--cache-mib 16] [--threads N] [--reps 5] [--format text|json]\n")
    os.exit(2)
  end
  o[key] = key == "format" and v or math.tointeger(tonumber(v))
  if o[key] == nil then io.stderr:write("stream.lua: --" .. key .. " must be an integer\n") os.exit(2) end
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
if o.format == "json" then
  print(require("keng.json").encode({schema = "keng-stream/1", rows = rows}))
else
  print("| threads | buffer MiB | read GB/s | triad GB/s |\n|---|---|---|---|")
  for _, r in ipairs(rows) do print(string.format("| %d | %d | %.1f | %.1f |", r.threads, r.mib, r.read, r.triad)) end
end
