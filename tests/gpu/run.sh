#!/usr/bin/env bash
# run.sh — the one device call of the GPU check (docs/cuda.md "GPU check"). First, HERE:
#   bash tests/gpu/prepare.sh     # -> build-gpu-deps/prefix/prefix.tar.xz (Lua, OpenBLAS, readline,
#                                 #    libpng, zlib headers, pkgconf, busted, Open MPI; unpacked here in
#                                 #    build-gpu-deps/root) and build-gpu-deps/wheels (diffusers)
# then one device `run`: command "bash tests/gpu/run.sh", carry ["build-gpu-deps/prefix",
# "build-gpu-deps/wheels"], timeout_s 540. In that one call it
#   1. builds keng + its Lua module (not the C tests or labs) for sm_90 only, all cores, in build-gpu/
#   2. runs tests/gpu/compare.lua (CPU vs CUDA for every op, and the GPU-tier shapes; again under
#      KENG_SYNC=1 after a CUDA error, crash or hang, if time allows), the specs with a CUDA block under
#      KENG_DEVICE=cuda, and tests/gpu/graph.lua
#   3. runs each benchmark row of the GPU tier in its own process under its own `timeout`, in the
#      priority order of ROWS below (so one hang or crash costs only that row)
#   4. the PyTorch peer (scripts/bench/peers/pytorch_gpu.py), the same rows on the same GPU, runs
#      beside the build (which needs no GPU) for PEER_BUDGET seconds (default 120), on the last 4
#      cores (taskset; nvcc gets the others); the checks wait for it, so nothing shares the GPU
#      with a timed PyTorch step; after keng's rows, the peer rows it did not reach run with the
#      time left
#   5. writes the report: exactly the files of OUT_FILES in $OUT (at most 8: the device tool
#      returns no more), rewritten after every stage and row so a call cut short still returns what
#      it measured.
# Time: a deadline BUDGET seconds (default 500) from the start; every stage has its own timeout
# within it, and each row's timeout is its cap or the time left before the deadline.
#
# Dry run on a machine without a GPU (proves the prefix, the build and the harness path):
#   KENG_GPU_DRY_RUN=1 bash tests/gpu/run.sh      # CUDA off, build-gpu-dry/, CPU-tier rows with
#   --steps 1, compare.lua / graph.lua as CPU self-tests at small sizes, the peer on the CPU at tiny
#   sizes; OUT defaults to build-gpu-dry/out. It fails when CMake found a library outside the prefix.
#
# Environment: BUDGET, PEER_BUDGET, BUILD (build dir), ARCH (CUDA architectures, default 90),
# OUT (report dir; default BUILD/out), ROWS_ONLY (comma-separated row ids to run, in ROWS order),
# ROW_STEPS / ROW_TIMEOUT (every row's timed steps / timeout cap instead of ROWS's), PEER=0 (skip
# the peer), SANITIZE=1 (compare.lua under compute-sanitizer, if time allows).
set -uo pipefail
start=$(date +%s)
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"

DRY=${KENG_GPU_DRY_RUN:-0}
if [ "$DRY" = 1 ]; then
  budget=${BUDGET:-900}; peer_budget=${PEER_BUDGET:-150}; build=${BUILD:-build-gpu-dry}
else
  budget=${BUDGET:-500}; peer_budget=${PEER_BUDGET:-120}; build=${BUILD:-build-gpu}
fi
deadline=$((start + budget))
final_margin=15                                  # kept for the last summary after the peer

# the files returned from $OUT — never any other (the device tool returns at most 8)
OUT_FILES=(summary.md results.json run.log build.log checks.log rows.log peer.log peer.json)

# the benchmark rows, in priority order: id:timed steps:timeout seconds (all.lua's row ids; the
# GPU tier's default is 100 steps, these keep each row within its timeout; difference-rule rows
# (generate, SD predict) time 1 + N calls against 1)
ROWS=(
  gemma_generate_1:3:100
  gemma_fit:5:100
  gemma_generate_32:3:80
  mistral_generate_1:3:80
  mistral_fit:5:80
  mistral_generate_32:3:80
  bert_fit:5:60
  bert_predict:5:60
  sam_fit:5:70
  sam_predict:5:70
  sd_fit:5:60
  sd_predict:3:90
)

work="$top/$build/check"                         # every stage's full log and result
out=${OUT:-$top/$build/out}
rm -rf "$work"
mkdir -p "$work/rows" "$out"
exec > >(tee "$out/run.log") 2>&1
tee_pid=$!

now() { date +%s; }
left() { echo $(( deadline - $(now) )); }
stamp() { echo "[+$(( $(now) - start ))s] $*"; }
meta() { printf '%s\t%s\n' "$1" "$2" >>"$work/meta.tsv"; }
stage() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >>"$work/stages.tsv"; }
tailf() { [ -f "$1" ] && tail -n "$2" "$1"; }

deps="$top/build-gpu-deps"
# prepare.sh's staged tree: carried packed (build-gpu-deps/prefix/prefix.tar.xz: the tree itself is
# more than the device tool carries) and unpacked into build-gpu-deps/root by stage 0 below (here
# prepare.sh leaves it unpacked); a tree from an older prepare.sh (prefix/usr) is used as it is
root="$deps/root"
[ -d "$deps/prefix/usr" ] && root="$deps/prefix"
pre="$root/usr"
lib="$pre/lib/x86_64-linux-gnu"
# keng (and the carried lua5.4) run with the prefix's libraries; python3 does not see them
keng_ld="$lib:$lib/openblas-openmp"
kenv() { LD_LIBRARY_PATH="$keng_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }
# busted and its modules from the prefix only (no ";;": the system's copies are not used)
export LUA_PATH="$pre/share/lua/5.4/?.lua;$pre/share/lua/5.4/?/init.lua;./?.lua"
export LUA_CPATH="$lib/lua/5.4/?.so"
keng="$top/$build/keng"

# ---- the report ---------------------------------------------------------------------------
put() {                                          # put NAME < content: only names of OUT_FILES
  local n=$1 f
  for f in "${OUT_FILES[@]}"; do
    if [ "$f" = "$n" ]; then cat >"$out/$n.tmp" && mv "$out/$n.tmp" "$out/$n"; return; fi
  done
  echo "run.sh: refusing to write $n (not in OUT_FILES)" >&2; cat >/dev/null
}
publish() {
  meta elapsed $(( $(now) - start ))
  {
    echo "== configure (tail)"; tailf "$work/configure.log" 40
    echo "== build: errors"; grep -E -m 40 "error|Error" "$work/build.log" 2>/dev/null
    echo "== build (tail)"; tailf "$work/build.log" 60
  } | put build.log
  {
    for f in compare compare_sync specs nccl graph generate_graph cudnn_sdpa sanitizer; do
      [ -f "$work/$f.log" ] || continue
      echo "== $f.log"
      if [ "$f" = cudnn_sdpa ]; then grep -iE "error|fail|not supported" "$work/$f.log" | head -40
      else tail -n 1500 "$work/$f.log"; fi
    done
  } | put checks.log
  {
    while IFS=$'\t' read -r id st rc secs tmo steps; do
      echo "== $id: $st (exit $rc, $secs s of $tmo, $steps steps)"
      tailf "$work/rows/$id.log" 150; echo
    done <"$work/rows.tsv"
  } 2>/dev/null | put rows.log
  [ -f "$work/peer.log" ] && tail -n 400 "$work/peer.log" | put peer.log
  [ -f "$work/peer.json" ] && put peer.json <"$work/peer.json"
  # the summary: the carried lua5.4 (needs no build), else keng, else a few plain lines
  if ! kenv "$pre/bin/lua5.4" tests/gpu/summary.lua "$work" "$out" 2>"$work/summary.err" &&
     ! { [ -x "$keng" ] && kenv "$keng" tests/gpu/summary.lua "$work" "$out" 2>>"$work/summary.err"; }; then
    { echo "# keng GPU check — summary.lua failed"; echo; cat "$work/summary.err"; echo
      echo '```'; cat "$work/stages.tsv" "$work/rows.tsv" 2>/dev/null; echo '```'; } | put summary.md
  fi
}
peer_pid=""
wait_peer() {                                    # the peer's phase A, running beside the build
  [ -n "${peer_pid:-}" ] || return 0
  stamp "== waiting for the PyTorch peer (phase A)"
  wait "$peer_pid"
  peer_pid=""
  grep -vE "^WARNING|^$" "$work/peer.log" 2>/dev/null | tail -15
  publish
}
finish() {
  local rc=$1
  wait_peer                                      # a stage failed early: the peer's rows still count
  stage total done $(( $(now) - start )) "exit $rc"
  publish
  stamp "done: exit $rc (report in $out: ${OUT_FILES[*]})"
  sed -n '1,200p' "$out/summary.md" 2>/dev/null
  # the device tool returns only the last 12,000 characters of the output: end with the tables
  echo; echo "== recap (summary.md in full above and in \$OUT)"
  grep -E '^(\||compare\.lua: )' "$out/summary.md" 2>/dev/null | cut -c1-400
  exec >&- 2>&-                                  # let tee finish run.log before the call returns
  wait "$tee_pid" 2>/dev/null
  exit "$rc"
}

: >"$work/rows.tsv"
meta date "$(date -u '+%Y-%m-%d %H:%M UTC')"
meta commit "$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
# the sources' own hash, for a copy without .git (compare with the same line run here)
meta sources "$(find CMakeLists.txt engine lua_bindings scripts tests/gpu -type f -not -name '*.pyc' -print0 |
  sort -z | xargs -0 sha1sum | sha1sum | cut -c1-12)"
meta budget "$budget"
meta dry "$DRY"

# ---- 0. the staged prefix ---------------------------------------------------------------
unpacked=""
if [ ! -d "$pre" ] && [ -f "$deps/prefix/prefix.tar.xz" ]; then
  t0=$(now)
  rm -rf "$root.part" && mkdir -p "$root.part"
  if timeout 120 tar -C "$root.part" -xJf "$deps/prefix/prefix.tar.xz" 2>"$work/unpack.log" ||
     { rm -rf "$root.part" && mkdir -p "$root.part" &&      # no xz there: Python's lzma
       timeout 120 python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' \
         "$deps/prefix/prefix.tar.xz" "$root.part" 2>>"$work/unpack.log"; }; then
    rm -rf "$root" && mv "$root.part" "$root"
    unpacked=", unpacked in $(( $(now) - t0 )) s"
  else
    cat "$work/unpack.log"
  fi
fi
missing=""
for f in include/png.h include/zlib.h include/lua5.4/lua.h include/x86_64-linux-gnu/openblas-openmp/cblas.h \
    lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so lib/x86_64-linux-gnu/libreadline.so \
    lib/x86_64-linux-gnu/libpng16.so bin/pkg-config-prefix bin/lua5.4 share/lua/5.4/busted/runner.lua; do
  [ -e "$pre/$f" ] || missing="$missing $f"
done
if [ -n "$missing" ]; then
  stage prefix failed 0 "missing:$missing — run tests/gpu/prepare.sh and carry build-gpu-deps/prefix"
  echo "run.sh: the staged prefix $root lacks:$missing (run tests/gpu/prepare.sh here, carry build-gpu-deps/prefix)"
  finish 2
fi
stage prefix ok 0 "$(du -sh "$pre" | cut -f1)$unpacked"

# ---- 1. the machine ------------------------------------------------------------------------
stamp "== machine"
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
gpu=$(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
meta gpu "${gpu:-no GPU (nvidia-smi absent)}"
meta nvcc "$(nvcc --version 2>/dev/null | tail -1)"
echo "gpu: ${gpu:-none}; $(nvcc --version 2>/dev/null | tail -1); $(cmake --version | head -1); $(nproc) cores"
cuda=ON
[ "$DRY" = 1 ] && cuda=OFF
# cuDNN (conv ops): the toolkit's, else the pip wheel's (nvidia-cudnn-cu13) found through Python
if [ "$cuda" = ON ] && ! ls /usr/local/cuda/lib64/libcudnn.so* >/dev/null 2>&1 && [ -z "${CUDNN_ROOT:-}" ]; then
  CUDNN_ROOT=$(timeout 30 python3 -c 'import nvidia.cudnn as m, os; print(os.path.dirname(m.__file__) if m.__file__ else list(m.__path__)[0])' 2>/dev/null)
  if [ -n "$CUDNN_ROOT" ]; then export CUDNN_ROOT; keng_ld="$keng_ld:$CUDNN_ROOT/lib"; fi
fi
echo "cuDNN root: ${CUDNN_ROOT:-(toolkit)}"
# NCCL (keng.distributed's cuda collectives) likewise: the toolkit's, else nvidia-nccl-cu13's
if [ "$cuda" = ON ] && ! ls /usr/local/cuda/lib64/libnccl.so* >/dev/null 2>&1 && [ -z "${NCCL_ROOT:-}" ]; then
  NCCL_ROOT=$(timeout 30 python3 -c 'import nvidia.nccl as m, os; print(os.path.dirname(m.__file__) if m.__file__ else list(m.__path__)[0])' 2>/dev/null)
  if [ -n "$NCCL_ROOT" ]; then export NCCL_ROOT; keng_ld="$keng_ld:$NCCL_ROOT/lib"; fi
fi
echo "NCCL root: ${NCCL_ROOT:-(toolkit)}"

# the peer's cores: the last 4 (of 8 or more, with taskset), so that the build running meanwhile
# does not slow its Python; `pin` runs the build on the others
ncpu=$(nproc)
pin=(); peer_pin=(); jobs=$ncpu
if [ "${PEER:-1}" != 0 ] && [ "$ncpu" -ge 8 ] && command -v taskset >/dev/null; then
  pin=(taskset -c "0-$((ncpu - 5))"); peer_pin=(taskset -c "$((ncpu - 4))-$((ncpu - 1))"); jobs=$((ncpu - 4))
fi

# ---- the PyTorch peer on the same GPU: phase A beside the build, phase B after keng's rows ------
peer_ids() {                                     # the rows, in ROWS order, less those in $1 (a,b,..)
  local ids="" spec id
  for spec in "${ROWS[@]}"; do
    id=${spec%%:*}
    if [ -n "${ROWS_ONLY:-}" ] && [[ ",$ROWS_ONLY," != *",$id,"* ]]; then continue; fi
    [[ ",${1:-}," == *",$id,"* ]] && continue
    ids="$ids${ids:+,}$id"
  done
  echo "$ids"
}
peer_args() {
  if [ "$DRY" = 1 ]; then echo "--device cpu --tiny --steps 1"; else echo "--steps 5 --gen-steps 3"; fi
}
# run_peer PHASE BUDGET IDS JSON: one pytorch_gpu.py process (its log appended to peer.log)
run_peer() {
  local phase=$1 avail=$2 ids=$3 json=$4 t1 prc
  t1=$(now)
  # diffusers for the SD rows, from the carried wheels (not in the device image)
  local pyenv=(env PYTHONUNBUFFERED=1)
  if [ -d "$work/site" ]; then pyenv+=(PYTHONPATH="$work/site")
  elif ! timeout 60 python3 -c "import diffusers" 2>/dev/null && ls build-gpu-deps/wheels/*.whl >/dev/null 2>&1; then
    if timeout 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" \
        build-gpu-deps/wheels/*.whl >>"$work/pip.log" 2>&1; then
      pyenv+=(PYTHONPATH="$work/site")
    else
      { echo "== pip install of the carried wheels failed:"; cat "$work/pip.log"; } >>"$work/peer.log"
    fi
  fi
  avail=$(( avail - ($(now) - t1) ))
  echo "== phase $phase: $ids (budget $avail s)" >>"$work/peer.log"
  # its --budget starts after its imports (torch, transformers, diffusers: 10-20 s there)
  # shellcheck disable=SC2046
  timeout -k 5 $(( avail + 40 )) "${peer_pin[@]}" "${pyenv[@]}" python3 scripts/bench/peers/pytorch_gpu.py \
    $(peer_args) --budget "$avail" --only "$ids" --out "$json" >>"$work/peer.log" 2>&1
  prc=$?
  stage "pytorch peer ($phase)" "$([ $prc = 0 ] && echo ok || echo "exit $prc$([ $prc = 124 ] && echo ' (timeout)')")" \
    $(( $(now) - t1 )) "$ids"
}
if [ "${PEER:-1}" != 0 ]; then
  ids=$(peer_ids)
  [ "$DRY" = 1 ] && ids=gemma_generate_1                        # and bert_predict in phase B
  stamp "== PyTorch peer beside the build (${peer_budget} s${peer_pin[*]:+, ${peer_pin[*]}}: $ids)"
  run_peer A "$peer_budget" "$ids" "$work/peer.json" </dev/null &
  peer_pid=$!
fi
# ---- 2. configure + build --------------------------------------------------------------------
stamp "== configure + build ($build, CUDA $cuda, sm_${ARCH:-90})"
t0=$(now)
zlib=$(ldconfig -p 2>/dev/null | awk '/libz\.so\.1 .*x86-64/ {print $NF; exit}')
for z in "$zlib" /usr/lib/x86_64-linux-gnu/libz.so.1 /lib/x86_64-linux-gnu/libz.so.1 /usr/lib64/libz.so.1; do
  [ -n "$z" ] && [ -e "$z" ] && { zlib=$z; break; }
done
timeout 120 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKENG_CUDA=$cuda \
  -DCMAKE_CUDA_ARCHITECTURES="${ARCH:-90}" -DCMAKE_PREFIX_PATH="$pre" \
  -DPKG_CONFIG_EXECUTABLE="$pre/bin/pkg-config-prefix" -DZLIB_INCLUDE_DIR="$pre/include" -DZLIB_LIBRARY="$zlib" \
  >"$work/configure.log" 2>&1
crc=$?
if [ $crc -ne 0 ]; then
  tail -30 "$work/configure.log"
  stage configure failed $(( $(now) - t0 )) "exit $crc (build.log)"
  finish 3
fi
grep -E "keng: (CUDA backend|cuDNN|NCCL)" "$work/configure.log"
# every library must come from the prefix (or the image, for CUDA / OpenMP / zlib's runtime)
outside=""
for v in OPENBLAS_INCLUDE OPENBLAS_LIB READLINE_LIB PNG_LIBRARY_RELEASE PNG_PNG_INCLUDE_DIR JPEG_LIBRARY_RELEASE JPEG_INCLUDE_DIR LUA_INCLUDEDIR; do
  p=$(sed -n "s/^$v:[A-Z]*=//p" "$build/CMakeCache.txt" | head -1)
  echo "  $v = $p"
  case "$p" in "$top"/build-gpu-deps/*) ;; *) outside="$outside $v=$p" ;; esac
done
if [ -n "$outside" ]; then
  echo "run.sh: found outside the prefix:$outside"
  if [ "$DRY" = 1 ]; then stage configure failed $(( $(now) - t0 )) "outside the prefix:$outside"; finish 3; fi
fi
left_s=$(left)
timeout $(( left_s < 400 ? left_s - 60 : 340 )) "${pin[@]}" ninja -C "$build" -j "$jobs" keng keng_lua >"$work/build.log" 2>&1
brc=$?
secs=$(( $(now) - t0 ))
if [ $brc -ne 0 ]; then
  grep -B2 -A12 -m5 "error" "$work/build.log" | head -60
  stage build failed $secs "exit $brc$([ $brc = 124 ] && echo ' (timeout)')"
  finish 4
fi
stage build ok $secs "CUDA $cuda, arch ${ARCH:-90}"
echo "built in $secs s"
# every library keng loads comes from the prefix, the build, CUDA (toolkit or pip wheels) or the
# base every image has; a dry run fails on any other (the device image may lack it: libudev was one)
libs=$(kenv ldd "$keng" 2>&1)
missing_libs=$(echo "$libs" | grep "not found" | awk '{print $1}' | tr '\n' ' ')
base='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|librt|libpthread|libgomp|libgcc_s|libstdc\+\+|libz|libcuda)\.so'
outside_libs=$(echo "$libs" | awk '/=>/ {print $1, $3}' | grep -vE " ($top/|/usr/local/cuda|.*/nvidia/)" |
  grep -vE "$base" | awk '{print $1 "=" $2}' | tr '\n' ' ')
if [ -n "$missing_libs" ] || { [ "$DRY" = 1 ] && [ -n "$outside_libs" ]; }; then
  echo "run.sh: keng's libraries: not found: ${missing_libs:-none}; outside the prefix: ${outside_libs:-none}"
  stage libraries failed 0 "not found: ${missing_libs:-none}; outside the prefix: ${outside_libs:-none}"
  [ "$DRY" = 1 ] && finish 3
else
  stage libraries ok 0 "${outside_libs:+from the image: $outside_libs}"
fi
avail_line=$(kenv "$keng" -e 'io.write(tostring(keng.cuda.is_available()), " ", keng.cuda.device_count())' 2>&1)
echo "keng.cuda.is_available(), device_count(): $avail_line"
if [ "$DRY" != 1 ] && [ "${avail_line%% *}" != true ]; then
  # compare.lua and graph.lua would only print that they skip: say it where it shows
  stage "keng sees the GPU" failed 0 "keng.cuda.is_available() is false ($avail_line): no check below ran on the GPU"
  no_gpu=1
fi
publish

# ---- 3. checks: compare.lua, the CUDA specs, graph.lua ------------------------------------------
cmp_env=()
[ "$DRY" = 1 ] && cmp_env=(KENG_COMPARE_DEVICE=cpu KENG_COMPARE_TIER=small)
checks_rc=${no_gpu:-0}
wait_peer                                        # the GPU to keng alone from here on
# the checks together end by CHECKS_WINDOW seconds (default 220) after the build, so that hung
# checks leave the rows their time; each check's timeout is its cap or what is left of the window
checks_end=$(( $(now) + ${CHECKS_WINDOW:-220} ))
run_check() {                                     # run_check NAME TIMEOUT LOG cmd...
  local name=$1 tmo=$2 log=$3 t1 rc
  shift 3
  t1=$(now)
  (( tmo > checks_end - t1 )) && tmo=$(( checks_end - t1 ))
  if [ "$tmo" -lt 10 ]; then
    stage "$name" skipped 0 "the checks' window (CHECKS_WINDOW) is spent"
    return 0
  fi
  stamp "== $name (timeout $tmo s)"
  timeout -k 5 "$tmo" env "${cmp_env[@]}" LD_LIBRARY_PATH="$keng_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@" \
    >"$work/$log.log" 2>&1
  rc=$?
  grep -vE " ok$|^$" "$work/$log.log" | tail -25
  local st=ok
  [ $rc = 0 ] || st=failed
  [ $rc = 0 ] && grep -q "skipped —" "$work/$log.log" && st=skipped       # no GPU seen
  stage "$name" "$st" $(( $(now) - t1 )) "exit $rc$([ $rc = 124 ] && echo ' (timeout)')"
  [ $rc = 0 ] || checks_rc=1
  publish
  return $rc
}
run_check compare.lua 150 compare "$keng" tests/gpu/compare.lua
crc=$?
# a fault (a CUDA error, a crash, a hang) may surface on a later op: rerun synchronised to find
# its op — not for plain mismatches or refused shapes, which name their op already
if [ "$DRY" != 1 ] && [ $(( checks_end - $(now) )) -gt 150 ] &&
   { { [ $crc -ne 0 ] && [ $crc -ne 1 ]; } || grep -q "(cudaError" "$work/compare.log"; }; then
  run_check "compare.lua KENG_SYNC=1" 120 compare_sync env KENG_SYNC=1 "$keng" tests/gpu/compare.lua
fi
if grep -q "cuDNN should have taken" "$work/compare.log" 2>/dev/null; then
  # one bf16 causal call with cuDNN's own log on (errors and warnings), to see why plans fail
  CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG="$work/cudnn_sdpa.log" timeout 30 env LD_LIBRARY_PATH="$keng_ld" "$keng" -e '
    local q = keng.randn({2, 8, 128, 64}, {dtype = "bf16", device = "cuda"})
    keng.scaled_dot_product_attention(q, q, q, {causal = true}):sum():item()
    local s = keng.backends.cudnn_sdpa_stats
    print("cudnn", s.cudnn, "plans", s.plans, "build failures", s.build_failures, "exec failures", s.exec_failures)' 2>&1
fi
spec_env=(env KENG_DEVICE=cuda)
[ "$DRY" = 1 ] && spec_env=(env)
run_check "specs (KENG_DEVICE=cuda)" 90 specs "${spec_env[@]}" "$keng" tests/run.lua tests/lua/optim_spec.lua \
  tests/lua/cuda_backend_spec.lua tests/lua/decode_spec.lua tests/lua/generate_spec.lua
# NCCL with a communicator of one (no mpirun): all_reduce / broadcast / all_gather / reduce_scatter
run_check "NCCL, world size 1" 40 nccl "${spec_env[@]}" "$keng" tests/run.lua --filter="through NCCL" \
  tests/lua/distributed_spec.lua
run_check graph.lua 60 graph "$keng" tests/gpu/graph.lua
run_check generate_graph.lua 60 generate_graph "$keng" scripts/bench/generate_graph.lua
if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null && [ $(( checks_end - $(now) )) -gt 60 ]; then
  run_check "compute-sanitizer compare.lua" 120 sanitizer compute-sanitizer --print-limit 20 "$keng" tests/gpu/compare.lua
fi

# ---- 4. the benchmark rows, one process each ----------------------------------------------------
tier=gpu
[ "$DRY" = 1 ] && tier=cpu
rows_deadline=$(( deadline - final_margin ))
stamp "== benchmark rows, $tier tier, one process each (rows stop by +$(( rows_deadline - start ))s)"
t_rows=$(now)
n_ok=0
for spec in "${ROWS[@]}"; do
  IFS=: read -r id steps cap <<<"$spec"
  if [ -n "${ROWS_ONLY:-}" ] && [[ ",$ROWS_ONLY," != *",$id,"* ]]; then continue; fi
  [ "$DRY" = 1 ] && { steps=1; cap=240; }
  steps=${ROW_STEPS:-$steps}; cap=${ROW_TIMEOUT:-$cap}
  avail=$(( rows_deadline - $(now) ))
  tmo=$(( cap < avail ? cap : avail ))
  if [ $tmo -lt 20 ]; then
    printf '%s\tskipped\t\t0\t0\t%s\n' "$id" "$steps" >>"$work/rows.tsv"
    echo "$id: skipped ($avail s left for rows)"
    continue
  fi
  t1=$(now)
  timeout -k 5 "$tmo" env KENG_BENCH_TRACE=1 LD_LIBRARY_PATH="$keng_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$keng" scripts/bench/all.lua --tier "$tier" --only "$id" --steps "$steps" --out "$work/rows/$id" \
    >"$work/rows/$id.log" 2>&1
  rc=$?
  secs=$(( $(now) - t1 ))
  case $rc in
    0|1) st=ran ;;
    124|137) st=timeout ;;
    *) st=crashed ;;
  esac
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$st" "$rc" "$secs" "$tmo" "$steps" >>"$work/rows.tsv"
  line=$(grep -m1 -E "^\[ *1/1\]" "$work/rows/$id.log")
  echo "$id: $st, exit $rc, $secs s: ${line#*... }"
  [ $rc = 0 ] && n_ok=$((n_ok + 1))
  publish
done
stage rows done $(( $(now) - t_rows )) "$n_ok ok"

# ---- 5. the peer's phase B: the rows phase A did not reach, with the time left -------------------
if [ "${PEER:-1}" != 0 ]; then
  reached=$(python3 -c 'import json, sys
print(",".join(r["id"] for r in json.load(open(sys.argv[1]))["rows"] if r.get("status") != "skipped"))' \
    "$work/peer.json" 2>/dev/null)
  ids=$(peer_ids "$reached")
  if [ "$DRY" = 1 ]; then ids=bert_predict; [[ ",$reached," == *",bert_predict,"* ]] && ids=""; fi
  avail=$(( deadline - final_margin - $(now) ))
  if [ -n "$ids" ] && [ "$avail" -ge 45 ]; then
    stamp "== PyTorch peer, phase B ($avail s: $ids)"
    peer_pin=()
    run_peer B "$(( avail - 40 ))" "$ids" "$work/peer_b.json"
    # merged into peer.json: phase A's rows, then B's for the ids A did not reach
    python3 - "$work/peer.json" "$work/peer_b.json" <<'PY' 2>>"$work/peer.log"
import json, os, sys
a_path, b_path = sys.argv[1], sys.argv[2]
b = json.load(open(b_path))
a = json.load(open(a_path)) if os.path.exists(a_path) else dict(b, rows=[])
again = {r["id"] for r in b["rows"]}             # B ran only rows A skipped or did not reach
a["rows"] = [r for r in a["rows"] if r["id"] not in again] + b["rows"]
with open(a_path + ".tmp", "w") as f:
    json.dump(a, f, indent=2, sort_keys=True)
os.replace(a_path + ".tmp", a_path)
PY
    grep -vE "^WARNING|^$" "$work/peer.log" | tail -8
    publish
  elif [ -n "$ids" ]; then
    stage "pytorch peer (B)" skipped 0 "$avail s left: $ids"
  fi
fi

# ---- 6. the dry run: the GPU-tier peer models at docs/benchmarks.md's parameter counts ------------
if [ "$DRY" = 1 ] && [ "${PEER:-1}" != 0 ]; then
  # (meta device: no GPU, no memory)
  t1=$(now)
  { echo "== pytorch_gpu.py --check-params"; timeout 120 python3 scripts/bench/peers/pytorch_gpu.py --check-params; } \
    >>"$work/peer.log" 2>&1
  prc=$?
  stage "peer --check-params" "$([ $prc = 0 ] && echo ok || echo "exit $prc")" $(( $(now) - t1 ))
  [ $prc = 0 ] || checks_rc=1
fi

finish $checks_rc
