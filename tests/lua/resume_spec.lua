-- resume_spec.lua — exact resume: keng.get_rng_state / set_rng_state, the flat optimizer
-- state_dict (names, unknown keys, wrong slots), ModelCheckpoint{save_optimizer = true} and
-- fit{resume_from =, initial_epoch =}: 6 epochs in one go and 3 + 3 with a fresh model and
-- optimizer give the same per-epoch losses (exact equality), with shuffling and dropout.
-- Shape letters: N samples, C features.
local keng = require "keng"
local H = require "helper"
local nn = require "keng.nn"
local optim = require "keng.optim"
local train = require "keng.train"
local cbs = require "keng.callbacks"

local tmpfile = H.tmpname

describe("rng state", function()
  it("set_rng_state replays the same draws on any later op", function()
    keng.manual_seed(3)
    keng.rand({5})
    local s = keng.get_rng_state()
    assert.are.equal("integer", math.type(s.seed))
    local a = keng.randn({7}):tolist()
    local d1 = keng.dropout(keng.ones({9}), 0.5):tolist()
    keng.set_rng_state(s)
    assert.are.same(a, keng.randn({7}):tolist())
    assert.are.same(d1, keng.dropout(keng.ones({9}), 0.5):tolist())
  end)

  it("refuses a table that is not a state, by key", function()
    H.raises(function() keng.set_rng_state({seed = 1, offset = 0, sead = 2}) end, "set_rng_state: unknown key 'sead' (valid: offset, seed)")
    H.raises(function() keng.set_rng_state({seed = 1}) end, "set_rng_state: state.offset must be an integer")
    H.raises(function() keng.set_rng_state({seed = 1, offset = 6}) end, "offset 6 is not a multiple of 4")
  end)
end)

-- a small MLP with dropout on 2 classes
local function mlp()
  return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))
end

local function data()
  keng.manual_seed(11)
  local x = keng.randn({40, 4})
  local y = x:narrow(2, 1, 1):squeeze(2):gt(0):long()
  return {x = x, y = y}
end

describe("flat optimizer state_dict", function()
  local function stepped(kind, opts)
    keng.manual_seed(5)
    local m = mlp()
    local opt = optim[kind](m:parameters(), opts)
    for _ = 1, 2 do
      opt:zero_grad()
      m(keng.randn({3, 4})):sum():backward()
      opt:step()
    end
    return m, opt
  end

  for _, kind in ipairs({"SGD", "AdamW"}) do
    it(kind .. ": names from the model, scalars and a round trip into a fresh optimizer", function()
      local opts = {lr = 0.05, momentum = kind == "SGD" and 0.9 or nil}
      local m, opt = stepped(kind, opts)
      local flat = opt:state_dict{flat = true, names = m}
      assert.are.equal(kind, flat.kind)
      assert.are.equal(2, flat.iterations)
      assert.are.equal(2, flat["1.weight.step"])
      local slot = kind == "SGD" and "momentum" or "m"
      assert.is_true(keng.is_tensor(flat["4.bias." .. slot]))
      local opt2 = optim[kind](m:parameters(), opts)
      opt2:load_state_dict(flat, {names = m})
      assert.are.equal(2, opt2.iterations)
      assert.are.same(opt.state[1][slot]:tolist(), opt2.state[1][slot]:tolist())
      -- without names: param1, param2, ...
      assert.is_true(keng.is_tensor(opt:state_dict{flat = true}["param1." .. slot]))
    end)
  end

  it("refuses unknown names, slots of another optimizer and shapes, by name", function()
    local m, opt = stepped("AdamW", {})
    local flat = opt:state_dict{flat = true, names = m}
    flat["9.weight.m"] = flat["1.weight.m"]
    H.raises(function() optim.AdamW(m:parameters()):load_state_dict(flat, {names = m}) end,
      "AdamW:load_state_dict: unknown key(s) 9.weight.m: no parameter of this optimizer has that name")
    flat["9.weight.m"] = nil
    flat["1.weight.momentum"] = flat["1.weight.m"]
    H.raises(function() optim.AdamW(m:parameters()):load_state_dict(flat, {names = m}) end,
      "parameter 1: unknown state 'momentum' for AdamW (valid: m, step, v)")
    flat["1.weight.momentum"] = nil
    flat["1.weight.m"] = keng.zeros({2, 2})
    H.raises(function() optim.AdamW(m:parameters()):load_state_dict(flat, {names = m}) end,
      "parameter 1: state 'm' is [2,2] but the parameter is [16,4]")
    H.raises(function() opt:state_dict{flat = true, name = m} end, "unknown option 'name'")
  end)
end)

describe("fit resume", function()
  local d = data()
  local function run(opts, cb_list)
    keng.manual_seed(1)
    local m = mlp()
    local opt = optim.AdamW(m:parameters(), {lr = 0.01})
    -- a schedule by epoch and validation data: both must carry over the resume too
    local list = {cbs.LearningRateScheduler(function(epoch) return 0.01 * 0.8 ^ epoch end)}
    for _, cb in ipairs(cb_list or {}) do list[#list + 1] = cb end
    local o = {loss = "cross_entropy", optimizer = opt, batch_size = 8, verbose = 0, callbacks = list,
               validation_data = {x = d.x:narrow(1, 1, 8), y = d.y:narrow(1, 1, 8)}}
    for k, v in pairs(opts) do o[k] = v end
    return train.fit(m, d, o), m
  end

  it("3 epochs + resume gives the same 6 epochs as one run, to the last digit", function()
    local full = run({epochs = 6})
    local path = tmpfile("-{epoch}.safetensors")
    local first = run({epochs = 3}, {cbs.ModelCheckpoint(path, {save_optimizer = true})})
    local ck = path:gsub("{epoch}", "3")
    local rest = run({epochs = 6, resume_from = ck})
    for e = 1, 3 do assert.are.equal(full.history.loss[e], first.history.loss[e]) end
    assert.are.same({4, 5, 6}, rest.epoch)
    for e = 1, 3 do
      assert.are.equal(full.history.loss[e + 3], rest.history.loss[e])
      assert.are.equal(full.history.val_loss[e + 3], rest.history.val_loss[e])
      assert.are.equal(full.history.lr[e + 3], rest.history.lr[e])
    end
    -- every step too (steps of epochs 4..6)
    for i = 1, #rest.steps do assert.are.equal(full.steps[#first.steps + i], rest.steps[i]) end
    -- the file holds the optimizer, the step and the generator
    local sd, meta = keng.load(ck)
    assert.are.equal("3", meta.epoch)
    assert.are.equal("15", meta.global_step)
    assert.are.equal("AdamW", meta["__optimizer__.kind"])
    assert.is_not_nil(meta.rng_offset)
    assert.is_true(keng.is_tensor(sd["__optimizer__.1.weight.v"]))
    for i = 1, 3 do os.remove((path:gsub("{epoch}", tostring(i)))) end
  end)

  it("weights only is not enough: resuming without the optimizer state diverges", function()
    -- proves the spec above can fail: the same resume with a fresh optimizer and generator
    local full = run({epochs = 6})
    local path = tmpfile(".safetensors")
    run({epochs = 3}, {cbs.ModelCheckpoint(path)})
    keng.manual_seed(1)
    local m = mlp()
    m:load_state_dict((keng.load(path)))
    local rest = train.fit(m, d, {loss = "cross_entropy", optimizer = optim.AdamW(m:parameters(), {lr = 0.01}),
      batch_size = 8, verbose = 0, epochs = 6, initial_epoch = 3})
    assert.are.same({4, 5, 6}, rest.epoch)
    assert.are_not.equal(full.history.loss[4], rest.history.loss[1])
    H.raises(function() run({epochs = 6, resume_from = path}) end,
      "holds no optimizer state (save it with ModelCheckpoint(path, {save_optimizer = true}))")
    os.remove(path)
  end)

  it("refuses a resume that contradicts initial_epoch, a model of another shape, and a bad path", function()
    local path = tmpfile(".safetensors")
    run({epochs = 2}, {cbs.ModelCheckpoint(path, {save_optimizer = true})})
    H.raises(function() run({epochs = 6, resume_from = path, initial_epoch = 1}) end,
      "fit: initial_epoch = 1 but " .. path .. " was saved after epoch 2")
    H.raises(function() run({epochs = 1, resume_from = path}) end,
      "fit: 2 epochs are already done (initial_epoch) but epochs = 1")
    keng.manual_seed(1)
    local other = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 2))
    H.raises(function()
      train.fit(other, d, {loss = "cross_entropy", epochs = 4, verbose = 0, resume_from = path})
    end, "fit: load_state_dict: error(s) loading the state dict of Sequential:")
    H.raises(function() run({epochs = 6, resume_from = 3}) end, "fit: resume_from must be a checkpoint path, got number")
    H.raises(function()
      keng.manual_seed(1)
      local m = mlp()
      train.fit(m, d, {loss = "cross_entropy", epochs = 4, verbose = 0, resume_from = path,
        optimizer = optim.SGD(m:parameters(), {lr = 0.1})})
    end, "fit: SGD:load_state_dict: the state is from a AdamW, not a SGD")
    H.raises(function() run({epochs = 6, resume_from = path .. ".nope"}) end, "fit: ")
    os.remove(path)
  end)

  it("a failed save leaves the previous checkpoint whole (temp file + rename)", function()
    local path = tmpfile(".safetensors")
    local m = nn.Linear(2, 2)
    cbs.save_training_state(path, m, optim.AdamW(m:parameters()), {epoch = 1, global_step = 4})
    local bad = nn.Linear(2, 2, {device = "meta"})
    H.raises(function() cbs.save_training_state(path, bad, optim.AdamW(bad:parameters()), {epoch = 2, global_step = 8}) end,
      "is on the meta device and has no values to save")
    local _, meta = keng.load(path)
    assert.are.equal("1", meta.epoch)
    assert.are.equal("4", meta.global_step)
    assert.is_nil(io.open(path .. ".tmp", "rb"))
    os.remove(path)
  end)
end)
