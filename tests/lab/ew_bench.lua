-- ew_bench.lua — silu, sigmoid, exp, group_norm, softmax, log_softmax, layer_norm forward and
-- forward + backward; median process CPU time (os.clock), so run it with KENG_NUM_THREADS=1.
-- Peer: ew_bench.py.   KENG_NUM_THREADS=1 keng tests/lab/ew_bench.lua [runs]
local keng = require "keng"
local runs = tonumber(arg[1]) or 7
local time = require("keng.bench").timer(runs, os.clock)     -- process CPU time
print(string.format("keng %d threads (CPU ms, median of %d)", keng.num_threads(), runs))
keng.manual_seed(0)
local x = keng.randn({8, 32, 128, 128})
local function fb(name, mk, f)
  local tf = keng.no_grad(function() return time(function() return f(mk()) end) end)
  local t = mk():detach(); t.requires_grad = true
  local y0 = f(t); local g = keng.randn(y0.shape)
  local tb = time(function() local y = f(t); y:backward(g); t.grad = nil end)
  print(string.format("%-34s fwd %8.2f  fwd+bwd %8.2f", name, tf * 1e3, tb * 1e3))
end
fb("silu [8,32,128,128]", function() return x end, function(t) return t:silu() end)
fb("sigmoid [8,32,128,128]", function() return x end, function(t) return t:sigmoid() end)
fb("exp [8,32,128,128]", function() return x end, function(t) return t:exp() end)
fb("gelu (erf) [8,32,128,128]", function() return x end, function(t) return t:gelu() end)
fb("group_norm G8 [8,32,128,128]", function() return x end, function(t) return keng.group_norm(t, 8) end)
local x2 = keng.randn({8, 128, 32, 32})
fb("group_norm G8 [8,128,32,32]", function() return x2 end, function(t) return keng.group_norm(t, 8) end)
local s = keng.randn({64, 128, 128})
fb("softmax [64,128,128] dim -1", function() return s end, function(t) return t:softmax(-1) end)
fb("log_softmax [64,128,128] dim -1", function() return s end, function(t) return t:log_softmax(-1) end)
fb("softmax [64,128,128] dim 2", function() return s end, function(t) return t:softmax(2) end)
local l = keng.randn({32 * 128, 128})
fb("layer_norm [4096,128]", function() return l end, function(t) return keng.layer_norm(t) end)
