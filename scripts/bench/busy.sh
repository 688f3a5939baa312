#!/usr/bin/env bash
# busy.sh — idle vs one core busy, per row, for one or more keng binaries (issue 21 item 3:
# "within 1.3x of its idle time when one of the two cores runs another process").
#
#   scripts/bench/busy.sh [--steps N] [--rounds R] [--rows a,b] [--configs "default 2 1"] BIN...
#
# For each round, each mode (idle, then busy), each binary and each thread configuration
# ("default": no variable, the adaptive count; a number: KENG_NUM_THREADS=n) it runs
#   BIN scripts/bench/all.lua --tier cpu --only ROWS --steps N
# and keeps each row's median ms/step. "busy" is a shell busy loop started in the same session
# (at keng's priority) 0.2 s before and killed after. Each run puts its session first when it may
# (`echo -20 > /proc/self/autogroup`, ignored if refused), so other sessions on a shared machine
# disturb it less; on a quiet machine that changes nothing. It prints one line per (binary,
# configuration, row): the idle and busy medians over the rounds and busy / idle, and the
# configurations interleave so that a load that comes and goes hits all of them alike.
# Defaults: the five rows of docs/kernels.md ("Threads under load"), --steps 3, --rounds 2.
# It measures thread policy only where this session can have both cores: on a machine loaded by
# other sessions the loop takes its half out of our session's share, whatever keng does (the last
# line repeats the load average; scripts/bench/busy_drop.lua times the reaction on any machine).
set -euo pipefail
steps=3 rounds=2 configs="default 2 1"
rows=sam_fit,sam_predict,bert_fit,mistral_generate_1,gemma_generate_32
bins=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "busy.sh: unknown option $1 (valid: --steps --rounds --rows --configs)" >&2; exit 2 ;;
    *) bins+=("$1"); shift ;;
  esac
done
[ ${#bins[@]} -gt 0 ] || { echo "usage: scripts/bench/busy.sh [--steps N] [--rounds R] [--rows a,b] [--configs \"default 2 1\"] BIN..." >&2; exit 2; }
cd "$(dirname "$0")/../.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() { # mode bin config -> "row<TAB>median" lines on stdout
  local mode=$1 bin=$2 cfg=$3 env=""
  [ "$cfg" = default ] || env="KENG_NUM_THREADS=$cfg"
  setsid -w bash -c '
    echo -20 > /proc/self/autogroup 2>/dev/null || true
    if [ "$1" = busy ]; then (while :; do :; done) & loop=$!; sleep 0.2; fi
    env -u KENG_NUM_THREADS -u OMP_NUM_THREADS $2 "$3" scripts/bench/all.lua --tier cpu --only "$4" --steps "$5" \
      --out "$6" 2>/dev/null || true
    if [ -n "${loop:-}" ]; then kill $loop; fi
  ' _ "$mode" "$env" "$bin" "$rows" "$steps" "$out/res" |
    sed -n 's/^\[ *[0-9]*\/[0-9]*\] \(.*[^ ]\)  *batch .*(median \([0-9.]*\),.*/\1\t\2/p' || true
}

echo "# $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); rows $rows; --steps $steps, $rounds rounds"
for r in $(seq "$rounds"); do
  for mode in idle busy; do
    for b in "${!bins[@]}"; do
      for c in $configs; do
        run "$mode" "${bins[$b]}" "$c" | while IFS=$'\t' read -r row ms; do
          printf '%s\t%s\t%s\t%s\t%s\n' "$b" "$c" "$row" "$mode" "$ms" >> "$out/all"
          printf '  round %s %-4s %-28s %-8s %-26s %8s ms\n' "$r" "$mode" "${bins[$b]}" "$c" "$row" "$ms" >&2
        done
      done
    done
  done
done

# the median over the rounds of each (binary, config, row, mode)
echo "| binary | threads | row | idle ms | busy ms | busy / idle |"
echo "|---|---|---|---|---|---|"
for b in "${!bins[@]}"; do
  for c in $configs; do
    awk -F'\t' -v b="$b" -v c="$c" '$1 == b && $2 == c { print $3 }' "$out/all" | awk '!seen[$0]++' |
      while read -r row; do
        med() { awk -F'\t' -v b="$b" -v c="$c" -v row="$row" -v m="$1" '$1 == b && $2 == c && $3 == row && $4 == m { print $5 }' "$out/all" |
          sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
        idle=$(med idle) busy=$(med busy)
        ratio=$(awk -v i="$idle" -v b="$busy" 'BEGIN { if (i + 0 > 0 && b + 0 > 0) printf "%.2f", b / i; else print "-" }')
        echo "| ${bins[$b]} | $c | $row | $idle | $busy | $ratio |"
      done
  done
done
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
