-- summary.lua — the report of one device call of tests/gpu/run.sh: reads what the stages left in
-- WORK and writes OUT/summary.md (for people) and OUT/results.json (for tools). Plain Lua 5.4
-- (the carried lua5.4 runs it when the build failed; keng runs it too): no keng module needed.
--
--   lua5.4 tests/gpu/summary.lua WORK OUT
--
-- WORK holds (run.sh writes them): meta.tsv (key, value), stages.tsv (stage, status, seconds,
-- note), rows.tsv (row id, status, exit code, seconds, timeout, steps: one line per row in run
-- order), rows/<id>/*.json (all.lua's keng-bench/1 document for that row), rows/<id>.log,
-- peer.json (pytorch_gpu.py's document) and compare.log.
--
-- Per row: keng ms/step (mean, median, min) or the failure with its last log lines, PyTorch
-- eager ms/step on the same GPU and keng/PyTorch, and the H200 floor: the larger of the row's
-- counted FLOPs at the dtype's dense peak and, for generate rows, the weights read once per
-- decoded token at the HBM bandwidth — with keng's time as a percentage of it (100% = at the
-- floor). Peaks from NVIDIA's H200 SXM datasheet (dense): bf16 989 TFLOP/s, TF32 495, f32 67;
-- HBM3e 4.8 TB/s. Only for rows run on an H200 (the dry run on a CPU has no floor).
local here = (arg and arg[0] or ""):match("^(.*)/tests/gpu/[^/]*$") or "."
package.path = here .. "/scripts/lib/?.lua;" .. package.path

-- JSON text -> value as the engine's reader (keng.json_decode(s, null, array_mt)) gives it: keng.json
-- decodes through the engine, which plain lua5.4 (the carried interpreter, run when the build
-- failed) does not have; there this stands in for it. NaN / Infinity read as Python writes them.
local function plain_json_decode(s, null, array_mt)
  local i = 1
  local function fail(what) error(string.format("JSON: %s at byte %d", what, i), 0) end
  local function ws() i = s:find("[^ \t\r\n]", i) or #s + 1 end
  local ESC = {['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t"}
  local WORDS = {{"true", true}, {"false", false}, {"null", null}, {"NaN", 0 / 0}, {"Infinity", math.huge},
                 {"-Infinity", -math.huge}}
  local value
  local function str()
    local out, j = {}, i + 1
    while true do
      local k = s:find('["\\]', j) or fail("unterminated string")
      out[#out + 1] = s:sub(j, k - 1)
      if s:sub(k, k) == '"' then
        i = k + 1
        return table.concat(out)
      end
      local e = s:sub(k + 1, k + 1)
      if e == "u" then
        local cp = tonumber(s:sub(k + 2, k + 5), 16) or fail("bad \\u escape")
        j = k + 6
        local lo = s:sub(j, j + 1) == "\\u" and tonumber(s:sub(j + 2, j + 5), 16)
        if cp >= 0xD800 and cp < 0xDC00 and lo and lo >= 0xDC00 and lo < 0xE000 then
          cp, j = 0x10000 + (cp - 0xD800) * 0x400 + (lo - 0xDC00), j + 6
        end
        out[#out + 1] = utf8.char(cp)
      else
        out[#out + 1] = ESC[e] or fail("bad escape")
        j = k + 2
      end
    end
  end
  local function list(close, item)                                  -- items up to `close`
    i = i + 1
    ws()
    if s:sub(i, i) == close then i = i + 1; return end
    while true do
      item()
      ws()
      local d = s:sub(i, i)
      i = i + 1
      if d == close then return end
      if d ~= "," then fail("expected ',' or '" .. close .. "'") end
    end
  end
  function value()
    ws()
    local c = s:sub(i, i)
    if c == "{" then
      local t = {}
      list("}", function()
        ws()
        if s:sub(i, i) ~= '"' then fail("expected a key") end
        local k = str()
        ws()
        if s:sub(i, i) ~= ":" then fail("expected ':'") end
        i = i + 1
        t[k] = value()
      end)
      return t
    elseif c == "[" then
      local t, n = setmetatable({}, array_mt), 0
      list("]", function() n = n + 1; t[n] = value() end)
      return t
    elseif c == '"' then
      return str()
    end
    for _, w in ipairs(WORDS) do
      if s:sub(i, i + #w[1] - 1) == w[1] then
        i = i + #w[1]
        return w[2]
      end
    end
    local tok = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", i)
    local v = tok and tonumber(tok) or fail("unexpected character")
    i = i + #tok
    return v
  end
  local v = value()
  ws()
  if i <= #s then fail("trailing characters") end
  return v
end
if not pcall(require, "keng") then package.loaded.keng = {json_decode = plain_json_decode} end
local json = require "keng.json"

local M = {}
M.plain_json_decode = plain_json_decode

M.H200 = {bf16 = 989e12, tf32 = 494.7e12, f32 = 66.9e12, f16 = 989e12, bytes_per_s = 4.8e12}
local DTYPE_BYTES = {bf16 = 2, f16 = 2, f32 = 4, f64 = 8}

local function read(path)
  local f = io.open(path)
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function lines(path)
  local out = {}
  local s = read(path)
  if s then for l in s:gmatch("[^\n]+") do out[#out + 1] = l end end
  return out
end

local function tsv(path)
  local out = {}
  for _, l in ipairs(lines(path)) do
    local f = {}
    for c in (l .. "\t"):gmatch("([^\t]*)\t") do f[#f + 1] = c end
    out[#out + 1] = f
  end
  return out
end

local function decode(path)
  local s = read(path)
  if not s then return nil end
  local ok, doc = pcall(json.decode, s)
  return ok and type(doc) == "table" and doc or nil
end

local function tail(path, n)
  local l = lines(path)
  local out = {}
  for i = math.max(1, #l - n + 1), #l do out[#out + 1] = l[i] end
  return out
end

-- the row's keng-bench/1 document in WORK/rows/<id>/ (all.lua names it <date>-<tier>.json)
local function row_doc(work, id)
  local p = io.popen("ls '" .. work .. "/rows/" .. id .. "'/*.json 2>/dev/null")
  local file = p and p:read("l")
  if p then p:close() end
  local doc = file and decode(file)
  if not doc or type(doc.rows) ~= "table" then return nil, doc end
  for _, r in ipairs(doc.rows) do if r.id == id then return r, doc end end
  return nil, doc
end

-- the H200 floor of a finished row (ms), the peak it assumed, or nil where nothing is counted
function M.floor(r, doc)
  if not (r.device or ""):find("H200", 1, true) then return nil end
  local dtype = r.dtype or "f32"
  local tf32 = r.tf32 == true or (doc and (doc.tf32 == true or doc.allow_tf32 == true))
  local peak_name = dtype == "f32" and (tf32 and "tf32" or "f32") or dtype
  local peak = M.H200[peak_name]
  local compute = (type(r.flops_per_step) == "number" and peak) and r.flops_per_step / peak or 0
  local memory = 0
  if r.task == "generate" and type(r.params) == "number" and type(r.max_length) == "number" then
    local prompt = type(r.shapes) == "table" and type(r.shapes.prompts) == "table" and r.shapes.prompts[2] or 6
    memory = r.params * (DTYPE_BYTES[dtype] or 2) * (r.max_length - prompt) / M.H200.bytes_per_s
  end
  local s = math.max(compute, memory)
  if s <= 0 then return nil end
  return s * 1e3, (memory > compute) and "HBM" or peak_name
end

local function fmt(x, f) return type(x) == "number" and string.format(f or "%.2f", x) or "" end

function M.build(work)
  local meta = {}
  for _, f in ipairs(tsv(work .. "/meta.tsv")) do meta[f[1]] = f[2] end
  local stages = {}
  for _, f in ipairs(tsv(work .. "/stages.tsv")) do
    stages[#stages + 1] = {stage = f[1], status = f[2], seconds = tonumber(f[3]), note = f[4]}
  end
  local peer = decode(work .. "/peer.json")
  local peer_rows = {}
  if peer and type(peer.rows) == "table" then
    for _, r in ipairs(peer.rows) do peer_rows[r.id] = r end
  end
  local rows = {}
  for _, f in ipairs(tsv(work .. "/rows.tsv")) do
    local id = f[1]
    local row = {id = id, run = f[2], exit_code = tonumber(f[3]), seconds = tonumber(f[4]), timeout = tonumber(f[5]),
                 steps = tonumber(f[6])}
    local r, doc = row_doc(work, id)
    if r then
      row.row, row.batch, row.dtype, row.task = r.row, r.batch, r.dtype, r.task
      row.keras_best = type(r.keras) == "table" and r.keras.best or nil
      row.graph, row.graph_error = r.graph, r.graph_error
      if r.status == "ok" then
        row.status = "ok"
        row.mean_ms, row.median_ms, row.min_ms, row.tflops = r.mean_ms, r.median_ms, r.min_ms, r.tflops
        row.floor_ms, row.floor_by = M.floor(r, doc)
        if row.floor_ms and r.mean_ms and r.mean_ms > 0 then row.pct_floor = 100 * row.floor_ms / r.mean_ms end
      else
        row.status, row.reason = r.status, r.reason
      end
    elseif row.run == "skipped" then
      row.status, row.reason = "skipped", "not run: too little time left before the deadline"
    elseif row.run == "timeout" then
      row.status, row.reason = "timeout", string.format("killed after %s s (its timeout)", f[5])
    else
      row.status = "crashed"
      row.reason = string.format("exit %s with no result", f[3])
    end
    if row.status ~= "ok" and row.status ~= "skipped" then row.log_tail = json.array(tail(work .. "/rows/" .. id .. ".log", 8)) end
    local p = peer_rows[id]
    if p then
      row.peer_status = p.status
      if p.status == "ok" then
        row.peer_ms = p.mean_ms
        if row.mean_ms and p.mean_ms and p.mean_ms > 0 then row.ratio = row.mean_ms / p.mean_ms end
      else
        row.peer_reason = p.reason
      end
    end
    rows[#rows + 1] = row
  end
  -- rows the peer ran that keng did not reach (a failed build: the peer runs beside it)
  local seen = {}
  for _, r in ipairs(rows) do seen[r.id] = true end
  for _, p in ipairs(peer and type(peer.rows) == "table" and peer.rows or {}) do
    if type(p.id) == "string" and not seen[p.id] then
      seen[p.id] = true
      rows[#rows + 1] = {id = p.id, batch = p.batch, dtype = p.dtype, status = "not run",
                         reason = "keng did not reach this row", peer_status = p.status,
                         peer_ms = p.status == "ok" and p.mean_ms or nil, peer_reason = p.status ~= "ok" and p.reason or nil}
    end
  end
  local cmp = {}
  for _, l in ipairs(lines(work .. "/compare.log")) do
    local total, on, passed, failed = l:match("^(%d+) cases on (%S+): (%d+) passed, (%d+) failed")
    if total then cmp.total, cmp.device, cmp.passed, cmp.failed = tonumber(total), on, tonumber(passed), tonumber(failed) end
    if l:find("FAIL", 1, true) or l:find(" ERROR ", 1, true) then
      cmp.failures = cmp.failures or json.array()
      if #cmp.failures < 40 then cmp.failures[#cmp.failures + 1] = l end
    end
  end
  return {schema = "keng-gpu-check/1", meta = meta, stages = json.array(stages), rows = json.array(rows), compare = cmp,
          peer = peer and {torch_version = peer.torch_version, transformers_version = peer.transformers_version,
                           diffusers_version = peer.diffusers_version, tf32 = peer.tf32, device = peer.device} or nil}
end

function M.markdown(res)
  local m = res.meta
  local out = {}
  local function add(s) out[#out + 1] = s end
  add(string.format("# keng GPU check%s — %s", m.dry == "1" and " (DRY RUN, CPU)" or "", m.date or ""))
  add("")
  add(string.format("commit %s (sources %s) · %s · %s · budget %s s, used %s s", m.commit or "?", m.sources or "?",
    m.gpu or "?", m.nvcc or "",
    m.budget or "?", m.elapsed or "?"))
  add("")
  add("| stage | status | s | note |")
  add("|---|---|---|---|")
  for _, s in ipairs(res.stages) do
    add(string.format("| %s | %s | %s | %s |", s.stage, s.status, s.seconds or "", s.note or ""))
  end
  local c = res.compare
  if c.total then
    add("")
    add(string.format("compare.lua: %d cases on %s, %d passed, %d failed", c.total, c.device, c.passed, c.failed))
  end
  if c.failures then
    add("")
    add("```")
    for _, l in ipairs(c.failures) do add(l) end
    add("```")
  end
  add("")
  add("| row | batch | dtype | steps | keng ms/step (median, min) | PyTorch ms/step | keng/PyTorch | H200 floor ms | % of floor | Keras 3 best (A100) | status |")
  add("|---|---|---|---|---|---|---|---|---|---|---|")
  for _, r in ipairs(res.rows) do
    local keng_ms = r.mean_ms and string.format("%.2f (%.2f, %.2f)", r.mean_ms, r.median_ms or 0, r.min_ms or 0) or ""
    local peer = r.peer_ms and fmt(r.peer_ms) or (r.peer_status and r.peer_status or "")
    local status = r.status
    if r.status == "ok" and r.graph ~= nil then
      status = status .. (r.graph and " (graph)" or
        (" (eager" .. (type(r.graph_error) == "string" and ": " .. r.graph_error:sub(1, 80) or "") .. ")"))
    end
    if r.status ~= "ok" then status = status .. ": " .. (r.reason or "") end
    add(string.format("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |", r.id, r.batch or "", r.dtype or "",
      r.steps or "", keng_ms, peer, fmt(r.ratio), fmt(r.floor_ms, "%.1f") .. (r.floor_by and " (" .. r.floor_by .. ")" or ""),
      fmt(r.pct_floor, "%.0f%%"), fmt(r.keras_best), (status:gsub("|", "/"))))
  end
  local failed = {}
  for _, r in ipairs(res.rows) do if r.log_tail then failed[#failed + 1] = r end end
  if #failed > 0 then
    add("")
    add("## Rows that did not finish (last log lines; all of them in rows.log)")
    for _, r in ipairs(failed) do
      add("")
      add(string.format("%s (%s, %s s):", r.id, r.status, r.seconds or "?"))
      add("```")
      for _, l in ipairs(r.log_tail) do add(l) end
      add("```")
    end
  end
  local pf = {}
  for _, r in ipairs(res.rows) do if r.peer_reason then pf[#pf + 1] = "- " .. r.id .. ": " .. r.peer_reason end end
  if #pf > 0 then
    add("")
    add("PyTorch peer rows without a time:")
    for _, l in ipairs(pf) do add(l) end
  end
  if res.peer then
    add("")
    add(string.format("peer: torch %s, transformers %s, diffusers %s, tf32 %s", tostring(res.peer.torch_version),
      tostring(res.peer.transformers_version), tostring(res.peer.diffusers_version), tostring(res.peer.tf32)))
  end
  add("")
  add("Floor: max(counted FLOPs / dense peak of the dtype (bf16 989, TF32 495 when the row ran TF32, f32 67 TFLOP/s), " ..
      "for generate the weights read once per decoded token at 4.8 TB/s); % of floor = floor / keng mean.")
  return table.concat(out, "\n") .. "\n"
end

function M.write(work, outdir)
  local res = M.build(work)
  local f = assert(io.open(outdir .. "/summary.md", "w"))
  f:write(M.markdown(res))
  f:close()
  f = assert(io.open(outdir .. "/results.json", "w"))
  f:write(json.encode(res, {indent = "  "}), "\n")
  f:close()
  return res
end

if arg and arg[0] and arg[0]:match("summary%.lua$") and arg[1] then
  if not arg[2] then io.stderr:write("usage: lua5.4 tests/gpu/summary.lua WORK OUT\n"); os.exit(2) end
  M.write(arg[1], arg[2])
end
return M
