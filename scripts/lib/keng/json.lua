-- keng.json — JSON for configs and benchmark results: decode is the engine's strict reader
-- (keng.json_decode, engine/io/json.c); encode writes objects with sorted keys, arrays, strings,
-- numbers (floats exactly, NaN / Infinity as Python writes them), booleans and null.
local json = {}
local json_decode = require("keng").json_decode
local options = require "keng.options"

json.null = setmetatable({}, {__tostring = function() return "null" end})

local escapes = {['"'] = '\\"', ['\\'] = '\\\\', ['\b'] = '\\b', ['\f'] = '\\f', ['\n'] = '\\n',
                 ['\r'] = '\\r', ['\t'] = '\\t'}

local function is_array(t)
  local n = #t
  if n == 0 then return next(t) == nil and getmetatable(t) == json.array_mt end
  for k in pairs(t) do
    if type(k) ~= "number" or k < 1 or k > n or k % 1 ~= 0 then return false end
  end
  return true
end
json.array_mt = {}
function json.array(t) return setmetatable(t or {}, json.array_mt) end

-- the shortest of 15, 16 or 17 significant digits that reads back as v exactly, with ".0" on an
-- integral value so that decode gives a float again (as Python's json writes 2.0)
local function float_text(v)
  local s = string.format("%.15g", v)
  if tonumber(s) ~= v then s = string.format("%.16g", v) end
  if tonumber(s) ~= v then s = string.format("%.17g", v) end
  if not s:find("[.e]") then s = s .. ".0" end
  return s
end

local function encode(v, indent, depth, out)
  local ty = type(v)
  if v == nil or v == json.null then out[#out + 1] = "null"
  elseif ty == "boolean" then out[#out + 1] = tostring(v)
  elseif ty == "number" then
    -- non-finite as Python's json.dumps writes them (diffusers' -Infinity in scheduler configs);
    -- decode reads them back
    if v ~= v then out[#out + 1] = "NaN"
    elseif v == math.huge or v == -math.huge then out[#out + 1] = v > 0 and "Infinity" or "-Infinity"
    elseif math.type(v) == "integer" then out[#out + 1] = tostring(v)
    else out[#out + 1] = float_text(v) end
  elseif ty == "string" then
    out[#out + 1] = '"' .. v:gsub('[%c"\\]', function(c)
      return escapes[c] or string.format("\\u%04x", c:byte())
    end) .. '"'
  elseif ty == "table" then
    local pad = indent and "\n" .. string.rep(indent, depth + 1) or ""
    local close = indent and "\n" .. string.rep(indent, depth) or ""
    local sep = indent and ": " or ":"
    if is_array(v) then
      if #v == 0 then out[#out + 1] = "[]"; return end
      -- short arrays of numbers stay on one line
      local flat = true
      for _, x in ipairs(v) do if type(x) == "table" then flat = false end end
      out[#out + 1] = "["
      for i, x in ipairs(v) do
        if i > 1 then out[#out + 1] = "," end
        if not flat then out[#out + 1] = pad elseif i > 1 and indent then out[#out + 1] = " " end
        encode(x, indent, depth + 1, out)
      end
      out[#out + 1] = flat and "]" or close .. "]"
    else
      local keys = {}
      for k in pairs(v) do
        if type(k) ~= "string" then error("json.encode: object keys must be strings, got " .. type(k), 3) end
        keys[#keys + 1] = k
      end
      table.sort(keys)
      if #keys == 0 then out[#out + 1] = "{}"; return end
      out[#out + 1] = "{"
      for i, k in ipairs(keys) do
        if i > 1 then out[#out + 1] = "," end
        out[#out + 1] = pad
        encode(k, indent, depth + 1, out)
        out[#out + 1] = sep
        encode(v[k], indent, depth + 1, out)
      end
      out[#out + 1] = close .. "}"
    end
  else
    error("json.encode: cannot encode a " .. ty, 3)
  end
end

-- json.encode(value, {indent = "  "}) -> string
function json.encode(v, opts)
  opts = options.check("json.encode", opts, {"indent"})
  local out = {}
  encode(v, opts and opts.indent, 0, out)
  return table.concat(out)
end

-- json.decode(string, {null_as_nil = false}) -> value, read by the engine's strict reader
-- (engine/io/json.c, the one that reads safetensors headers). JSON null decodes to json.null, or
-- with null_as_nil to nil: an object member that is null is then absent, and an array closes up
-- over its nulls (a model config's "sliding_window": null reads as no key). Arrays carry
-- json.array_mt (so [] and {} stay apart); a number written as an integer that fits in 64 bits
-- is a Lua integer, any other a float. As Python's json.loads, the bare tokens NaN, Infinity and
-- -Infinity read as floats (diffusers writes -Infinity). Refused, with "json: invalid JSON at
-- line L, column C (byte B): what": duplicate keys (named), lone \u surrogates, invalid UTF-8,
-- numbers beyond a double's range (1e400), nesting deeper than 64, trailing characters.
function json.decode(s, opts)
  if type(s) ~= "string" then error("json.decode: expected a string, got " .. type(s), 2) end
  local null = json.null
  if opts ~= nil then
    opts = options.check("json.decode", opts, {"null_as_nil"})
    if opts.null_as_nil then null = nil end
  end
  local ok, v = pcall(json_decode, s, null, json.array_mt)
  if not ok then error(v, 2) end
  return v
end

return json
