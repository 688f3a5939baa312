-- keng.callbacks — hooks called by keng.train.fit, as in Keras.
--
-- A callback is any table with some of these methods (missing ones are skipped):
--   on_train_begin(logs)   on_train_end(logs)
--   on_epoch_begin(epoch, logs)   on_epoch_end(epoch, logs)     epoch is 1-based
--   on_batch_begin(step, logs)    on_batch_end(step, logs)      step is 1-based within the epoch
-- Before on_train_begin, fit sets cb.model, cb.optimizer and cb.params = {epochs=, steps=,
-- verbose=}. logs hold numbers: "loss", metrics, "val_*" at epoch end, and at batch end also
-- "batch_size", "epoch" and "global_step". Setting `model.stop_training = true` ends fit after
-- the current batch.
local keng = require "keng"

local callbacks = {}

local options = require "keng.options"

local Callback = {}
Callback.__index = Callback
Callback.__name = "Callback"
callbacks.Callback = Callback

-- Callback:extend(name) -> a class; Class(opts) makes an instance and calls init(self, ...)
local function new_callback(cls, ...)
  local o = setmetatable({}, cls)
  o:init(...)
  return o
end
function Callback:extend(name) return require("keng.util").class(self, name, new_callback) end
function Callback:init() end
function Callback:on_train_begin(logs) end
function Callback:on_train_end(logs) end
function Callback:on_epoch_begin(epoch, logs) end
function Callback:on_epoch_end(epoch, logs) end
function Callback:on_batch_begin(step, logs) end
function Callback:on_batch_end(step, logs) end

-- callbacks.Lambda{on_epoch_end = function(self, epoch, logs) ... end, ...}
local Lambda = Callback:extend("Lambda")
function Lambda:init(hooks) for k, v in pairs(hooks or {}) do self[k] = v end end
callbacks.Lambda = Lambda

-- the value a monitor names, or an error listing what the logs hold
local function monitored(who, monitor, logs)
  local v = logs[monitor]
  if type(v) ~= "number" then
    local keys = {}
    for k, x in pairs(logs) do if type(x) == "number" then keys[#keys + 1] = k end end
    table.sort(keys)
    error(string.format("%s: monitor '%s' is not in the logs (have: %s)%s", who, monitor,
      table.concat(keys, ", "), monitor:sub(1, 4) == "val_" and "; pass validation_data to fit" or ""), 0)
  end
  return v
end

-- mode "min" | "max" | "auto" (max for accuracy-like names) -> better(a, b, delta)
local function comparer(mode, monitor)
  if mode == nil or mode == "auto" then
    mode = (monitor:find("acc") or monitor:find("auc")) and "max" or "min"
  end
  if mode == "max" then return function(a, b, d) return a > b + (d or 0) end, -math.huge end
  return function(a, b, d) return a < b - (d or 0) end, math.huge
end

-- snapshot/restore of a model's state_dict (copies, so later steps do not change them)
local function snapshot(model)
  local out = {}
  keng.no_grad(function()
    for k, t in pairs(model:state_dict()) do out[k] = t:detach():clone() end
  end)
  return out
end
local function restore(model, snap)
  keng.no_grad(function()
    for k, t in pairs(model:state_dict()) do if snap[k] then t:copy_(snap[k]) end end
  end)
end

-- "ckpt-{epoch:03d}-{val_loss:.3f}.safetensors" -> filled from epoch and logs
local function fill_path(path, epoch, logs)
  return (path:gsub("{([%w_]+):?([^}]*)}", function(key, fmt)
    local v = key == "epoch" and epoch or logs[key]
    if v == nil then return "{" .. key .. "}" end
    if fmt ~= "" then return string.format("%" .. fmt, v) end
    return tostring(v)
  end))
end
callbacks.fill_path = fill_path

-- ---- training checkpoints (exact resume) -------------------------------------------------------
-- One safetensors file holds everything a resume needs: the model's state_dict under its own
-- names, the optimizer's tensors under the reserved prefix "__optimizer__." and, in the string
-- metadata, the optimizer's scalars ("__optimizer__.iterations", ".lr", ".kind",
-- "__optimizer__.<param>.step"), "epoch", "global_step" and the generator ("rng_seed",
-- "rng_offset"). One file rather than a sibling because keng.save writes it with a single
-- rename: a crash can never pair the weights of one epoch with the optimizer of another.
local OPT = "__optimizer__."
callbacks.OPTIMIZER_PREFIX = OPT

-- save_training_state(path, model, opt, {epoch =, global_step =, meta =}): the file above
function callbacks.save_training_state(path, model, opt, info)
  info = info or {}
  local tensors, meta = {}, {format = "pt"}
  for k, v in pairs(info.meta or {}) do meta[k] = v end
  for k, t in pairs(model:state_dict()) do tensors[k] = t end
  for k, v in pairs(opt:state_dict{flat = true, names = model}) do
    if keng.is_tensor(v) then tensors[OPT .. k] = v
    elseif math.type(v) == "integer" then meta[OPT .. k] = string.format("%d", v)
    elseif type(v) == "number" then meta[OPT .. k] = string.format("%.17g", v)
    else meta[OPT .. k] = tostring(v) end
  end
  local rng = keng.get_rng_state()
  meta.rng_seed, meta.rng_offset = string.format("%d", rng.seed), string.format("%d", rng.offset)
  if info.epoch then meta.epoch = string.format("%d", info.epoch) end
  if info.global_step then meta.global_step = string.format("%d", info.global_step) end
  keng.save(path, tensors, meta)
end

local function meta_int(path, meta, key)
  local v = meta[key] and math.tointeger(tonumber(meta[key]))
  if not v then
    error(string.format("resume_from: %s: metadata '%s' is %s, not an integer (was it written by "
      .. "ModelCheckpoint{save_optimizer = true}?)", path, key, meta[key] and "'" .. meta[key] .. "'" or "missing"), 0)
  end
  return v
end

-- load_training_state(path, model, opt) -> {epoch =, global_step =}: puts back the weights
-- (strict), the optimizer state (names checked) and the generator from save_training_state.
function callbacks.load_training_state(path, model, opt)
  local sd, meta = keng.load(path)
  local weights, flat = {}, {}
  for k, t in pairs(sd) do
    if k:sub(1, #OPT) == OPT then flat[k:sub(#OPT + 1)] = t else weights[k] = t end
  end
  if meta[OPT .. "kind"] == nil then
    error("resume_from: " .. path .. " holds no optimizer state (save it with ModelCheckpoint(path, {save_optimizer = true}))", 0)
  end
  for k, v in pairs(meta) do
    if k:sub(1, #OPT) == OPT then
      local key = k:sub(#OPT + 1)
      if key == "kind" then flat.kind = v
      elseif key == "lr" then flat.lr = tonumber(v)
      else flat[key] = meta_int(path, meta, k) end
    end
  end
  local info = {epoch = meta_int(path, meta, "epoch"), global_step = meta_int(path, meta, "global_step")}
  local rng = {seed = meta_int(path, meta, "rng_seed"), offset = meta_int(path, meta, "rng_offset")}
  model:load_state_dict(weights)
  opt:load_state_dict(flat, {names = model})
  keng.set_rng_state(rng)
  return info
end

-- ModelCheckpoint(path, {monitor = "val_loss", save_best_only = false, mode = "auto",
-- verbose = 0, save_optimizer = false}): saves model:state_dict() with keng.save (atomic) at
-- each epoch end, or only when the monitored value improves. path may hold {epoch} and
-- {<log name>:<fmt>}. save_optimizer = true also saves what fit{resume_from = path} needs to
-- continue exactly (save_training_state above).
local ModelCheckpoint = Callback:extend("ModelCheckpoint")
function ModelCheckpoint:init(path, opts)
  if type(path) ~= "string" then error("ModelCheckpoint(path, opts): path must be a string", 3) end
  opts = options.check("ModelCheckpoint", opts, {"monitor", "save_best_only", "mode", "verbose", "save_optimizer"}, 3)
  self.path, self.monitor = path, opts.monitor or "val_loss"
  self.save_best_only, self.verbose = opts.save_best_only or false, opts.verbose or 0
  self.save_optimizer = opts.save_optimizer or false
  self.better, self.best = comparer(opts.mode, self.monitor)
  self.saved = {}
end
function ModelCheckpoint:on_batch_end(step, logs)
  self.global_step = logs.global_step
end
function ModelCheckpoint:on_epoch_end(epoch, logs)
  local value
  if self.save_best_only then
    value = monitored("ModelCheckpoint", self.monitor, logs)
    if not self.better(value, self.best) then return end
    self.best = value
  end
  local path = fill_path(self.path, epoch, logs)
  local meta = {epoch = tostring(epoch), format = "pt"}
  for k, v in pairs(logs) do if type(v) == "number" then meta[k] = string.format("%.17g", v) end end
  if self.save_optimizer then
    if not self.optimizer then error("ModelCheckpoint: save_optimizer needs fit's optimizer (cb.optimizer is nil)", 0) end
    callbacks.save_training_state(path, self.model, self.optimizer,
      {epoch = epoch, global_step = self.global_step or 0, meta = meta})
  else
    keng.save(path, self.model:state_dict(), meta)
  end
  self.saved[#self.saved + 1] = path
  if self.verbose > 0 then
    print(string.format("Epoch %d: saved %s%s", epoch, path,
      value and string.format(" (%s %.5f)", self.monitor, value) or ""))
  end
end
ModelCheckpoint.writes_files = true  -- fit{distributed = true} keeps it on rank 0 only
callbacks.ModelCheckpoint = ModelCheckpoint

-- EarlyStopping{monitor = "val_loss", patience = 0, min_delta = 0, mode = "auto",
-- restore_best = false, baseline = nil, verbose = 0}: stops fit when the monitored value has not
-- improved by more than min_delta for `patience` epochs; restore_best puts back the weights of
-- the best epoch (copied in place, so optimizers keep their references).
local EarlyStopping = Callback:extend("EarlyStopping")
function EarlyStopping:init(opts)
  opts = options.check("EarlyStopping", opts, {"monitor", "patience", "min_delta", "restore_best",
    "restore_best_weights", "baseline", "verbose", "mode"}, 3)
  self.monitor, self.patience = opts.monitor or "val_loss", opts.patience or 0
  self.min_delta = math.abs(opts.min_delta or 0)
  self.restore_best = opts.restore_best or opts.restore_best_weights or false
  self.baseline, self.verbose = opts.baseline, opts.verbose or 0
  self.better, self.init_best = comparer(opts.mode, self.monitor)
end
function EarlyStopping:on_train_begin()
  self.wait, self.stopped_epoch, self.best_epoch = 0, nil, nil
  self.best = self.baseline or self.init_best
  self.best_weights = nil
end
function EarlyStopping:on_epoch_end(epoch, logs)
  local value = monitored("EarlyStopping", self.monitor, logs)
  if self.better(value, self.best, self.min_delta) then
    self.best, self.best_epoch, self.wait = value, epoch, 0
    if self.restore_best then self.best_weights = snapshot(self.model) end
    return
  end
  self.wait = self.wait + 1
  if self.wait >= self.patience then
    self.stopped_epoch = epoch
    self.model.stop_training = true
  end
end
function EarlyStopping:on_train_end()
  if self.stopped_epoch and self.verbose > 0 then
    print(string.format("Epoch %d: early stopping (best %s %.5f at epoch %s)", self.stopped_epoch,
      self.monitor, self.best, tostring(self.best_epoch)))
  end
  if self.restore_best and self.best_weights then restore(self.model, self.best_weights) end
end
callbacks.EarlyStopping = EarlyStopping

-- TerminateOnNaN({verbose = 1}): stops fit at the first NaN or infinite loss, with a message
-- on stderr (unless verbose = 0) naming the epoch and step; fit's History keeps it as
-- stop_reason, and the callback as cb.message.
local TerminateOnNaN = Callback:extend("TerminateOnNaN")
function TerminateOnNaN:init(opts) self.verbose = options.check("TerminateOnNaN", opts, {"verbose"}, 3).verbose or 1 end
function TerminateOnNaN:on_batch_end(step, logs)
  local l = logs.loss
  if l and (l ~= l or l == math.huge or l == -math.huge) then
    self.message = string.format("TerminateOnNaN: invalid loss %s at epoch %d, step %d (global step %d); terminating training",
      l ~= l and "nan" or tostring(l), logs.epoch or 0, step, logs.global_step or step)
    if self.verbose > 0 then io.stderr:write(self.message, "\n") end
    self.model.stop_training = true
  end
end
callbacks.TerminateOnNaN = TerminateOnNaN

-- CSVLogger(path, {separator = ",", append = false}): one row per epoch: epoch, then the log
-- names in the order of the first row (loss first, the rest sorted).
local CSVLogger = Callback:extend("CSVLogger")
function CSVLogger:init(path, opts)
  opts = options.check("CSVLogger", opts, {"separator", "append"}, 3)
  self.path, self.sep, self.append = path, opts.separator or ",", opts.append or false
end
function CSVLogger:on_train_begin()
  local f, err = io.open(self.path, self.append and "a" or "w")
  if not f then error("CSVLogger: cannot open " .. self.path .. ": " .. tostring(err), 0) end
  self.file, self.keys = f, nil
  if self.append then
    local r = io.open(self.path, "r")
    self.header_written = r and r:read("l") ~= nil
    if r then r:close() end
  else
    self.header_written = false
  end
end
function CSVLogger:on_epoch_end(epoch, logs)
  if not self.keys then
    local keys = {}
    for k, v in pairs(logs) do if type(v) == "number" and k ~= "loss" then keys[#keys + 1] = k end end
    table.sort(keys)
    if logs.loss then table.insert(keys, 1, "loss") end
    self.keys = keys
    if not self.header_written then self.file:write("epoch", self.sep, table.concat(keys, self.sep), "\n") end
  end
  local row = {tostring(epoch)}
  for _, k in ipairs(self.keys) do
    row[#row + 1] = logs[k] and string.format("%.8g", logs[k]) or ""
  end
  self.file:write(table.concat(row, self.sep), "\n")
  self.file:flush()
end
function CSVLogger:on_train_end()
  if self.file then self.file:close(); self.file = nil end
end
callbacks.CSVLogger = CSVLogger

-- LossCurve(path, {title =}): an SVG of the training loss per step (and val_loss per epoch,
-- placed at each epoch's last step), rewritten at every epoch end through a temp file + rename.
local LossCurve = Callback:extend("LossCurve")
function LossCurve:init(path, opts)
  opts = options.check("LossCurve", opts, {"title"}, 3)
  self.path, self.title = path, opts.title or "training loss"
end
function LossCurve:on_train_begin()
  self.losses, self.val = {}, {}
end
function LossCurve:on_batch_end(step, logs)
  if logs.loss then self.losses[#self.losses + 1] = logs.loss end
end
function LossCurve:on_epoch_end(epoch, logs)
  if logs.val_loss then self.val[#self.val + 1] = {#self.losses, logs.val_loss} end
  self:write()
end
function LossCurve:on_train_end() self:write() end

local function finite(v) return v == v and v ~= math.huge and v ~= -math.huge end

-- the SVG text for the series collected so far
function LossCurve:svg()
  local W, Hh, L, R, T, B = 640, 400, 70, 20, 40, 50
  local n = #self.losses
  local lo, hi = math.huge, -math.huge
  local function see(v) if finite(v) then lo, hi = math.min(lo, v), math.max(hi, v) end end
  for _, v in ipairs(self.losses) do see(v) end
  for _, p in ipairs(self.val) do see(p[2]) end
  if lo > hi then lo, hi = 0, 1 end
  if hi - lo < 1e-12 then lo, hi = lo - 0.5, hi + 0.5 end
  local function X(i) return L + (W - L - R) * (n > 1 and (i - 1) / (n - 1) or 0.5) end
  local function Y(v) return T + (Hh - T - B) * (hi - v) / (hi - lo) end
  local out = {string.format('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">', W, Hh, W, Hh),
    '<rect width="100%" height="100%" fill="white"/>',
    string.format('<text x="%d" y="24" font-family="sans-serif" font-size="16">%s</text>', L, self.title),
    string.format('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>', L, Hh - B, W - R, Hh - B),
    string.format('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>', L, T, L, Hh - B)}
  for k = 0, 4 do
    local v = lo + (hi - lo) * k / 4
    out[#out + 1] = string.format('<text x="%d" y="%.1f" font-family="sans-serif" font-size="11" text-anchor="end">%.4g</text>',
      L - 6, Y(v) + 4, v)
  end
  out[#out + 1] = string.format('<text x="%d" y="%d" font-family="sans-serif" font-size="12" text-anchor="middle">step (1..%d)</text>',
    (L + W - R) // 2, Hh - 15, n)
  local pts = {}
  for i, v in ipairs(self.losses) do
    if finite(v) then pts[#pts + 1] = string.format("%.1f,%.1f", X(i), Y(v)) end
  end
  out[#out + 1] = '<polyline id="loss" fill="none" stroke="#1f77b4" stroke-width="1.5" points="' .. table.concat(pts, " ") .. '"/>'
  if #self.val > 0 then
    local vp = {}
    for _, p in ipairs(self.val) do
      if finite(p[2]) then vp[#vp + 1] = string.format("%.1f,%.1f", X(math.max(p[1], 1)), Y(p[2])) end
    end
    out[#out + 1] = '<polyline id="val_loss" fill="none" stroke="#ff7f0e" stroke-width="2" points="' .. table.concat(vp, " ") .. '"/>'
    out[#out + 1] = string.format('<text x="%d" y="24" font-family="sans-serif" font-size="12" fill="#ff7f0e">val_loss</text>', W - R - 60)
  end
  out[#out + 1] = "</svg>"
  return table.concat(out, "\n") .. "\n"
end

function LossCurve:write()
  local tmp = self.path .. ".tmp"
  local f, err = io.open(tmp, "w")
  if not f then error("LossCurve: cannot write " .. tmp .. ": " .. tostring(err), 0) end
  f:write(self:svg())
  f:close()
  local ok, rerr = os.rename(tmp, self.path)
  if not ok then error("LossCurve: cannot rename to " .. self.path .. ": " .. tostring(rerr), 0) end
end
callbacks.LossCurve = LossCurve

-- LearningRateScheduler(fn, {verbose = 0}): at each epoch begin sets optimizer.lr = fn(epoch, lr)
-- (epoch 1-based). The lr in use is logged as "lr" at epoch end.
local LearningRateScheduler = Callback:extend("LearningRateScheduler")
function LearningRateScheduler:init(fn, opts)
  if type(fn) ~= "function" then error("LearningRateScheduler(fn): fn(epoch, lr) -> lr expected", 3) end
  self.fn, self.verbose = fn, options.check("LearningRateScheduler", opts, {"verbose"}, 3).verbose or 0
end
function LearningRateScheduler:on_epoch_begin(epoch)
  local opt = self.optimizer
  if not opt then error("LearningRateScheduler: fit has no optimizer", 0) end
  local lr = self.fn(epoch, opt.lr)
  if type(lr) ~= "number" then error("LearningRateScheduler: fn returned " .. type(lr) .. ", not a number", 0) end
  opt.lr = lr
  if self.verbose > 0 then print(string.format("Epoch %d: learning rate %.6g", epoch, lr)) end
end
function LearningRateScheduler:on_epoch_end(epoch, logs)
  logs.lr = self.optimizer.lr
end
callbacks.LearningRateScheduler = LearningRateScheduler

return callbacks
