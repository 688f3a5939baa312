#!/usr/bin/env bash
# run_all.sh BUILD_DIR — runs the C tests (ctest) and the busted specs (inside keng), then
# prints one closing line "N passed, N failed" summing both. Exit status 1 on any failure.
set -uo pipefail
build=${1:-build}
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

echo "== C tests (ctest)"
ctest_out=$(cd "$build" && ctest --output-on-failure 2>&1)
echo "$ctest_out"
c_total=$(echo "$ctest_out" | sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' | tail -1)
c_failed=$(echo "$ctest_out" | sed -n 's/.*, \([0-9]*\) tests failed out of.*/\1/p' | tail -1)
c_total=${c_total:-0}; c_failed=${c_failed:-0}
if [ "$c_total" = 0 ] && ! echo "$ctest_out" | grep -q "No tests were found"; then c_failed=1; fi

echo "== Lua specs (busted inside keng)"
export KENG_BIN="$top/$build/keng"
lua_out=$("$KENG_BIN" tests/run.lua 2>&1)
lua_rc=$?
echo "$lua_out"
line=$(echo "$lua_out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -1)
l_passed=$(echo "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p'); l_passed=${l_passed:-0}
l_failed=$(echo "$line" | sed -n 's/.* \([0-9]*\) failed$/\1/p'); l_failed=${l_failed:-1}
if [ $lua_rc -ne 0 ] && [ "$l_failed" = 0 ]; then l_failed=1; fi

passed=$(( c_total - c_failed + l_passed ))
failed=$(( c_failed + l_failed ))
echo
echo "ctest: $((c_total - c_failed)) passed, $c_failed failed; busted: $l_passed passed, $l_failed failed"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
