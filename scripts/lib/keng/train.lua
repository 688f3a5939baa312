-- keng.train — the Keras-style training loop: fit, evaluate, predict.
--
--   local h = train.fit(model, {x = x, y = y}, {loss = "cross_entropy", epochs = 5})
--   h.history.loss[5], h.steps[#h.steps]       -- mean loss of epoch 5, loss of the last step
--
-- Shape letters: N samples, B batch. Data comes as
--   {x = tensor | {tensors}, y = tensor}   batched along dim 1 (the last partial batch is kept);
--                                          a table x is passed as model(x1, x2, ...)
--   a list of {x, y} batches               {{x1, y1}, {x2, y2}, ...}
--   a function                             each call returns the next (x, y) batch, nil ends
--                                          the epoch; a function returning a function is a
--                                          factory called once per epoch for a fresh iterator
-- One step is: model:train(); pred = model(x); loss; opt:zero_grad(); loss:backward(); opt:step().
local keng = require "keng"
local callbacks = require "keng.callbacks"
local options = require "keng.options"
local progress = require "keng.progress"

local train = {}

-- loss/metric settings of the last fit per model, so evaluate(model, data) needs no options
local compiled = setmetatable({}, {__mode = "k"})

------------------------------------------------------------------------------------------------
-- losses and metrics

local function bce(pred, y, from_logits)
  y = y:to(pred.dtype)
  if from_logits then
    -- max(z, 0) - z·y + log(1 + exp(-|z|)): stable for large |z|
    return (pred:relu() - pred * y + ((-pred:abs()):exp() + 1):log()):mean()
  end
  local p = pred:clamp(1e-7, 1 - 1e-7)
  return -(y * p:log() + (1 - y) * (1 - p):log()):mean()
end

-- opts.loss -> function(pred, y) -> scalar tensor
local function loss_fn(loss, opts, who)
  if type(loss) == "function" then return loss end
  if loss == "cross_entropy" or loss == "sparse_categorical_crossentropy" then
    return function(pred, y) return keng.cross_entropy(pred, y, opts.loss_opts) end
  elseif loss == "mse" or loss == "mean_squared_error" then
    return function(pred, y) return keng.mse_loss(pred, y:to(pred.dtype)) end
  elseif loss == "binary_crossentropy" then
    return function(pred, y) return bce(pred, y, opts.from_logits) end
  elseif loss == nil then
    error(who .. ": opts.loss is required (\"cross_entropy\", \"mse\", \"binary_crossentropy\" or a function(pred, y) -> scalar tensor)", 3)
  end
  error(who .. ": unknown loss '" .. tostring(loss) .. "' (expected \"cross_entropy\", \"mse\", \"binary_crossentropy\" or a function)", 3)
end

-- A metric returns (sum over the batch, count) so epoch values are exact sample means.
local metric_fns = {}
function metric_fns.accuracy(pred, y, opts)
  local pshape, yshape = pred.shape, y.shape
  local correct
  if #pshape == #yshape + 1 and pshape[#pshape] > 1 then
    correct = pred:argmax(-1):eq(y:long())                            -- class ids (0-based)
  else
    local cut = opts.from_logits and 0 or 0.5                         -- binary: threshold
    correct = pred:gt(cut):eq(y:gt(0.5))
  end
  return correct:long():sum():item(), correct:numel()
end
function metric_fns.mae(pred, y)
  return (pred - y:to(pred.dtype)):abs():sum():item(), pred:numel()
end
function metric_fns.mse(pred, y)
  local d = pred - y:to(pred.dtype)
  return (d * d):sum():item(), pred:numel()
end
metric_fns.acc = metric_fns.accuracy

-- opts.metrics -> list of {name, fn(pred, y) -> sum, count}
local function metric_list(metrics, opts, who)
  local out = {}
  for _, m in ipairs(metrics or {}) do
    if type(m) == "string" then
      local f = metric_fns[m]
      if not f then error(who .. ": unknown metric '" .. m .. "' (expected accuracy, mae or mse, or {name, fn})", 3) end
      out[#out + 1] = {m == "acc" and "accuracy" or m, function(p, y) return f(p, y, opts) end}
    elseif type(m) == "table" and type(m[1]) == "string" and type(m[2]) == "function" then
      out[#out + 1] = {m[1], function(p, y) local v = m[2](p, y); return v, 1 end}  -- {name, fn -> number}
    else
      error(who .. ": a metric is a name or {name, fn(pred, y) -> number}", 3)
    end
  end
  return out
end

------------------------------------------------------------------------------------------------
-- data

local function first_tensor(x)
  if keng.is_tensor(x) then return x end
  if type(x) == "table" then return x[1] end
end

local function batch_len(x) local t = first_tensor(x); return t and (t.shape[1] or 1) or 1 end

local function pick(x, f)  -- apply f to a tensor or to each tensor of a list
  if keng.is_tensor(x) then return f(x) end
  local out = {}
  for i, t in ipairs(x) do out[i] = f(t) end
  return out
end

-- data -> {next_epoch = fn(shuffle) -> iterator, steps = number|nil}; iterator() -> x, y | nil
-- share_perm(perm) -> perm: distributed fit makes every rank use rank 0's shuffle
local function make_source(data, opts, who, share_perm)
  if type(data) == "function" then
    -- an iterator (each call is a batch) or a factory (each call is a fresh iterator): probed
    -- on the first call
    local mode, iter
    return {steps = opts.steps_per_epoch, next_epoch = function()
      local fresh = true
      return function()
        if mode == "iter" then return data() end
        if mode == "factory" then
          if fresh then iter, fresh = data(), false end
          return iter()
        end
        local a, b = data()
        if type(a) ~= "function" then mode = "iter"; return a, b end
        mode, iter, fresh = "factory", a, false
        return iter()
      end
    end}
  end
  if keng.is_tensor(data) then data = {x = data} end
  if type(data) ~= "table" then
    error(string.format("%s: data must be {x =, y =}, a list of {x, y} batches or a function (got %s)", who, type(data)), 3)
  end
  if data.x == nil then
    if type(data[1]) == "table" then                      -- a list of {x, y} batches
      return {steps = #data, next_epoch = function()
        local i = 0
        return function()
          i = i + 1
          local b = data[i]
          if b then return b[1] or b.x, b[2] or b.y end
        end
      end}
    end
    error(who .. ": data table has no field x (expected {x = tensor, y = tensor})", 3)
  end
  local x, y = data.x, data.y
  local N = batch_len(x)
  if y ~= nil and keng.is_tensor(y) and y.shape[1] ~= N then
    error(string.format("%s: x has %d samples but y has %d (dim 1 must match)", who, N, y.shape[1]), 3)
  end
  local bs = opts.batch_size or 32
  local nb = (N + bs - 1) // bs
  local steps = opts.steps_per_epoch and math.min(opts.steps_per_epoch, nb) or nb
  return {steps = steps, next_epoch = function(shuffle)
    local perm
    if shuffle and N > 1 then
      local dev = first_tensor(x).device
      local _, idx = keng.rand({N}, {device = dev}):topk(N)            -- a random permutation (0-based)
      perm = share_perm and share_perm(idx) or idx
    end
    local b = 0
    return function()
      b = b + 1
      if b > steps then return nil end
      local start = (b - 1) * bs + 1
      local len = math.min(bs, N - start + 1)
      if perm then
        local ids = perm:narrow(1, start, len)
        return pick(x, function(t) return t:index_select(1, ids) end),
               y and pick(y, function(t) return t:index_select(1, ids) end)
      end
      return pick(x, function(t) return t:narrow(1, start, len) end),
             y and pick(y, function(t) return t:narrow(1, start, len) end)
    end
  end}
end
train.make_source = make_source

------------------------------------------------------------------------------------------------
-- the model

local function forward(model, x)
  local mt = getmetatable(model)
  local call = (mt and mt.__call) and model or function(...) return model:forward(...) end
  if keng.is_tensor(x) then return call(x) end
  if type(x) == "table" and x[1] ~= nil and keng.is_tensor(x[1]) then return call(table.unpack(x)) end
  return call(x)
end

local function trainable(model)
  local out = {}
  for _, p in ipairs(model:parameters()) do if p.requires_grad then out[#out + 1] = p end end
  return out
end

-- step(model, x, y, opt, loss) -> the loss tensor of one optimizer step on one batch: the step
-- fit takes (pred = model(x); loss; opt:zero_grad(); loss:backward(); opt:step()) without its
-- host reads, callbacks and metrics, so that a benchmark can time it or capture it in a CUDA Graph.
-- x as in fit (a table of tensors is passed as model(x1, x2, ...)); loss: a function(pred, y) or
-- a loss name as in fit ("cross_entropy", "mse", "binary_crossentropy").
function train.step(model, x, y, opt, loss)
  local l = loss_fn(loss, {}, "step")(forward(model, x), y)
  opt:zero_grad()
  l:backward()
  opt:step()
  return l
end

local function make_optimizer(model, opts, who)
  local o = opts.optimizer
  if type(o) == "table" then return o end
  local ok, optim = pcall(require, "keng.optim")
  if not ok then error(who .. ": no optimizer given and keng.optim is not available: " .. tostring(optim), 3) end
  local name = (o or "adamw"):lower()
  local ctor = ({sgd = optim.SGD, adam = optim.Adam, adamw = optim.AdamW})[name]
  if not ctor then error(who .. ": unknown optimizer '" .. tostring(o) .. "' (expected sgd, adam, adamw or an optimizer)", 3) end
  return ctor(trainable(model), {lr = opts.lr})
end

local function set_mode(model, on)
  if on and type(model.train) == "function" then model:train(true)
  elseif not on and type(model.eval) == "function" then model:eval() end
end

local function default_verbose() return progress.is_terminal() and 1 or 2 end

local function call_cbs(cbs, hook, ...)
  for _, cb in ipairs(cbs) do
    local f = cb[hook]
    if f then f(cb, ...) end
  end
end

-- the names in logs, loss first, val_* last, as the progress line shows them
local function ordered(logs)
  local a, v = {}, {}
  for k, x in pairs(logs) do
    if type(x) == "number" and k ~= "loss" and k ~= "val_loss" and k ~= "lr" then
      if k:sub(1, 4) == "val_" then v[#v + 1] = k else a[#a + 1] = k end
    end
  end
  table.sort(a); table.sort(v)
  if logs.loss then table.insert(a, 1, "loss") end
  if logs.val_loss then table.insert(v, 1, "val_loss") end
  for _, k in ipairs(v) do a[#a + 1] = k end
  return a
end

------------------------------------------------------------------------------------------------
-- options: every key is checked (keng.options); counts are whole numbers

local FIT_OPTS = {"loss", "optimizer", "lr", "epochs", "batch_size", "steps_per_epoch", "shuffle", "metrics",
  "validation_data", "validation_batch_size", "validation_steps", "callbacks", "clip_norm", "verbose", "loss_opts",
  "from_logits", "initial_epoch", "resume_from", "distributed"}
local EVALUATE_OPTS = {"loss", "metrics", "batch_size", "steps", "verbose", "loss_opts", "from_logits"}

-- the count options that are present: epochs >= 0, the others >= 1 (raises at the user's line)
local function check_counts(who, opts)
  if opts.epochs ~= nil then options.integer(who, "epochs", opts.epochs, 0, 3) end
  if opts.initial_epoch ~= nil then options.integer(who, "initial_epoch", opts.initial_epoch, 0, 3) end
  for _, k in ipairs({"batch_size", "steps_per_epoch", "steps", "validation_batch_size", "validation_steps"}) do
    if opts[k] ~= nil then options.integer(who, k, opts[k], 1, 3) end
  end
end

------------------------------------------------------------------------------------------------
-- evaluate

-- runs the model over data without a tape; returns {loss =, <metric> =} (sample means)
local function run_eval(model, data, opts, loss, metrics, who)
  local src = make_source(data, {batch_size = opts.batch_size, steps_per_epoch = opts.steps}, who)
  local was_training = model.training
  set_mode(model, false)
  local sums, n = {loss = 0}, 0
  local counts = {}
  local bar = (opts.verbose or 0) == 1 and progress.new(src.steps, {verbose = 1}) or nil
  keng.no_grad(function()
    local step = 0
    for x, y in src.next_epoch(false) do
      step = step + 1
      local pred = forward(model, x)
      local B = batch_len(x)
      sums.loss = sums.loss + loss(pred, y):item() * B
      n = n + B
      for _, m in ipairs(metrics) do
        local s, c = m[2](pred, y)
        sums[m[1]] = (sums[m[1]] or 0) + s
        counts[m[1]] = (counts[m[1]] or 0) + c
      end
      if bar then bar:update(step, {"loss"}, {loss = sums.loss / n}) end
    end
  end)
  if was_training ~= nil then set_mode(model, was_training) end
  if n == 0 then error(who .. ": data gave no batches", 3) end
  local logs = {loss = sums.loss / n}
  for _, m in ipairs(metrics) do logs[m[1]] = sums[m[1]] / counts[m[1]] end
  if bar then bar:finish(ordered(logs), logs) end
  return logs
end

-- evaluate(model, data, opts) -> mean loss, logs {loss =, accuracy = ...}. opts: loss, metrics,
-- batch_size, steps, verbose (default: the loss and metrics of the model's last fit)
function train.evaluate(model, data, opts)
  opts = options.check("evaluate", opts, EVALUATE_OPTS)
  check_counts("evaluate", opts)
  local c = compiled[model] or {}
  local o = setmetatable({}, {__index = function(_, k) local v = opts[k]; if v == nil then v = c[k] end; return v end})
  local loss = loss_fn(o.loss, o, "evaluate")
  local metrics = metric_list(o.metrics, o, "evaluate")
  local logs = run_eval(model, data, {batch_size = o.batch_size, steps = opts.steps,
    verbose = opts.verbose or 0}, loss, metrics, "evaluate")
  return logs.loss, logs
end

-- predict(model, data, opts) -> the outputs of every batch concatenated along dim 1 (a list of
-- tensors when the model returns a list). data: a tensor, {x = ...}, a list of batches or a
-- function. opts: batch_size (32), steps, verbose (1: a progress bar; default 0).
function train.predict(model, data, opts)
  opts = options.check("predict", opts, {"batch_size", "steps", "verbose"})
  check_counts("predict", opts)
  local src = make_source(data, {batch_size = opts.batch_size, steps_per_epoch = opts.steps}, "predict")
  local was_training = model.training
  set_mode(model, false)
  local outs = {}
  local bar = opts.verbose == 1 and progress.new(src.steps, {verbose = 1}) or nil
  keng.no_grad(function()
    for x in src.next_epoch(false) do
      outs[#outs + 1] = forward(model, x)
      if bar then bar:update(#outs, {}, {}) end
    end
  end)
  if bar then bar:finish({}, {}) end
  if was_training ~= nil then set_mode(model, was_training) end
  if #outs == 0 then error("predict: data gave no batches", 2) end
  if keng.is_tensor(outs[1]) then return #outs == 1 and outs[1] or keng.cat(outs, 1) end
  local res = {}
  for i = 1, #outs[1] do
    local parts = {}
    for b, o in ipairs(outs) do parts[b] = o[i] end
    res[i] = keng.cat(parts, 1)
  end
  return res
end

------------------------------------------------------------------------------------------------
-- fit

local History = {}
History.__index = History
train.History = History

function History:__tostring()
  local names, parts = {}, {}
  for k in pairs(self.history) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do parts[#parts + 1] = string.format("%s=%.4g", k, self:last(k)) end
  return string.format("History(epochs=%d, steps=%d%s%s)", #self.epoch, #self.steps,
    #parts > 0 and ", " or "", table.concat(parts, ", "))
end

-- the last value of a logged name ("loss", "val_loss", ...)
function History:last(name) local h = self.history[name]; return h and h[#h] end

-- fit(model, data, opts) -> History {history = {loss = {per epoch}, ...}, steps = {loss per
-- step}, epoch = {1, 2, ...}, params =, stop_reason =}. See docs/training.md for the options.
function train.fit(model, data, opts)
  opts = options.check("fit", opts, FIT_OPTS)
  if type(model) ~= "table" then error("fit: model must be a module (got " .. type(model) .. ")", 2) end
  check_counts("fit", opts)
  if opts.clip_norm ~= nil then options.number("fit", "clip_norm", opts.clip_norm, 0) end
  if opts.lr ~= nil then options.number("fit", "lr", opts.lr, 0) end
  if opts.verbose ~= nil and opts.verbose ~= "auto" and opts.verbose ~= 0 and opts.verbose ~= 1 and opts.verbose ~= 2 then
    error("fit: verbose must be 0, 1, 2 or \"auto\", got " .. tostring(opts.verbose), 2)
  end
  local loss = loss_fn(opts.loss, opts, "fit")
  local metrics = metric_list(opts.metrics, opts, "fit")
  -- distributed: every rank runs the model through a DataParallel wrapper on its rows of each
  -- batch (rows rank+1, rank+1+W, ...); losses and metrics are summed over the ranks
  local D = opts.distributed and require "keng.distributed"
  local run = model
  if D then D.init(); run = D.data_parallel(model) end
  local src = make_source(data, opts, "fit", D and function(perm) return D.broadcast(perm, 0) end)
  if D then
    local next_epoch = src.next_epoch
    src = {steps = src.steps, next_epoch = function(shuffle)
      local it = next_epoch(shuffle)
      return function()
        local x, y = it()
        if x == nil then return nil end
        local ids = D.shard_rows(batch_len(x))
        local function rows(t) return t:index_select(1, ids) end
        return pick(x, rows), y ~= nil and pick(y, rows) or nil, batch_len(x)
      end
    end}
  end
  local opt = make_optimizer(model, opts, "fit")
  local epochs = opts.epochs or 1
  local verbose = opts.verbose
  if verbose == nil or verbose == "auto" then verbose = default_verbose() end
  if D and D.rank() ~= 0 then verbose = 0 end     -- one progress bar per job
  local shuffle = opts.shuffle
  if shuffle == nil then shuffle = true end
  local clip = opts.clip_norm
  local params = clip and trainable(model)
  local optim = clip and require "keng.optim"
  compiled[model] = {loss = opts.loss, metrics = opts.metrics, from_logits = opts.from_logits,
                     loss_opts = opts.loss_opts, batch_size = opts.batch_size}

  local cbs = {}
  for i, cb in ipairs(opts.callbacks or {}) do
    if type(cb) ~= "table" then error(string.format("fit: callback %d is a %s, not a table", i, type(cb)), 2) end
    if not (D and D.rank() ~= 0 and cb.writes_files) then cbs[#cbs + 1] = cb end  -- checkpoints: rank 0
  end
  local hist = setmetatable({history = {}, steps = {}, epoch = {},
    params = {epochs = epochs, steps = src.steps, verbose = verbose}}, History)
  for _, cb in ipairs(cbs) do cb.model, cb.optimizer, cb.params = model, opt, hist.params end
  model.stop_training = false

  local function log_epoch(epoch, logs)
    hist.epoch[#hist.epoch + 1] = epoch
    for k, v in pairs(logs) do
      if type(v) == "number" then
        local h = hist.history[k]
        if not h then h = {}; hist.history[k] = h end
        h[#h + 1] = v
      end
    end
  end

  -- resume: epochs counts the whole run; initial_epoch epochs are already done (Keras)
  local first, global = (opts.initial_epoch or 0) + 1, 0
  if opts.resume_from ~= nil then
    if type(opts.resume_from) ~= "string" then
      error("fit: resume_from must be a checkpoint path, got " .. type(opts.resume_from), 2)
    end
    local ok, info = pcall(callbacks.load_training_state, opts.resume_from, model, opt)
    if not ok then error("fit: " .. tostring(info):gsub("^[^\n]-%.lua:%d+: ", ""), 2) end
    if opts.initial_epoch and opts.initial_epoch ~= info.epoch then
      error(string.format("fit: initial_epoch = %d but %s was saved after epoch %d", opts.initial_epoch,
        opts.resume_from, info.epoch), 2)
    end
    first, global = info.epoch + 1, info.global_step
  end
  if first - 1 > epochs then
    error(string.format("fit: %d epochs are already done (initial_epoch) but epochs = %d: epochs counts the "
      .. "whole run, not the epochs still to go", first - 1, epochs), 2)
  end

  call_cbs(cbs, "on_train_begin", {})
  for epoch = first, epochs do
    call_cbs(cbs, "on_epoch_begin", epoch, {})
    if verbose == 1 then print(string.format("Epoch %d/%d", epoch, epochs)) end
    local bar = verbose > 0 and progress.new(src.steps, {verbose = verbose}) or nil
    local sum, n, msum, mcount = 0, 0, {}, {}
    local step = 0
    local running = {}
    for x, y, n_all in src.next_epoch(shuffle) do
      step = step + 1
      global = global + 1
      call_cbs(cbs, "on_batch_begin", step, {epoch = epoch, global_step = global})
      set_mode(run, true)
      local B = batch_len(x)
      local pred, l, lv
      if B > 0 or not D then
        pred = forward(run, x)
        l = loss(pred, y)
        if not keng.is_tensor(l) or l:numel() ~= 1 then
          error(string.format("fit: the loss must be a one-element tensor (got %s)",
            keng.is_tensor(l) and "shape " .. require("keng.util").shape_str(l, ",") or type(l)), 2)
        end
      end
      opt:zero_grad()
      if l then
        -- each rank's grad is weighted by its share of the batch: the sum is the global mean
        if D then rawset(run, "_next_weight", B / n_all) end
        l:backward()
        lv = l:item()
      else
        run:sync_grads(0)                 -- no rows here this step: zeros in the sum
        lv = 0
      end
      if clip then optim.clip_grad_norm(params, clip) end
      opt:step()
      local step_m = {}
      if #metrics > 0 and pred then
        keng.no_grad(function()
          local p = pred:detach()
          for i, m in ipairs(metrics) do step_m[i] = {m[2](p, y)} end
        end)
      end
      if D then                           -- the job's batch: sums over ranks
        local v = {lv * B, B}
        for i = 1, #metrics do local sc = step_m[i] or {0, 0}; v[#v + 1] = sc[1]; v[#v + 1] = sc[2] end
        v = D.all_reduce(keng.tensor(v, {dtype = "f64"})):tolist()
        lv, B = v[1] / v[2], v[2]
        for i = 1, #metrics do step_m[i] = {v[2 * i + 1], v[2 * i + 2]} end
      end
      hist.steps[#hist.steps + 1] = lv
      sum, n = sum + lv * B, n + B
      running.loss = sum / n
      local blogs = {loss = lv, epoch = epoch, global_step = global, batch_size = B}
      for i, m in ipairs(metrics) do
        local s, c = step_m[i][1], step_m[i][2]
        msum[m[1]] = (msum[m[1]] or 0) + s
        mcount[m[1]] = (mcount[m[1]] or 0) + c
        running[m[1]] = msum[m[1]] / mcount[m[1]]
        blogs[m[1]] = s / c
      end
      if bar then bar:update(step, ordered(running), running) end
      call_cbs(cbs, "on_batch_end", step, blogs)
      if model.stop_training or (opts.steps_per_epoch and step >= opts.steps_per_epoch) then break end
    end
    if step == 0 then
      -- an iterator that is spent: end training (epoch 1 with no data is a mistake)
      if epoch == first then error("fit: data gave no batches", 2) end
      hist.stop_reason = "data exhausted at epoch " .. epoch
      break
    end
    local logs = {loss = sum / n}
    for k, s in pairs(msum) do logs[k] = s / mcount[k] end
    if opts.validation_data then
      local vl = run_eval(model, opts.validation_data, {batch_size = opts.validation_batch_size or opts.batch_size,
        steps = opts.validation_steps}, loss, metrics, "fit (validation_data)")
      for k, v in pairs(vl) do logs["val_" .. k] = v end
    end
    call_cbs(cbs, "on_epoch_end", epoch, logs)
    log_epoch(epoch, logs)
    if bar then bar:finish(ordered(logs), logs, string.format("Epoch %d/%d", epoch, epochs)) end
    if model.stop_training then
      hist.stop_reason = hist.stop_reason or ("stopped by a callback at epoch " .. epoch)
      break
    end
  end
  call_cbs(cbs, "on_train_end", {})
  for _, cb in ipairs(cbs) do if cb.message then hist.stop_reason = cb.message end end
  return hist
end

train.losses = {binary_crossentropy = bce}
train.metrics = metric_fns
train.callbacks = callbacks

return train
