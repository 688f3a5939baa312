-- options_spec.lua — no option is silently ignored: every options table in keng refuses a key it
-- does not know, naming the key and the valid ones, at the caller's line (keng.options); range
-- checks of counts and rates (fit epochs / batch_size, optimizer lr, non-leaf parameters).
local keng = require "keng"
local H = require "helper"
local nn = require "keng.nn"
local optim = require "keng.optim"
local train = require "keng.train"
local cbs = require "keng.callbacks"
local options = require "keng.options"

-- fn raises with every pattern in its message, blamed on this file (the user's line)
local function refuses(fn, ...)
  local err = H.raises(fn, (...))
  for i = 2, select("#", ...) do
    local p = select(i, ...)
    assert(err:find(p, 1, true), "error '" .. err .. "' does not contain '" .. p .. "'")
  end
  assert(err:find("options_spec.lua:", 1, true), "error not blamed on the caller's line: " .. err)
  return err
end

local function tiny()
  local m = nn.Linear(2, 3)
  local x, y = keng.randn({8, 2}), keng.tensor({0, 1, 2, 0, 1, 2, 0, 1}, {dtype = "i64"})
  return m, {x = x, y = y}
end

describe("keng.options", function()
  it("check names the unknown keys and the valid ones, sorted", function()
    local function f(o) local r = options.check("f", o, {"b", "a"}); return r end
    assert.are.same({}, f(nil))
    assert.are.same({a = 1}, f({a = 1}))
    refuses(function() f({c = 1}) end, "f: unknown option 'c' (valid: a, b)")  -- blames f's caller
    H.raises(function() f({d = 1, c = 2}) end, "f: unknown options 'c', 'd' (valid: a, b)")
    H.raises(function() f(3) end, "f: options must be a table, got number")
    H.raises(function() f({[1] = true}) end, "unknown option '1'")
  end)

  it("integer and number check counts and rates", function()
    assert.equal(3, options.integer("f", "n", 3.0, 0))
    H.raises(function() options.integer("f", "n", 2.5, 1) end, "f: n must be a whole number, got 2.5")
    H.raises(function() options.integer("f", "n", -1, 0) end, "f: n must be >= 0, got -1")
    H.raises(function() options.integer("f", "n", "3", 0) end, "whole number")
    H.raises(function() options.number("f", "x", math.huge) end, "f: x must be a finite number, got inf")
    H.raises(function() options.number("f", "x", 0 / 0) end, "finite number")
    H.raises(function() options.number("f", "x", -1, 0) end, "f: x must be >= 0, got -1")
  end)
end)

describe("fit / evaluate / predict options", function()
  it("fit refuses misspelt and unsupported keys (epoch, initial_epoch)", function()
    local m, data = tiny()
    refuses(function() train.fit(m, data, {loss = "cross_entropy", epoch = 3, verbose = 0}) end,
      "fit: unknown option 'epoch'", "epochs", "batch_size")
    refuses(function() train.fit(m, data, {loss = "cross_entropy", initial_epoch = 5, verbose = 0}) end,
      "fit: unknown option 'initial_epoch'")
  end)

  it("fit checks counts and rates", function()
    local m, data = tiny()
    local function fit(o)
      o.loss, o.verbose = "cross_entropy", o.verbose or 0
      return train.fit(m, data, o)
    end
    refuses(function() fit({epochs = -1}) end, "fit: epochs must be >= 0, got -1")
    refuses(function() fit({epochs = 1.5}) end, "fit: epochs must be a whole number, got 1.5")
    refuses(function() fit({batch_size = 2.5}) end, "fit: batch_size must be a whole number, got 2.5")
    refuses(function() fit({batch_size = 0}) end, "fit: batch_size must be >= 1, got 0")
    refuses(function() fit({steps_per_epoch = 0}) end, "fit: steps_per_epoch must be >= 1")
    refuses(function() fit({lr = math.huge}) end, "fit: lr must be a finite number, got inf")
    refuses(function() fit({clip_norm = -1}) end, "fit: clip_norm must be >= 0")
    refuses(function() fit({verbose = 3}) end, "fit: verbose must be 0, 1, 2 or \"auto\"")
    local h = fit({epochs = 2.0, batch_size = 4})   -- integral floats are whole numbers
    assert.equal(2, #h.epoch)
  end)

  it("evaluate and predict refuse unknown keys", function()
    local m, data = tiny()
    refuses(function() train.evaluate(m, data, {loss = "cross_entropy", epochs = 1}) end,
      "evaluate: unknown option 'epochs'", "batch_size", "steps")
    refuses(function() train.predict(m, data.x, {batch = 4}) end, "predict: unknown option 'batch' (valid: batch_size, steps, verbose)")
    refuses(function() train.predict(m, data.x, {batch_size = 0.5}) end, "predict: batch_size must be a whole number")
  end)

  it("callbacks refuse unknown keys", function()
    refuses(function() cbs.EarlyStopping{patience = 2, restore = true} end, "EarlyStopping: unknown option 'restore'")
    refuses(function() cbs.ModelCheckpoint("/tmp/x.safetensors", {save_best = true}) end,
      "ModelCheckpoint: unknown option 'save_best'")
    refuses(function() cbs.TerminateOnNaN{verbos = 0} end, "TerminateOnNaN: unknown option 'verbos'")
    refuses(function() cbs.CSVLogger("/tmp/x.csv", {sep = ";"}) end, "CSVLogger: unknown option 'sep'")
    refuses(function() cbs.LossCurve("/tmp/x.svg", {name = "a"}) end, "LossCurve: unknown option 'name'")
    refuses(function() cbs.LearningRateScheduler(function(_, lr) return lr end, {quiet = true}) end,
      "LearningRateScheduler: unknown option 'quiet'")
  end)
end)

describe("optimizer options", function()
  it("refuse an infinite learning rate and other non-finite hyper-parameters", function()
    local p = keng.zeros({2}):requires_grad_()
    refuses(function() optim.AdamW({p}, {lr = math.huge}) end, "AdamW: lr must be finite, got inf")
    refuses(function() optim.SGD({p}, {lr = math.huge}) end, "SGD: lr must be finite")
    refuses(function() optim.Adam({p}, {weight_decay = math.huge}) end, "Adam: weight_decay must be finite")
    refuses(function() optim.AdamW({p}, {learning_rat = 1}) end, "AdamW: unknown option 'learning_rat'",
      "learning_rate", "schedule")
    local opt = optim.SGD({p}, {lr = 0.1})
    opt.lr = math.huge
    p.grad = keng.ones({2})
    refuses(function() opt:step() end, "SGD:step: lr must be a finite number >= 0, got inf")
    refuses(function() optim.schedules.cosine(1, 10, {warmup_steps = 2}) end,
      "schedules.cosine: unknown option 'warmup_steps' (valid: min_lr, warmup)")
  end)

  it("refuse a parameter that is not a leaf (its update would be lost)", function()
    local p = keng.zeros({2}):requires_grad_()
    local q = p * 2
    refuses(function() optim.AdamW({p, q}) end, "AdamW: params[2] is not a leaf tensor")
  end)
end)

describe("nn layer constructors", function()
  it("refuse unknown keys at the user's line", function()
    refuses(function() nn.Linear(2, 3, {biass = false}) end, "Linear: unknown option 'biass'", "bias, bias_init")
    refuses(function() nn.Embedding(5, 3, {padding_idx = 0}) end, "Embedding: unknown option 'padding_idx'")
    refuses(function() nn.LayerNorm(3, {epsilon = 1e-6}) end, "LayerNorm: unknown option 'epsilon'", "eps")
    refuses(function() nn.RMSNorm(3, {offset = true}) end, "RMSNorm: unknown option 'offset'", "unit_offset")
    refuses(function() nn.GroupNorm(1, 3, {eps = 1e-6, affin = false}) end, "GroupNorm: unknown option 'affin'")
    refuses(function() nn.Conv2d(1, 1, 3, {pad = 1}) end, "Conv2d: unknown option 'pad'", "padding")
    refuses(function() nn.ConvTranspose2d(1, 1, 3, {outpadding = 1}) end, "ConvTranspose2d: unknown option 'outpadding'")
    refuses(function() nn.MultiHeadAttention(4, 2, {kv_head = 1}) end, "MultiHeadAttention: unknown option 'kv_head'")
    refuses(function() nn.TransformerEncoderLayer(4, 2, 8, {pre_norm = true}) end,
      "TransformerEncoderLayer: unknown option 'pre_norm'", "norm_first")
    refuses(function() nn.GELU{approx = "tanh"} end, "GELU: unknown option 'approx'")
    refuses(function() nn.GELU("tan") end, "GELU: approximate must be \"none\" or \"tanh\"")
    local mha = nn.MultiHeadAttention(4, 2)
    refuses(function() mha(keng.zeros({1, 2, 4}), {masks = true}) end, "MultiHeadAttention:forward: unknown option 'masks'")
  end)

  it("an init option that was ignored before now takes effect (Linear/Embedding std)", function()
    keng.manual_seed(3)
    local l = nn.Linear(64, 64, {weight_init = "normal", std = 1.0})
    local sd = l.weight:float():pow(2):mean():sqrt():item()
    assert.truthy(sd > 0.8 and sd < 1.2, "std 1 ignored: " .. sd)
    local e = nn.Embedding(64, 64, {init = "normal", std = 1.0})
    sd = e.weight:float():pow(2):mean():sqrt():item()
    assert.truthy(sd > 0.8 and sd < 1.2, "std 1 ignored: " .. sd)
  end)
end)
