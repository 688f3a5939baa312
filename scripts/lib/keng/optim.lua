-- keng.optim — SGD, Adam and AdamW over the engine's fused per-parameter updates (one kernel
-- call per parameter: keng._sgd_step_ / keng._adam_step_, formulas in engine/ops/optim.c),
-- gradient clipping by global norm, and learning-rate schedules.
--
--   local optim = require "keng.optim"
--   local opt = optim.AdamW(model:parameters(), {lr = 1e-3, weight_decay = 0.004})
--   loss:backward(); optim.clip_grad_norm(model:parameters(), 1.0); opt:step(); opt:zero_grad()
--
-- Defaults are Keras 3's (Adam/AdamW lr 1e-3, beta1 0.9, beta2 0.999, eps 1e-7, AdamW
-- weight_decay 0.004; SGD lr 0.01). Adam's `weight_decay` is an L2 term added to the gradient
-- (PyTorch's Adam) unless `decoupled = true`; AdamW's is decoupled (p <- p - lr·wd·p, as Keras
-- and PyTorch). State (m, v, momentum) is kept in each parameter's dtype and device.
-- `step()` skips parameters whose grad is nil or whose requires_grad is false. `zero_grad()`
-- sets every grad to nil (as PyTorch); `zero_grad(false)` zeroes them in place instead.
-- Schedules are functions of the step number s = opt.iterations, the number of steps already
-- taken (0 at the first step, as Keras' optimizer.iterations); a schedule sets opt.lr before
-- each step.
--
-- CUDA Graphs: on cuda the kernels read lr and each parameter's step count from a small f64
-- device buffer (opt.scalars: {lr, step of param 1, ...}) that step() writes before the updates.
-- Inside a keng.cuda.graph capture step() registers a replay hook (keng.cuda.on_replay) instead
-- of writing: before every launch the hook advances the host state as an eager step() would
-- (schedule, step counts, iterations) and writes the buffer, so a replayed step equals an eager
-- one, schedules and Adam's bias correction included. opt.device_scalars = true / false forces
-- the buffer on / off (default: on when the first parameter is on cuda); the cpu path reads
-- plain numbers as before.
local keng = require "keng"
local options = require "keng.options"
local util = require "keng.util"

local optim = {schedules = {}}

-- ---- helpers --------------------------------------------------------------------------------

-- a list of tensors from a list, or from anything with :parameters() (a module)
local function param_list(params, fname)
  if type(params) == "table" and type(params.parameters) == "function" then params = params:parameters() end
  if type(params) ~= "table" then error(fname .. ": params must be a list of tensors, got " .. type(params), 3) end
  local list = {}
  for i, p in ipairs(params) do
    if not keng.is_tensor(p) then error(string.format("%s: params[%d] is a %s, not a tensor", fname, i, type(p)), 3) end
    if not p.is_leaf then
      -- a non-leaf's update would be lost: backward fills grads of leaves only (as PyTorch refuses)
      error(string.format("%s: params[%d] is not a leaf tensor (it is the result of an op); optimize the leaf "
        .. "it came from, or t:detach():requires_grad_()", fname, i), 3)
    end
    list[i] = p
  end
  return list
end

-- v in [lo, hi] (open ends when lo_open / hi_open), else an error at stack level `level` as
-- error() counts it from here
local function check_number(level, fname, key, v, lo, hi, lo_open, hi_open)
  if type(v) ~= "number" or v ~= v then
    error(string.format("%s: %s must be a number, got %s", fname, key, tostring(v)), level)
  end
  if v == math.huge or v == -math.huge then
    error(string.format("%s: %s must be finite, got %s", fname, key, tostring(v)), level)
  end
  if v < lo or (lo_open and v == lo) or v > hi or (hi_open and v == hi) then
    local range = hi == math.huge and string.format("%s %g", lo_open and ">" or ">=", lo)
      or string.format("in %s%g, %g%s", lo_open and "(" or "[", lo, hi, hi_open and ")" or "]")
    error(string.format("%s: %s must be %s, got %g", fname, key, range, v), level)
  end
  return v
end

-- Reads opts into a fresh table of hyper-parameters: known keys (with Keras aliases) or an error.
local aliases = {learning_rate = "lr", beta_1 = "beta1", beta_2 = "beta2", epsilon = "eps"}
local function read_opts(fname, opts, defaults)
  local valid = {schedule = true}
  for k in pairs(defaults) do valid[k] = true end
  for k, v in pairs(aliases) do if defaults[v] ~= nil then valid[k] = true end end
  opts = options.check(fname, opts, valid, 3)
  local h = {}
  for k, v in pairs(defaults) do h[k] = v end
  for k, v in pairs(opts) do h[aliases[k] or k] = v end
  return h
end

-- ---- Optimizer: the shared base --------------------------------------------------------------

local Optimizer = {}
Optimizer.__index = Optimizer
Optimizer.__name = "Optimizer"
optim.Optimizer = Optimizer

-- A subclass; calling it makes an instance (Class(params, opts)).
local function new_optimizer(cls, ...) return cls.new(cls, ...) end
function Optimizer:extend(name) return util.class(self, name, new_optimizer, {"__tostring"}) end

function Optimizer.new(cls, params, opts)
  local h = read_opts(cls.__name, opts, cls.defaults)
  local self = setmetatable({}, cls)
  self.params = param_list(params, cls.__name)
  self.hyper = h
  self.lr = h.lr
  self.iterations = 0
  self.state = {} -- [param index] = {step = n, <state tensors>}
  cls.check(self, cls.__name)
  if h.schedule ~= nil then self:set_schedule(h.schedule) end
  h.schedule = nil
  return self
end

function Optimizer:__tostring()
  local keys = {}
  for k in pairs(self.hyper) do keys[#keys + 1] = k end
  table.sort(keys)
  local parts = {}
  for _, k in ipairs(keys) do
    parts[#parts + 1] = k .. "=" .. tostring(k == "lr" and self.lr or self.hyper[k])
  end
  return string.format("%s(%d params, %s)", self.__name, #self.params, table.concat(parts, ", "))
end

-- fn(step) -> lr, called before every step with step = opt.iterations; nil removes it.
function Optimizer:set_schedule(fn)
  if fn ~= nil and type(fn) ~= "function" and not (getmetatable(fn) or {}).__call then
    error(self.__name .. ":set_schedule: expected a function of the step number, got " .. type(fn), 2)
  end
  self.schedule = fn
  return self
end

function Optimizer:zero_grad(set_to_none)
  for _, p in ipairs(self.params) do
    if set_to_none == false then
      local g = p.grad
      if g then g:zero_() end
    else
      p.grad = nil
    end
  end
end

-- opt.lr from the schedule (if any), checked; level: error level of the caller
function Optimizer:next_lr(level)
  if self.schedule then
    local lr = self.schedule(self.iterations)
    if type(lr) ~= "number" or not (lr >= 0 and lr < math.huge) then
      error(string.format("%s:step: the schedule returned %s at step %d (need a finite number >= 0)", self.__name,
        tostring(lr), self.iterations), level + 1)
    end
    self.lr = lr
  end
  if type(self.lr) ~= "number" or not (self.lr >= 0 and self.lr < math.huge) then
    error(string.format("%s:step: lr must be a finite number >= 0, got %s", self.__name, tostring(self.lr)), level + 1)
  end
end

-- the device-scalar buffer {lr, step_1, ..., step_n} (f64, on the first parameter's device), made
-- on first use; nil when the optimizer runs on plain numbers
function Optimizer:scalar_buffer()
  local p1 = self.params[1]
  if not p1 then return nil end
  local on = self.device_scalars
  if on == nil then on = p1.device:sub(1, 4) == "cuda" end
  if not on then return nil end
  if not self.scalars or self.scalars.device ~= p1.device then
    self.scalars = keng.zeros({#self.params + 1}, {dtype = "f64", device = p1.device})
    self.scalar_views = {lr = self.scalars:narrow(1, 1, 1)}
  end
  return self.scalars
end

-- writes lr and the step counts into the buffer (an asynchronous upload on cuda)
function Optimizer:write_scalars()
  local vals = {self.lr}
  for i = 1, #self.params do
    local s = self.state[i]
    vals[i + 1] = s and s.step or 0
  end
  self.scalars:copy_(keng.tensor(vals, {dtype = "f64"}))
end

-- one replay of a captured step, on the host: what step() would have done before the kernels
function Optimizer:replay_host(stepped)
  self:next_lr(2)
  for _, i in ipairs(stepped) do
    local s = self.state[i]
    s.step = s.step + 1
  end
  self.iterations = self.iterations + 1
end

-- Runs one update of every parameter that has a grad and requires grad.
function Optimizer:step()
  self:next_lr(2)
  local fresh = self.scalars == nil
  local buf = self:scalar_buffer()
  fresh = fresh and buf ~= nil
  local stepped = {}
  for i, p in ipairs(self.params) do
    local g = p.grad
    if g and p.requires_grad then
      local s = self.state[i]
      if not s then
        s = self:init_state(p)
        s.step = 0
        self.state[i] = s
      end
      s.step = s.step + 1
      stepped[#stepped + 1] = i
    end
  end
  local lr_t, views = nil, self.scalar_views
  if buf then
    lr_t = views.lr
    local capture = keng.cuda.on_replay and keng.cuda.on_replay(function(replay)
      if replay then self:replay_host(stepped) end
      self:write_scalars()
    end)
    if capture and fresh then
      error(self.__name .. ":step: first step inside a keng.cuda.graph capture: run the step eagerly once "
        .. "first (warmup >= 1), so the optimizer state exists before the capture", 2)
    end
    if capture then
      -- the graph bakes in these kernels once: a second step in the same capture would read the
      -- same buffer, so it cannot be replayed faithfully
      if self.capture_id == capture then
        error(self.__name .. ":step: called twice inside one keng.cuda.graph capture (one step per graph)", 2)
      end
      self.capture_id = capture
    else
      self:write_scalars()
    end
  end
  for _, i in ipairs(stepped) do
    local p, s = self.params[i], self.state[i]
    if buf and p.device == buf.device then
      views[i] = views[i] or buf:narrow(1, i + 1, 1)
      self:update(p, p.grad, s, lr_t, views[i])
    else                                                          -- a parameter on another device
      self:update(p, p.grad, s)
    end
  end
  self.iterations = self.iterations + 1
end

local function zeros_like(p) return keng.zeros(p.shape, {dtype = p.dtype, device = p.device}) end

-- names for the parameters in a flat state: from a module (its named_parameters, matched by
-- identity), a list (names[i] for params[i]) or nil ("param1", "param2", ...)
local function param_names(self, names, fname)
  local out = {}
  if type(names) == "table" and type(names.named_parameters) == "function" then
    local by = {}
    for n, t in pairs(names:named_parameters()) do   -- a tied tensor: its first name in sort order
      if not by[t] or n < by[t] then by[t] = n end
    end
    for i, p in ipairs(self.params) do out[i] = by[p] or ("param" .. i) end
  elseif type(names) == "table" then
    for i = 1, #self.params do
      if type(names[i]) ~= "string" then
        error(string.format("%s: names[%d] must be a string (one name per parameter), got %s", fname, i, type(names[i])), 3)
      end
      out[i] = names[i]
    end
  elseif names == nil then
    for i = 1, #self.params do out[i] = "param" .. i end
  else
    error(fname .. ": names must be a module or a list of names, got " .. type(names), 3)
  end
  return out
end

-- state_dict() -> {kind, iterations, lr, state = {[i] = {step, <name> = tensor clone}}}; tensors
-- are copies.
-- state_dict{flat = true, names = model} -> one level of name -> value, for a safetensors file:
--   "<param name>.<slot>" = tensor copy (slot m, v, momentum), "<param name>.step" = integer,
--   "kind" = "AdamW", "iterations" = integer, "lr" = number.
-- Parameters are named by `names` (see param_names), so the state survives a rebuilt model.
function Optimizer:state_dict(opts)
  opts = options.check(self.__name .. ":state_dict", opts, {"flat", "names"})
  local state = {}
  for i, s in pairs(self.state) do
    local c = {}
    for k, v in pairs(s) do c[k] = keng.is_tensor(v) and v:clone() or v end
    state[i] = c
  end
  if not opts.flat then
    if opts.names ~= nil then error(self.__name .. ":state_dict: names needs flat = true", 2) end
    return {kind = self.__name, iterations = self.iterations, lr = self.lr, state = state}
  end
  local names = param_names(self, opts.names, self.__name .. ":state_dict")
  local flat = {kind = self.__name, iterations = self.iterations, lr = self.lr}
  for i, c in pairs(state) do
    for k, v in pairs(c) do flat[names[i] .. "." .. k] = v end
  end
  return flat
end

-- the nested form of a flat state (errors name the unknown or missing keys)
local function unflatten(self, flat, names, fname)
  local index = {}
  for i, n in ipairs(param_names(self, names, fname)) do index[n] = i end
  local state, unknown = {}, {}
  for k, v in pairs(flat) do
    if k ~= "kind" and k ~= "iterations" and k ~= "lr" then
      local pname, slot = tostring(k):match("^(.*)%.([%w_]+)$")
      local i = pname and index[pname]
      if not i then
        unknown[#unknown + 1] = tostring(k)
      else
        state[i] = state[i] or {}
        state[i][slot] = v
      end
    end
  end
  if #unknown > 0 then
    table.sort(unknown)
    local known = {}
    for n in pairs(index) do known[#known + 1] = n end
    table.sort(known)
    error(string.format("%s: unknown key(s) %s: no parameter of this optimizer has that name (parameters: %s)",
      fname, table.concat(unknown, ", "), table.concat(known, ", ")), 3)
  end
  for i, s in pairs(state) do
    if math.type(s.step) ~= "integer" then
      error(string.format("%s: parameter '%s' has state but no integer step", fname,
        param_names(self, names, fname)[i]), 3)
    end
  end
  return {kind = flat.kind, iterations = flat.iterations, lr = flat.lr, state = state}
end

-- load_state_dict(sd, {names =}) takes either form of state_dict (the flat one when sd has no
-- `state` table; names as given to state_dict). Slots the optimizer does not use, shapes that
-- differ and names of no parameter are refused by name.
function Optimizer:load_state_dict(sd, opts)
  local fname = self.__name .. ":load_state_dict"
  opts = options.check(fname, opts, {"names"})
  if type(sd) ~= "table" then error(fname .. ": expected a table from state_dict()", 2) end
  if type(sd.state) ~= "table" then sd = unflatten(self, sd, opts.names, fname) end
  if sd.kind and sd.kind ~= self.__name then
    error(string.format("%s: the state is from a %s, not a %s", fname, sd.kind, self.__name), 2)
  end
  local state = {}
  for i, s in pairs(sd.state) do
    local p = self.params[i]
    if not p then error(string.format("%s: state for parameter %s but the optimizer has %d", fname, tostring(i),
      #self.params), 2) end
    local c, keys = {}, {}
    for k in pairs(s) do keys[#keys + 1] = k end
    table.sort(keys)
    local slots = self:state_slots()
    for _, k in ipairs(keys) do
      local v = s[k]
      if k ~= "step" and (slots[k] == nil or not keng.is_tensor(v)) then
        local valid = {"step"}
        for n in pairs(slots) do valid[#valid + 1] = n end
        table.sort(valid)
        error(string.format("%s: parameter %d: unknown state '%s' for %s (valid: %s)", fname, i, tostring(k),
          self.__name, table.concat(valid, ", ")), 2)
      end
      if keng.is_tensor(v) then
        local ps, vs = p.shape, v.shape
        if table.concat(ps, ",") ~= table.concat(vs, ",") then
          error(string.format("%s: parameter %d: state '%s' is [%s] but the parameter is [%s]", fname, i, k,
            table.concat(vs, ","), table.concat(ps, ",")), 2)
        end
        c[k] = v:to{dtype = p.dtype, device = p.device}:clone()
      else
        c[k] = v
      end
    end
    state[i] = c
  end
  self.state = state
  self.iterations = sd.iterations or 0
  if sd.lr then self.lr = sd.lr end
end

-- ---- SGD ----------------------------------------------------------------------------------------

local SGD = Optimizer:extend("SGD")
SGD.defaults = {lr = 0.01, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false, decoupled = false}
optim.SGD = SGD

function SGD:check(fname)
  local h = self.hyper
  check_number(4, fname, "lr", h.lr, 0, math.huge)
  check_number(4, fname, "momentum", h.momentum, 0, 1, false, true)
  check_number(4, fname, "dampening", h.dampening, 0, 1)
  check_number(4, fname, "weight_decay", h.weight_decay, 0, math.huge)
  if h.nesterov and (h.momentum <= 0 or h.dampening ~= 0) then
    error(fname .. ": nesterov needs momentum > 0 and dampening 0", 3)
  end
  self.args = {lr = h.lr, momentum = h.momentum, dampening = h.dampening, weight_decay = h.weight_decay,
               nesterov = h.nesterov, decoupled = h.decoupled, step = 1}
end

-- the state tensors init_state makes (load_state_dict refuses others, without allocating them)
function SGD:state_slots() return self.hyper.momentum > 0 and {momentum = true} or {} end

function SGD:init_state(p)
  return {momentum = self.hyper.momentum > 0 and zeros_like(p) or nil}
end

function SGD:update(p, g, s, lr_t, step_t)
  local a = self.args
  a.lr, a.step, a.lr_t, a.step_t = self.lr, s.step, lr_t, step_t
  keng._sgd_step_(p, g, s.momentum, a)
end

-- ---- Adam and AdamW --------------------------------------------------------------------------

local Adam = Optimizer:extend("Adam")
Adam.defaults = {lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-7, weight_decay = 0, decoupled = false}
optim.Adam = Adam

function Adam:check(fname)
  local h = self.hyper
  check_number(4, fname, "lr", h.lr, 0, math.huge)
  check_number(4, fname, "beta1", h.beta1, 0, 1, false, true)
  check_number(4, fname, "beta2", h.beta2, 0, 1, false, true)
  check_number(4, fname, "eps", h.eps, 0, math.huge, true)
  check_number(4, fname, "weight_decay", h.weight_decay, 0, math.huge)
  self.args = {lr = h.lr, beta1 = h.beta1, beta2 = h.beta2, eps = h.eps, weight_decay = h.weight_decay,
               decoupled = h.decoupled, step = 1}
end

function Adam:state_slots() return {m = true, v = true} end
function Adam:init_state(p) return {m = zeros_like(p), v = zeros_like(p)} end

function Adam:update(p, g, s, lr_t, step_t)
  local a = self.args
  a.lr, a.step, a.lr_t, a.step_t = self.lr, s.step, lr_t, step_t
  keng._adam_step_(p, g, s.m, s.v, a)
end

local AdamW = Adam:extend("AdamW")
AdamW.defaults = {lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-7, weight_decay = 0.004, decoupled = true}
optim.AdamW = AdamW

-- ---- gradient clipping -------------------------------------------------------------------------

-- Scales every grad in place so that their global L2 norm is at most max_norm (when it is
-- larger, by max_norm / (norm + 1e-6), as PyTorch). The norm is summed in f32 with engine ops.
-- Returns the norm before clipping (a number; 0 when no parameter has a grad).
function optim.clip_grad_norm(params, max_norm)
  local list = param_list(params, "clip_grad_norm")
  if type(max_norm) ~= "number" or not (max_norm > 0) then
    error("clip_grad_norm: max_norm must be a number > 0, got " .. tostring(max_norm), 2)
  end
  local total, grads = nil, {}
  for _, p in ipairs(list) do
    local g = p.grad
    if g then
      grads[#grads + 1] = g
      local gf = g:float()
      local sq = (gf * gf):sum()
      total = total and total + sq or sq
    end
  end
  if not total then return 0 end
  local norm = total:sqrt():item()
  local coef = max_norm / (norm + 1e-6)
  if coef < 1 then
    for _, g in ipairs(grads) do g:mul_(coef) end
  end
  return norm
end

-- ---- learning-rate schedules: lr(step), step = steps already taken (0-based) -----------------

function optim.schedules.constant(lr)
  check_number(3, "schedules.constant", "lr", lr, 0, math.huge)
  return function() return lr end
end

-- lr · min(1, (step + 1) / warmup_steps): reaches lr at step warmup_steps - 1, then stays.
function optim.schedules.linear_warmup(lr, warmup_steps)
  check_number(3, "schedules.linear_warmup", "lr", lr, 0, math.huge)
  check_number(3, "schedules.linear_warmup", "warmup_steps", warmup_steps, 0, math.huge)
  return function(step)
    if warmup_steps <= 0 then return lr end
    return lr * math.min(1, (step + 1) / warmup_steps)
  end
end

-- Linear warmup over opts.warmup steps (as linear_warmup), then half a cosine from lr down to
-- opts.min_lr over the remaining total_steps - warmup steps; min_lr after total_steps.
function optim.schedules.cosine(lr, total_steps, opts)
  opts = options.check("schedules.cosine", opts, {"min_lr", "warmup"})
  local min_lr, warmup = opts.min_lr or 0, opts.warmup or 0
  check_number(3, "schedules.cosine", "lr", lr, 0, math.huge)
  check_number(3, "schedules.cosine", "total_steps", total_steps, 0, math.huge, true)
  check_number(3, "schedules.cosine", "min_lr", min_lr, 0, lr)
  check_number(3, "schedules.cosine", "warmup", warmup, 0, total_steps)
  return function(step)
    if step < warmup then return lr * (step + 1) / warmup end
    local decay = total_steps - warmup
    local progress = decay > 0 and math.min(1, (step - warmup) / decay) or 1
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))
  end
end

return optim
