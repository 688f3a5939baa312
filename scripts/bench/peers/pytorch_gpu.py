#!/usr/bin/env python3
"""pytorch_gpu.py — the GPU-tier benchmark rows in PyTorch eager on a CUDA device, the peer that
tests/gpu/run.sh runs beside keng on the same GPU (keng/PyTorch per row in its summary).

The rows, models, inputs and timing rules are in peer_rows.py (shared with pytorch_cpu.py): the
full sizes of docs/benchmarks.md (bert_base_en, gemma_7b_en, mistral_7b_en, sam_huge_sa1b, Stable
Diffusion v1) with random weights initialised on the device, in transformers' model classes
(diffusers' for SD: a 'not available' row where diffusers is missing), bf16 LLM rows, f32 others
with TF32 matmuls and convolutions unless --no-tf32 (keng's GPU tier and Keras on the A100 ran
TF32), torch.cuda.synchronize before every clock read, one untimed warm-up. Rows run in the order
--only names them; after each row the JSON (keng-bench/1, framework "pytorch", the row ids of
scripts/bench/all.lua) is rewritten, so a run cut short by --budget or a kill keeps what it
measured. Exits 1 when a row failed.

Usage:
    python3 scripts/bench/peers/pytorch_gpu.py [--steps 10] [--gen-steps 3] [--only ids,families]
        [--budget SECONDS] [--no-tf32] [--out bench-results/pytorch-gpu.json]
    python3 scripts/bench/peers/pytorch_gpu.py --device cpu --tiny --steps 1 ...   # a dry run here:
        the CPU-tier sizes on the CPU (tests/gpu/run.sh with KENG_GPU_DRY_RUN=1)
    python3 scripts/bench/peers/pytorch_gpu.py --check-params   # the GPU-tier models' parameter
        counts against docs/benchmarks.md, built on the meta device (the dry run runs it too)
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
t_import = time.monotonic()
import torch  # noqa: E402
import transformers  # noqa: E402

import peer_rows  # noqa: E402


def main():
    t0 = time.monotonic()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10, help="timed steps of fit / predict rows")
    ap.add_argument("--gen-steps", type=int, default=None,
                    help="timed steps of the difference-rule rows (generate, SD predict); default --steps")
    ap.add_argument("--only", default=None, help="families or row ids, comma-separated, run in this order")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole run: rows are skipped once less than 15 s is left")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny: a dry run)")
    ap.add_argument("--tiny", action="store_true", help="the CPU-tier sizes instead of the GPU tier's")
    ap.add_argument("--no-tf32", dest="tf32", action="store_false", help="f32 matmuls and convolutions without TF32")
    ap.add_argument("--out", default="bench-results/pytorch-gpu.json")
    ap.add_argument("--check-params", action="store_true",
                    help="only build each GPU-tier model on the meta device and compare its parameter count "
                         "with docs/benchmarks.md (no GPU, no memory); exit 1 on a mismatch")
    a = ap.parse_args()
    if a.check_params:
        bad = peer_rows.check_params()
        raise SystemExit("pytorch_gpu.py: " + "; ".join(bad) if bad else 0)
    for name, v in (("--steps", a.steps), ("--gen-steps", a.gen_steps)):
        if v is not None and v < 1:
            ap.error(f"{name} must be a positive integer")
    rows = peer_rows.select_rows(a.only)
    if a.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SystemExit("pytorch_gpu.py: --device cuda but torch.cuda.is_available() is false "
                             "(use --device cpu --tiny for a dry run)")
        device_name = torch.cuda.get_device_name(torch.device(a.device))
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
    elif a.device == "cpu":
        device_name = peer_rows.cpu_name()
    else:
        ap.error("--device must be cuda, cuda:N or cpu")
    tier = "cpu" if a.tiny else "gpu"
    gen_steps = a.gen_steps or a.steps
    print(f"pytorch {torch.__version__}, transformers {transformers.__version__}, diffusers "
          f"{peer_rows.diffusers_version() or 'missing'} · {tier} tier sizes on {a.device} ({device_name}) · "
          f"tf32 {a.tf32 and a.device != 'cpu'} · {a.steps} timed steps ({gen_steps} for difference-rule rows) · "
          f"imports {t0 - t_import:.1f} s", flush=True)

    runner = peer_rows.Runner(tier, a.device, diff_repeats=1 if tier == "gpu" else 3)
    budget = a.budget - (time.monotonic() - t0) if a.budget else None

    def steps_of(row):                           # the difference-rule rows: generate, SD predict
        return gen_steps if row[3] == "generate" or row[0] == "sd_predict" else a.steps
    ok = peer_rows.run_suite(runner, rows, a.steps, a.out, device_name, budget=budget, steps_of=steps_of,
                             extra={"tf32": a.tf32 and a.device != "cpu", "gen_steps": gen_steps})
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
