"""rows_bench.py — the PyTorch peer of rows_bench.lua (same ops and shapes, CPU time).
    python3 tests/lab/rows_bench.py [runs] [threads]"""
import os, sys, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import setup
runs, tm = setup(9)
F = torch.nn.functional
print("torch %d threads (CPU ms, median of %d)" % (torch.get_num_threads(), runs))
torch.manual_seed(0)
def fb(name, x, f, no_bwd=False):
    with torch.no_grad(): tf = tm(lambda: f(x))
    tb = float("nan")
    if not no_bwd:
        t = x.detach().clone().requires_grad_()
        g = torch.randn_like(f(t))
        def step():
            y = f(t); y.backward(g); t.grad = None
        tb = tm(step)
    print("%-36s fwd %8.3f  fwd+bwd %8.3f" % (name, tf * 1e3, tb * 1e3))
s = torch.randn(64, 128, 128)
fb("softmax [64,128,128] -1", s, lambda t: t.softmax(-1))
fb("log_softmax [64,128,128] -1", s, lambda t: t.log_softmax(-1))
fb("softmax [64,128,128] dim 1", s, lambda t: t.softmax(1))
v = torch.randn(32, 32000)
fb("softmax [32,32000] -1", v, lambda t: t.softmax(-1))
fb("softmax bf16 [64,128,128] -1", s.bfloat16(), lambda t: t.softmax(-1), True)
l = torch.randn(4096, 768); w = torch.randn(768); b = torch.randn(768)
fb("layer_norm [4096,768] w,b", l, lambda t: F.layer_norm(t, (768,), w, b))
fb("rms_norm [4096,768] w", l, lambda t: F.rms_norm(t, (768,), w))
fb("layer_norm [4096,128]", torch.randn(4096, 128), lambda t: F.layer_norm(t, (128,)))
x = torch.randn(8, 32, 128, 128)
fb("group_norm G8 [8,32,128,128]", x, lambda t: F.group_norm(t, 8))
fb("group_norm G32 [8,128,32,32]", torch.randn(8, 128, 32, 32), lambda t: F.group_norm(t, 32))
fb("argmax f32 [32,32000] -1", v, lambda t: t.argmax(-1), True)
fb("argmax bf16 [32,32000] -1", v.bfloat16(), lambda t: t.argmax(-1), True)
fb("max f32 [4096,768] -1", l, lambda t: t.max(-1), True)
fb("dropout p0.1 [32,128,768]", torch.randn(32, 128, 768), lambda t: F.dropout(t, 0.1, True), True)
