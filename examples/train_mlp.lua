-- train_mlp.lua — trains a small MLP from scratch with fit() on a synthetic task:
-- two interleaved spirals, class 0 or 1 (not linearly separable).
--   keng examples/train_mlp.lua [epochs]
local nn, optim = require "keng.nn", require "keng.optim"
local callbacks = require "keng.callbacks"

keng.manual_seed(0)
local N = 1024
local t = keng.rand({N}) * 2 * math.pi + 0.5                  -- angle along the spiral
local label = keng.randint(0, 2, {N})                           -- 0-based class ids
local sign = label:float() * 2 - 1                              -- the second spiral is mirrored
local x = keng.stack({t:cos() * t * sign, t:sin() * t * sign}, 2) / 4 + keng.randn({N, 2}) * 0.02
local split = N * 7 // 8
local train_set = {x = x:narrow(1, 1, split), y = label:narrow(1, 1, split)}
local val_set = {x = x:narrow(1, split + 1, N - split), y = label:narrow(1, split + 1, N - split)}

local model = nn.Sequential(nn.Linear(2, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 2))
model:summary()

local history = model:fit(train_set, {
  loss = "cross_entropy", metrics = {"accuracy"},
  optimizer = optim.AdamW(model:parameters(), {lr = 1e-2}),
  epochs = tonumber(arg and arg[1]) or 60, batch_size = 64,
  validation_data = val_set,
  callbacks = {callbacks.EarlyStopping{monitor = "val_loss", patience = 8, restore_best = true}},
})
local loss, logs = model:evaluate(val_set)
print(string.format("validation: loss %.4f, accuracy %.3f after %d epochs", loss, logs.accuracy, #history.epoch))
