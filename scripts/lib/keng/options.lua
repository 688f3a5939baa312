-- keng.options — the one check of an options table: a key keng does not know is refused with
-- its name and the valid ones (a misspelt `epoch = 3` must not silently train 1 epoch), and the
-- range checks options share (a whole number of epochs, a finite learning rate).
--
--   local options = require "keng.options"
--   function M.fit(model, data, opts)
--     opts = options.check("fit", opts, {"epochs", "batch_size"})   -- raises at fit's caller
--     local epochs = options.integer("fit", "epochs", opts.epochs or 1, 0)
--
-- `level` counts as error() does from the function that calls these: 2 (the default) blames
-- its caller, the user's line.
local options = {}

-- the valid names of `valid` (a list of names, or a set {name = true}), sorted, as one string
local function names(valid)
  local list = {}
  if valid[1] ~= nil then
    for _, k in ipairs(valid) do list[#list + 1] = k end
  else
    for k in pairs(valid) do list[#list + 1] = k end
  end
  table.sort(list)
  return table.concat(list, ", ")
end

local function is_valid(valid, k)
  if valid[1] == nil then return valid[k] ~= nil end
  for _, v in ipairs(valid) do if v == k then return true end end
  return false
end

-- opts (nil -> {}) after checking that every key is in `valid`; `what` names the table in the
-- message ("option" by default: "fit: unknown option 'epoch' (valid: batch_size, epochs, ...)")
function options.check(who, opts, valid, level, what)
  level = (level or 2) + 1
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    error(string.format("%s: %ss must be a table, got %s", who, what or "option", type(opts)), level)
  end
  local bad = {}
  for k in pairs(opts) do
    if not is_valid(valid, k) then bad[#bad + 1] = tostring(k) end
  end
  if #bad > 0 then
    table.sort(bad)
    error(string.format("%s: unknown %s%s '%s' (valid: %s)", who, what or "option", #bad > 1 and "s" or "",
      table.concat(bad, "', '"), names(valid)), level)
  end
  return opts
end

-- v as an integer >= min (an integral float such as 3.0 is accepted), or an error naming key
function options.integer(who, key, v, min, level)
  local i = math.type(v) == "float" and v == v and math.tointeger(v) or (math.type(v) == "integer" and v)
  if not i then
    error(string.format("%s: %s must be a whole number, got %s", who, key, tostring(v)), (level or 2) + 1)
  end
  if min and i < min then
    error(string.format("%s: %s must be >= %d, got %d", who, key, min, i), (level or 2) + 1)
  end
  return i
end

-- v as a finite number in [lo, hi] (either bound may be nil), or an error naming key
function options.number(who, key, v, lo, hi, level)
  if type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge then
    error(string.format("%s: %s must be a finite number, got %s", who, key, tostring(v)), (level or 2) + 1)
  end
  if (lo and v < lo) or (hi and v > hi) then
    local range = lo and hi and string.format("in [%g, %g]", lo, hi) or lo and string.format(">= %g", lo)
      or string.format("<= %g", hi)
    error(string.format("%s: %s must be %s, got %g", who, key, range, v), (level or 2) + 1)
  end
  return v
end

-- a config rule's value meaning "the key must be absent (or null)"
options.ABSENT = setmetatable({}, {__tostring = function() return "absent (null)" end})

local function show(v)
  if type(v) == "string" then return string.format("%q", v) end
  if type(v) == "table" and v ~= options.ABSENT then return "a " .. type(v) end
  return tostring(v)
end

-- Model-config keys that change the numbers and that keng implements at one value only:
-- rules {key = the value keng implements, or options.ABSENT}. A key present in cfg with
-- another value raises naming it (an absent key means the implemented default).
function options.config(who, cfg, rules, level)
  local keys = {}
  for k in pairs(rules) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local v, want = cfg[k], rules[k]
    if v ~= nil and v ~= want then
      error(string.format("%s: config %s = %s is not supported (keng implements %s = %s only)", who, k, show(v), k,
        show(want)), (level or 2) + 1)
    end
  end
  return cfg
end

return options
