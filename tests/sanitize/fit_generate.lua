-- fit_generate.lua — the leak check's workload (tests/sanitize/leaks.sh): a tiny fit with a
-- checkpoint, then greedy generation with the gemma fixture; afterwards every tensor must be
-- back with the pool once Lua has collected the garbage. Prints "leaks: ok" or raises.
local keng = require "keng"
local nn = require "keng.nn"
local optim = require "keng.optim"
local train = require "keng.train"
local cbs = require "keng.callbacks"
local root = arg[0]:match("^(.*)/tests/sanitize/fit_generate.lua$") or "."

local function allocated() collectgarbage() collectgarbage() return keng.memory_stats().allocated end
local base = allocated()

do
  local x = keng.randn({32, 4})
  local y = x:sum(2):gt(0):long()
  local m = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
  local ck = os.tmpname()
  local h = train.fit(m, {x = x, y = y}, {loss = "cross_entropy", optimizer = optim.AdamW(m:parameters(), {lr = 1e-2}),
    epochs = 2, batch_size = 8, verbose = 0, callbacks = {cbs.ModelCheckpoint(ck, {monitor = "loss"})}})
  assert(#h.history.loss == 2)
  local sd = keng.load(ck)
  m:load_state_dict(sd)
  os.remove(ck)
  local gemma = require "models.gemma"
  local lm = gemma.from_pretrained(root .. "/tests/fixtures/gemma")
  local out = lm:generate({{2, 5, 7, 11}}, {max_length = 12})
  assert(#out[1] > 0)
  print("fit losses " .. h.history.loss[1] .. " " .. h.history.loss[2] .. "; generated " .. #out[1] .. " ids")
end

local left = allocated() - base
if left ~= 0 then error(string.format("leaks: %d bytes of tensors still allocated after collection", left)) end
keng.empty_cache()
print("leaks: ok")
