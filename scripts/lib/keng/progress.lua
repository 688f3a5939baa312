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
  opts = opts or {}
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

return progress
