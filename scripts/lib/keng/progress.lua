-- keng.progress — the Keras-style progress line printed by keng.train.
--
--   12/100 [===>..........................] - ETA: 3s - 12ms/step - loss: 0.4321
--
-- verbose 1 on a terminal redraws one line with "\r"; verbose 1 elsewhere prints only the final
-- line of each epoch (no "\r", so logs and pipes stay clean); verbose 2 prints one summary line
-- per epoch; verbose 0 prints nothing. `progress.is_terminal()` decides the default verbosity.
local keng = require "keng"

local progress = {}

local tty_cache
-- True when this process's stdout is a terminal. Lua has no isatty, so ask the shell: os.execute
-- runs `test -t 1` with our own stdout (io.popen would hand the child a pipe instead).
-- KENG_PROGRESS=0/1 overrides the probe (useful under CI loggers that fake a terminal).
function progress.is_terminal()
  local env = os.getenv("KENG_PROGRESS")
  if env == "0" then return false elseif env == "1" then return true end
  if tty_cache == nil then
    io.stdout:flush()
    local ok = os.execute("test -t 1")
    tty_cache = ok == true or ok == 0
  end
  return tty_cache
end

-- "3s", "1m05s", "1:02:03" like Keras' ETA
local function fmt_time(s)
  if s >= 3600 then return string.format("%d:%02d:%02d", s // 3600, (s % 3600) // 60, s % 60) end
  if s >= 60 then return string.format("%dm%02ds", s // 60, s % 60) end
  return string.format("%ds", math.floor(s + 0.5))
end
progress.fmt_time = fmt_time

local function fmt_per_step(sec)
  if sec >= 1 then return string.format("%.0fs/step", sec) end
  if sec >= 1e-3 then return string.format("%.0fms/step", sec * 1e3) end
  return string.format("%.0fus/step", sec * 1e6)
end

-- " - loss: 0.4321 - accuracy: 0.9000" from an ordered list of names and a {name = value} table
local function fmt_values(names, values)
  local parts = {}
  for _, k in ipairs(names) do
    local v = values[k]
    if type(v) == "number" then
      parts[#parts + 1] = string.format(" - %s: %s", k,
        (v ~= 0 and math.abs(v) < 1e-3) and string.format("%.4e", v) or string.format("%.4f", v))
    end
  end
  return table.concat(parts)
end
progress.fmt_values = fmt_values

local Bar = {}
Bar.__index = Bar

-- progress.new(total, opts): total steps (nil when unknown); opts: verbose (1|2), tty (bool),
-- width (30), out (a file, default io.stdout)
function progress.new(total, opts)
  opts = require("keng.options").check("progress.new", opts, {"verbose", "tty", "width", "out"})
  local tty = opts.tty
  if tty == nil then tty = progress.is_terminal() end
  return setmetatable({total = total, verbose = opts.verbose or 1, tty = tty, width = opts.width or 30,
                       out = opts.out or io.stdout, start = keng.time(), last_len = 0, seen = 0}, Bar)
end

function Bar:bar(step)
  local total = self.total
  if not total then return string.format("%d/Unknown", step) end
  local digits = #tostring(total)
  local done = math.floor(self.width * math.min(step, total) / total)
  local arrow = ""
  if done > 0 then arrow = string.rep("=", done - 1) .. (step >= total and "=" or ">") end
  return string.format("%" .. digits .. "d/%d [%s%s]", step, total, arrow, string.rep(".", self.width - #arrow))
end

-- Called after each step with the running values (ordered names + table).
function Bar:update(step, names, values)
  self.seen = step
  if self.verbose ~= 1 or not self.tty then return end
  local now = keng.time()
  -- redraw at most 20 times a second (the first and last steps always)
  if self.drawn and now - self.drawn < 0.05 and step ~= self.total then return end
  self.drawn = now
  local elapsed = now - self.start
  local per = elapsed / math.max(step, 1)
  local line = self:bar(step)
  if self.total and step < self.total then
    line = line .. " - ETA: " .. fmt_time(per * (self.total - step))
  else
    line = line .. " - " .. fmt_time(elapsed)
  end
  line = line .. " - " .. fmt_per_step(per) .. fmt_values(names, values)
  local pad = math.max(self.last_len - #line, 0)
  self.out:write("\r", line, string.rep(" ", pad))
  self.out:flush()
  self.last_len = #line
end

-- Ends the epoch: the final bar (verbose 1) or one summary line (verbose 2). prefix: "Epoch 3/10"
function Bar:finish(names, values, prefix)
  local elapsed = keng.time() - self.start
  local per = fmt_per_step(elapsed / math.max(self.seen, 1))
  if self.verbose == 1 then
    local line = self:bar(self.seen) .. " - " .. fmt_time(elapsed) .. " - " .. per .. fmt_values(names, values)
    if self.tty then
      self.out:write("\r", line, string.rep(" ", math.max(self.last_len - #line, 0)), "\n")
    else
      self.out:write(line, "\n")
    end
  elseif self.verbose == 2 then
    self.out:write((prefix and prefix .. " - " or ""), fmt_time(elapsed), " - ", per,
      fmt_values(names, values), "\n")
  end
  self.out:flush()
end

-- ---- progress of long work (SD sampling, generate, loading, benchmark rows) ----------------
-- A tqdm-style line on stderr, so that a program's own output (an image path, streamed text) on
-- stdout stays clean:
--   sampling  12/50 [=======>......................] - ETA: 3s - 120ms/step
-- Shown by default only when stderr is a terminal (KENG_PROGRESS=0/1 overrides the probe), where
-- it redraws one line with "\r". `enabled = true` forces it on: not on a terminal it is then
-- plain lines (each tenth of the work and the last step), never "\r". `enabled = false` is off.

local err_tty_cache
-- True when stderr is a terminal (KENG_PROGRESS=0/1 overrides, as for is_terminal)
function progress.stderr_is_terminal()
  local env = os.getenv("KENG_PROGRESS")
  if env == "0" then return false elseif env == "1" then return true end
  if err_tty_cache == nil then
    io.stderr:flush()
    local ok = os.execute("test -t 2")
    err_tty_cache = ok == true or ok == 0
  end
  return err_tty_cache
end

local Task = {}
Task.__index = Task
progress.Task = Task

-- the value of a `progress =` option: nil (on a terminal), true or false; anything else raises
function progress.check_option(who, v, level)
  if v ~= nil and type(v) ~= "boolean" then
    error(string.format("%s: progress must be true, false or nil (on when stderr is a terminal), got %s", who,
      type(v)), (level or 1) + 1)
  end
  return v
end

-- progress.task(label, total, {enabled = nil|true|false, tty =, out = io.stderr, width = 30,
-- unit = "step"}) -> a Task; `task.active` is false when it prints nothing
function progress.task(label, total, opts)
  opts = require("keng.options").check("progress.task", opts, {"enabled", "tty", "out", "width", "unit"})
  local tty = opts.tty
  if tty == nil then tty = progress.stderr_is_terminal() end
  local active
  if opts.enabled == nil then active = tty else active = opts.enabled end
  return setmetatable({label = label, total = total, tty = tty, active = active, out = opts.out or io.stderr,
    width = opts.width or 30, unit = opts.unit or "step", start = keng.time(), last_len = 0, step = 0,
    tenth = 0}, Task)
end

function Task:line(step, extra, final)
  local elapsed = keng.time() - self.start
  local per = elapsed / math.max(step, 1)
  local head = self.label .. " "
  if self.total then
    local bar = Bar.bar({total = self.total, width = self.width}, step)
    head = head .. bar
  else
    head = head .. step
  end
  local line = head
  if self.total and step < self.total and not final then
    line = line .. " - ETA: " .. fmt_time(per * (self.total - step))
  else
    line = line .. " - " .. fmt_time(elapsed)
  end
  local per_s = fmt_per_step(per):gsub("/step$", "/" .. self.unit)
  line = line .. " - " .. per_s
  if extra and extra ~= "" then line = line .. " - " .. extra end
  return line
end

-- after step `step` (1-based) of the work; extra: a short text ("12.3 tok/s")
function Task:update(step, extra)
  self.step = step
  if not self.active then return end
  if self.tty then
    local now = keng.time()
    if self.drawn and now - self.drawn < 0.05 and step ~= self.total then return end   -- 20 redraws/s at most
    self.drawn = now
    local line = self:line(step, extra)
    self.out:write("\r", line, string.rep(" ", math.max(self.last_len - #line, 0)))
    self.out:flush()
    self.last_len = #line
  elseif self.total then                                            -- plain lines: each tenth
    local tenth = math.floor(10 * step / self.total)
    if tenth > self.tenth and step < self.total then
      self.tenth = tenth
      self.out:write(self:line(step, extra), "\n")
      self.out:flush()
    end
  end
end

-- the work is done (or stopped early at self.step): the final line
function Task:finish(extra)
  if not self.active or self.finished then return end
  self.finished = true
  local line = self:line(self.step, extra, true)
  if self.tty then
    self.out:write("\r", line, string.rep(" ", math.max(self.last_len - #line, 0)), "\n")
  else
    self.out:write(line, "\n")
  end
  self.out:flush()
end

local function file_size(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local n = f:seek("end")
  f:close()
  return n
end

local function fmt_bytes(n)
  if n >= 2^30 then return string.format("%.2f GB", n / 2^30) end
  if n >= 2^20 then return string.format("%.1f MB", n / 2^20) end
  return string.format("%.1f kB", n / 2^10)
end
progress.fmt_bytes = fmt_bytes

-- the bytes a checkpoint file holds: the file, or for a sharded index the shards it names
function progress.checkpoint_bytes(path)
  if not path:match("%.json$") then return file_size(path) or 0 end
  local f = io.open(path, "rb")
  if not f then return 0 end
  local text = f:read("a")
  f:close()
  local dir = path:match("^(.*)/[^/]*$") or "."
  local seen, total = {}, 0
  for shard in text:gmatch('"[^"]*"%s*:%s*"([^"]+%.safetensors)"') do
    if not seen[shard] then
      seen[shard] = true
      total = total + (file_size(dir .. "/" .. shard) or 0)
    end
  end
  return total
end

-- ---- checkpoint loading, per tensor ---------------------------------------------------------
-- A checkpoint's tensors are mapped by keng.load (nothing is read yet); the work is done when a
-- model takes them, tensor by tensor, in load_state_dict (dtype conversion, device copy, the
-- pages read). So a load is tracked per tensor: progress.loading registers the tensors keng.load
-- returned, Module:load_state_dict calls progress.loaded_tensor for each tensor it takes, and
-- the line counts tensors and bytes:
--   loading model.safetensors 120/291 [===========>..................] - ETA: 2s - 9ms/tensor - 0.50/1.20 GB
--   loaded model.safetensors: 291/291 tensors, 1.20 GB in 3.4s (352.9 MB/s)
-- progress.on_tensor, when set to a function, is called after each tensor with
-- (path, tensors_done, tensors_total, bytes_done, bytes_total), shown or not (a GUI's hook;
-- the specs count the calls).

local owner = setmetatable({}, {__mode = "k"})                      -- a registered tensor -> its load
progress.on_tensor = nil

local function tensor_bytes(t) return t:numel() * keng.dtype_sizes[t.dtype] end

local function bytes_pair(done, total)
  if total >= 2^30 then return string.format("%.2f/%.2f GB", done / 2^30, total / 2^30) end
  if total >= 2^20 then return string.format("%.1f/%.1f MB", done / 2^20, total / 2^20) end
  return string.format("%.1f/%.1f kB", done / 2^10, total / 2^10)
end

-- progress.loading(path, fn, {enabled =, out =, tty =, min_bytes = 32 MB}) -> fn()'s result,
-- a table {name = tensor} (keng.load's), whose tensors are registered for per-tensor progress:
-- a line on stderr when it is a terminal and the tensors hold at least min_bytes (enabled =
-- true: always, as plain lines off a terminal; false: never). The line ends ("loaded ...")
-- when the load_state_dict that took them returns (progress.finish_loads).
function progress.loading(path, fn, opts)
  opts = require("keng.options").check("progress.loading", opts, {"enabled", "out", "tty", "min_bytes"})
  local r = fn()
  if type(r) ~= "table" then return r end
  local n, bytes = 0, 0
  for _, t in pairs(r) do
    if keng.is_tensor(t) then n, bytes = n + 1, bytes + tensor_bytes(t) end
  end
  local name = tostring(path):match("[^/]*$")
  local task = progress.task("loading " .. name, n, {enabled = opts.enabled, out = opts.out, tty = opts.tty,
    unit = "tensor"})
  if opts.enabled == nil and bytes < (opts.min_bytes or 32 * 2^20) then task.active = false end
  local load = {path = path, name = name, total = n, bytes = bytes, done = 0, done_bytes = 0, task = task}
  for _, t in pairs(r) do
    if keng.is_tensor(t) then owner[t] = load end
  end
  return r
end

-- after a model took tensor t (Module:load_state_dict): counts it once for the load that
-- registered it -> that load, or nil when t is not a registered checkpoint tensor
function progress.loaded_tensor(t)
  local load = owner[t]
  owner[t] = nil
  if not load or load.finished then return nil end                  -- a later load_state_dict of the same table
  load.done, load.done_bytes = load.done + 1, load.done_bytes + tensor_bytes(t)
  load.task:update(load.done, bytes_pair(load.done_bytes, load.bytes))
  if progress.on_tensor then progress.on_tensor(load.path, load.done, load.total, load.done_bytes, load.bytes) end
  return load
end

-- ends the lines of the loads (a set {load = true}, from loaded_tensor) with their totals
function progress.finish_loads(loads)
  for load in pairs(loads) do
    load.finished = true
    local t = load.task
    if t.active and not t.finished then
      t.finished = true
      local dt = keng.time() - t.start
      local line = string.format("loaded %s: %d/%d tensors, %s in %s (%s/s)", load.name, load.done, load.total,
        fmt_bytes(load.done_bytes), dt < 10 and string.format("%.1fs", dt) or fmt_time(dt),
        fmt_bytes(load.done_bytes / math.max(dt, 1e-9)))
      t.out:write(t.tty and "\r" or "", line, string.rep(" ", math.max(t.last_len - #line, 0)), "\n")
      t.out:flush()
    end
  end
end

return progress
