#!/usr/bin/env bash
# tests/fuzz/run.sh [BUILD_DIR] [TARGET...] — builds the libFuzzer targets (clang,
# -fsanitize=fuzzer,address,undefined) and runs each for FUZZ_SECONDS (default 60) from its
# seed corpus tests/fuzz/corpus/<target>/. A crash, leak, timeout (FUZZ_TIMEOUT s per input,
# default 10) or out-of-memory fails the target; its reproducer is left in BUILD_DIR/crashes/.
# Prints one line per target "fuzz <target>: ok (N execs)" or "fuzz <target>: FAILED ...",
# then "N passed, N failed". FUZZ_SECONDS=0 only builds and replays the corpus.
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build-fuzz}
shift || true
case "$build" in /*) ;; *) build="$top/$build" ;; esac
targets=("$@")
[ ${#targets[@]} = 0 ] && targets=(safetensors safetensors_index json sentencepiece wordpiece clip_bpe png jpeg config tokenizer_json gguf)
secs=${FUZZ_SECONDS:-60}
CC=${FUZZ_CC:-$(command -v clang-14 || command -v clang)}
[ -n "$CC" ] || { echo "fuzz: clang not found (apt-get install clang libclang-rt-14-dev)"; echo "0 passed, 1 failed"; exit 1; }
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"

# 1. the engine as a shared library built by CMake with clang and coverage instrumentation
if ! { CC=$CC cmake -S "$top" -B "$build" -G Ninja -DKENG_CUDA=OFF -DKENG_NATIVE=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        "-DKENG_SANITIZE=fuzzer-no-link,address,undefined" >/dev/null &&
       ninja -C "$build" kengcore >"$build/ninja.log" 2>&1; }; then
  cat "$build/ninja.log" 2>/dev/null | tail -30
  echo "fuzz: engine build failed"; echo "0 passed, 1 failed"; exit 1
fi
# 2. the targets
lua_flags=$(pkg-config --cflags --libs lua5.4)
mkdir -p "$build/bin" "$build/crashes"
for t in "${targets[@]}"; do
  src="$top/tests/fuzz/fuzz_$t.c"
  bin="$build/bin/fuzz_$t"
  if [ ! -x "$bin" ] || [ "$src" -nt "$bin" ] || [ "$build/libkengcore.so" -nt "$bin" ] ||
     [ "$top/tests/fuzz/fuzz_util.h" -nt "$bin" ] || [ "$top/lua_bindings/json.c" -nt "$bin" ]; then
    if [ "$t" = config ]; then  # Lua over the JSON binding (lua_bindings/json.c) and the engine
      $CC -g -O1 -fsanitize=fuzzer $san -DKENG_SOURCE_DIR="\"$top\"" -I"$top/engine/include" "$src" \
        "$top/lua_bindings/json.c" -o "$bin" $lua_flags -L"$build" -lkengcore -Wl,-rpath,"$build" ||
        { echo "fuzz: cannot build $t"; echo "0 passed, 1 failed"; exit 1; }
    else
      $CC -g -O1 -fsanitize=fuzzer $san -I"$top/engine/include" "$src" -o "$bin" \
        -L"$build" -lkengcore -Wl,-rpath,"$build" || { echo "fuzz: cannot build $t"; echo "0 passed, 1 failed"; exit 1; }
    fi
  fi
done
# 3. run
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export OMP_NUM_THREADS=1
passed=0; failed=0
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"   # working corpus (grows); seeds are read-only inputs
  mkdir -p "$corpus"
  log="$build/fuzz_$t.log"
  maxlen=65536; [ "$t" = config ] && maxlen=4096   # each input goes through a file and Lua
  start=$(date +%s)
  if [ "$secs" = 0 ]; then
    "$build/bin/fuzz_$t" -runs=0 -timeout="${FUZZ_TIMEOUT:-10}" -artifact_prefix="$build/crashes/$t-" \
      "$corpus" "$top/tests/fuzz/corpus/$t" >"$log" 2>&1
  else
    "$build/bin/fuzz_$t" -max_total_time="$secs" -timeout="${FUZZ_TIMEOUT:-10}" -rss_limit_mb=2048 \
      -max_len="$maxlen" -print_final_stats=1 -artifact_prefix="$build/crashes/$t-" \
      "$corpus" "$top/tests/fuzz/corpus/$t" >"$log" 2>&1
  fi
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  [ -n "$execs" ] || execs=$(grep -o '#[0-9]*' "$log" | tail -1 | tr -d '#')
  if [ $rc = 0 ]; then
    echo "fuzz $t: ok (${execs:-?} execs in $(( $(date +%s) - start )) s)"
    passed=$((passed + 1))
  else
    echo "fuzz $t: FAILED (rc $rc, ${execs:-?} execs; log $log)"
    grep -E "ERROR:|SUMMARY:|runtime error|Test unit written" "$log" | head -8 | sed 's/^/  /'
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[ $failed = 0 ]
