-- train_spec.lua — keng.train (fit / evaluate / predict), keng.callbacks and keng.progress:
-- an MLP and a 2-layer transformer reach a loss threshold with SGD, Adam and AdamW; History
-- contents against sums computed here; the data forms (tensors, batch lists, iterators,
-- factories, shuffling); callback order; EarlyStopping, TerminateOnNaN, ModelCheckpoint,
-- CSVLogger, LossCurve, LearningRateScheduler; the output of a child `keng` whose stdout is a
-- pipe (no progress bar) and with KENG_PROGRESS=1 (the "\r" bar).
-- Shape letters: N samples, B batch, T length, C features.
local keng = require "keng"
local H = require "helper"
local nn = require "keng.nn"
local optim = require "keng.optim"
local train = require "keng.train"
local cbs = require "keng.callbacks"
local progress = require "keng.progress"

local tmpfile, read = H.tmpname, H.read

-- a quadrant task: class 1 when both coordinates have the same sign (not linearly separable)
local function quadrants(N)
  local x = keng.randn({N, 2})
  local y = (x:select(2, 1) * x:select(2, 2)):gt(0):long()
  return x, y
end

-- a 2-layer pre-norm transformer encoder over [B, T, Cin] with mean pooling and a class head
local Block = nn.Module:extend("TestBlock")
function Block:init(C, heads)
  self.ln1, self.attn = nn.LayerNorm(C), nn.MultiHeadAttention(C, heads)
  self.ln2, self.fc1, self.fc2 = nn.LayerNorm(C), nn.Linear(C, 2 * C), nn.Linear(2 * C, C)
end
function Block:forward(x)                                -- x [B, T, C]
  x = x + self.attn(self.ln1(x))
  return x + self.fc2(self.fc1(self.ln2(x)):gelu())
end
local Tiny = nn.Module:extend("TinyTransformer")
function Tiny:init(Cin, C, heads, classes)
  self.embed = nn.Linear(Cin, C)
  self.blocks = {Block(C, heads), Block(C, heads)}
  self.ln, self.head = nn.LayerNorm(C), nn.Linear(C, classes)
end
function Tiny:forward(x)                                 -- x [B, T, Cin] -> [B, classes]
  local h = self.embed(x)
  for _, b in ipairs(self.blocks) do h = b(h) end
  return self.head(self.ln(h):mean(2))
end

local OPTS = {
  SGD = function(p) return optim.SGD(p, {lr = 0.3, momentum = 0.9}) end,
  Adam = function(p) return optim.Adam(p, {lr = 0.02}) end,
  AdamW = function(p) return optim.AdamW(p, {lr = 0.02}) end,
}

describe("fit reaches a loss threshold", function()
  for _, name in ipairs{"SGD", "Adam", "AdamW"} do
    it("an MLP on the quadrant task with " .. name, function()
      keng.manual_seed(3)
      local x, y = quadrants(256)
      local m = nn.Sequential(nn.Linear(2, 32), nn.Tanh(), nn.Linear(32, 2))
      local h = m:fit({x = x, y = y}, {loss = "cross_entropy", optimizer = OPTS[name](m:parameters()),
        epochs = 30, batch_size = 32, verbose = 0, metrics = {"accuracy"}})
      assert(h.history.loss[1] > 0.5, "starts near ln 2: " .. h.history.loss[1])
      assert(h:last("loss") < 0.25, name .. " final loss " .. h:last("loss"))
      assert(h:last("accuracy") > 0.9, name .. " final accuracy " .. h:last("accuracy"))
      local l = train.evaluate(m, {x = x, y = y})
      assert(l < 0.25, "evaluate after fit: " .. l)
    end)
  end

  for _, name in ipairs{"SGD", "Adam", "AdamW"} do
    it("a 2-layer transformer on a sequence-sign task with " .. name, function()
      keng.manual_seed(7)
      local x = keng.randn({128, 6, 4})                         -- [N, T, C]
      local y = x:select(3, 1):sum(2):gt(0):long()              -- sign of a sum over T: needs mixing
      keng.manual_seed(11)
      local m = Tiny(4, 16, 2, 2)
      local lr = ({SGD = 0.05, Adam = 3e-3, AdamW = 3e-3})[name]
      local opt = optim[name](m:parameters(), {lr = lr, momentum = name == "SGD" and 0.9 or nil})
      local h = train.fit(m, {x = x, y = y}, {loss = "cross_entropy", optimizer = opt, epochs = 15,
        batch_size = 16, verbose = 0})
      assert(h:last("loss") < 0.25 and h:last("loss") < h.history.loss[1] / 2,
        string.format("%s: loss %.4f -> %.4f", name, h.history.loss[1], h:last("loss")))
    end)
  end

  it("defaults to AdamW over the trainable parameters", function()
    keng.manual_seed(3)
    local x, y = quadrants(128)
    local m = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 2))
    local frozen = m["1"].weight
    frozen.requires_grad = false
    local before = frozen:clone()
    local h = m:fit({x = x, y = y}, {loss = "cross_entropy", epochs = 3, verbose = 0, lr = 0.01})
    assert(h:last("loss") < h.history.loss[1])
    assert(frozen:ne(before):sum():item() == 0, "a frozen parameter changed")
  end)
end)

-- y = x·w with no bias, trained by plain SGD: everything here can be recomputed by hand
local function linear_problem(N)
  local x = keng.arange(N):float():reshape{N, 1} / N
  local y = x * 3 - 1
  return x, y
end

describe("train.step", function()
  it("is one fit step: the same parameters as fit over one batch of one epoch", function()
    local function run(use_step)
      keng.manual_seed(7)
      local m = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
      local x, y = quadrants(16)
      local opt = optim.SGD(m:parameters(), {lr = 0.1})
      if use_step then
        m:train()
        local l = train.step(m, x, y, opt, "cross_entropy")
        assert.are.same({}, l.shape)
      else
        train.fit(m, {x = x, y = y}, {loss = "cross_entropy", optimizer = opt, batch_size = 16, epochs = 1, shuffle = false,
          verbose = 0})
      end
      return m:parameters()
    end
    local a, b = run(true), run(false)
    for i = 1, #a do H.close(a[i], b[i], 0, "parameter " .. i) end
  end)

  it("names an unknown loss at the caller's line", function()
    local m = nn.Linear(2, 2)
    local e = H.raises(function() train.step(m, keng.randn({4, 2}), keng.zeros({4}, {dtype = "i64"}),
      optim.SGD(m:parameters()), "hinge") end, "step: unknown loss 'hinge'")
    assert.truthy(e:find("train_spec.lua:", 1, true), e)
  end)
end)

describe("History", function()
  it("holds per-step losses, sample-weighted epoch means and val_* entries", function()
    keng.manual_seed(1)
    local N, bs, E = 10, 4, 3                                  -- batches of 4, 4, 2
    local x, y = linear_problem(N)
    local m = nn.Linear(1, 1)
    local h = train.fit(m, {x = x, y = y}, {loss = "mse", optimizer = optim.SGD(m:parameters(), {lr = 0.1}),
      epochs = E, batch_size = bs, shuffle = false, verbose = 0, validation_data = {x = x, y = y},
      metrics = {"mae"}})
    assert.are.same({1, 2, 3}, h.epoch)
    assert.are.equal(E * 3, #h.steps)
    assert.are.equal(E, #h.history.loss)
    for e = 1, E do
      local s = h.steps
      local want = (s[3 * e - 2] * 4 + s[3 * e - 1] * 4 + s[3 * e] * 2) / N
      H.close(h.history.loss[e], want, 1e-12, "epoch " .. e .. " mean")
    end
    assert.are.equal(E, #h.history.val_loss)
    assert.are.equal(E, #h.history.mae)
    assert.are.equal(E, #h.history.val_mae)
    -- the last val_loss is the loss of the final weights over all the data
    local pred = m(x)
    H.close(h:last("val_loss"), ((pred - y) ^ 2):mean():item(), 1e-6, "val_loss")
    H.close(h:last("val_mae"), (pred - y):abs():mean():item(), 1e-6, "val_mae")
    assert.are.equal(E, h.params.epochs)
    assert.are.equal(3, h.params.steps)
  end)

  it("the first step's loss is the loss of the initial weights on the first batch", function()
    keng.manual_seed(2)
    local x, y = linear_problem(8)
    local m = nn.Linear(1, 1)
    local first = ((m(x:narrow(1, 1, 4)) - y:narrow(1, 1, 4)) ^ 2):mean():item()
    local h = train.fit(m, {x = x, y = y}, {loss = "mse", optimizer = optim.SGD(m:parameters(), {lr = 0.1}),
      batch_size = 4, shuffle = false, verbose = 0})
    H.close(h.steps[1], first, 1e-6, "step 1")
  end)

  it("one SGD step through fit equals the update by hand", function()
    keng.manual_seed(4)
    local x, y = linear_problem(6)
    local m = nn.Linear(1, 1)
    local w, b = m.weight:item(), m.bias:item()
    -- d/dw mean((w x + b - y)^2) = mean(2 (w x + b - y) x)
    local xs, ys = x:reshape{-1}:tolist(), y:reshape{-1}:tolist()
    local gw, gb = 0, 0
    for i = 1, 6 do
      local r = w * xs[i] + b - ys[i]
      gw, gb = gw + 2 * r * xs[i] / 6, gb + 2 * r / 6
    end
    train.fit(m, {x = x, y = y}, {loss = "mse", optimizer = optim.SGD(m:parameters(), {lr = 0.5}),
      batch_size = 6, verbose = 0})
    H.close(m.weight:item(), w - 0.5 * gw, 1e-6, "weight")
    H.close(m.bias:item(), b - 0.5 * gb, 1e-6, "bias")
  end)
end)

-- a module that records the first feature of every sample it sees in training mode
local Recorder = nn.Module:extend("Recorder")
function Recorder:init() self.lin = nn.Linear(1, 1); self.seen = {} end
function Recorder:forward(x)
  if self.training then
    for _, v in ipairs(x:reshape{-1}:tolist()) do self.seen[#self.seen + 1] = v end
  end
  return self.lin(x)
end

describe("data", function()
  it("keeps the last partial batch and shuffles with a permutation each epoch", function()
    keng.manual_seed(5)
    local N = 23
    local x = keng.arange(N):float():reshape{N, 1}
    local m = Recorder()
    train.fit(m, {x = x, y = x}, {loss = "mse", optimizer = optim.SGD(m:parameters(), {lr = 0}),
      batch_size = 5, epochs = 2, verbose = 0})
    assert.are.equal(2 * N, #m.seen)
    local in_order = true
    for e = 0, 1 do
      local got = {}
      for i = 1, N do got[i] = m.seen[e * N + i] end
      for i = 1, N do if got[i] ~= i - 1 then in_order = false end end
      table.sort(got)
      for i = 1, N do assert.are.equal(i - 1, got[i]) end          -- each sample exactly once
    end
    assert.is_false(in_order, "shuffle = true (the default) left the data in order")
    m.seen = {}
    train.fit(m, {x = x, y = x}, {loss = "mse", optimizer = optim.SGD(m:parameters(), {lr = 0}),
      batch_size = 5, shuffle = false, verbose = 0})
    for i = 1, N do assert.are.equal(i - 1, m.seen[i]) end
  end)

  it("takes a list of batches, an iterator function and a factory", function()
    local x, y = linear_problem(8)
    local m = nn.Linear(1, 1)
    local opt = optim.SGD(m:parameters(), {lr = 0.1})
    local batches = {{x:narrow(1, 1, 3), y:narrow(1, 1, 3)}, {x:narrow(1, 4, 5), y:narrow(1, 4, 5)}}
    local h = train.fit(m, batches, {loss = "mse", optimizer = opt, epochs = 2, verbose = 0})
    assert.are.equal(4, #h.steps)
    -- an iterator: 3 batches in all, steps_per_epoch 2 -> epoch 2 gets one, epoch 3 none
    local i = 0
    local function iter()
      i = i + 1
      if i <= 3 then return x:narrow(1, i, 2), y:narrow(1, i, 2) end
    end
    h = train.fit(m, iter, {loss = "mse", optimizer = opt, epochs = 5, steps_per_epoch = 2, verbose = 0})
    assert.are.equal(3, #h.steps)
    assert.are.equal(2, #h.history.loss)
    assert.truthy(h.stop_reason:find("exhausted", 1, true))
    -- a factory: a fresh iterator per epoch
    local function factory()
      local k = 0
      return function()
        k = k + 1
        if k <= 2 then return x:narrow(1, k, 4), y:narrow(1, k, 4) end
      end
    end
    h = train.fit(m, factory, {loss = "mse", optimizer = opt, epochs = 3, verbose = 0})
    assert.are.equal(6, #h.steps)
    assert.are.equal(3, #h.history.loss)
  end)

  it("passes a list x as several arguments", function()
    local Two = nn.Module:extend("Two")
    function Two:init() self.a, self.b = nn.Linear(2, 1), nn.Linear(3, 1) end
    function Two:forward(p, q) return self.a(p) + self.b(q) end
    keng.manual_seed(6)
    local p, q = keng.randn({10, 2}), keng.randn({10, 3})
    local m = Two()
    local h = train.fit(m, {x = {p, q}, y = keng.zeros({10, 1})}, {loss = "mse", epochs = 2, batch_size = 4, verbose = 0})
    assert.are.equal(6, #h.steps)
    local out = train.predict(m, {x = {p, q}}, {batch_size = 3})
    H.close(out, m(p, q), 1e-6, "predict with two inputs")
  end)

  it("raises on a bad loss name, a missing loss and mismatched x and y", function()
    local m = nn.Linear(1, 1)
    local x = keng.zeros({4, 1})
    H.raises(function() train.fit(m, {x = x, y = x}, {verbose = 0}) end, "fit: opts.loss is required")
    H.raises(function() train.fit(m, {x = x, y = x}, {loss = "hinge", verbose = 0}) end, "unknown loss 'hinge'")
    H.raises(function() train.fit(m, {x = x, y = keng.zeros({3, 1})}, {loss = "mse", verbose = 0}) end,
      "x has 4 samples but y has 3")
    H.raises(function() train.fit(m, {x = x, y = x}, {loss = function(p) return p end, verbose = 0}) end,
      "the loss must be a one-element tensor")
  end)
end)

describe("evaluate and predict", function()
  it("predict concatenates batches (partial last one included) and matches one big call", function()
    keng.manual_seed(8)
    local m = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    local x = keng.randn({11, 3})
    local out = train.predict(m, x, {batch_size = 4})
    assert.are.same({11, 2}, out.shape)
    assert.is_false(out.requires_grad, "predict records no tape")
    H.close(out, m(x), 1e-6, "predict")
    H.close(m:predict({x = x}, {batch_size = 11}), out, 1e-6, "m:predict")
  end)

  it("evaluate returns the sample mean loss and metrics, in eval mode, without a tape", function()
    keng.manual_seed(9)
    local m = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5), nn.Linear(4, 3))
    local x, y = keng.randn({10, 3}), keng.randint(0, 3, {10})
    m:train()
    local loss, logs = train.evaluate(m, {x = x, y = y}, {loss = "cross_entropy", batch_size = 3,
      metrics = {"accuracy"}})
    assert.is_true(m.training, "evaluate restores the training mode")
    m:eval()
    local logits = m(x)
    H.close(loss, keng.cross_entropy(logits, y):item(), 1e-5, "loss")
    local acc = logits:argmax(-1):eq(y):float():mean():item()
    H.close(logs.accuracy, acc, 1e-6, "accuracy")
    for _, p in ipairs(m:parameters()) do assert.is_nil(p.grad) end
  end)

  it("binary_crossentropy on probabilities and on logits matches the formula", function()
    local z = keng.tensor({{-2.0}, {0.5}, {3.0}})
    local y = keng.tensor({{0.0}, {1.0}, {1.0}})
    local want = 0
    for i, zi in ipairs({-2.0, 0.5, 3.0}) do
      local p = 1 / (1 + math.exp(-zi))
      local yi = ({0, 1, 1})[i]
      want = want - (yi * math.log(p) + (1 - yi) * math.log(1 - p)) / 3
    end
    H.close(train.losses.binary_crossentropy(z:sigmoid(), y), want, 1e-5, "probabilities")
    H.close(train.losses.binary_crossentropy(z, y, true), want, 1e-5, "logits")
  end)
end)

describe("callbacks", function()
  it("are called in order with the logs", function()
    local events = {}
    local rec = cbs.Lambda{
      on_train_begin = function() events[#events + 1] = "train_begin" end,
      on_epoch_begin = function(_, e) events[#events + 1] = "epoch_begin " .. e end,
      on_batch_begin = function(_, s) events[#events + 1] = "batch_begin " .. s end,
      on_batch_end = function(_, s, logs)
        assert.is_number(logs.loss)
        events[#events + 1] = "batch_end " .. s
      end,
      on_epoch_end = function(_, e, logs)
        assert.is_number(logs.loss)
        events[#events + 1] = "epoch_end " .. e
      end,
      on_train_end = function() events[#events + 1] = "train_end" end,
    }
    local plain = {hits = 0}                                   -- any table with hooks works
    function plain:on_batch_end() self.hits = self.hits + 1 end
    local x, y = linear_problem(4)
    local m = nn.Linear(1, 1)
    train.fit(m, {x = x, y = y}, {loss = "mse", batch_size = 2, epochs = 2, verbose = 0, callbacks = {rec, plain}})
    assert.are.same({"train_begin",
      "epoch_begin 1", "batch_begin 1", "batch_end 1", "batch_begin 2", "batch_end 2", "epoch_end 1",
      "epoch_begin 2", "batch_begin 1", "batch_end 1", "batch_begin 2", "batch_end 2", "epoch_end 2",
      "train_end"}, events)
    assert.are.equal(4, plain.hits)
    assert.are.equal(m, rec.model)
    assert.is_table(rec.optimizer)
  end)

  it("stop_training set by a callback ends fit after the current batch", function()
    local x, y = linear_problem(8)
    local m = nn.Linear(1, 1)
    local stopper = cbs.Lambda{on_batch_end = function(self, step, logs)
      if logs.global_step == 3 then self.model.stop_training = true end
    end}
    local h = train.fit(m, {x = x, y = y}, {loss = "mse", batch_size = 2, epochs = 4, verbose = 0, callbacks = {stopper}})
    assert.are.equal(3, #h.steps)
    assert.are.equal(1, #h.history.loss)
  end)

  it("EarlyStopping stops after `patience` epochs without improvement", function()
    local x, y = linear_problem(8)
    local m = nn.Linear(1, 1)
    local es = cbs.EarlyStopping{monitor = "loss", patience = 2}
    -- lr 0: the loss never improves, so epochs 2 and 3 are the two patient ones
    local h = train.fit(m, {x = x, y = y}, {loss = "mse", optimizer = optim.SGD(m:parameters(), {lr = 0}),
      epochs = 10, batch_size = 8, verbose = 0, callbacks = {es}})
    assert.are.equal(3, #h.history.loss)
    assert.are.equal(3, es.stopped_epoch)
    -- a learning model is not stopped
    local es2 = cbs.EarlyStopping{monitor = "val_loss", patience = 1}
    h = train.fit(m, {x = x, y = y}, {loss = "mse", optimizer = optim.SGD(m:parameters(), {lr = 0.3}),
      epochs = 5, batch_size = 8, verbose = 0, validation_data = {x = x, y = y}, callbacks = {es2}})
    assert.are.equal(5, #h.history.loss)
    assert.is_nil(es2.stopped_epoch)
  end)

  it("EarlyStopping restore_best puts back the weights of the best epoch", function()
    local m = nn.Linear(2, 1)
    local es = cbs.EarlyStopping{monitor = "loss", patience = 1, restore_best = true}
    es.model = m
    es:on_train_begin({})
    keng.no_grad(function() m.weight:fill_(1) end)
    es:on_epoch_end(1, {loss = 1.0})                               -- best
    keng.no_grad(function() m.weight:fill_(2) end)
    es:on_epoch_end(2, {loss = 2.0})                               -- worse: stop
    assert.is_true(m.stop_training)
    es:on_train_end({})
    H.close(m.weight, keng.ones({1, 2}), 0, "restored weight")
    H.raises(function() es:on_epoch_end(3, {acc = 1}) end, "monitor 'loss' is not in the logs (have: acc)")
  end)

  it("EarlyStopping names a missing monitor", function()
    local x, y = linear_problem(4)
    H.raises(function()
      train.fit(nn.Linear(1, 1), {x = x, y = y}, {loss = "mse", verbose = 0, callbacks = {cbs.EarlyStopping()}})
    end, "monitor 'val_loss' is not in the logs")
  end)

  it("TerminateOnNaN stops at the first NaN loss and names the step", function()
    local x, y = linear_problem(12)
    local m = nn.Linear(1, 1)
    local calls = 0
    local function loss(pred, t)
      calls = calls + 1
      local l = ((pred - t) ^ 2):mean()
      if calls == 3 then l = l * (0 / 0) end                       -- a NaN at step 3
      return l
    end
    local tn = cbs.TerminateOnNaN{verbose = 0}
    local h = train.fit(m, {x = x, y = y}, {loss = loss, batch_size = 2, epochs = 3, verbose = 0, callbacks = {tn}})
    assert.are.equal(3, #h.steps)
    assert.is_true(h.steps[3] ~= h.steps[3], "step 3 is NaN")
    assert.truthy(tn.message:find("step 3", 1, true), tn.message)
    assert.truthy(h.stop_reason:find("TerminateOnNaN", 1, true))
    assert.are.equal(1, #h.history.loss)
  end)

  it("ModelCheckpoint writes a loadable safetensors file, best only", function()
    local dir = tmpfile("_ckpt")
    os.execute("mkdir -p '" .. dir .. "'")
    local x, y = linear_problem(8)
    local m = nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1))
    local snaps = {}
    local snap = cbs.Lambda{on_epoch_end = function(_, e)
      snaps[e] = {}
      for k, t in pairs(m:state_dict()) do snaps[e][k] = t:clone() end
    end}
    local ck = cbs.ModelCheckpoint(dir .. "/m-{epoch:02d}.safetensors", {monitor = "loss", save_best_only = true})
    local h = train.fit(m, {x = x, y = y}, {loss = "mse", optimizer = optim.SGD(m:parameters(), {lr = 0.1}),
      epochs = 3, batch_size = 8, verbose = 0, callbacks = {snap, ck}})
    assert.is_true(h.history.loss[3] < h.history.loss[1])
    assert.are.equal(dir .. "/m-03.safetensors", ck.saved[#ck.saved])
    local sd, meta = keng.load(ck.saved[#ck.saved])
    local n = 0
    for k, t in pairs(snaps[3]) do
      n = n + 1
      assert.truthy(sd[k], "missing " .. k)
      assert.are.equal(0, sd[k]:ne(t):sum():item(), k .. " is not bit-exact")
    end
    assert.are.equal(4, n)
    assert.are.equal("3", meta.epoch)
    local m2 = nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1))
    m2:load_state_dict(sd)
    H.close(m2(x), m(x), 0, "loaded model")
    -- save_best_only with a loss that stops improving saves fewer files than epochs
    local ck2 = cbs.ModelCheckpoint(dir .. "/b.safetensors", {monitor = "loss", save_best_only = true})
    train.fit(m, {x = x, y = y}, {loss = "mse", optimizer = optim.SGD(m:parameters(), {lr = 0}),
      epochs = 3, batch_size = 8, verbose = 0, callbacks = {ck2}})
    assert.are.equal(1, #ck2.saved)
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("CSVLogger writes a header and one row per epoch", function()
    local path = tmpfile(".csv")
    local x, y = linear_problem(8)
    local m = nn.Linear(1, 1)
    local h = train.fit(m, {x = x, y = y}, {loss = "mse", epochs = 3, batch_size = 4, verbose = 0,
      metrics = {"mae"}, validation_data = {x = x, y = y}, callbacks = {cbs.CSVLogger(path)}})
    local lines = {}
    for l in read(path):gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.are.equal(4, #lines)
    assert.are.equal("epoch,loss,mae,val_loss,val_mae", lines[1])
    for e = 1, 3 do
      local f = {}
      for v in lines[e + 1]:gmatch("[^,]+") do f[#f + 1] = tonumber(v) end
      assert.are.equal(e, f[1])
      H.close(f[2], h.history.loss[e], 1e-7, "loss")
      H.close(f[5], h.history.val_mae[e], 1e-7, "val_mae")
    end
    os.remove(path)
  end)

  it("LossCurve writes an SVG with one point per step", function()
    local path = tmpfile(".svg")
    local x, y = linear_problem(8)
    local h = train.fit(nn.Linear(1, 1), {x = x, y = y}, {loss = "mse", epochs = 2, batch_size = 2, verbose = 0,
      validation_data = {x = x, y = y}, callbacks = {cbs.LossCurve(path)}})
    local svg = read(path)
    assert.truthy(svg:find("^<svg"))
    local pts = svg:match('id="loss"[^>]-points="([^"]*)"')
    local n = 0
    for _ in pts:gmatch("[%d.]+,[%d.]+") do n = n + 1 end
    assert.are.equal(#h.steps, n)
    assert.truthy(svg:find('id="val_loss"', 1, true))
    os.remove(path)
  end)

  it("LearningRateScheduler sets the optimizer's lr each epoch", function()
    local x, y = linear_problem(4)
    local m = nn.Linear(1, 1)
    local opt = optim.SGD(m:parameters(), {lr = 0.1})
    local seen = {}
    local probe = cbs.Lambda{on_batch_begin = function(self) seen[#seen + 1] = self.optimizer.lr end}
    local h = train.fit(m, {x = x, y = y}, {loss = "mse", optimizer = opt, epochs = 3, batch_size = 4, verbose = 0,
      callbacks = {cbs.LearningRateScheduler(function(epoch, lr) return lr / 2 end), probe}})
    H.close(seen, {0.05, 0.025, 0.0125}, 1e-12, "lr per epoch")
    H.close(h.history.lr, {0.05, 0.025, 0.0125}, 1e-12, "logged lr")
  end)
end)

describe("progress", function()
  it("draws the Keras bar", function()
    local out = {}
    local sink = {write = function(_, ...) for _, s in ipairs{...} do out[#out + 1] = s end end, flush = function() end}
    local bar = progress.new(10, {verbose = 1, tty = true, out = sink})
    bar:update(3, {"loss"}, {loss = 0.43216})
    local s = table.concat(out)
    assert.truthy(s:find("\r 3/10 [========>.....................] - ETA: ", 1, true), s)
    assert.truthy(s:find("/step - loss: 0.4322", 1, true), s)
    bar:update(10, {"loss"}, {loss = 0.25})
    out = {}
    bar:finish({"loss", "val_loss"}, {loss = 0.25, val_loss = 0.5})
    s = table.concat(out)
    assert.truthy(s:find("^\r10/10 %[==============================%] %- %d+s %- %d+[mu]?s/step %- loss: 0%.2500 %- val_loss: 0%.5000 *\n$"), s)
  end)

  -- the keng binary: $KENG_BIN (run_all.sh), else the keng running these specs, else build*/keng
  local function find_keng()
    local function ok(p) local f = p and p ~= "" and io.open(p, "rb"); if f then f:close() return true end end
    if ok(os.getenv("KENG_BIN")) then return os.getenv("KENG_BIN") end
    local self = io.popen("readlink /proc/$PPID/exe 2>/dev/null"):read("l")
    if self and self:match("keng$") and ok(self) then return self end
    if arg and arg[-1] and arg[-1]:match("keng$") and ok(arg[-1]) then return arg[-1] end
    local root = debug.getinfo(1, "S").source:match("^@(.*)/tests/lua/train_spec.lua$") or "."
    return io.popen("ls -d '" .. root .. "'/build*/keng 2>/dev/null | head -n 1"):read("l")
  end

  local script = [[
local nn, train = require "keng.nn", require "keng.train"
keng.manual_seed(1)
local x = keng.randn({20, 2}); local y = x:sum(2, true)
local v = VERBOSE
train.fit(nn.Linear(2, 1), {x = x, y = y}, {loss = "mse", epochs = 3, batch_size = 8, verbose = v})
]]

  local function run_child(verbose, env)
    local keng_bin = find_keng()
    assert(keng_bin, "no keng binary found (set KENG_BIN)")
    local path = tmpfile(".lua")
    local f = assert(io.open(path, "w"))
    f:write((script:gsub("VERBOSE", tostring(verbose))))
    f:close()
    local p = io.popen((env or "env -u KENG_PROGRESS") .. " '" .. keng_bin .. "' '" .. path .. "' 2>&1")
    local out = p:read("a")
    local okc = p:close()
    os.remove(path)
    assert(okc, "child keng failed: " .. out)
    return out
  end

  it("is absent when stdout is a pipe: one line per epoch by default", function()
    local out = run_child("nil")
    assert.is_nil(out:find("\r", 1, true), "a carriage return on a pipe")
    assert.is_nil(out:find("[", 1, true), "a bar on a pipe")
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.are.equal(3, #lines, out)
    for e = 1, 3 do
      assert.truthy(lines[e]:find("^Epoch " .. e .. "/3 %- %d+s %- %d+[mu]?s/step %- loss: %d"), lines[e])
    end
  end)

  it("prints nothing with verbose 0 and final bar lines (no \\r) with verbose 1 on a pipe", function()
    assert.are.equal("", run_child(0))
    local out = run_child(1)
    assert.is_nil(out:find("\r", 1, true))
    local _, bars = out:gsub("3/3 %[=+%] %- ", "")
    assert.are.equal(3, bars, out)
    assert.truthy(out:find("Epoch 2/3\n", 1, true))
  end)

  it("redraws with \\r when KENG_PROGRESS=1 says stdout is a terminal", function()
    local out = run_child("nil", "env KENG_PROGRESS=1")
    assert.truthy(out:find("\r1/3 [", 1, true), out)
    assert.truthy(out:find("ETA: ", 1, true), out)
  end)
end)
