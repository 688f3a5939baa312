#!/usr/bin/env bash
# tests/sanitize/leaks.sh [BUILD_DIR] — leak check of a piped REPL session and of a tiny fit +
# generate script (tests/sanitize/fit_generate.lua). With an ASan build (cmake
# -DKENG_SANITIZE=address,undefined) LeakSanitizer checks the process at exit; with a plain
# build valgrind does (--leak-check=full, definite leaks are errors). Both runs also assert
# that every tensor is back with the pool after Lua collects (keng.memory_stats().allocated).
# Prints one line per check and "N passed, N failed".
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build-asan}
case "$build" in /*) ;; *) build="$top/$build" ;; esac
bin="$build/keng"
[ -x "$bin" ] || { echo "leaks: no $bin"; echo "0 passed, 1 failed"; exit 1; }
libs=$(ldd "$bin" "$build/libkengcore.so" 2>/dev/null; nm -D "$bin" 2>/dev/null | grep -c __asan_init)
if grep -q 'libasan\|^[1-9]' <<<"$libs"; then
  mode=lsan
  export ASAN_OPTIONS=detect_leaks=1:${ASAN_OPTIONS:-}
  export LSAN_OPTIONS=suppressions=$top/tests/sanitize/lsan.supp:print_suppressions=0
  run=("$bin")
else
  mode=valgrind
  command -v valgrind >/dev/null || { echo "leaks: valgrind not installed (apt-get install valgrind)"; echo "0 passed, 1 failed"; exit 1; }
  run=(valgrind -q --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite
       --suppressions="$top/tests/sanitize/valgrind.supp" --error-exitcode=3 "$bin")
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
passed=0; failed=0
check() { # name, expected output substring, command output, exit status
  if [ "$4" = 0 ] && grep -qF -- "$2" <<<"$3" && ! grep -q 'LeakSanitizer\|definitely lost\|ERROR: AddressSanitizer' <<<"$3"; then
    echo "leaks $1 ($mode): ok"; passed=$((passed + 1))
  else
    echo "leaks $1 ($mode): FAILED (exit $4)"; echo "$3" | tail -40 | sed 's/^/  /'; failed=$((failed + 1))
  fi
}

# 1. a REPL session: tensors made, used, dropped; an error; a NaN check; the pool after collection
session='x = keng.randn({64, 64})
y = x:matmul(x):relu():sum()
print(y.shape)
z = keng.empty({1e6, 1e6})
l = keng.nn.Linear(8, 4)
w = l(keng.randn({2, 8})):sum()
w:backward()
keng.debug.check_numerics(true)
bad = keng.tensor{-1.5}:log()
keng.debug.check_numerics(false)
x, y, l, w = nil, nil, nil, nil
collectgarbage(); collectgarbage()
print("allocated after collect", keng.memory_stats().allocated)'
out=$(cd "$top" && printf '%s\n' "$session" | "${run[@]}" 2>&1); rc=$?
check repl "allocated after collect	0" "$out" $rc

# 2. fit + checkpoint + generate
out=$(cd "$top" && "${run[@]}" tests/sanitize/fit_generate.lua 2>&1); rc=$?
check fit_generate "leaks: ok" "$out" $rc

echo "$passed passed, $failed failed"
[ $failed = 0 ]
