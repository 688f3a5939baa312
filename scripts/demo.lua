-- demo.lua — a first keng script: fits a two-layer MLP to a noisy sine with autograd and
-- plain SGD, then times an f32 matmul. Run: keng scripts/demo.lua [steps]
-- (The benchmark suite scripts/bench/all.lua replaces this as `make bench` once it lands.)
local keng = require "keng"
local steps = tonumber(arg and arg[1]) or 300
keng.manual_seed(0)

-- data: y = sin(3x) + noise, x in [-1, 1)          x, y: [N, 1]
local N, Hd = 256, 64
local x = keng.rand({N, 1}) * 2 - 1
local y = (x * 3):sin() + keng.randn({N, 1}) * 0.05

-- parameters: w [out, in] as keng.linear expects
local function param(shape, scale)
  local t = (keng.randn(shape) * scale):detach()
  t.requires_grad = true
  return t
end
local w1, b1 = param({Hd, 1}, 1.0), param({Hd}, 0.1)
local w2, b2 = param({1, Hd}, 1 / math.sqrt(Hd)), param({1}, 0.1)
local params = {w1, b1, w2, b2}

local function forward(inp)
  local h = keng.linear(inp, w1, b1):tanh()  -- [N, Hd]
  return keng.linear(h, w2, b2)              -- [N, 1]
end

local lr, t0 = 0.1, keng.time()
for step = 1, steps do
  local loss = ((forward(x) - y) ^ 2):mean()
  for _, p in ipairs(params) do p.grad = nil end
  loss:backward()
  keng.no_grad(function()
    for _, p in ipairs(params) do p:sub_(p.grad * lr) end
  end)
  if step == 1 or step % 50 == 0 then print(string.format("step %4d  mse %.5f", step, loss:item())) end
end
print(string.format("%d steps in %.2f s", steps, keng.time() - t0))

-- f32 matmul throughput
local n = 1024
local a, b = keng.randn({n, n}), keng.randn({n, n})
a:matmul(b) -- warm-up
local reps, start = 5, keng.time()
for _ = 1, reps do local _ = a:matmul(b) end
local secs = keng.time() - start
print(string.format("matmul %dx%dx%d f32: %.1f GFLOP/s (%d threads)", n, n, n, 2 * n ^ 3 * reps / secs / 1e9,
  keng.num_threads()))
