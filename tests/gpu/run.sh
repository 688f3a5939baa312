#!/usr/bin/env bash
# run.sh — the one prepared script for a lent GPU machine (see docs/cuda.md). That machine has
# nvcc, CMake, ninja and Python but no Lua or Debian -dev packages, so first run, HERE:
#   tests/gpu/prepare.sh            # -> build-gpu-deps/prefix (Lua, OpenBLAS, readline, pkgconf)
# then on the device (repo root), carrying that prefix:
#   run: command "bash tests/gpu/run.sh", carry ["build-gpu-deps/prefix"], timeout_s 540
# It builds keng with CUDA (sm_90 by default) in build-gpu/, prints the GPU, runs
# tests/gpu/compare.lua (CPU vs CUDA per op; rerun under KENG_SYNC=1 if it fails, so a fault is
# reported by the op that caused it; it also runs cuDNN's fused attention against keng's flash
# kernel and the CPU for bf16/f16 shapes and fails if keng.backends.cudnn_sdpa_stats shows cuDNN
# never ran, checks the fused linear (cuBLASLt bias epilogue) and the numerics guard on cuda), the
# specs that have a CUDA block with KENG_DEVICE=cuda (tests/lua/optim_spec.lua, whose optimizers
# now read lr / step from device scalars, and tests/lua/cuda_backend_spec.lua), the CUDA Graph
# checks (tests/gpu/graph.lua: AdamW / Adam / SGD with schedules, replay == eager bit for bit),
# then the GPU tier of the benchmark (scripts/bench/all.lua --tier gpu --steps 3; fit and predict
# rows timed as CUDA Graph replays — a per-row "graph" line follows) with whatever time is left,
# and exits with the status of the checks (the benchmark's rows are reported, not gating). Logs
# go to $OUT when set (the device tool brings them back), else to build-gpu/.
#
# Time: the device tool allows 8 minutes per call. Every stage prints a timestamp (seconds since
# start); the benchmark runs under `timeout` so the whole script ends by BUDGET seconds (default
# 450): about 2-3 min build on 16 cores (one architecture), < 1 min compare.lua, seconds for the
# spec and graph check, the rest for the benchmark (rows still running at the deadline are cut).
#
# Environment: ARCH (CUDA architectures, default 90), BUILD (build dir, default build-gpu),
# CUDA=OFF (check the dependency setup on a machine without nvcc), SPECS=1 (also run the CPU
# specs), SANITIZE=1 (also run compare.lua under compute-sanitizer), BUDGET (seconds, default
# 450), BENCH=0 (skip the benchmark).
set -uo pipefail
start=$(date +%s)
budget=${BUDGET:-450}
stamp() { echo "[+$(( $(date +%s) - start ))s] $*"; }
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
build=${BUILD:-build-gpu}
logs=${OUT:-$top/$build}
mkdir -p "$logs" "$build"

prefix="$top/build-gpu-deps/prefix/usr"
lib="$prefix/lib/x86_64-linux-gnu"
if [ ! -f "$lib/openblas-openmp/libopenblas.so.0" ]; then
  echo "run.sh: $prefix is missing: run tests/gpu/prepare.sh first and carry build-gpu-deps/prefix"
  exit 2
fi
export LD_LIBRARY_PATH="$lib:$lib/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$lib/pkgconfig"
pc=${PKGCONF:-$(command -v pkg-config || echo "$prefix/bin/pkgconf")}

stamp "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "(no nvidia-smi)"
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
nvcc --version 2>&1 | tail -1; cmake --version | head -1; echo "pkg-config: $pc"

# cuDNN (conv ops): the toolkit's, else the pip wheel's (nvidia-cudnn-cu13) found through Python
if ! ls /usr/local/cuda/lib64/libcudnn.so* >/dev/null 2>&1 && [ -z "${CUDNN_ROOT:-}" ]; then
  CUDNN_ROOT=$(python3 -c 'import nvidia.cudnn as m, os; print(os.path.dirname(m.__file__) if m.__file__ else list(m.__path__)[0])' 2>/dev/null)
  [ -n "$CUDNN_ROOT" ] && export CUDNN_ROOT && export LD_LIBRARY_PATH="$CUDNN_ROOT/lib:$LD_LIBRARY_PATH"
fi
echo "cuDNN root: ${CUDNN_ROOT:-(toolkit)}"

stamp "== configure + build ($build)"
t0=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKENG_CUDA="${CUDA:-ON}" \
  -DCMAKE_CUDA_ARCHITECTURES="${ARCH:-90}" -DPKG_CONFIG_EXECUTABLE="$pc" -DCMAKE_C_FLAGS="-I$prefix/include" \
  -DOPENBLAS_INCLUDE="$prefix/include/x86_64-linux-gnu/openblas-openmp" \
  -DOPENBLAS_LIB="$lib/openblas-openmp/libopenblas.so" -DREADLINE_LIB="$lib/libreadline.so" \
  >"$logs/configure.log" 2>&1 || { tail -40 "$logs/configure.log"; echo "run.sh: configure failed"; exit 3; }
grep -E "keng: (CUDA backend|cuDNN)" "$logs/configure.log"
ninja -C "$build" >"$logs/build.log" 2>&1 || { grep -B2 -A12 -m5 "error" "$logs/build.log" | head -80; echo "run.sh: build failed"; exit 4; }
echo "built in $(( $(date +%s) - t0 )) s"
keng="$top/$build/keng"
"$keng" -e 'print("cuda available:", keng.cuda.is_available(), "devices:", keng.cuda.device_count())'

if [ "${SPECS:-0}" = 1 ]; then
  stamp "== CPU specs"
  "$keng" tests/run.lua >"$logs/specs.log" 2>&1
  tail -1 "$logs/specs.log"
fi

stamp "== CPU vs CUDA (tests/gpu/compare.lua)"
t0=$(date +%s)
"$keng" tests/gpu/compare.lua >"$logs/compare.log" 2>&1
rc=$?
grep -v " ok$" "$logs/compare.log" | tail -60
echo "compare.lua exit $rc in $(( $(date +%s) - t0 )) s"
if [ $rc -ne 0 ]; then
  stamp "== again with KENG_SYNC=1 (faults land on their op)"
  KENG_SYNC=1 "$keng" tests/gpu/compare.lua >"$logs/compare_sync.log" 2>&1
  grep -v " ok$" "$logs/compare_sync.log" | tail -30
fi
if grep -q "cuDNN should have taken" "$logs/compare.log"; then
  # one bf16 causal call with cuDNN's own log on (errors and warnings), to see why plans fail
  stamp "== cuDNN attention refused: one call with CUDNN_LOGLEVEL_DBG=2 -> cudnn_sdpa.log"
  CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG="$logs/cudnn_sdpa.log" "$keng" -e '
    local q = keng.randn({2, 8, 128, 64}, {dtype = "bf16", device = "cuda"})
    keng.scaled_dot_product_attention(q, q, q, {causal = true}):sum():item()
    local s = keng.backends.cudnn_sdpa_stats
    print("cudnn", s.cudnn, "plans", s.plans, "build failures", s.build_failures, "exec failures", s.exec_failures)' 2>&1
  grep -iE "error|fail|not supported" "$logs/cudnn_sdpa.log" | head -20
fi
if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  stamp "== compute-sanitizer (memcheck)"
  compute-sanitizer --print-limit 20 "$keng" tests/gpu/compare.lua >"$logs/sanitizer.log" 2>&1
  grep -E "ERROR SUMMARY|Invalid|FAIL" "$logs/sanitizer.log" | head -20
fi

stamp "== specs with KENG_DEVICE=cuda (optim_spec, cuda_backend_spec)"
KENG_DEVICE=cuda "$keng" tests/run.lua tests/lua/optim_spec.lua tests/lua/cuda_backend_spec.lua \
  >"$logs/optim_spec.log" 2>&1
src=$?
grep -E "passed|FAIL|Error|error" "$logs/optim_spec.log" | tail -20
[ $src -ne 0 ] && rc=1

stamp "== CUDA Graph check (tests/gpu/graph.lua)"
"$keng" tests/gpu/graph.lua >"$logs/graph.log" 2>&1
grc=$?
tail -20 "$logs/graph.log"
[ $grc -ne 0 ] && rc=1

if [ "${BENCH:-1}" != 0 ] && [ -f scripts/bench/all.lua ]; then
  left=$(( budget - ($(date +%s) - start) ))
  if [ $left -gt 30 ]; then
    stamp "== benchmark, GPU tier, 3 steps ($left s left; cut at the deadline)"
    timeout --signal=TERM --kill-after=10 $left "$keng" scripts/bench/all.lua --tier gpu --steps 3 --out "$logs/bench" \
      >"$logs/bench.log" 2>&1
    brc=$?
    tail -40 "$logs/bench.log"
    [ $brc -eq 124 ] && echo "(benchmark cut at the deadline; rows printed so far are in bench.log)"
    # which rows were timed as CUDA Graph replays (keng.bench.graphed), and why not where not
    for j in "$logs"/bench/*-gpu.json; do
      [ -f "$j" ] && python3 - "$j" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])).get("rows", []):
    if r.get("status") == "ok":
        print("graph %-22s %s %s" % (r.get("id"), r.get("graph"), r.get("graph_error", "")))
PY
    done
    stamp "benchmark exit $brc"
  else
    stamp "== benchmark skipped: only $left s left"
  fi
fi
stamp "done: exit $rc"
exit $rc
