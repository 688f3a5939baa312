-- Run by tests/lua/distributed_spec.lua under `mpirun -np 2`: fit{distributed = true} of a small
-- MLP (global batch 8: 4 rows per rank; 21 samples, so the last batch of 5 splits 3/2) must give
-- rank 0 the weights of a plain one-process fit on the full batches. Prints the max difference.
local keng = require "keng"
local nn = require "keng.nn"
local train = require "keng.train"
local dist = require "keng.distributed"

dist.init()
local R = dist.rank()

local function data()
  keng.manual_seed(11)
  local x = keng.randn({21, 6})
  local y = (x:narrow(2, 1, 3) * 2 - x:narrow(2, 4, 3)):tanh()
  return {x = x, y = y}
end

local function model()
  keng.manual_seed(1 + R)       -- a different init on each rank: data_parallel broadcasts rank 0's
  return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
end

local function run(distributed)
  local d = data()
  local m = model()
  keng.manual_seed(5)           -- the shuffles: rank 0's reach every rank
  local h = train.fit(m, d, {loss = "mse", optimizer = "sgd", lr = 0.1, epochs = 3, batch_size = 8,
    metrics = {"mae"}, verbose = 0, distributed = distributed or nil})
  return m, h
end

local m2, h2 = run(true)
-- every rank holds the same weights
for i, p in ipairs(m2:parameters()) do
  local g = dist.all_gather(p)
  local d = (g:select(1, 1) - g:select(1, 2)):abs():max():item()
  assert(d == 0, "parameter " .. i .. " differs across ranks by " .. d)
end
if R == 0 then
  local m1, h1 = run(false)
  local maxd = 0
  for i, p in ipairs(m1:parameters()) do
    maxd = math.max(maxd, (p - m2:parameters()[i]):abs():max():item())
  end
  local dl = 0
  for i, l in ipairs(h1.steps) do dl = math.max(dl, math.abs(l - h2.steps[i])) end
  local dm = math.abs(h1.history.mae[3] - h2.history.mae[3])
  print(string.format("steps %d/%d max weight diff %.3g max step-loss diff %.3g mae diff %.3g",
    #h1.steps, #h2.steps, maxd, dl, dm))
  assert(#h1.steps == #h2.steps, "step counts differ")
  assert(maxd < 1e-5, "weights differ by " .. maxd)
  assert(dl < 1e-5 and dm < 1e-5, "losses differ")
end
-- a list of batches with a 1-row batch (rank 1 gets no rows: it adds zeros), accuracy as a
-- metric, and a ModelCheckpoint that only rank 0 runs
local callbacks = require "keng.callbacks"
local function run_list(distributed)
  local d = data()
  local y = d.y:argmax(2)
  local batches = {{d.x:narrow(1, 1, 8), y:narrow(1, 1, 8)}, {d.x:narrow(1, 9, 1), y:narrow(1, 9, 1)},
                   {d.x:narrow(1, 10, 5), y:narrow(1, 10, 5)}}
  local m = model()
  local ck = callbacks.ModelCheckpoint(os.tmpname())
  local h = train.fit(m, batches, {loss = "cross_entropy", optimizer = "adam", lr = 0.01, epochs = 2,
    metrics = {"accuracy"}, verbose = 0, callbacks = {ck}, distributed = distributed or nil})
  for _, f in ipairs(ck.saved) do os.remove(f) end
  return m, h, #ck.saved
end
local m4, h4, saved = run_list(true)
assert(saved == (R == 0 and 2 or 0), "rank " .. R .. " saved " .. saved .. " checkpoints")
if R == 0 then
  local m3, h3 = run_list(false)
  local maxd = 0
  for i, p in ipairs(m3:parameters()) do maxd = math.max(maxd, (p - m4:parameters()[i]):abs():max():item()) end
  local dl = 0
  for i, l in ipairs(h3.steps) do dl = math.max(dl, math.abs(l - h4.steps[i])) end
  print(string.format("list batches: max weight diff %.3g max step-loss diff %.3g accuracy %.4f vs %.4f",
    maxd, dl, h3.history.accuracy[2], h4.history.accuracy[2]))
  assert(maxd < 1e-5 and dl < 1e-5, "list-batch fit differs")
  assert(math.abs(h3.history.accuracy[2] - h4.history.accuracy[2]) < 1e-12, "accuracy differs")
end

-- LoRA adapters (only they train, so only they are reduced), in f32 and under mixed_bfloat16
-- (bf16 forward/backward per shard: sums over 4 rows round differently than over 8)
local lora, precision = require "keng.lora", require "keng.precision"
local function run_lora(policy, distributed)
  local old = precision.set_policy(policy)
  local d = data()
  local m = model()
  keng.manual_seed(9)
  lora.enable(m, {rank = 2, targets = {"1", "3"}})
  keng.manual_seed(5)
  local h = train.fit(m, d, {loss = "mse", optimizer = "adamw", lr = 0.01, epochs = 2, batch_size = 8,
    verbose = 0, distributed = distributed or nil})
  precision.set_policy(old)
  return m, h
end
for _, case in ipairs({{"float32", 1e-6, 1e-6}, {"mixed_bfloat16", 1e-3, 2e-2}}) do
  local policy, wtol, ltol = case[1], case[2], case[3]
  local m6, h6 = run_lora(policy, true)
  if R == 0 then
    local m5, h5 = run_lora(policy, false)
    local maxd, n = 0, 0
    for i, p in ipairs(m5:parameters()) do
      if p.requires_grad then n = n + 1 end
      maxd = math.max(maxd, (p - m6:parameters()[i]):float():abs():max():item())
    end
    local dl = 0
    for i, l in ipairs(h5.steps) do dl = math.max(dl, math.abs(l - h6.steps[i])) end
    print(string.format("lora %s: %d trainable, max weight diff %.3g max step-loss diff %.3g", policy, n, maxd, dl))
    assert(n == 4 and maxd < wtol and dl < ltol, "lora fit differs under " .. policy)
  end
end

-- one progress line per job (rank 0's): the spec counts "Epoch 1/1 -" in the job's output
do
  local d = data()
  train.fit(model(), d, {loss = "mse", epochs = 1, batch_size = 8, verbose = 2, distributed = true})
end

dist.barrier()
print("rank " .. R .. " ok")
