-- decode_counts.lua — what one decode token costs in generate(): engine ops dispatched, host
-- reads (item / tolist / cpu: a sync on a GPU), tensors built from Lua values (keng.tensor),
-- and ms per token, for gemma_tiny and mistral_tiny (bf16, as the benchmark rows) at batch 1
-- and 32. Per token = (run with N2 new tokens - run with N1) / (N2 - N1), so prefill and setup
-- cancel; each run's time is the least of `reps` runs, in process CPU time (os.clock) unless
-- KENG_WALL=1 — on a shared machine CPU time is what stays comparable (run with
-- KENG_NUM_THREADS=1 for one thread's time). Runs the same way on the library before and
-- after a change:
--   ./build/keng scripts/bench/decode_counts.lua [reps]                  # this tree
--   KENG_HOME=/tmp/old ./build/keng scripts/bench/decode_counts.lua      # another scripts/ tree
local keng = require "keng"
local profile = require "keng.profile"

local reps = tonumber(arg and arg[1]) or 3
local P, N1, N2 = 6, 8, 56
local clock = os.getenv("KENG_WALL") == "1" and keng.time or os.clock

local counts = {sync = 0, lua_tensor = 0}
local mt = getmetatable(keng.zeros({1}))
local methods = mt.methods                                          -- the tensor methods table
for _, name in ipairs({"item", "tolist", "cpu"}) do
  local f = methods[name]
  methods[name] = function(...) counts.sync = counts.sync + 1; return f(...) end
end
local tensor = keng.tensor
keng.tensor = function(...) counts.lua_tensor = counts.lua_tensor + 1; return tensor(...) end

local function run(lm, prompts, new)
  return lm:generate(prompts, {max_length = P + new, stop_token_ids = {}})
end

-- one measurement: ops, syncs, Lua tensors and ms of a generate call with `new` tokens
local function measure(lm, prompts, new)
  counts.sync, counts.lua_tensor = 0, 0
  local p = profile.run(run, lm, prompts, new)
  local ops = 0
  for _, o in ipairs(p.ops) do ops = ops + o.calls end
  local c = {ops = ops, sync = counts.sync, lua_tensor = counts.lua_tensor}
  local best = math.huge
  for _ = 1, reps do
    local t0 = clock()
    run(lm, prompts, new)
    best = math.min(best, clock() - t0)
  end
  c.ms = best * 1000
  return c
end

print(string.format("%-14s %3s %10s %10s %12s %10s", "model", "B", "ops/token", "syncs/tok", "Lua tens/tok", "ms/token"))
for _, spec in ipairs({{"models.gemma", "gemma_tiny"}, {"models.mistral", "mistral_tiny"}}) do
  keng.manual_seed(0)
  local lm = require(spec[1]).from_preset(spec[2], {dtype = "bf16"})
  for _, B in ipairs({1, 32}) do
    local prompts = {}
    for b = 1, B do
      prompts[b] = {2}
      for j = 2, P do prompts[b][j] = 100 + (b * 7 + j * 13) % 900 end
    end
    run(lm, prompts, 2)                                             -- warm up
    local a, b = measure(lm, prompts, N1), measure(lm, prompts, N2)
    local function d(k) return (b[k] - a[k]) / (N2 - N1) end
    print(string.format("%-14s %3d %10.1f %10.2f %12.2f %10.3f", spec[2], B, d("ops"), d("sync"), d("lua_tensor"), d("ms")))
  end
end
