-- all.lua — the benchmark suite: every row of the Keras 3 table (docs/benchmarks.md).
--
--   keng scripts/bench/all.lua [--tier cpu|gpu] [--only bert,gemma_fit] [--steps N]
--        [--dtype f32|bf16|keras] [--format md|csv|json] [--out DIR] [--compare FILE.json]
--        [--profile N] [--tf32 | --no-tf32] [--quantize int8|int4]
--
-- Rows come from scripts/bench/config.lua and run through the bench file config.runners names for
-- their family. A row whose model or bench file is not there prints "not implemented"; a row that
-- raises prints "failed: <reason>" and the suite goes on, exiting 1 at the end. Writes
-- DIR/<date>-<tier>.json, .md and .png (default DIR bench-results). docs/benchmarks.md explains it.
local keng = keng or require "keng"

-- make `require "bench.x"` work from any working directory
local here = (arg and arg[0] or ""):match("^(.*)/bench/[^/]*$")
if here then package.path = here .. "/?.lua;" .. here .. "/lib/?.lua;" .. package.path end

local bench = require "keng.bench"
local profile = require "keng.profile"
local progress = require "keng.progress"
local config = require "bench.config"
local json = require "keng.json"
local roofline = require "bench.roofline"

------------------------------------------------------------------------------------------------
-- command line

local usage = [[usage: keng scripts/bench/all.lua [--tier cpu|gpu] [--only a,b] [--steps N]
       [--dtype f32|bf16|keras] [--format md|csv|json] [--out DIR] [--compare FILE.json]
       [--profile N] [--tf32 | --no-tf32] [--quantize int8|int4]
  --only takes families (bert, gemma, mistral, sam, stable_diffusion/sd) or row ids (bert_fit, ...)
  --profile N prints each row's N costliest ops and op shapes per timed step (keng.profile; the
              JSON keeps them under "profile")
  --tf32 / --no-tf32 set keng.backends.allow_tf32 for the run (TF32 tensor cores for f32 matmul,
              conv and the attention math route on cuda; default on for --tier gpu, as Keras ran
              its f32 rows on the A100, off for --tier cpu, where it changes nothing); the JSON
              records it as "tf32" and the header line prints it
  --quantize int8|int4 adds, after each generate row, the same row with keng.quantize(lm, fmt)
              weights (row "<name> int8", id "<id>_int8"); generate rows show ms and weight
              bytes read per decoded token side by side (JSON: quantize, ms_per_token,
              weight_bytes_per_token)]]

local function die(msg)
  io.stderr:write("all.lua: ", msg, "\n", usage, "\n")
  os.exit(2)
end

local function parse(argv)
  local o = {dtype = "keras", format = "md", out = "bench-results"}
  local i = 1
  while i <= #argv do
    local a = argv[i]
    local key, val = a:match("^%-%-([%w_]+)=(.*)$")
    if a == "--tf32" or a == "--no-tf32" then
      o.tf32 = a == "--tf32"
      key = "tf32"
    elseif not key then
      key = a:match("^%-%-([%w_]+)$")
      if not key then die("unexpected argument '" .. a .. "'") end
      if key == "help" then print(usage); os.exit(0) end
      val = argv[i + 1]
      if val == nil then die("--" .. key .. " needs a value") end
      i = i + 1
    end
    if key == "tf32" then
      if a ~= "--tf32" and a ~= "--no-tf32" then die("--tf32 and --no-tf32 take no value") end
    elseif key == "tier" or key == "dtype" or key == "format" or key == "out" or key == "compare" or key == "only"
        or key == "quantize" then
      o[key] = val
    elseif key == "profile" then
      o.profile = tonumber(val)
      if not o.profile or o.profile < 1 or o.profile % 1 ~= 0 then die("--profile must be a positive integer") end
    elseif key == "steps" then
      o.steps = tonumber(val)
      if not o.steps or o.steps < 1 or o.steps % 1 ~= 0 then die("--steps must be a positive integer") end
    else
      die("unknown option --" .. key)
    end
    i = i + 1
  end
  o.tier = o.tier or (keng.cuda.is_available() and "gpu" or "cpu")
  if o.tier ~= "cpu" and o.tier ~= "gpu" then die("--tier must be cpu or gpu") end
  if o.tier == "gpu" and not keng.cuda.is_available() then die("--tier gpu needs a CUDA device (none found)") end
  if o.dtype ~= "keras" and o.dtype ~= "f32" and o.dtype ~= "bf16" then die("--dtype must be f32, bf16 or keras") end
  if o.format ~= "md" and o.format ~= "csv" and o.format ~= "json" then die("--format must be md, csv or json") end
  if o.quantize and o.quantize ~= "int8" and o.quantize ~= "int4" then die("--quantize must be int8 or int4") end
  o.steps = o.steps or config.default_steps[o.tier]
  if o.tf32 == nil then o.tf32 = o.tier == "gpu" end
  return o
end

local opts = parse(arg or {})
keng.backends.allow_tf32 = opts.tf32

local aliases = {sd = "stable_diffusion"}
local function selected(row)
  if not opts.only then return true end
  for name in opts.only:gmatch("[^,%s]+") do
    name = aliases[name] or name
    if name == row.family or name == row.id then return true end
  end
  return false
end

------------------------------------------------------------------------------------------------
-- the machine

local function popen_line(cmd)
  local p = io.popen(cmd .. " 2>/dev/null")
  if not p then return nil end
  local s = p:read("l")
  p:close()
  return s and s ~= "" and s or nil
end

local function cpu_name()
  local f = io.open("/proc/cpuinfo")
  local name
  if f then
    for line in f:lines() do
      name = line:match("^model name%s*:%s*(.-)%s*$")
      if name then break end
    end
    f:close()
  end
  return name or "unknown cpu"
end

local device = opts.tier == "gpu" and "cuda" or "cpu"
local device_name = opts.tier == "gpu"
  and (popen_line("nvidia-smi --query-gpu=name --format=csv,noheader") or "cuda")
  or cpu_name()
local threads = keng.num_threads()
local commit = popen_line("git rev-parse --short=12 HEAD") or "unknown"
local date = os.date("%Y-%m-%d")

-- peak TFLOP/s for a dtype: the known-GPU table, or a short matmul probe on the CPU (the best of
-- a few 1024³ products in that dtype, matmul or linear), cached in DIR/cpu-peak.json per cpu, threads and dtype
-- a CPU figure measured once per cpu, thread count and name, cached in DIR/cpu-peak.json
local function cpu_cached(name, measure)
  local file, key = opts.out .. "/cpu-peak.json", device_name .. " / " .. threads .. " threads / " .. name
  -- a corrupt cache stops the run rather than being silently measured over (delete it to re-measure)
  local ok, c = pcall(require("keng.util").read_json, file, "cpu-peak cache", 1)
  if not ok then die(tostring(c) .. " (delete the file to measure the peaks again)") end
  local cache = c or {}
  if type(cache[key]) == "number" then return cache[key] end
  local v = measure()
  cache[key] = v
  os.execute("mkdir -p '" .. opts.out .. "'")
  local w, err = io.open(file, "w")
  if not w then die("cannot write the cpu-peak cache: " .. tostring(err)) end
  w:write(json.encode(cache, {indent = "  "}), "\n")
  w:close()
  return v
end

local peaks = {}
local function peak_tflops(dtype)
  if peaks[dtype] ~= nil then return peaks[dtype] or nil end
  local p
  if opts.tier == "gpu" then
    for _, g in ipairs(config.gpu_peaks) do
      -- f32 under TF32 is measured against the TF32 tensor-core peak, where the GPU has one
      if device_name:find(g.match, 1, true) then
        p = (dtype == "f32" and opts.tf32 and g.tf32) or g[dtype] or g.bf16
        break
      end
    end
  else
    p = cpu_cached(dtype, function()
      local N = 1024
      local a, b = keng.randn({N, N}):to(dtype), keng.randn({N, N}):to(dtype)
      -- the better of keng's two GEMM entry points (a @ b, and a @ bᵀ as every linear layer
      -- calls it: bf16 1024³ 0.144 vs 0.166 TFLOP/s on the 2-core machine)
      local best = math.huge
      keng.no_grad(function()
        for _, f in ipairs({function() return a:matmul(b) end, function() return keng.linear(a, b) end}) do
          best = math.min(best, bench.run(f, {steps = 3, warmup = 1}).min_ms)
        end
      end)
      return 2 * N ^ 3 / (best / 1e3) / 1e12
    end)
  end
  peaks[dtype] = p or false
  return p
end

-- read bandwidth (GB/s) for the memory roofline of decode rows (bench/roofline.lua), measured
-- over the row's weight bytes (rounded up to MiB: in cache for the tiny presets, DRAM for big
-- models) and cached beside the peaks; not measured on the GPU tier
local bandwidths = {}
local function bandwidth_gbs(mib)
  if opts.tier == "gpu" then return nil end
  if bandwidths[mib] == nil then
    bandwidths[mib] = cpu_cached("read GB/s over " .. mib .. " MiB", function()
      return (roofline.measure_bandwidth{mib = mib})
    end)
  end
  return bandwidths[mib]
end

------------------------------------------------------------------------------------------------
-- running rows

local function module_exists(name)
  return package.searchpath(name, package.path) ~= nil
end

local tty = progress.is_terminal()
local rows = {}
for _, row in ipairs(config.rows) do
  if selected(row) then
    rows[#rows + 1] = row
    if opts.quantize and row.task == "generate" then         -- the quantized twin, right after it
      local q = setmetatable({id = row.id .. "_" .. opts.quantize, name = row.name .. " " .. opts.quantize,
                              quantize = opts.quantize}, {__index = row})
      rows[#rows + 1] = q
    end
  end
end
if #rows == 0 then die("--only '" .. tostring(opts.only) .. "' matches no row") end

local tf32_note = "TF32 " .. (opts.tf32 and "on" or "off")
local adaptive = keng.thread_policy and keng.thread_policy().adaptive
print(string.format("keng %s (%s) · %s tier · %s · %d threads%s · %d timed steps per row · %s%s",
  keng.version, commit, opts.tier, device_name, threads, adaptive and " (at most; adaptive)" or "", opts.steps, tf32_note,
  opts.dtype ~= "keras" and (" · all rows in " .. opts.dtype) or ""))

local results = {}
local any_failed = false
for i, row in ipairs(rows) do
  local dtype = opts.dtype == "keras" and row.dtype or opts.dtype
  local size = row[opts.tier]
  local label = string.format("[%2d/%d] %-24s batch %-3d %-4s %s", i, #rows, row.name, row.batch, dtype, size.preset)
  io.write(label, " ... ")
  io.flush()
  local res = {id = row.id, row = row.name, family = row.family, task = row.task, batch = row.batch, quantize = row.quantize,
               dtype = dtype, tier = opts.tier, device = device_name, threads = threads,
               preset = size.preset, keras = row.keras, framework = "keng", keng_version = keng.version,
               commit = commit}
  local fam_file = config.runners[row.family]
  local missing = not module_exists(row.module) and row.module:gsub("%.", "/") .. ".lua is not there yet"
    or not fam_file and "config.runners has no bench file for family '" .. row.family .. "'"
    or not module_exists(fam_file) and fam_file:gsub("%.", "/") .. ".lua is not there yet"
  if missing then
    res.status = "not implemented"
    res.reason = missing
    print("not implemented")
  else
    local ctx = {tier = opts.tier, steps = opts.steps, dtype = dtype, device = device,
                 repeats = config.diff_repeats[opts.tier], profile = opts.profile ~= nil}
    if tty then
      ctx.on_step = function(s, n, ms)
        io.write(string.format("\r%s ... step %d/%d %.1f ms ", label, s, n, ms))
        io.flush()
      end
    end
    keng.empty_cache(); keng.reset_peak_memory_stats(device) -- trim the pools (cuda too); peak = this row's
    local ok, r = xpcall(function() return require(fam_file).run(row, ctx) end, function(e)
      return {msg = tostring(e), trace = debug.traceback(nil, 2)}
    end)
    if tty then io.write("\r", label, " ... ") end
    if ok then
      r.times_ms = json.array(r.times_ms)
      local prof = r.profile
      if prof then                                   -- the JSON keeps the costliest lines only
        local top = {}
        for i = 1, math.min(#prof.entries, math.max(opts.profile, 40)) do top[i] = prof.entries[i] end
        r.profile = {total_ms = prof.total_ms, ops = json.array(prof.ops), entries = json.array(top)}
      end
      for k, v in pairs(r) do if res[k] == nil then res[k] = v end end
      res.status = "ok"
      res.peak_memory_bytes = keng.memory_stats(device).peak
      local pk = peak_tflops(dtype)
      if pk and res.tflops then res.peak_tflops, res.pct_peak = pk, 100 * res.tflops / pk end
      -- the roofline (bench/roofline.lua): performed FLOPs against the peak, bytes against the
      -- measured bandwidth where counted (decode); pct_peak above stays the direct count's
      if res.mean_ms > 0 and res.flops_performed_per_step then
        res.tflops_performed = res.flops_performed_per_step / (res.mean_ms / 1e3) / 1e12
      end
      local mib = res.weight_bytes and math.max(1, math.ceil(res.weight_bytes / 2 ^ 20))
      local bw = mib and bandwidth_gbs(mib)
      if bw then
        res.bandwidth_gbs, res.bandwidth_source = bw, roofline.bandwidth_source(mib)
        res.gbs = res.mean_ms > 0 and res.bytes_per_step / (res.mean_ms / 1e3) / 1e9 or nil
      end
      roofline.classify(res, pk, bw)
      print(string.format("%.2f ms/step (median %.2f, min %.2f, sd %.2f)%s  %.3f TFLOP/s%s%s", res.mean_ms,
        res.median_ms, res.min_ms, res.stddev_ms,
        res.items_per_s and string.format("  %.1f items/s", res.items_per_s) or "", res.tflops_performed or res.tflops or 0,
        res.gbs and string.format("  %.1f GB/s", res.gbs) or "",
        res.pct_roofline and string.format(" (%s-bound, %.1f%% of roofline)", res.bound, res.pct_roofline) or "") ..
        (res.ms_per_token and string.format("  %.3f ms/token, %.2f MB of weights/token", res.ms_per_token,
          res.weight_bytes_per_token / 1e6) or ""))
      if prof then print(profile.report(prof, {top = opts.profile})) end
    else
      any_failed = true
      res.status = "failed"
      res.reason = (r.msg:gsub("\n.*", ""))
      print("failed: " .. res.reason)
      if os.getenv("KENG_BENCH_TRACE") then io.stderr:write(r.trace, "\n") end
    end
  end
  results[#results + 1] = res
  collectgarbage()
end

------------------------------------------------------------------------------------------------
-- comparison with an earlier run or a peer (--compare FILE.json)

local other, other_name
if opts.compare then
  local f = io.open(opts.compare)
  if not f then die("--compare: cannot open " .. opts.compare) end
  local ok, doc = pcall(json.decode, f:read("a"))
  f:close()
  if not ok or type(doc) ~= "table" or type(doc.rows) ~= "table" then
    die("--compare: " .. opts.compare .. " is not a benchmark JSON (" .. tostring(ok and "no rows" or doc) .. ")")
  end
  other, other_name = {}, doc.framework or "other"
  if other_name == "keng" then other_name = "keng " .. tostring(doc.commit or doc.date or "earlier") end
  for _, r in ipairs(doc.rows) do
    -- a zero mean (the difference rule clamped by noise) cannot be a ratio
    if r.status == "ok" and type(r.mean_ms) == "number" and r.mean_ms > 0 then other[r.id] = r end
  end
end

------------------------------------------------------------------------------------------------
-- the report

local function f2(x) return x and string.format("%.2f", x) or "NA" end

local function cells(r)
  local ms = r.status == "ok" and string.format("%.2f", r.mean_ms) or
             (r.status == "failed" and ("failed: " .. r.reason) or "not implemented")
  -- performed TFLOP/s, with the direct-formula figure beside where an algorithm skipped FLOPs
  local tf = r.tflops_performed or r.tflops
  local tfs = tf and string.format("%.3f", tf) or ""
  if tf and r.tflops and r.tflops > tf * 1.005 then tfs = tfs .. string.format(" (%.3f direct)", r.tflops) end
  local roof = r.pct_roofline and string.format("%.1f", r.pct_roofline) or ""
  if r.bound == "memory" and r.gbs then roof = roof .. string.format(" (%.1f of %.1f GB/s)", r.gbs, r.bandwidth_gbs) end
  local c = {r.row, tostring(r.batch), r.dtype .. (r.quantize and " + " .. r.quantize or ""), ms, f2(r.keras.best), f2(r.keras.k2), tfs, r.bound or "", roof}
  if opts.quantize then
    c[#c + 1] = r.ms_per_token and string.format("%.3f", r.ms_per_token) or ""
    c[#c + 1] = r.weight_bytes_per_token and string.format("%.2f", r.weight_bytes_per_token / 1e6) or ""
  end
  if other then
    local o = other[r.id]
    c[#c + 1] = o and string.format("%.2f", o.mean_ms) or ""
    c[#c + 1] = (o and r.status == "ok") and string.format("%.2f", r.mean_ms / o.mean_ms) or ""
  end
  return c
end

local header = {"row", "batch", "dtype", "keng ms/step", "Keras 3 best", "Keras 2 TF", "TFLOP/s", "bound", "% of roofline"}
if opts.quantize then
  header[#header + 1] = "ms/token"
  header[#header + 1] = "MB weights/token"
end
if other then
  header[#header + 1] = other_name .. " ms/step"
  header[#header + 1] = "keng/" .. other_name
end

local function markdown()
  local out = {"| " .. table.concat(header, " | ") .. " |",
               "|" .. string.rep("---|", #header)}
  for _, r in ipairs(results) do out[#out + 1] = "| " .. table.concat(cells(r), " | ") .. " |" end
  return table.concat(out, "\n")
end

local function csv()
  local function q(s) return s:find('[,"]') and '"' .. s:gsub('"', '""') .. '"' or s end
  local out = {}
  local h = {}
  for i, s in ipairs(header) do h[i] = q(s) end
  out[1] = table.concat(h, ",")
  for _, r in ipairs(results) do
    local c = cells(r)
    for i, s in ipairs(c) do c[i] = q(s) end
    out[#out + 1] = table.concat(c, ",")
  end
  return table.concat(out, "\n")
end

local doc = {schema = "keng-bench/1", framework = "keng", keng_version = keng.version, commit = commit,
             date = date, tier = opts.tier, device = device_name, threads = threads, steps = opts.steps,
             dtype = opts.dtype, tf32 = opts.tf32, quantize = opts.quantize, rows = json.array(results)}
-- the thread count follows the load unless one was given (docs/kernels.md, "Threads under load")
if keng.thread_policy then
  local tp = keng.thread_policy()
  doc.thread_policy = {source = tp.source, adaptive = tp.adaptive, max = tp.max, current_at_end = tp.current}
end
local note = opts.tier == "cpu" and
  "Keras figures are the published A100 40GB numbers at the GPU-tier sizes, for reference only; " ..
  "CPU-tier rows run the scaled-down presets of docs/benchmarks.md." or
  "Keras figures: published A100 40GB numbers (keras.io benchmarks)."
-- what the roofline columns mean (bench/roofline.lua)
note = note .. "\nRoofline: TFLOP/s counts the FLOPs performed (Winograd convs: the direct count beside); " ..
  "compute-bound rows against the peak (" .. (opts.tier == "cpu" and "best 1024^3 matmul per dtype" or "datasheet") ..
  "), memory-bound decode rows against the read bandwidth over their weights' size (" ..
  roofline.bandwidth_source("N") .. "); fit/predict rows' bytes are not counted."

print()
if opts.format == "json" then print(json.encode(doc, {indent = "  "}))
elseif opts.format == "csv" then print(csv())
else print(markdown()); print(); print(note) end

os.execute("mkdir -p '" .. opts.out .. "'")
local base = opts.out .. "/" .. date .. "-" .. opts.tier
local function write(path, text)
  local f, err = io.open(path, "w")
  if not f then io.stderr:write("all.lua: cannot write ", tostring(err), "\n"); return end
  f:write(text, "\n")
  f:close()
end
write(base .. ".json", json.encode(doc, {indent = "  "}))
write(base .. ".md", table.concat({
  string.format("# keng benchmarks — %s tier, %s", opts.tier, date), "",
  string.format("keng %s (commit %s) on %s, %d threads, %d timed steps per row after one warm-up, %s%s.",
    keng.version, commit, device_name, threads, opts.steps, tf32_note,
    opts.dtype ~= "keras" and (", all rows in " .. opts.dtype) or ""), "",
  markdown(), "", note, "", "![chart](" .. date .. "-" .. opts.tier .. ".png)"}, "\n"))

-- the chart: keng vs Keras 3 best (vs the compared run when given), log scale
local short = {fit = "FIT", predict = "PRED", generate = "GEN"}
local fam = {sam = "SAM", stable_diffusion = "SD", bert = "BERT", gemma = "GEMMA", mistral = "MISTRAL"}
local groups = {}
for _, r in ipairs(results) do
  local task = short[r.task] .. (r.task == "generate" and tostring(r.batch) or "")
  local vals = {r.status == "ok" and r.mean_ms or nil, r.keras.best}
  if other then vals[3] = other[r.id] and other[r.id].mean_ms end
  groups[#groups + 1] = {label = {fam[r.family] or r.family:upper(), task}, values = vals}
end
local series = {"KENG " .. opts.tier:upper() .. " TIER", "KERAS 3 BEST A100"}
if other then series[3] = other_name:upper() end
local ok, err = pcall(function()
  require("bench.chart").draw(base .. ".png", groups, {series = series,
    title = string.format("KENG VS KERAS, MS/STEP (LOG SCALE), %s", device_name:upper():sub(1, 40))})
end)
if not ok then io.stderr:write("all.lua: chart not written: ", tostring(err), "\n") end

if other then
  print()
  print(string.format("keng / %s (mean ms/step; below 1 = keng faster):", other_name))
  for _, r in ipairs(results) do
    local o = other[r.id]
    if o and r.status == "ok" then
      print(string.format("  %-26s %9.2f / %9.2f = %.2f", r.row .. (r.task == "generate" and " " .. r.batch or ""),
        r.mean_ms, o.mean_ms, r.mean_ms / o.mean_ms))
    end
  end
end
print()
print("wrote " .. base .. ".json, .md, .png")
if any_failed then os.exit(1) end
