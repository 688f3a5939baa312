-- keng.nn.initializers — parameter initialisers with Keras defaults, by name.
-- Each is fn(shape, opts) -> tensor; opts: dtype, device and the initialiser's own options
-- (mean/std, low/high, value, fan_in/fan_out); any other key raises naming it and the valid ones. Weights are stored [out, in, *kernel] as in PyTorch,
-- so fan_in = in * prod(kernel), fan_out = out * prod(kernel) unless opts says otherwise.
-- Truncated normals cut at two standard deviations, with Keras' 0.8796 correction of the std.
local keng = require "keng"
local options = require "keng.options"
local I = {}

local TRUNC_STD = 0.87962566103423978  -- std of a unit normal truncated to [-2, 2]

function I.fans(shape, opts)
  opts = opts or {}
  local fan_in, fan_out
  if #shape == 0 then
    fan_in, fan_out = 1, 1
  elseif #shape == 1 then
    fan_in, fan_out = shape[1], shape[1]
  else
    local rf = 1
    for i = 3, #shape do rf = rf * shape[i] end
    fan_in, fan_out = shape[2] * rf, shape[1] * rf
  end
  return opts.fan_in or fan_in, opts.fan_out or fan_out
end

-- values are drawn in f32 (f64 for f64 parameters) on the target device, then cast
local function draw_opts(opts)
  return {dtype = opts.dtype == "f64" and "f64" or "f32", device = opts.device}
end

local function uniform(shape, lo, hi, opts)
  return keng.rand(shape, draw_opts(opts)) * (hi - lo) + lo
end

local function truncated_normal(shape, mean, std, opts)
  local o = draw_opts(opts)
  local x = keng.randn(shape, o)
  for _ = 1, 4 do  -- redraw what falls outside [-2, 2]; the clamp catches the last stragglers
    x = keng.where(x:abs():gt(2), keng.randn(shape, o), x)
  end
  return x:clamp(-2, 2) * std + mean
end

-- def(name, keys, fn): I[name] checks its options (dtype, device and its own keys) before drawing,
-- so a misspelt or foreign key (std on a uniform) raises instead of being ignored
local VALID = {}  -- fn -> its valid option names, sorted
local function def(name, keys, fn)
  local valid = {"device", "dtype"}
  for _, k in ipairs(keys) do valid[#valid + 1] = k end
  table.sort(valid)
  local f = function(shape, opts)
    return fn(shape, options.check(name, opts, valid))
  end
  VALID[f] = valid
  I[name] = f
end

local FAN_IN, FANS = {"fan_in"}, {"fan_in", "fan_out"}

def("zeros", {}, function(shape, opts) return keng.zeros(shape, draw_opts(opts)) end)
def("ones", {}, function(shape, opts) return keng.ones(shape, draw_opts(opts)) end)
def("constant", {"value"}, function(shape, opts) return keng.full(shape, opts.value or 0, draw_opts(opts)) end)
def("normal", {"mean", "std", "stddev"}, function(shape, opts)  -- Keras RandomNormal: mean 0, stddev 0.05
  return keng.randn(shape, draw_opts(opts)) * (opts.std or opts.stddev or 0.05) + (opts.mean or 0)
end)
def("uniform", {"low", "high", "minval", "maxval"}, function(shape, opts)  -- Keras RandomUniform: [-0.05, 0.05)
  return uniform(shape, opts.low or opts.minval or -0.05, opts.high or opts.maxval or 0.05, opts)
end)
def("truncated_normal", {"mean", "std", "stddev"}, function(shape, opts)
  return truncated_normal(shape, opts.mean or 0, opts.std or opts.stddev or 0.05, opts)
end)
def("glorot_uniform", FANS, function(shape, opts)
  local fi, fo = I.fans(shape, opts)
  local limit = math.sqrt(6 / (fi + fo))
  return uniform(shape, -limit, limit, opts)
end)
def("glorot_normal", FANS, function(shape, opts)
  local fi, fo = I.fans(shape, opts)
  return truncated_normal(shape, 0, math.sqrt(2 / (fi + fo)) / TRUNC_STD, opts)
end)
def("he_uniform", FAN_IN, function(shape, opts)
  local fi = I.fans(shape, opts)
  local limit = math.sqrt(6 / fi)
  return uniform(shape, -limit, limit, opts)
end)
def("he_normal", FAN_IN, function(shape, opts)
  local fi = I.fans(shape, opts)
  return truncated_normal(shape, 0, math.sqrt(2 / fi) / TRUNC_STD, opts)
end)
def("lecun_uniform", FAN_IN, function(shape, opts)
  local fi = I.fans(shape, opts)
  local limit = math.sqrt(3 / fi)
  return uniform(shape, -limit, limit, opts)
end)
def("lecun_normal", FAN_IN, function(shape, opts)
  local fi = I.fans(shape, opts)
  return truncated_normal(shape, 0, math.sqrt(1 / fi) / TRUNC_STD, opts)
end)
I.xavier_uniform = I.glorot_uniform
I.xavier_normal = I.glorot_normal
I.kaiming_uniform = I.he_uniform
I.kaiming_normal = I.he_normal

-- options(fn) -> the sorted option names a built-in initialiser takes, nil for a user's function
function I.options(fn) return VALID[fn] end

-- get(name_or_fn) -> fn; error names the unknown initialiser and the known ones
function I.get(init, level)
  if type(init) == "function" then return init end
  local fn = type(init) == "string" and rawget(I, init)
  if type(fn) ~= "function" or not VALID[fn] then
    local names = {}
    for k, v in pairs(I) do if VALID[v] then names[#names + 1] = k end end
    table.sort(names)
    error(string.format("unknown initialiser '%s' (expected a function or one of %s)",
      tostring(init), table.concat(names, ", ")), (level or 1) + 1)
  end
  return fn
end

return I
