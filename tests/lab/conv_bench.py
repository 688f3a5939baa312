"""conv_bench.py — the PyTorch peer of conv_bench.lua (same shapes, CPU time).
    python3 tests/lab/conv_bench.py [runs] [threads] [name filter, e.g. unet]"""
import os, sys, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import setup
runs, tm = setup(5)
cases = [
  ("vae_in 3->32 k3 @128", 8, 3, 128, 32, 3, 1, 1),
  ("vae 32->32 k3 @128", 8, 32, 128, 32, 3, 1, 1),
  ("vae down 32 k3 s2 @129", 8, 32, 129, 32, 3, 2, 0),
  ("vae 64->64 k3 @64", 8, 64, 64, 64, 3, 1, 1),
  ("vae 1x1 32->64 @64", 8, 32, 64, 64, 1, 1, 0),
  ("vae 128 k3 @32", 8, 128, 32, 128, 3, 1, 1),
  ("vae 128 k3 @16", 8, 128, 16, 128, 3, 1, 1),
  ("unet 32 k3 @16 B26", 26, 32, 16, 32, 3, 1, 1),
  ("unet 64 k3 @8 B26", 26, 64, 8, 64, 3, 1, 1),
  ("unet 128 k3 @4 B26", 26, 128, 4, 128, 3, 1, 1),
  ("unet 1x1 64 @8 B26", 26, 64, 8, 64, 1, 1, 0),
  ("unet 32 k3 @16 B13", 13, 32, 16, 32, 3, 1, 1),
  ("unet 96->32 k3 @16 B13", 13, 96, 16, 32, 3, 1, 1),
  ("unet 64 k3 @8 B13", 13, 64, 8, 64, 3, 1, 1),
  ("unet 192->64 k3 @8 B13", 13, 192, 8, 64, 3, 1, 1),
  ("unet 128 k3 @4 B13", 13, 128, 4, 128, 3, 1, 1),
  ("unet 256->128 k3 @4 B13", 13, 256, 4, 128, 3, 1, 1),
  ("unet 128 k3 @2 B13", 13, 128, 2, 128, 3, 1, 1),
  ("unet 256->128 k3 @2 B13", 13, 256, 2, 128, 3, 1, 1),
  ("vae 128 k3 @16 B13", 13, 128, 16, 128, 3, 1, 1),
]
print("torch %d threads" % torch.get_num_threads())
only = sys.argv[3] if len(sys.argv) > 3 else None
for name, B, Ci, H, Co, k, s, p in cases:
    if only and only not in name: continue
    torch.manual_seed(0)
    x, w, b = torch.randn(B, Ci, H, H), torch.randn(Co, Ci, k, k) * 0.1, torch.randn(Co)
    with torch.no_grad():
        tf = tm(lambda: torch.nn.functional.conv2d(x, w, b, s, p))
    x.requires_grad_(); w.requires_grad_(); b.requires_grad_()
    def fb():
        y = torch.nn.functional.conv2d(x, w, b, s, p); y.sum().backward(); x.grad = w.grad = b.grad = None
    tb = tm(fb)
    print("%-26s fwd %8.2f ms  fwd+bwd %8.2f ms" % (name, tf * 1e3, tb * 1e3))
