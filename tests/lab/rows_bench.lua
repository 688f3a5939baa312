-- rows_bench.lua — the row-wise kernels of issue 7 (softmax, log_softmax, layer/rms/group norm,
-- argmax, max, dropout) forward and forward + backward; median process CPU time (os.clock), so
-- run it with KENG_NUM_THREADS=1. Peer: rows_bench.py.
--   KENG_NUM_THREADS=1 keng tests/lab/rows_bench.lua [runs]
local keng = require "keng"
local runs = tonumber(arg[1]) or 9
local time = require("keng.bench").timer(runs, os.clock)     -- process CPU time
print(string.format("keng %d threads (CPU ms, median of %d)", keng.num_threads(), runs))
keng.manual_seed(0)
local function fb(name, x, f, no_bwd)
  local tf = keng.no_grad(function() return time(function() return f(x) end) end)
  local tb = 0 / 0
  if not no_bwd then
    local t = x:detach(); t.requires_grad = true
    local g = keng.randn(f(t).shape)
    tb = time(function() local y = f(t); y:backward(g); t.grad = nil end)
  end
  print(string.format("%-36s fwd %8.3f  fwd+bwd %8.3f", name, tf * 1e3, tb * 1e3))
end
local s = keng.randn({64, 128, 128})
fb("softmax [64,128,128] -1", s, function(t) return t:softmax(-1) end)
fb("log_softmax [64,128,128] -1", s, function(t) return t:log_softmax(-1) end)
fb("softmax [64,128,128] dim 1", s, function(t) return t:softmax(1) end)
local v = keng.randn({32, 32000})
fb("softmax [32,32000] -1", v, function(t) return t:softmax(-1) end)
fb("softmax bf16 [64,128,128] -1", s:to("bf16"), function(t) return t:softmax(-1) end, true)
local l = keng.randn({4096, 768})
local w, b = keng.randn({768}), keng.randn({768})
fb("layer_norm [4096,768] w,b", l, function(t) return keng.layer_norm(t, w, b) end)
fb("rms_norm [4096,768] w", l, function(t) return keng.rms_norm(t, w) end)
local l2 = keng.randn({4096, 128})
fb("layer_norm [4096,128]", l2, function(t) return keng.layer_norm(t) end)
local x = keng.randn({8, 32, 128, 128})
fb("group_norm G8 [8,32,128,128]", x, function(t) return keng.group_norm(t, 8) end)
fb("group_norm G32 [8,128,32,32]", keng.randn({8, 128, 32, 32}), function(t) return keng.group_norm(t, 32) end)
fb("argmax f32 [32,32000] -1", v, function(t) return t:argmax(-1) end, true)
fb("argmax bf16 [32,32000] -1", v:to("bf16"), function(t) return t:argmax(-1) end, true)
fb("max f32 [4096,768] -1", l, function(t) return t:max(-1) end, true)
local d = keng.randn({32, 128, 768})
fb("dropout p0.1 [32,128,768]", d, function(t) return keng.dropout(t, 0.1, true) end, true)
