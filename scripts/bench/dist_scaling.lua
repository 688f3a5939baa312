-- dist_scaling.lua — data-parallel scaling of the BERT fit row (bench config `bert_fit`, CPU tier:
-- bert_tiny classifier, global batch 32, T 128, sparse CE, AdamW, f32; docs/distributed.md):
-- the same global batch at 1 rank and at N ranks, each rank taking its B/N rows and
-- keng.distributed.data_parallel averaging the gradients in buckets during backward. Each rank
-- runs KENG_NUM_THREADS threads (default 1: one core per rank, so that N ranks use N cores).
--
--   keng scripts/bench/dist_scaling.lua [--ranks 2] [--steps 20] [--warmup 2] [--threads 1] [--json out.json]
--
-- starts the runs itself (`keng --nproc N` for N ranks) and prints one row: the median step time
-- at 1 and N ranks, samples/s, the speedup and the scaling efficiency = speedup / N (1: perfect),
-- and the CPU time a step costs over all ranks (1-rank CPU time / N-rank CPU time: the work
-- efficiency, which a machine busy with other jobs distorts far less than the wall clock).
-- With --child it is one of those runs (prints `result <json>` on rank 0).
local keng = require "keng"
local json = require "keng.json"

-- make `require "bench.x"` work from any working directory
local here = (arg and arg[0] or ""):match("^(.*)/bench/[^/]*$")
if here then package.path = here .. "/?.lua;" .. here .. "/lib/?.lua;" .. package.path end

local function flag(name, default)
  for i = 1, #arg do if arg[i] == "--" .. name then return arg[i + 1] end end
  return default
end
local function has(name) for i = 1, #arg do if arg[i] == "--" .. name then return true end end return false end

-- every argument is a known option (with its value) or the run stops naming it
do
  local takes = {steps = true, ranks = true, threads = true, warmup = true, json = true, child = false}
  local i = 1
  while i <= #arg do
    local name = arg[i]:match("^%-%-(.+)$")
    if takes[name] == nil then
      error("dist_scaling: unknown argument '" .. arg[i] .. "' (valid: --ranks N --steps N --warmup N --threads N --json FILE)", 0)
    end
    i = i + (takes[name] and 2 or 1)
  end
end

local STEPS = math.tointeger(tonumber(flag("steps", "20")))
local RANKS = math.tointeger(tonumber(flag("ranks", "2")))
local THREADS = math.tointeger(tonumber(flag("threads", "1")))
local WARMUP = math.tointeger(tonumber(flag("warmup", "2")))
for name, v in pairs({steps = STEPS, ranks = RANKS, threads = THREADS, warmup = WARMUP}) do
  if not v or v < (name == "warmup" and 0 or 1) then error("dist_scaling: --" .. name .. " needs a whole number", 0) end
end

-- one run (world size 1 or N): the median step time on rank 0
local function child()
  local dist = require "keng.distributed"
  local bert, optim = require "models.bert", require "keng.optim"
  local train, bench = require "keng.train", require "keng.bench"
  local config, common = require "bench.config", require "bench.common"
  dist.init()
  local row
  for _, r in ipairs(config.rows) do if r.id == "bert_fit" then row = r end end
  local B, T = row.batch, row.cpu.seq
  keng.manual_seed(0)
  local model = bert.from_preset(row.cpu.preset, {num_classes = row.num_classes, dtype = "f32"})
  local ids = common.bert_tokens(B, T, config.cpu_vocab.bert)                -- [B, T], the global batch
  local labels = {}
  for i = 1, B do labels[i] = (i - 1) % 2 end
  local mine = dist.shard_rows(B)                                            -- this rank's rows
  local n = mine:numel()
  local x = {token_ids = ids:index_select(1, mine), segment_ids = keng.zeros({n, T}, {dtype = "i64"}),
             padding_mask = keng.ones({n, T}, {dtype = "i64"})}
  local y = keng.tensor(labels, {dtype = "i64"}):index_select(1, mine)
  local dp = dist.data_parallel(model)
  local opt = optim.AdamW(model:parameters(), row.optimizer)
  dp:train()
  local c0
  local r = bench.run(function(i)
    if i == 1 then c0 = os.clock() end
    train.step(dp, x, y, opt, function(logits, l) return keng.cross_entropy(logits:float(), l) end)
  end, {steps = STEPS, warmup = WARMUP, items = B})
  -- CPU seconds per step, summed over the ranks (os.clock: this process's threads; it includes the
  -- collectives' polling): the work a step costs, which a busy machine's scheduling does not inflate
  local cpu = dist.all_reduce(keng.tensor({(os.clock() - c0) / STEPS}, {dtype = "f64"})):item()
  if dist.rank() == 0 then
    print("result " .. json.encode({ranks = dist.world_size(), threads = keng.num_threads(), cpu_ms = cpu * 1e3,
      median_ms = r.median_ms, min_ms = r.min_ms, preset = row.cpu.preset, batch = B, seq = T,
      buckets = dp.last_sync and dp.last_sync.buckets,
      started_in_backward = dp.last_sync and dp.last_sync.started_in_backward}))
  end
end

if has("child") then return child() end

-- the driver: the 1-rank and N-rank runs as child processes, the row from their results
local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local exe = arg[-1] or "keng"
local script = arg[0]
local function run(n)
  local env = "KENG_NUM_THREADS=" .. THREADS .. " OMP_NUM_THREADS=" .. THREADS .. " "
  local cmd = env .. q(exe) .. (n > 1 and (" --nproc " .. n) or "") .. " " .. q(script) ..
    " --child --steps " .. STEPS .. " --warmup " .. WARMUP
  local p = io.popen(cmd .. " 2>&1", "r")
  local out = p:read("a")
  p:close()
  local res = out:match("result (%b{})")
  if not res then error("dist_scaling: the " .. n .. "-rank run failed:\n" .. out, 0) end
  return json.decode(res)
end

local one, many = run(1), run(RANKS)
local speedup = one.median_ms / many.median_ms
local row = {bench = "bert_fit data-parallel scaling", preset = one.preset, global_batch = one.batch, seq = one.seq,
             threads_per_rank = THREADS, steps = STEPS, ranks = RANKS,
             ms_1 = one.median_ms, ms_n = many.median_ms, samples_per_s_1 = one.batch / one.median_ms * 1e3,
             samples_per_s_n = many.batch / many.median_ms * 1e3, speedup = speedup, efficiency = speedup / RANKS,
             cpu_ms_1 = one.cpu_ms, cpu_ms_n = many.cpu_ms, cpu_efficiency = one.cpu_ms / many.cpu_ms,
             load_average = (io.open("/proc/loadavg") or {read = function() end}):read("n"),
             buckets = many.buckets, buckets_started_in_backward = many.started_in_backward,
             cores = keng.thread_policy().max, date = os.date("!%Y-%m-%d %H:%M UTC")}
print(string.format("BERT fit (%s, global batch %d, T %d, %d thread(s) per rank, median of %d steps)",
  row.preset, row.global_batch, row.seq, THREADS, STEPS))
print(string.format("  1 rank:  %8.1f ms/step  %7.1f samples/s", row.ms_1, row.samples_per_s_1))
print(string.format("  %d ranks: %8.1f ms/step  %7.1f samples/s  speedup %.2fx  scaling efficiency %.0f%%",
  RANKS, row.ms_n, row.samples_per_s_n, speedup, 100 * row.efficiency))
print(string.format("  CPU time per step (all ranks): 1 rank %.1f ms, %d ranks %.1f ms: work efficiency %.0f%%" ..
  " (load average %s)", row.cpu_ms_1, RANKS, row.cpu_ms_n, 100 * row.cpu_efficiency, tostring(row.load_average)))
local out = flag("json")
if out then
  local f = assert(io.open(out, "w"))
  f:write(json.encode(row, {indent = "  "}), "\n")
  f:close()
end
