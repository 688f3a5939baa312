-- keng.bench — the one timing harness every benchmark uses (docs/benchmarks.md, "Timing rules").
--
--   local bench = require "keng.bench"
--   local r = bench.run(step_fn, {steps = 100, warmup = 1, items = 32})
--   r.mean_ms, r.median_ms, r.min_ms, r.stddev_ms, r.items_per_s, r.tflops
--
-- Rules: `warmup` untimed calls first (they build and compile); then `steps` timed calls, each
-- between two clock reads taken after keng.synchronize(), so queued device work is counted in
-- the step that queued it. The FLOPs the engine counted (keng.flop_count(): matmul, conv,
-- attention) over the timed steps give TFLOP/s; r.flops_performed_per_step counts what the CPU
-- executed (keng.flop_count_performed: fewer where Winograd skips products). `bench.run_diff` is the generate / diffusion
-- rule: (time of a long run - time of a short run) / difference, so fixed costs cancel.
-- `bench.graphed` turns a step into CUDA Graph replays on the GPU tier (fit and predict rows).
local keng = require "keng"
local options = require "keng.options"
local profile = require "keng.profile"

local bench = {}

local performed = keng.flop_count_performed or keng.flop_count

local function sync()
  if keng.cuda.is_available() then keng.synchronize() end
end

-- statistics of a list of numbers: mean, median, min, max, stddev (population, n; 0 for n < 2)
function bench.stats(xs)
  local n = #xs
  if n == 0 then error("bench.stats: empty sample", 2) end
  local sorted, sum = {}, 0
  for i, x in ipairs(xs) do sorted[i] = x; sum = sum + x end
  table.sort(sorted)
  local mean = sum / n
  local ss = 0
  for _, x in ipairs(xs) do ss = ss + (x - mean) ^ 2 end
  local median = n % 2 == 1 and sorted[(n + 1) // 2] or (sorted[n // 2] + sorted[n // 2 + 1]) / 2
  return {n = n, mean = mean, median = median, min = sorted[1], max = sorted[n],
          stddev = n > 1 and math.sqrt(ss / (n - 1)) or 0}
end

-- timer(runs, clock) -> time(fn) -> median seconds of `runs` calls of fn after one warm-up call
-- (a full collection before each, outside the clock), and the fastest: the micro-benchmarks'
-- one timer (scripts/bench/kernels.lua, tests/lab). clock: keng.time (wall clock, the default)
-- or os.clock (process CPU time: it sums every thread, so run those with one thread). On a shared
-- machine the median moves with the other jobs, the fastest much less.
function bench.timer(runs, clock)
  clock = clock or keng.time
  return function(fn)
    fn()
    local ts = {}
    for i = 1, runs do
      collectgarbage()
      local t0 = clock()
      fn()
      ts[i] = clock() - t0
    end
    local s = bench.stats(ts)
    return s.median, s.min
  end
end

-- fills the result table r from per-step seconds, FLOPs and items per step
local function finish(r, secs, flops, items, pflops)
  local s = bench.stats(secs)
  r.flops_performed_per_step = (pflops or flops) / s.n
  r.steps, r.times_ms = s.n, {}
  for i, t in ipairs(secs) do r.times_ms[i] = t * 1e3 end
  r.mean_ms, r.median_ms, r.min_ms, r.max_ms, r.stddev_ms =
    s.mean * 1e3, s.median * 1e3, s.min * 1e3, s.max * 1e3, s.stddev * 1e3
  r.flops_per_step = flops / s.n
  r.tflops = s.mean > 0 and r.flops_per_step / s.mean / 1e12 or 0
  if items then r.items_per_s = s.mean > 0 and items / s.mean or 0 end
  return r
end

-- Times fn(i) for opts.steps (default 100) calls after opts.warmup (default 1) untimed calls.
-- opts.items: items per step (samples, tokens) for items/s; opts.on_step(i, steps, ms) is called
-- after each timed step (live progress); opts.gc: run a full collection before each step
-- outside the clock (default true, so one step's garbage is not charged to the next).
-- opts.profile: also profile the timed steps op by op (keng.profile; it times every op, so the
-- step times then include that small cost); r.profile is the profile of one step.
function bench.run(fn, opts)
  opts = options.check("bench.run", opts, {"steps", "warmup", "items", "on_step", "gc", "profile"})
  if type(fn) ~= "function" then error("bench.run: expected a function, got " .. type(fn), 2) end
  local steps, warmup = opts.steps or 100, opts.warmup or 1
  if steps < 1 then error("bench.run: steps must be >= 1, got " .. tostring(steps), 2) end
  local gc = opts.gc ~= false
  for i = 1, warmup do fn(-i) end
  local secs, flops, profiles, pflops = {}, 0, {}, 0
  for i = 1, steps do
    if gc then collectgarbage() end
    sync()
    if opts.profile then profile.start() end
    local f0, p0, t0 = keng.flop_count(), performed(), keng.time()
    fn(i)
    sync()
    local t1, f1 = keng.time(), keng.flop_count()
    pflops = pflops + (performed() - p0)
    if opts.profile then profiles[i] = {profile.stop(), 1 / steps} end
    secs[i], flops = t1 - t0, flops + (f1 - f0)
    if opts.on_step then opts.on_step(i, steps, secs[i] * 1e3) end
  end
  local r = finish({warmup = warmup}, secs, flops, opts.items, pflops)
  if opts.profile then r.profile = profile.combine(profiles) end
  return r
end

-- The difference rule: fn(k) runs the workload with k repetitions inside (k generate() calls,
-- or k diffusion steps). After one untimed fn(short), times fn(short) and fn(long) `repeats`
-- times (default 1) and reports (t_long - t_short) / (long - short) per repetition; the sample
-- kept in times_ms is one value per repeat. Defaults short = 1, long = short + opts.steps.
-- opts.clock: the clock in seconds (keng.time, the wall clock, by default; the spec passes a
-- simulated one, so the rule is checked exactly whatever the machine's load).
function bench.run_diff(fn, opts)
  opts = options.check("bench.run_diff", opts, {"short", "long", "steps", "repeats", "items", "on_step", "profile",
    "clock"})
  local now = opts.clock or keng.time
  local short = opts.short or 1
  local long = opts.long or short + (opts.steps or 100)
  if long <= short then error("bench.run_diff: long must exceed short", 2) end
  local repeats = opts.repeats or 1
  fn(short)
  local per, flops, raw, profiles, pflops = {}, 0, {}, {}, 0
  for i = 1, repeats do
    local function clock(k)
      collectgarbage()
      sync()
      if opts.profile then profile.start() end
      local f0, p0, t0 = keng.flop_count(), performed(), now()
      fn(k)
      sync()
      local t, f, pf = now() - t0, keng.flop_count() - f0, performed() - p0
      if opts.profile then      -- per repetition by the same rule: (long - short) / (long - short)
        local w = (k == long and 1 or -1) / ((long - short) * repeats)
        profiles[#profiles + 1] = {profile.stop(), w}
      end
      return t, f, pf
    end
    local ts, fs, ps = clock(short)
    local tl, fl, pl = clock(long)
    raw[i] = {short_ms = ts * 1e3, long_ms = tl * 1e3}               -- kept: noise can make tl < ts
    per[i] = math.max(tl - ts, 0) / (long - short)
    flops = flops + math.max(fl - fs, 0) / (long - short)
    pflops = pflops + math.max(pl - ps, 0) / (long - short)
    if opts.on_step then opts.on_step(i, repeats, per[i] * 1e3) end
  end
  local r = finish({warmup = 1, short = short, long = long}, per, flops, opts.items, pflops)
  r.steps, r.raw = long - short, raw
  if opts.profile then r.profile = profile.combine(profiles) end
  return r
end

-- decode_per_token(lm, prompts, {tokens = 64, repeats = 3}) -> seconds per generated token, wall
-- and process CPU time (which a busy machine inflates less; summed over threads): the difference
-- of two greedy generate calls (prompts + tokens new tokens, and + 1) over tokens - 1, so prefill
-- and the call's fixed cost drop out; the best of `repeats` pairs (a shared machine only ever slows
-- a run), after a 2-token warm-up that touches every weight page once. prompts: [B, P] ids. The
-- decode rows time with it: scripts/bench/decode.lua, tests/lab/quant_1b.lua. opts.clock /
-- opts.cpu_clock replace keng.time / os.clock (the spec's simulated ones).
function bench.decode_per_token(lm, prompts, opts)
  local who = "bench.decode_per_token"
  opts = options.check(who, opts, {"tokens", "repeats", "clock", "cpu_clock"})
  local tokens = options.integer(who, "tokens", opts.tokens or 64, 2)
  local repeats = options.integer(who, "repeats", opts.repeats or 3, 1)
  local now, cpu = opts.clock or keng.time, opts.cpu_clock or os.clock
  local function gen(n)
    collectgarbage()
    local t0, c0 = now(), cpu()
    lm:generate(prompts, {max_new_tokens = n, sampler = "greedy", stop_token_ids = {}})
    return now() - t0, cpu() - c0
  end
  local best, best_cpu = math.huge, math.huge
  keng.no_grad(function()
    gen(2)                                                          -- warm-up
    for _ = 1, repeats do
      local long, long_cpu = gen(tokens)
      local short, short_cpu = gen(1)
      best = math.min(best, (long - short) / (tokens - 1))
      best_cpu = math.min(best_cpu, (long_cpu - short_cpu) / (tokens - 1))
    end
  end)
  return best, best_cpu
end

-- ---- CUDA Graphs on the GPU tier -------------------------------------------------------------

-- true when a step may be replayed through keng.cuda.graph: the GPU tier (ctx.tier == "gpu") on a
-- cuda device with CUDA available, unless ctx.graph == false. The CPU tier never is.
function bench.graphable(ctx)
  return type(ctx) == "table" and ctx.tier == "gpu" and ctx.graph ~= false and type(ctx.device) == "string"
    and ctx.device:sub(1, 4) == "cuda" and keng.cuda.is_available() and type(keng.cuda.graph) == "function"
end

-- bench.graphed(fn, ctx) -> step, warmup, info. fn() takes no arguments (its inputs are closed
-- over and used in place, as a captured graph reads them). When bench.graphable(ctx): step()
-- runs fn eagerly on its first call (algorithm choices, workspaces and optimizer state settle),
-- captures it into a keng.cuda.graph on the second (capture + first launch) and replays the graph
-- after that, so `warmup` = 2 untimed calls leave only replays to time. A capture that fails (fn
-- reads a value on the host, say) falls back to fn for good, and info.graph_error says why;
-- info.graph tells whether the timed steps were replays. Otherwise step = fn, warmup = 1 and
-- info.graph = false: the CPU tier times exactly what it did before.
function bench.graphed(fn, ctx)
  local info = {graph = false}
  if not bench.graphable(ctx) then return function() return fn() end, 1, info end
  local g = keng.cuda.graph(fn, {warmup = 1, device = ctx.device})
  local eager = false
  local function step()
    if eager then return fn() end
    local res = table.pack(pcall(g))
    if res[1] then
      info.graph = g:captured()
      return table.unpack(res, 2, res.n)
    end
    if g:captured() then error(res[2], 0) end                        -- a replay failed: a real error
    eager, info.graph, info.graph_error = true, false, tostring(res[2])
    return fn()
  end
  return step, 2, info
end

-- a number with `digits` decimals (default 2), "-" for nil
function bench.fmt(x, digits)
  if x == nil then return "-" end
  if type(x) ~= "number" then return tostring(x) end
  return string.format("%." .. (digits or 2) .. "f", x)
end

return bench
