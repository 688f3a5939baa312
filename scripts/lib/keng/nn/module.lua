-- keng.nn.Module — the base class of every layer and model.
--
--   local Block = nn.Module:extend("Block")
--   function Block:init(d) self.query = nn.Linear(d, d); self.scale = self:param("scale", {d}, "ones") end
--   function Block:forward(x) return self.query(x) * self.scale end
--   local m = Block(8); m(x)                  -- instances are callable: m(x) == m:forward(x)
--
-- Parameters (leaf tensors with requires_grad), buffers (state that is not trained) and
-- submodules live in per-instance registries, in the order they were assigned, so names come
-- out dotted and depth first as in PyTorch ("query.weight", "1.bias"). Assigning a module, a
-- leaf tensor that requires grad, or a plain list of modules to a field registers it; anything
-- else is an ordinary field. Registered names stay out of the raw instance table, so assigning
-- the same name again (or nil, which unregisters) always goes through __newindex.
local keng = require "keng"
local precision = require "keng.precision"
local initializers = require "keng.nn.initializers"
local options = require "keng.options"
local util = require "keng.util"

local Module = {}
Module.__name = "Module"

local FLOAT = {f32 = true, f64 = true, bf16 = true, f16 = true}

local function is_module(v)
  return type(v) == "table" and rawget(v, "_modules") ~= nil and getmetatable(v) ~= nil
end
Module.is_module = is_module

local shape_str = util.shape_str

-- a plain Lua list whose elements are all modules (wrapped into a ModuleList on assignment)
local function is_module_list(v)
  if type(v) ~= "table" or getmetatable(v) ~= nil or #v == 0 then return false end
  local n = 0
  for _ in pairs(v) do n = n + 1 end
  if n ~= #v then return false end
  for _, e in ipairs(v) do if not is_module(e) then return false end end
  return true
end

---------------------------------------------------------------------------------------------
-- registration

local function unregister(self, name)
  local params, mods, bufs = rawget(self, "_params"), rawget(self, "_modules"), rawget(self, "_buffers")
  if params[name] == nil and mods[name] == nil and bufs[name] == nil then return end
  params[name], mods[name], bufs[name] = nil, nil, nil
  rawget(self, "_nonpersistent")[name] = nil
  local order = rawget(self, "_order")
  for i, n in ipairs(order) do if n == name then table.remove(order, i) break end end
end

-- kind: "_params" | "_modules" | "_buffers"; a name keeps its place when re-registered
local function register(self, kind, name, v)
  if type(name) ~= "string" then
    error(string.format("register: names must be strings, got %s", type(name)), 3)
  end
  local params, mods, bufs = rawget(self, "_params"), rawget(self, "_modules"), rawget(self, "_buffers")
  local known = params[name] ~= nil or mods[name] ~= nil or bufs[name] ~= nil
  rawset(self, name, nil)  -- a plain field of the same name gives way
  params[name], mods[name], bufs[name] = nil, nil, nil
  if not known then table.insert(rawget(self, "_order"), name) end
  rawget(self, kind)[name] = v
end

---------------------------------------------------------------------------------------------
-- instance metamethods (copied into every class by extend)

function Module.__index(self, k)
  local key = type(k) == "number" and tostring(k) or k
  local v = rawget(self, "_params")[key]
  if v ~= nil then return v end
  v = rawget(self, "_modules")[key]
  if v ~= nil then return v end
  v = rawget(self, "_buffers")[key]
  if v ~= nil then return v end
  return getmetatable(self)[k]
end

function Module.__newindex(self, k, v)
  local key = type(k) == "number" and tostring(k) or k
  local params, mods, bufs = rawget(self, "_params"), rawget(self, "_modules"), rawget(self, "_buffers")
  if params[key] ~= nil or bufs[key] ~= nil then
    if v == nil then return unregister(self, key) end
    if keng.is_tensor(v) then
      return register(self, params[key] ~= nil and "_params" or "_buffers", key, v)
    end
    if not is_module(v) then
      error(string.format("%s: cannot assign a %s to '%s', which holds a %s (a tensor or nil expected)",
        self.__name, type(v), key, params[key] ~= nil and "parameter" or "buffer"), 2)
    end
  end
  if is_module(v) then return register(self, "_modules", key, v) end
  if is_module_list(v) then return register(self, "_modules", key, Module.ModuleList(v)) end
  if mods[key] ~= nil then
    if v == nil then return unregister(self, key) end
    if keng.is_tensor(v) and v.requires_grad and v.is_leaf then return register(self, "_params", key, v) end
    unregister(self, key)
  elseif keng.is_tensor(v) and v.requires_grad and v.is_leaf then
    return register(self, "_params", key, v)
  end
  rawset(self, k, v)
end

function Module.__call(self, ...)
  local out = table.pack(self:forward(...))
  local y = out[1]
  if keng.is_tensor(y) then
    rawset(self, "_output_shape", y.shape)
  elseif type(y) == "table" and keng.is_tensor(y[1]) then
    rawset(self, "_output_shape", y[1].shape)
  end
  return table.unpack(out, 1, out.n)
end

function Module.__tostring(self)
  local extra = self:extra_repr()
  local kids = self:named_children()
  if #kids == 0 then return self.__name .. "(" .. (extra or "") .. ")" end
  local lines = {self.__name .. "("}
  if extra then lines[2] = "  " .. extra end
  for _, c in ipairs(kids) do
    local s = tostring(c[2]):gsub("\n", "\n  ")
    lines[#lines + 1] = "  (" .. c[1] .. "): " .. s
  end
  lines[#lines + 1] = ")"
  return table.concat(lines, "\n")
end

---------------------------------------------------------------------------------------------
-- errors at the user's line

-- Raises msg blaming the caller of the function that calls Module.error, as error(msg, 2)
-- would, except that the module plumbing (m(x) -> __call -> forward, Class(...) -> init) is
-- skipped: `nn.Linear(4, 3)(x)` with a bad x names the user's line, not module.lua.
function Module.error(msg, level)
  error(msg, Module.user_level((level or 2) + 1))
end

-- functions that only pass a call on (containers' forward register here too)
Module.plumbing = setmetatable({}, {__mode = "k"})

-- level (as error() counts it from the caller of user_level), moved past the module plumbing
-- frames (__call, new_instance, Sequential:forward) to the first frame that is none of them
function Module.user_level(level)
  level = level + 1
  while true do
    local info = debug.getinfo(level, "f")
    if not info or not Module.plumbing[info.func] then break end
    level = level + 1
  end
  return level - 1
end

-- x, or an error naming who wanted a tensor and what it got
function Module.check_tensor(who, x, what)
  if not keng.is_tensor(x) then
    Module.error(string.format("%s: %s must be a tensor, got %s", who, what or "input",
      type(x) == "string" and string.format("the string %q", x:sub(1, 40)) or type(x)), 3)
  end
  return x
end

---------------------------------------------------------------------------------------------
-- classes

local METAMETHODS = {"__index", "__newindex", "__call", "__tostring", "__len"}

local function new_instance(cls, ...)
  local obj = setmetatable({_params = {}, _modules = {}, _buffers = {}, _order = {},
    _nonpersistent = {}, training = true}, cls)
  obj:init(...)
  return obj
end
Module.plumbing[new_instance] = true
Module.plumbing[Module.__call] = true

local class_mt = {
  __call = new_instance,
  __tostring = function(cls) return "class " .. cls.__name end,
}

-- Module:extend(name) -> a class; Class(...) makes an instance and calls init(self, ...)
function Module:extend(name)
  return util.class(self, name, new_instance, METAMETHODS)
end

setmetatable(Module, class_mt)

function Module:init() end

function Module:forward()
  error(string.format("forward: %s does not define forward", self.__name), 2)
end

-- a one-line description of the module's configuration, shown by tostring
function Module:extra_repr() return nil end

-- the dtype/device options a layer was built with: param() picks them up. With {dtype=} the
-- module computes in that dtype; otherwise the precision policy decides.
function Module:configure(opts)
  opts = opts or {}
  if opts.dtype then
    rawset(self, "_param_dtype", opts.dtype)
  else
    rawset(self, "_param_dtype", precision.variable_dtype())
    local cd = precision.compute_dtype()
    if cd ~= precision.variable_dtype() then rawset(self, "_compute_dtype", cd) end
  end
  if opts.device then rawset(self, "_device", opts.device) end
  return self
end

-- the dtype this module computes in: the policy's when mixed, else the given reference's
function Module:compute_dtype(ref)
  return rawget(self, "_compute_dtype") or (ref and ref.dtype) or rawget(self, "_param_dtype") or "f32"
end

-- self:param(name, shape, init, opts) -> a leaf tensor with requires_grad, stored as self[name].
-- init: an initialiser name (keng.nn.initializers), a function(shape, opts) -> tensor, or omit
-- (glorot_uniform). shape may be a tensor, which becomes the parameter (storage shared).
-- opts: dtype, device, requires_grad (true), and options for the initialiser; a key that neither
-- param nor a built-in initialiser knows raises naming it and the valid ones.
function Module:param(name, shape, init, opts)
  opts = opts or {}                          -- the initialiser checks its own options
  if type(name) ~= "string" then error("param: name must be a string, got " .. type(name), 2) end
  local dtype = opts.dtype or rawget(self, "_param_dtype") or precision.variable_dtype()
  local device = opts.device or rawget(self, "_device") or "cpu"
  local t
  if keng.is_tensor(shape) then
    options.check(string.format("param: '%s'", name), opts, {"dtype", "device", "requires_grad"}, 2)
    t = shape:detach()
    if opts.dtype or opts.device then t = keng.no_grad(function() return t:to{dtype = opts.dtype, device = opts.device} end) end
  else
    if type(shape) ~= "table" then
      error(string.format("param: '%s': shape must be a list of sizes, got %s", name, type(shape)), 2)
    end
    for i, n in ipairs(shape) do
      if math.type(n) ~= "integer" or n < 0 then
        error(string.format("param: '%s': size %d of %s is not a non-negative integer", name, i,
          shape_str(shape)), 2)
      end
    end
    if device == "meta" then
      t = keng.empty(shape, {dtype = dtype, device = "meta"})
    else
      local fn = initializers.get(init or "glorot_uniform", 2)
      local iopts = {}
      for k, v in pairs(opts) do if k ~= "requires_grad" then iopts[k] = v end end
      local ivalid = initializers.options(fn)  -- nil for the user's own function: its options are its own
      if ivalid then
        local valid = {requires_grad = true}
        for _, k in ipairs(ivalid) do valid[k] = true end
        options.check(string.format("param: '%s' (%s)", name, type(init) == "string" and init or "glorot_uniform"),
          opts, valid, 2)
      end
      iopts.dtype, iopts.device = dtype, device
      t = keng.no_grad(function()
        local v = fn(shape, iopts)
        if not keng.is_tensor(v) then
          error(string.format("param: '%s': the initialiser returned a %s, not a tensor", name, type(v)), 0)
        end
        return v:to{dtype = dtype, device = device}
      end)
      local got = t.shape
      local same = #got == #shape
      for i = 1, #shape do same = same and got[i] == shape[i] end
      if not same then
        error(string.format("param: '%s': the initialiser returned shape %s, expected %s", name,
          shape_str(got), shape_str(shape)), 2)
      end
      t = t:detach()
    end
  end
  t.requires_grad = FLOAT[t.dtype] and opts.requires_grad ~= false or false
  register(self, "_params", name, t)
  return t
end

-- self:buffer(name, tensor, {persistent=true}) -> tensor; buffers are in state_dict (when
-- persistent) and follow to(), but are not parameters
function Module:buffer(name, t, opts)
  options.check("buffer", opts, {"persistent"})
  if type(name) ~= "string" then error("buffer: name must be a string, got " .. type(name), 2) end
  if not keng.is_tensor(t) then error(string.format("buffer: '%s': a tensor expected, got %s", name, type(t)), 2) end
  register(self, "_buffers", name, t)
  rawget(self, "_nonpersistent")[name] = (opts and opts.persistent == false) or nil
  return t
end

---------------------------------------------------------------------------------------------
-- traversal

-- ordered list of {name, child}
function Module:named_children()
  local out, mods = {}, rawget(self, "_modules")
  for _, name in ipairs(rawget(self, "_order")) do
    if mods[name] then out[#out + 1] = {name, mods[name]} end
  end
  return out
end

function Module:children()
  local out = {}
  for _, c in ipairs(self:named_children()) do out[#out + 1] = c[2] end
  return out
end

-- ordered list of {dotted name, module}, self first (name ""), each module once
function Module:named_modules()
  local out, seen = {}, {}
  local function visit(m, name)
    if seen[m] then return end
    seen[m] = true
    out[#out + 1] = {name, m}
    for _, c in ipairs(m:named_children()) do visit(c[2], name == "" and c[1] or name .. "." .. c[1]) end
  end
  visit(self, "")
  return out
end

function Module:modules()
  local out = {}
  for _, e in ipairs(self:named_modules()) do out[#out + 1] = e[2] end
  return out
end

-- every {dotted name, tensor, owner, local name} of a registry kind, in registration order;
-- dedup drops tensors already seen (tied weights appear once)
local function collect(self, kinds, dedup)
  local out, seen, seen_mod = {}, {}, {}
  local function visit(m, prefix)
    if seen_mod[m] then return end
    seen_mod[m] = true
    local params, mods, bufs = rawget(m, "_params"), rawget(m, "_modules"), rawget(m, "_buffers")
    local nonpersistent = rawget(m, "_nonpersistent")
    for _, name in ipairs(rawget(m, "_order")) do
      local t, kind = params[name], "param"
      if t == nil and bufs[name] ~= nil and (kinds.buffers_all or (kinds.buffers and not nonpersistent[name])) then
        t, kind = bufs[name], "buffer"
      end
      if t ~= nil and (kind == "buffer" or kinds.params) then
        if not (dedup and seen[t]) then
          seen[t] = true
          out[#out + 1] = {prefix .. name, t, m, name, kind}
        end
      elseif mods[name] then
        visit(mods[name], prefix .. name .. ".")
      end
    end
  end
  visit(self, "")
  return out
end

-- ordered list of {dotted name, tensor}, each tensor once
function Module:named_parameter_list()
  local out = {}
  for _, e in ipairs(collect(self, {params = true}, true)) do out[#out + 1] = {e[1], e[2]} end
  return out
end

-- {dotted name = tensor}
function Module:named_parameters()
  local out = {}
  for _, e in ipairs(collect(self, {params = true}, true)) do out[e[1]] = e[2] end
  return out
end

-- list of parameter tensors (registration order, depth first, each once)
function Module:parameters()
  local out = {}
  for _, e in ipairs(collect(self, {params = true}, true)) do out[#out + 1] = e[2] end
  return out
end

-- ordered list of {dotted name, tensor} of buffers
function Module:named_buffer_list()
  local out = {}
  for _, e in ipairs(collect(self, {buffers_all = true}, true)) do out[#out + 1] = {e[1], e[2]} end
  return out
end

function Module:buffers()
  local out = {}
  for _, e in ipairs(self:named_buffer_list()) do out[#out + 1] = e[2] end
  return out
end

-- fn(module) on every module, children before their parent (as PyTorch); returns self
function Module:apply(fn)
  local mods = self:modules()
  for i = #mods, 1, -1 do fn(mods[i]) end
  return self
end

function Module:train(on)
  if on == nil then on = true end
  for _, m in ipairs(self:modules()) do rawset(m, "training", on and true or false) end
  return self
end

function Module:eval() return self:train(false) end

-- freeze() / unfreeze(): requires_grad of every parameter
function Module:freeze()
  for _, p in ipairs(self:parameters()) do p.requires_grad = false end
  return self
end

function Module:unfreeze()
  for _, p in ipairs(self:parameters()) do p.requires_grad = true end
  return self
end

function Module:zero_grad()
  for _, p in ipairs(self:parameters()) do p.grad = nil end
  return self
end

---------------------------------------------------------------------------------------------
-- dtype and device

local function is_device(s)
  return s == "cpu" or s == "meta" or s == "cuda" or (type(s) == "string" and s:match("^cuda:%d+$") ~= nil)
end

-- m:to("bf16") / m:to("cuda") / m:to{dtype=, device=}: converts every parameter and buffer,
-- replacing the fields; parameters stay leaves with the same requires_grad. Only floating
-- tensors change dtype. After a dtype change the module computes in that dtype.
function Module:to(arg)
  local dtype, device
  if type(arg) == "table" then
    options.check("to", arg, {"dtype", "device"})
    dtype, device = arg.dtype, arg.device
  elseif is_device(arg) then
    device = arg
  elseif type(arg) == "string" then
    dtype = arg
  else
    error("to: a dtype, a device or {dtype=, device=} expected, got " .. type(arg), 2)
  end
  local done = {}  -- old tensor -> new, so tied weights stay tied
  for _, e in ipairs(collect(self, {params = true, buffers_all = true}, false)) do
    local t, owner, name, kind = e[2], e[3], e[4], e[5]
    local new = done[t]
    if not new then
      local target = {device = device}
      -- a module's _keep_dtype names tensors that keep theirs (an int8 layer's f32 scales)
      local keep = rawget(owner, "_keep_dtype")
      if dtype and FLOAT[t.dtype] and not (keep and keep[name]) then target.dtype = dtype end
      new = keng.no_grad(function() return t:detach():to(target) end)
      if new.dtype == t.dtype and new.device == t.device then
        new = t
      elseif kind == "param" then
        new.requires_grad = t.requires_grad
      end
      done[t] = new
    end
    if new ~= t then rawget(owner, kind == "param" and "_params" or "_buffers")[name] = new end
  end
  for _, m in ipairs(self:modules()) do
    if dtype then
      rawset(m, "_compute_dtype", nil)
      rawset(m, "_param_dtype", (keng.zeros({0}, {dtype = dtype}).dtype))
    end
    if device then rawset(m, "_device", device) end
  end
  return self
end

-- m:quantize("int8") -> m: weight-only quantization of every Linear (keng.quantize, docs/quantization.md)
function Module:quantize(fmt, opts)
  return require("keng.quantize").quantize_at(3, self, fmt, opts)
end

---------------------------------------------------------------------------------------------
-- state

-- {dotted name = tensor} of parameters and persistent buffers (detached, storage shared);
-- tied tensors appear under each name. opts.keep_vars returns the parameters themselves.
function Module:state_dict(opts)
  options.check("state_dict", opts, {"keep_vars"})
  local out = {}
  for _, e in ipairs(collect(self, {params = true, buffers = true}, false)) do
    out[e[1]] = (opts and opts.keep_vars) and e[2] or e[2]:detach()
  end
  return out
end

-- ordered list of the state_dict's names
function Module:state_dict_keys()
  local out = {}
  for _, e in ipairs(collect(self, {params = true, buffers = true}, false)) do out[#out + 1] = e[1] end
  return out
end

-- load_state_dict(sd, {strict=true}) copies values into the parameters and buffers (converting
-- dtype and device). A meta tensor is replaced by the loaded one, which materialises a model
-- built on device="meta". Strict mode raises on missing or unexpected keys; a shape mismatch
-- always raises; the message lists every problem. Returns {missing=, unexpected=}.
function Module:load_state_dict(sd, opts)
  options.check("load_state_dict", opts, {"strict"})
  if type(sd) ~= "table" then error("load_state_dict: a table of name -> tensor expected, got " .. type(sd), 2) end
  local strict = not (opts and opts.strict == false)
  local entries = collect(self, {params = true, buffers = true}, false)
  local expected, missing, unexpected, mismatched = {}, {}, {}, {}
  for _, e in ipairs(entries) do
    expected[e[1]] = true
    local src = sd[e[1]]
    if src == nil then
      missing[#missing + 1] = e[1]
    else
      local a, b = src.shape, e[2].shape
      local same = #a == #b
      for i = 1, #a do same = same and a[i] == b[i] end
      if not same then
        mismatched[#mismatched + 1] = string.format("size mismatch for %s: checkpoint %s, model %s",
          e[1], shape_str(a), shape_str(b))
      end
    end
  end
  for k in pairs(sd) do if not expected[k] then unexpected[#unexpected + 1] = k end end
  table.sort(unexpected)
  if #mismatched > 0 or (strict and (#missing > 0 or #unexpected > 0)) then
    local lines = {"load_state_dict: error(s) loading the state dict of " .. self.__name .. ":"}
    local function quoted(list)
      local q = {}
      for i, k in ipairs(list) do q[i] = '"' .. k .. '"' end
      return table.concat(q, ", ")
    end
    if strict and #missing > 0 then lines[#lines + 1] = "  missing keys: " .. quoted(missing) end
    if strict and #unexpected > 0 then lines[#lines + 1] = "  unexpected keys: " .. quoted(unexpected) end
    for _, m in ipairs(mismatched) do lines[#lines + 1] = "  " .. m end
    error(table.concat(lines, "\n"), 2)
  end
  local done = {}  -- old tensor -> its loaded replacement, so tied tensors load once
  local progress, loads = require "keng.progress", {}              -- a checkpoint's per-tensor progress
  keng.no_grad(function()
    for _, e in ipairs(entries) do
      local src, t, owner, name, kind = sd[e[1]], e[2], e[3], e[4], e[5]
      local reg = rawget(owner, kind == "param" and "_params" or "_buffers")
      if done[t] then
        reg[name] = done[t]
      elseif src ~= nil then
        local new = t
        if t.device == "meta" then
          new = src:detach():to{dtype = t.dtype}
          if kind == "param" then new.requires_grad = t.requires_grad end
          reg[name] = new
        else
          t:copy_(src)
        end
        done[t] = new
        local load = progress.loaded_tensor(src)
        if load then loads[load] = true end
      end
    end
  end)
  progress.finish_loads(loads)
  return {missing = missing, unexpected = unexpected}
end

---------------------------------------------------------------------------------------------
-- counting and summary

-- num_params() -> number of parameter elements (tied counted once); {trainable=true} counts
-- only those with requires_grad
function Module:num_params(opts)
  options.check("num_params", opts, {"trainable"})
  local n = 0
  for _, p in ipairs(self:parameters()) do
    if not (opts and opts.trainable) or p.requires_grad then n = n + p:numel() end
  end
  return n
end

local function commas(n)
  local s = tostring(math.tointeger(n) or n)
  local sign, digits = s:match("^(-?)(%d+)$")
  if not digits then return s end
  digits = digits:reverse():gsub("(%d%d%d)", "%1,"):reverse():gsub("^,", "")
  return sign .. digits
end
Module.format_count = commas

local function human_bytes(b)
  local units = {"B", "KB", "MB", "GB", "TB"}
  local i = 1
  while b >= 1024 and i < #units do b, i = b / 1024, i + 1 end
  return i == 1 and string.format("%d B", b) or string.format("%.2f %s", b, units[i])
end

-- summary({depth=, print_fn=, quiet=}) -> the Keras-like table as a string (printed unless
-- quiet): each submodule's dotted name, type, output shape of the last call and parameter
-- count (its own and its children's), then total, trainable and frozen counts.
function Module:summary(opts)
  options.check("summary", opts, {"depth", "quiet", "print_fn"})
  opts = opts or {}
  local rows = {{"Layer", "Type", "Output shape", "Params"}}
  -- the root's own parameters first-class rows, then each submodule
  local params = rawget(self, "_params")
  for _, e in ipairs(self:named_modules()) do
    local name, m = e[1], e[2]
    if name == "" then
      for _, pn in ipairs(rawget(self, "_order")) do
        if params[pn] then rows[#rows + 1] = {pn, "Parameter", shape_str(params[pn].shape), commas(params[pn]:numel())} end
      end
    else
      local _, depth = name:gsub("%.", "")
      if not opts.depth or depth < opts.depth then
        local shape = rawget(m, "_output_shape")
        rows[#rows + 1] = {name, m.__name, shape and shape_str(shape) or "?", commas(m:num_params())}
      end
    end
  end
  local widths = {0, 0, 0, 0}
  for _, r in ipairs(rows) do for i = 1, 4 do widths[i] = math.max(widths[i], #r[i]) end end
  local function line(r)
    return string.format("%-" .. widths[1] .. "s  %-" .. widths[2] .. "s  %-" .. widths[3] .. "s  %"
      .. widths[4] .. "s", r[1], r[2], r[3], r[4])
  end
  local total_w = widths[1] + widths[2] + widths[3] + widths[4] + 6
  local out = {string.format('Model: "%s"', self.__name), string.rep("-", total_w), line(rows[1]),
    string.rep("=", total_w)}
  for i = 2, #rows do out[#out + 1] = line(rows[i]) end
  out[#out + 1] = string.rep("=", total_w)
  local total, trainable, total_bytes, trainable_bytes = 0, 0, 0, 0
  for _, p in ipairs(self:parameters()) do
    local n, b = p:numel(), p:numel() * (util.dtype_size(p.dtype) or 4)
    total, total_bytes = total + n, total_bytes + b
    if p.requires_grad then trainable, trainable_bytes = trainable + n, trainable_bytes + b end
  end
  out[#out + 1] = string.format("Total params: %s (%s)", commas(total), human_bytes(total_bytes))
  out[#out + 1] = string.format("Trainable params: %s (%s)", commas(trainable), human_bytes(trainable_bytes))
  out[#out + 1] = string.format("Frozen params: %s (%s)", commas(total - trainable),
    human_bytes(total_bytes - trainable_bytes))
  local s = table.concat(out, "\n")
  if opts.quiet then return s end
  if opts.print_fn then opts.print_fn(s); return s end
  print(s) -- printed once; nothing returned, so the REPL does not echo the table again
end

---------------------------------------------------------------------------------------------
-- training (keng.train does the work; loaded on first use)

function Module:fit(data, opts) return require("keng.train").fit(self, data, opts) end
function Module:predict(data, opts) return require("keng.train").predict(self, data, opts) end
function Module:evaluate(data, opts) return require("keng.train").evaluate(self, data, opts) end

return Module
