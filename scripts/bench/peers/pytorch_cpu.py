#!/usr/bin/env python3
"""pytorch_cpu.py — the CPU-tier benchmark rows run with PyTorch + Hugging Face transformers,
so that `keng scripts/bench/all.lua --compare bench-results/pytorch.json` prints keng/PyTorch.

The rows, models, inputs and timing rules are in peer_rows.py (shared with pytorch_gpu.py): the
tiny configs of docs/benchmarks.md ("CPU tier") with random weights, the same synthetic inputs
(scripts/bench/config.lua), batch, dtype and thread count. Writes the keng-bench/1 JSON schema
(framework "pytorch").

Optional, never needed by tests. Requirements (pip):
    pip install torch==2.15.0 transformers==5.24.0 diffusers==0.42.1   # CPU wheels are enough
Usage:
    python3 scripts/bench/peers/pytorch_cpu.py [--steps 10] [--only bert,gemma] [--threads N]
        [--out bench-results/pytorch.json]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import transformers  # noqa: E402

import peer_rows  # noqa: E402

# repeats of a difference-rule row (scripts/bench/config.lua diff_repeats.cpu)
DIFF_REPEATS = 3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", default=None, help="families or row ids, comma-separated")
    ap.add_argument("--threads", type=int,
                    default=int(os.environ.get("KENG_NUM_THREADS", 0)) or os.cpu_count())
    ap.add_argument("--out", default="bench-results/pytorch.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rows = peer_rows.select_rows(a.only)
    if a.only:                                   # --only filters; the order stays config.lua's
        rows = [r for r in peer_rows.ROWS if r in rows]
    device = peer_rows.cpu_name()
    print(f"pytorch {torch.__version__}, transformers {transformers.__version__} · cpu tier · {device} · "
          f"{torch.get_num_threads()} threads · {a.steps} timed steps per row")
    runner = peer_rows.Runner("cpu", "cpu", DIFF_REPEATS)
    ok = peer_rows.run_suite(runner, rows, a.steps, a.out, device)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
