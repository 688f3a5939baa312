#!/usr/bin/env bash
# run.sh — the one prepared script for a lent GPU machine (see docs/cuda.md). That machine has
# nvcc, CMake, ninja and Python but no Lua or Debian -dev packages, so first run, HERE:
#   tests/gpu/prepare.sh            # -> build-gpu-deps/prefix (Lua, OpenBLAS, readline, pkgconf)
# then on the device (repo root), carrying that prefix:
#   run: command "bash tests/gpu/run.sh", carry ["build-gpu-deps/prefix"], timeout_s 540
# It builds keng with CUDA (sm_90 by default) in build-gpu/, prints the GPU, runs
# tests/gpu/compare.lua (CPU vs CUDA per op; rerun under KENG_SYNC=1 if it fails, so a fault is
# reported by the op that caused it) and exits with compare.lua's status. Logs go to $OUT when
# set (the device tool brings them back), else to build-gpu/.
#
# Environment: ARCH (CUDA architectures, default 90), BUILD (build dir, default build-gpu),
# CUDA=OFF (check the dependency setup on a machine without nvcc), SPECS=1 (also run the CPU
# specs), SANITIZE=1 (also run compare.lua under compute-sanitizer).
set -uo pipefail
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

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "(no nvidia-smi)"
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
nvcc --version 2>&1 | tail -1; cmake --version | head -1; echo "pkg-config: $pc"

# cuDNN (conv ops): the toolkit's, else the pip wheel's (nvidia-cudnn-cu13) found through Python
if ! ls /usr/local/cuda/lib64/libcudnn.so* >/dev/null 2>&1 && [ -z "${CUDNN_ROOT:-}" ]; then
  CUDNN_ROOT=$(python3 -c 'import nvidia.cudnn as m, os; print(os.path.dirname(m.__file__) if m.__file__ else list(m.__path__)[0])' 2>/dev/null)
  [ -n "$CUDNN_ROOT" ] && export CUDNN_ROOT && export LD_LIBRARY_PATH="$CUDNN_ROOT/lib:$LD_LIBRARY_PATH"
fi
echo "cuDNN root: ${CUDNN_ROOT:-(toolkit)}"

echo "== configure + build ($build)"
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
  echo "== CPU specs"
  "$keng" tests/run.lua >"$logs/specs.log" 2>&1
  tail -1 "$logs/specs.log"
fi

echo "== CPU vs CUDA (tests/gpu/compare.lua)"
t0=$(date +%s)
"$keng" tests/gpu/compare.lua >"$logs/compare.log" 2>&1
rc=$?
grep -v " ok$" "$logs/compare.log" | tail -60
echo "compare.lua exit $rc in $(( $(date +%s) - t0 )) s"
if [ $rc -ne 0 ]; then
  echo "== again with KENG_SYNC=1 (faults land on their op)"
  KENG_SYNC=1 "$keng" tests/gpu/compare.lua >"$logs/compare_sync.log" 2>&1
  grep -v " ok$" "$logs/compare_sync.log" | tail -30
fi
if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer (memcheck)"
  compute-sanitizer --print-limit 20 "$keng" tests/gpu/compare.lua >"$logs/sanitizer.log" 2>&1
  grep -E "ERROR SUMMARY|Invalid|FAIL" "$logs/sanitizer.log" | head -20
fi
exit $rc
