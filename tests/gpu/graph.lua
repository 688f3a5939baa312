-- graph.lua — checks keng.cuda.graph on a GPU (tests/gpu/run.sh runs it), after a pinned-staging
-- round trip: replays match eager
-- runs of the same steps (a forward, a training step with manual SGD, keng.optim's AdamW / Adam /
-- SGD with schedules — bit for bit, their lr and step count read from device memory — dropout
-- drawing fresh masks each replay), new inputs are copied into the captured ones, and reading a
-- value inside the captured function fails with a clear error. Exits 1 on a mismatch; skips
-- without a GPU.
--
--   keng tests/gpu/graph.lua
local keng = require "keng"

-- KENG_COMPARE_DEVICE=cpu: self-test of this script on the CPU (graphs replaced by eager calls;
-- the checks that need a real capture are skipped)
local SELF = os.getenv("KENG_COMPARE_DEVICE") == "cpu"
local DEV = SELF and "cpu" or "cuda"
local graph = keng.cuda.graph
if SELF then
  graph = function(fn)
    return setmetatable({captured = function() return true end}, {__call = function(_, ...) return fn(...) end})
  end
elseif not keng.cuda.is_available() then
  print("graph.lua: skipped — keng.cuda.is_available() is false")
  return
end

local failed = 0
local function check(name, fn)
  local ok, err = pcall(fn)
  print(string.format("%-44s %s", name, ok and "ok" or ("FAIL " .. tostring(err))))
  if not ok then failed = failed + 1 end
end

local function worst(a, b)
  local d = (a:cpu():double() - b:cpu():double()):abs():max():item()
  return d
end

check("pinned staging: round trips over several chunks", function()
  for _, n in ipairs({1, 1000, 1048577, 10 * 1048576 + 3}) do -- up to 40 MiB: beyond the 4 x 4 MiB ring
    local x = keng.randn({n})
    local g = x:to(DEV)
    local y = (g * 2):cpu()
    assert(worst(y, x * 2) == 0, "n = " .. n)
  end
  local xs = {}
  for i = 1, 8 do xs[i] = keng.full({300000}, i):to(DEV) end -- queued uploads, no waits between
  for i = 1, 8 do assert(xs[i]:sum():item() == 300000 * i, "upload " .. i) end
end)

check("forward: replays follow new inputs", function()
  local w = keng.randn({64, 32}, {device = DEV})
  local x = keng.randn({8, 64}, {device = DEV})
  local g = graph(function(x) return (x:matmul(w)):tanh():sum(2) end, {warmup = 1})
  for step = 1, 5 do
    local xn = keng.randn({8, 64}, {device = DEV})
    if step == 1 then xn = x end
    local got = g(xn)
    local want = (xn:matmul(w)):tanh():sum(2)
    assert(worst(got, want) < 1e-5, "step " .. step .. " differs by " .. worst(got, want))
    if step >= 2 then assert(g:captured(), "not captured after warm-up") end
  end
end)

check("training step (manual SGD) matches eager", function()
  keng.manual_seed(7)
  local w0 = keng.randn({16, 4}, {dtype = "f32"}) * 0.1
  local xs, ys = {}, {}
  for i = 1, 6 do xs[i], ys[i] = keng.randn({32, 16}), keng.randn({32, 4}) end
  local function make()
    local w = w0:clone():to(DEV):detach()
    w.requires_grad = true
    local function step(x, y)
      w.grad = nil
      local loss = ((x:matmul(w) - y) ^ 2):mean()
      loss:backward()
      keng.no_grad(function() w:sub_(w.grad * 0.1) end)
      return loss
    end
    return w, step
  end
  local we, eager = make()
  local wg, stepg = make()
  local g = graph(stepg, {warmup = 2})
  local xc, yc = xs[1]:to(DEV), ys[1]:to(DEV)
  for i = 1, 6 do
    local le = eager(xs[i]:to(DEV), ys[i]:to(DEV))
    xc:copy_(xs[i]); yc:copy_(ys[i])
    local lg = g(xc, yc)
    assert(worst(le, lg) < 1e-5, "loss of step " .. i .. " differs")
    assert(worst(we, wg) < 1e-5, "weights after step " .. i .. " differ by " .. worst(we, wg))
  end
end)

-- optimizers under replay: lr (from a schedule) and the step count live in device memory that
-- keng.optim writes before each launch, so a replayed step must equal an eager one bit for bit
-- (both run the same kernels on the same device scalars)
local optim = require "keng.optim"
local function optimizer_replay(name, make)
  check(name .. ": replay == eager (bitwise)", function()
    keng.manual_seed(11)
    local w1, w2 = keng.randn({16, 32}) * 0.2, keng.randn({4, 16}) * 0.2
    local b1 = keng.randn({16}) * 0.1
    local xs, ys = {}, {}
    for i = 1, 7 do xs[i], ys[i] = keng.randn({24, 32}), keng.randint(0, 4, {24}) end
    local function model()
      local ps = {w1:clone():to(DEV):detach(), b1:clone():to(DEV):detach(), w2:clone():to(DEV):detach()}
      for _, p in ipairs(ps) do p.requires_grad = true end
      local opt = make(ps)
      local function step(x, y)
        opt:zero_grad()
        local h = keng.linear(x, ps[1], ps[2]):gelu()
        local loss = keng.cross_entropy(keng.linear(h, ps[3]), y)
        loss:backward()
        opt:step()
        return loss
      end
      return ps, opt, step
    end
    local pe, oe, eager = model()
    local pg, og, stepg = model()
    local g = graph(stepg, {warmup = 2})
    local xc, yc = xs[1]:to(DEV), ys[1]:to(DEV)
    local worst_w = 0
    for i = 1, 7 do
      local le = eager(xs[i]:to(DEV), ys[i]:to(DEV))
      xc:copy_(xs[i]); yc:copy_(ys[i])
      local lg = g(xc, yc)
      assert(worst(le, lg) == 0, string.format("loss of step %d differs by %g", i, worst(le, lg)))
      for j = 1, 3 do worst_w = math.max(worst_w, worst(pe[j], pg[j])) end
      assert(worst_w == 0, string.format("weights after step %d differ by %g", i, worst_w))
    end
    assert(oe.iterations == og.iterations and oe.lr == og.lr, "host state differs")
    assert(SELF or g:captured(), "not captured")
  end)
end
optimizer_replay("AdamW + cosine schedule", function(ps)
  return optim.AdamW(ps, {lr = 3e-3, schedule = optim.schedules.cosine(3e-3, 7, {warmup = 2})})
end)
optimizer_replay("Adam (L2 weight decay)", function(ps) return optim.Adam(ps, {lr = 1e-2, weight_decay = 0.01}) end)
optimizer_replay("SGD momentum + linear warmup", function(ps)
  return optim.SGD(ps, {lr = 0.1, momentum = 0.9, schedule = optim.schedules.linear_warmup(0.1, 5)})
end)

check("dropout: fresh masks per replay, as eager", function()
  local x = keng.ones({4096}, {device = DEV})
  keng.manual_seed(123)
  local eager = {}
  for i = 1, 4 do eager[i] = keng.dropout(x, 0.5, true):cpu() end
  keng.manual_seed(123)
  local g = graph(function(x) return keng.dropout(x, 0.5, true) end, {warmup = 1})
  local prev
  for i = 1, 4 do
    local y = g(x):cpu()
    assert(worst(y, eager[i]) == 0, "call " .. i .. " differs from the eager draw")
    if prev then assert(worst(y, prev) > 0, "call " .. i .. " repeats the previous mask") end
    prev = y
  end
end)

check("embedding + cross_entropy step; bad ids raise after replay", function()
  if SELF then return end
  keng.manual_seed(3)
  local V, D = 50, 8
  local tab = (keng.randn({V, D}) * 0.1):to(DEV):detach()
  tab.requires_grad = true
  local ids = keng.randint(0, V, {4, 6}):to(DEV)
  local tg = keng.randint(0, V, {24}):to(DEV)
  local g = graph(function(ids, tg)
    tab.grad = nil
    local h = keng.embedding(ids, tab):reshape{24, D}
    local loss = keng.cross_entropy(h:matmul(tab:transpose(1, 2)), tg)
    loss:backward()
    keng.no_grad(function() tab:sub_(tab.grad * 0.5) end)
    return loss
  end, {warmup = 1})
  local l1 = g(ids, tg):item()
  local l2 = g(ids, tg):item()
  local l3 = g(ids, tg):item()
  assert(l3 < l1, string.format("loss did not fall: %g %g %g", l1, l2, l3))
  ids:fill_(V + 3) -- out of range: skipped in the replay, raised at the next sync
  g(ids, tg)
  local ok, err = pcall(keng.synchronize)
  assert(not ok and tostring(err):find("out of range in a replayed", 1, true), tostring(err))
  ids:fill_(1)
  g(ids, tg):item() -- clean again
end)

check("reading a value while captured fails clearly", function()
  if SELF then return end
  local x = keng.randn({4}, {device = DEV})
  local g = graph(function(x) return x:sum():item() end, {warmup = 0})
  local ok, err = pcall(g, x)
  assert(not ok and tostring(err):find("capture failed", 1, true), "expected a capture error, got " .. tostring(err))
  assert(tostring(err):find("captured", 1, true), tostring(err))
  -- the stream works again afterwards
  assert(math.abs(x:sum():item() - x:cpu():sum():item()) < 1e-5)
end)

check("shape change is refused", function()
  if SELF then return end
  local g = graph(function(x) return x * 2 end, {warmup = 0})
  g(keng.randn({3}, {device = DEV}))
  local ok, err = pcall(g, keng.randn({4}, {device = DEV}))
  assert(not ok and tostring(err):find("shapes must stay", 1, true), tostring(err))
end)

check("allow_tf32 matmul stays close", function()
  local a, b = keng.randn({256, 256}, {device = DEV}), keng.randn({256, 256}, {device = DEV})
  local exact = a:matmul(b)
  keng.backends.allow_tf32 = true
  local fast = a:matmul(b)
  keng.backends.allow_tf32 = false
  local rel = worst(exact, fast) / exact:abs():max():item()
  assert(rel < 5e-3, "tf32 error " .. rel)
end)

print(string.format("graph.lua: %d failed", failed))
if failed > 0 then os.exit(1) end
