-- keng.util — the small helpers the library, the models and the benchmarks share, each written
-- once: shape_str for messages, read_file, the one class helper (nn.Module, the optimizers and
-- the callbacks are all made by it) and the byte size of each dtype. No `require "keng"` here, so
-- that it loads in a bare Lua state too.
local util = {}

-- shape_str(x) -> "[2,3]": x a tensor or a shape list, in the engine's form (kg_shape_str in
-- engine/core/error.c), so a shape reads the same in every message, from C or from Lua. A second
-- argument (the "," older callers pass) is ignored.
function util.shape_str(x)
  local shape = type(x) == "userdata" and x.shape or x
  return "[" .. table.concat(shape, ",") .. "]"
end

-- read_file(path) -> the file's bytes, or nil when it cannot be opened
function util.read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

-- read_json(path, who, level, opts) -> the JSON object in the file at path, or nil when there is
-- no such file (an optional config: tokenizer_config.json, special_tokens_map.json, ...). A file
-- that is there but unreadable, malformed, or not an object raises "who: path: why" at `level`
-- (as error()), never silently skipped. opts go to keng.json.decode (null_as_nil).
function util.read_json(path, who, level, opts)
  local f, err, code = io.open(path, "rb")
  if not f then
    if code == 2 then return nil end                                -- ENOENT: the file is optional
    error(string.format("%s: %s", who, err), level + 1)
  end
  local text, rerr = f:read("a")
  f:close()
  if not text then error(string.format("%s: %s: %s", who, path, tostring(rerr)), level + 1) end
  local json = require "keng.json"
  local ok, j = pcall(json.decode, text, opts)
  if ok and (type(j) ~= "table" or getmetatable(j) == json.array_mt) then ok, j = false, "not a JSON object" end
  if not ok then error(string.format("%s: %s: %s", who, path, tostring(j)), level + 1) end
  return j
end

local function class_tostring(cls) return "class " .. cls.__name end

-- class(base, name, new, inherit) -> a subclass of base named name; calling it, Class(...),
-- returns new(Class, ...). inherit lists metamethods copied from base (Lua reads metamethods
-- with rawget, so a subclass does not see its base's through __index); when __index is not
-- among them the class is its instances' __index, so methods are found on the class and then,
-- through its own metatable, on base. cls.super is base.
function util.class(base, name, new, inherit)
  local cls = {}
  for _, mm in ipairs(inherit or {}) do cls[mm] = base[mm] end
  if cls.__index == nil then cls.__index = cls end
  cls.__name = name or base.__name
  cls.super = base
  return setmetatable(cls, {__index = base, __call = new, __tostring = class_tostring})
end

-- bytes per element of each dtype keng stores: the engine's kg_dtype_info (keng.dtype_sizes,
-- looked up when first asked, so a bare Lua state can still load this file), plus i16, which
-- only appears in safetensors headers
local BYTES = setmetatable({i16 = 2}, {__index = function(_, dtype)
  local ok, keng = pcall(require, "keng")
  return ok and type(keng) == "table" and keng.dtype_sizes and keng.dtype_sizes[dtype] or nil
end})

-- dtype_size(dtype) -> bytes per element, nil for a name keng does not know
function util.dtype_size(dtype) return BYTES[dtype] end

-- nbytes(t) -> the bytes t's elements take in its dtype
function util.nbytes(t) return t:numel() * BYTES[t.dtype] end

return util
