-- keng.json — the small JSON writer/reader for configs and benchmark results (objects with sorted keys,
-- arrays, strings, numbers, booleans, null). Not a general library: no \u surrogate pairs.
local json = {}

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

local function encode(v, indent, depth, out)
  local ty = type(v)
  if v == nil or v == json.null then out[#out + 1] = "null"
  elseif ty == "boolean" then out[#out + 1] = tostring(v)
  elseif ty == "number" then
    if v ~= v or v == math.huge or v == -math.huge then out[#out + 1] = "null"
    elseif math.type(v) == "integer" then out[#out + 1] = tostring(v)
    else out[#out + 1] = string.format("%.10g", v) end
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
  local out = {}
  encode(v, opts and opts.indent, 0, out)
  return table.concat(out)
end

-- json.decode(string, {null_as_nil = false}) -> value; raises "json: <what> at byte N" on
-- malformed input. JSON null decodes to json.null, or with null_as_nil to nil: an object member
-- that is null is then absent, and an array closes up over its nulls (a model config's
-- "sliding_window": null reads as no key)
function json.decode(s, opts)
  local null = json.null
  if opts and opts.null_as_nil then null = nil end
  local pos = 1
  local function fail(what) error(string.format("json: %s at byte %d", what, pos), 0) end
  local function ws() pos = s:find("[^ \t\r\n]", pos) or #s + 1 end
  local value
  local function str()
    local out = {}
    pos = pos + 1
    while true do
      local c = s:sub(pos, pos)
      if c == "" then fail("unterminated string") end
      if c == '"' then pos = pos + 1; return table.concat(out) end
      if c == "\\" then
        local e = s:sub(pos + 1, pos + 1)
        local map = {b = "\b", f = "\f", n = "\n", r = "\r", t = "\t", ['"'] = '"', ["\\"] = "\\", ["/"] = "/"}
        if map[e] then out[#out + 1] = map[e]; pos = pos + 2
        elseif e == "u" then
          local hex = s:sub(pos + 2, pos + 5)
          if not hex:match("^%x%x%x%x$") then fail("bad \\u escape") end
          out[#out + 1] = utf8.char(tonumber(hex, 16)); pos = pos + 6
        else fail("bad escape") end
      else
        out[#out + 1] = c; pos = pos + 1
      end
    end
  end
  function value()
    ws()
    local c = s:sub(pos, pos)
    if c == "{" then
      local obj = {}
      pos = pos + 1; ws()
      if s:sub(pos, pos) == "}" then pos = pos + 1; return obj end
      while true do
        ws()
        if s:sub(pos, pos) ~= '"' then fail("expected a key") end
        local k = str(); ws()
        if s:sub(pos, pos) ~= ":" then fail("expected ':'") end
        pos = pos + 1
        obj[k] = value(); ws()
        local d = s:sub(pos, pos); pos = pos + 1
        if d == "}" then return obj elseif d ~= "," then fail("expected ',' or '}'") end
      end
    elseif c == "[" then
      local arr = json.array()
      pos = pos + 1; ws()
      if s:sub(pos, pos) == "]" then pos = pos + 1; return arr end
      while true do
        arr[#arr + 1] = value(); ws()
        local d = s:sub(pos, pos); pos = pos + 1
        if d == "]" then return arr elseif d ~= "," then fail("expected ',' or ']'") end
      end
    elseif c == '"' then return str()
    elseif s:sub(pos, pos + 3) == "true" then pos = pos + 4; return true
    elseif s:sub(pos, pos + 4) == "false" then pos = pos + 5; return false
    elseif s:sub(pos, pos + 3) == "null" then pos = pos + 4; return null
    else
      local num = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
      if not num or num == "" or num == "-" then fail("unexpected character '" .. c .. "'") end
      pos = pos + #num
      return tonumber(num) or fail("bad number")
    end
  end
  local v = value(); ws()
  if pos <= #s then fail("trailing characters") end
  return v
end

return json
