-- conv_bench.lua — conv2d micro-bench at the sd_tiny shapes (VAE at 128x128 batch 8, UNet at
-- 16x16 batch 26): forward under no_grad, and forward + sum + backward (dx, dw, db); median
-- process CPU time (os.clock), so run it with KENG_NUM_THREADS=1. Peer: conv_bench.py.
--   KENG_NUM_THREADS=1 keng tests/lab/conv_bench.lua [runs] [name filter, e.g. unet]
-- KENG_CONV_WINOGRAD=0 / KENG_CONV_DIRECT=0 time the paths those kernels replaced.
local keng = require "keng"
local runs = tonumber(arg[1]) or 5
local time = require("keng.bench").timer(runs, os.clock)     -- process CPU time
local cases = {
  -- name, B, Cin, H, Cout, k, stride, pad
  {"vae_in 3->32 k3 @128", 8, 3, 128, 32, 3, 1, 1},
  {"vae 32->32 k3 @128", 8, 32, 128, 32, 3, 1, 1},
  {"vae down 32 k3 s2 @129", 8, 32, 129, 32, 3, 2, 0},
  {"vae 64->64 k3 @64", 8, 64, 64, 64, 3, 1, 1},
  {"vae 1x1 32->64 @64", 8, 32, 64, 64, 1, 1, 0},
  {"vae 128 k3 @32", 8, 128, 32, 128, 3, 1, 1},
  {"vae 128 k3 @16", 8, 128, 16, 128, 3, 1, 1},
  {"unet 32 k3 @16 B26", 26, 32, 16, 32, 3, 1, 1},
  {"unet 64 k3 @8 B26", 26, 64, 8, 64, 3, 1, 1},
  {"unet 128 k3 @4 B26", 26, 128, 4, 128, 3, 1, 1},
  {"unet 1x1 64 @8 B26", 26, 64, 8, 64, 1, 1, 0},
  {"unet 32 k3 @16 B13", 13, 32, 16, 32, 3, 1, 1},
  {"unet 96->32 k3 @16 B13", 13, 96, 16, 32, 3, 1, 1},
  {"unet 64 k3 @8 B13", 13, 64, 8, 64, 3, 1, 1},
  {"unet 192->64 k3 @8 B13", 13, 192, 8, 64, 3, 1, 1},
  {"unet 128 k3 @4 B13", 13, 128, 4, 128, 3, 1, 1},
  {"unet 256->128 k3 @4 B13", 13, 256, 4, 128, 3, 1, 1},
  {"unet 128 k3 @2 B13", 13, 128, 2, 128, 3, 1, 1},
  {"unet 256->128 k3 @2 B13", 13, 256, 2, 128, 3, 1, 1},
  {"vae 128 k3 @16 B13", 13, 128, 16, 128, 3, 1, 1},
}
print(string.format("keng %d threads", keng.num_threads()))
local only = arg[2]
for _, c in ipairs(cases) do
  local name, B, Ci, Hh, Co, k, s, p = table.unpack(c)
  if only and not name:find(only, 1, true) then goto next end
  keng.manual_seed(0)
  local x, w, b = keng.randn({B, Ci, Hh, Hh}), keng.randn({Co, Ci, k, k}) * 0.1, keng.randn({Co})
  local o = {stride = s, padding = p}
  local tf = keng.no_grad(function() return time(function() return keng.conv2d(x, w, b, o) end) end)
  x.requires_grad, w.requires_grad, b.requires_grad = true, true, true
  local tb = time(function()
    local y = keng.conv2d(x, w, b, o)
    y:sum():backward()
    x.grad, w.grad, b.grad = nil, nil, nil
  end)
  print(string.format("%-26s fwd %8.2f ms  fwd+bwd %8.2f ms", name, tf * 1e3, tb * 1e3))
  ::next::
end
