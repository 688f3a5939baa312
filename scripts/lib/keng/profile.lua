-- keng.profile — where the time goes, op by op (the engine times every op while it is on).
--   local profile = require "keng.profile"
--   local p = profile.run(function() model(x) end)     -- or profile.start() ... profile.stop()
--   print(profile.report(p, {top = 15}))               -- per op, then per op and shapes
-- p = {total_ms =, entries = {{line =, op =, calls =, ms =, flops =}, ...} (most time first),
--      ops = {{op =, calls =, ms =, flops =}, ...} (most time first)}. Times are wall ms per op
-- call summed (cuda ops synchronised, so a profile slows a GPU run down); FLOPs are those the
-- matmul, convolution and attention kernels count.
local keng = require "keng"

local profile = {}

function profile.start() keng.debug.profile_start() end

local function by_ms(a, b) return a.ms > b.ms end

-- the profile of raw entries (each line once): sorted, with per-op sums and the total
local function summarize(entries)
  local total, ops, index = 0, {}, {}
  for _, e in ipairs(entries) do
    total = total + e.ms
    local o = index[e.op]
    if not o then
      o = {op = e.op, calls = 0, ms = 0, flops = 0}
      index[e.op], ops[#ops + 1] = o, o
    end
    o.calls, o.ms, o.flops = o.calls + e.calls, o.ms + e.ms, o.flops + e.flops
  end
  table.sort(entries, by_ms)
  table.sort(ops, by_ms)
  return {total_ms = total, entries = entries, ops = ops}
end

function profile.stop() return summarize(keng.debug.profile_stop()) end

-- profile.combine({{p1, w1}, {p2, w2}, ...}) -> the weighted sum of profiles, line by line; lines
-- left with no calls are dropped. Per step: {{p, 1 / steps}}; the difference rule:
-- {{long, 1 / n}, {short, -1 / n}}.
function profile.combine(parts)
  local index, entries = {}, {}
  for _, part in ipairs(parts) do
    local p, w = part[1], part[2]
    for _, e in ipairs(p.entries) do
      local c = index[e.line]
      if not c then
        c = {line = e.line, op = e.op, calls = 0, ms = 0, flops = 0}
        index[e.line], entries[#entries + 1] = c, c
      end
      c.calls, c.ms, c.flops = c.calls + w * e.calls, c.ms + w * e.ms, c.flops + w * e.flops
    end
  end
  local kept = {}
  for _, c in ipairs(entries) do
    if c.calls > 1e-9 then kept[#kept + 1] = c end
  end
  return summarize(kept)
end

-- profile.run(fn, ...) -> p, fn's results: profiles one call of fn (stopped on error too)
function profile.run(fn, ...)
  profile.start()
  local res = table.pack(pcall(fn, ...))
  local p = profile.stop()
  if not res[1] then error(res[2], 0) end
  return p, table.unpack(res, 2, res.n)
end

local function row(ms, total, calls, flops, name)
  local rate = flops > 0 and ms > 0 and string.format("%7.1f", flops / ms / 1e6) or "       "
  local n = calls % 1 == 0 and string.format("%7d", calls) or string.format("%7.1f", calls)
  return string.format("%10.2f %5.1f%% %s %s  %s", ms, total > 0 and 100 * ms / total or 0, n, rate, name)
end

-- profile.report(p, {top = 15, shapes = true}) -> text: the ops by total time, then (shapes)
-- the top op lines with their shapes
function profile.report(p, opts)
  opts = require("keng.options").check("profile.report", opts, {"top", "shapes"})
  local top = opts.top or 15
  local out = {string.format("%10s %6s %7s %7s  %s", "ms", "share", "calls", "GFLOP/s", "op")}
  for i = 1, math.min(top, #p.ops) do
    local o = p.ops[i]
    out[#out + 1] = row(o.ms, p.total_ms, o.calls, o.flops, o.op)
  end
  out[#out + 1] = string.format("%10.2f        (all ops)", p.total_ms)
  if opts.shapes ~= false then
    out[#out + 1] = ""
    for i = 1, math.min(top, #p.entries) do
      local e = p.entries[i]
      out[#out + 1] = row(e.ms, p.total_ms, e.calls, e.flops, e.line)
    end
  end
  return table.concat(out, "\n")
end

return profile
