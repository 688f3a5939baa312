"""gemm_bf16_bench.py — the PyTorch peer of gemm_bf16_bench.lua (not a test; needs torch):
torch.matmul / F.linear on bf16 tensors, the same rows and output format.
Usage: python3 tests/lab/gemm_bf16_bench.py [threads=1] [runs=5] [row filter]
"""
import sys, time, statistics, torch, torch.nn.functional as F
th = int(sys.argv[1]) if len(sys.argv) > 1 else 1
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
which = sys.argv[3] if len(sys.argv) > 3 else None
torch.set_num_threads(th); torch.manual_seed(0)
def tm(fn):
    fn(); ts = []
    for _ in range(runs):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)
rows = [("mm 2048^3", (2048, 2048), (2048, 2048), "mm"), ("mm [1024,256]x[256,768]", (1024, 256), (256, 768), "mm"),
  ("mm [1024,768]x[768,256]", (1024, 768), (768, 256), "mm"), ("mm [1024,256]x[256,32000]", (1024, 256), (256, 32000), "mm"),
  ("lin [1024,256]x[768,256]T", (1024, 256), (768, 256), "lin"), ("lin [1024,256]x[32000,256]T", (1024, 256), (32000, 256), "lin"),
  ("lin 2048^3", (2048, 2048), (2048, 2048), "lin"), ("mm [1024,32000]x[32000,256]", (1024, 32000), (32000, 256), "mm"), ("mm [1024,1024]x[1024,256]", (1024, 1024), (1024, 256), "mm"), ("dW gT[256,1024]x[1024,768]", (1024, 256), (1024, 768), "tn"), ("dW gT[768,1024]x[1024,256]", (1024, 768), (1024, 256), "tn"),
  ("dW gT[32000,1024]x[1024,256]", (1024, 32000), (1024, 256), "tn")]
for name, sa, sb, kind in rows:
    if which and which not in name: continue
    a, b = torch.randn(*sa).bfloat16(), torch.randn(*sb).bfloat16()
    if kind == "mm": fn = lambda: a @ b; N, K, M = sa[0], sa[1], sb[1]
    elif kind == "lin": fn = lambda: F.linear(a, b); N, K, M = sa[0], sa[1], sb[0]
    else: at = a.t(); fn = lambda: at @ b; N, K, M = sa[1], sa[0], sb[1]
    m = tm(fn)
    print(f"{name:32s} {th} thr: {m*1e3:8.2f} ms  {2*N*M*K/m/1e9:6.1f} GFLOP/s")
