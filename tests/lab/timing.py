"""timing.py — the one timer of the tests/lab PyTorch peers (see keng.bench.timer, scripts/lib/keng/bench.lua): median process CPU
time of `runs` calls after one warm-up call; argv = [runs] [threads] (threads default 1)."""
import statistics
import sys
import time

import torch


def setup(default_runs):
    """sets torch's thread count from argv[2], returns (runs, tm) with tm(fn) -> median seconds"""
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else default_runs

    def tm(fn):
        fn()
        ts = []
        for _ in range(runs):
            t0 = time.process_time()
            fn()
            ts.append(time.process_time() - t0)
        return statistics.median(ts)

    return runs, tm
