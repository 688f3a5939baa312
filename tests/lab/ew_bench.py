"""ew_bench.py — the PyTorch peer of ew_bench.lua (same ops and shapes, CPU time).
    python3 tests/lab/ew_bench.py [runs] [threads]"""
import os, sys, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import setup
runs, tm = setup(7)
F = torch.nn.functional
print("torch %d threads (CPU ms, median of %d)" % (torch.get_num_threads(), runs))
torch.manual_seed(0)
x = torch.randn(8, 32, 128, 128)
def fb(name, t0, f):
    with torch.no_grad(): tf = tm(lambda: f(t0))
    t = t0.detach().clone().requires_grad_()
    g = torch.randn_like(f(t))
    def step():
        y = f(t); y.backward(g); t.grad = None
    tb = tm(step)
    print("%-34s fwd %8.2f  fwd+bwd %8.2f" % (name, tf * 1e3, tb * 1e3))
fb("silu [8,32,128,128]", x, F.silu)
fb("sigmoid [8,32,128,128]", x, torch.sigmoid)
fb("exp [8,32,128,128]", x, torch.exp)
fb("gelu (erf) [8,32,128,128]", x, F.gelu)
fb("group_norm G8 [8,32,128,128]", x, lambda t: F.group_norm(t, 8))
fb("group_norm G8 [8,128,32,32]", torch.randn(8, 128, 32, 32), lambda t: F.group_norm(t, 8))
s = torch.randn(64, 128, 128)
fb("softmax [64,128,128] dim -1", s, lambda t: t.softmax(-1))
fb("log_softmax [64,128,128] dim -1", s, lambda t: t.log_softmax(-1))
fb("softmax [64,128,128] dim 2", s, lambda t: t.softmax(1))
fb("layer_norm [4096,128]", torch.randn(4096, 128), lambda t: F.layer_norm(t, (128,)))
