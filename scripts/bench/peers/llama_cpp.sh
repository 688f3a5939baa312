#!/usr/bin/env bash
# llama_cpp.sh — the decode peer: llama.cpp on the same models, weights and threads as keng's
# decode rows (scripts/bench/decode.lua; docs/benchmarks.md, "Decode vs llama.cpp").
#
#   scripts/bench/peers/llama_cpp.sh LLAMA_CPP_SRC [--threads N] [--models "gemma_tiny mistral_tiny mistral_1b"]
#       [--work DIR] [--out bench-results/llama_cpp.json] [--tokens 64] [--keng build/keng] [--jobs 2]
#
# LLAMA_CPP_SRC is a llama.cpp source checkout (git clone, or the vendor/llama.cpp directory of
# the llama-cpp-python sdist: `pip download --no-binary :all: --no-deps llama-cpp-python`). The
# script
#   1. builds llama-bench and llama-batched-bench (CPU, GGML_NATIVE, Release) into DIR/build once;
#   2. writes each model as a bf16 GGUF with peers/keng_to_gguf.sh (keng's `decode.lua --save`
#      checkpoint: random weights from seed 0, the ones decode.lua times; a stand-in sentencepiece
#      tokenizer; llama.cpp's own convert_hf_to_gguf.py);
#   3. times batch 1 with llama-bench (tg: --tokens tokens after a 6-token prompt) and batch 32
#      with llama-batched-bench (32 sequences of a 6-token prompt then --tokens tokens each);
#   4. writes keng-bench/1 JSON (framework "llama.cpp"): rows decode_<model>_<batch> with mean_ms
#      = ms per decode step (one token for each of the batch's rows), which
#      `keng scripts/bench/decode.lua --compare FILE` reads; and for the tiny presets the rows of
#      all.lua (gemma_generate_1, ... : a 6-token prompt then 44 tokens, the time of one call),
#      which `keng scripts/bench/all.lua --compare FILE` reads.
# Needs cmake, a C++ compiler, python3 with numpy, torch, sentencepiece (convert_hf_to_gguf.py's
# requirements). Optional: no test needs it.
set -euo pipefail

die() { echo "llama_cpp.sh: $*" >&2; exit 2; }
[ $# -ge 1 ] || die "usage: $0 LLAMA_CPP_SRC [--threads N] [--models \"...\"] [--work DIR] [--out FILE] [--tokens N] [--keng PATH] [--jobs N]"
SRC=$(cd "$1" && pwd) || die "no directory $1"
shift
[ -f "$SRC/convert_hf_to_gguf.py" ] && [ -f "$SRC/CMakeLists.txt" ] || die "$SRC is not a llama.cpp source checkout (no convert_hf_to_gguf.py / CMakeLists.txt)"

ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
THREADS=${KENG_NUM_THREADS:-$(nproc)}
MODELS="gemma_tiny mistral_tiny mistral_1b"
WORK="$ROOT/bench-results/llama_cpp"
OUT="$ROOT/bench-results/llama_cpp.json"
TOKENS=64
KENG="$ROOT/build/keng"
JOBS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS=$2 ;;
    --models) MODELS=$2 ;;
    --work) WORK=$2 ;;
    --out) OUT=$2 ;;
    --tokens) TOKENS=$2 ;;
    --keng) KENG=$2 ;;
    --jobs) JOBS=$2 ;;
    *) die "unknown option $1 (valid: --threads, --models, --work, --out, --tokens, --keng, --jobs)" ;;
  esac
  [ $# -ge 2 ] || die "$1 needs a value"
  shift 2
done
[ -x "$KENG" ] || die "no keng at $KENG (build it, or pass --keng)"
mkdir -p "$WORK" "$(dirname "$OUT")"
WORK=$(cd "$WORK" && pwd)

# 1. build (once)
BIN="$WORK/build/bin"
if [ ! -x "$BIN/llama-bench" ] || [ ! -x "$BIN/llama-batched-bench" ]; then
  echo "building llama.cpp from $SRC into $WORK/build"
  cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >"$WORK/cmake.log"
  cmake --build "$WORK/build" -j "$JOBS" --target llama-bench llama-batched-bench >"$WORK/build.log"
fi
VERSION=$(cd "$SRC" && (git describe --tags --always 2>/dev/null || basename "$(dirname "$(dirname "$SRC")")"))

ROWS="$WORK/rows.jsonl"
: >"$ROWS"
for M in $MODELS; do
  # 2. the checkpoint and its GGUF (once per model)
  GGUF="$WORK/$M-bf16.gguf"
  if [ ! -f "$GGUF" ]; then
    echo "writing $M (keng, seed 0) and converting it to $GGUF"
    "$ROOT/scripts/bench/peers/keng_to_gguf.sh" "$M" "$SRC" "$KENG" "$GGUF"
  fi
  # 3. batch 1: llama-bench, pp 6 and tg TOKENS; batch 32: llama-batched-bench
  echo "timing $M with llama.cpp, $THREADS threads"
  "$BIN/llama-bench" -m "$GGUF" -t "$THREADS" -p 6 -n "$TOKENS" -r 3 -o json >"$WORK/$M-bench.json" 2>"$WORK/$M-bench.log"
  "$BIN/llama-batched-bench" -m "$GGUF" -t "$THREADS" -tb "$THREADS" -c $((32 * (6 + TOKENS) + 64)) -b 512 -ub 512 \
    -npp 6 -ntg "$TOKENS" -npl 32 --output-format jsonl >"$WORK/$M-batched.jsonl" 2>"$WORK/$M-batched.log"
  python3 - "$M" "$TOKENS" "$THREADS" "$WORK/$M-bench.json" "$WORK/$M-batched.jsonl" >>"$ROWS" <<'EOF'
import json, sys
m, tokens, threads, bench, batched = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
recs = json.load(open(bench))
pp = next(r for r in recs if r["n_prompt"] > 0 and r["n_gen"] == 0)
tg = next(r for r in recs if r["n_gen"] > 0 and r["n_prompt"] == 0)
step1 = 1e3 / tg["avg_ts"]                                  # ms per token
b32 = [json.loads(l[l.index("{"):]) for l in open(batched) if '"n_kv_max"' in l]
b = next(r for r in b32 if r["pl"] == 32)
step32 = b["t_tg"] / b["tg"] * 1e3                          # ms per step of 32 tokens
out = [{"id": "decode_%s_1" % m, "batch": 1, "mean_ms": step1, "ms_per_token": step1,
        "tokens_per_s": tg["avg_ts"], "stddev_ts": tg["stddev_ts"], "pp6_ms": 6e3 / pp["avg_ts"]},
       {"id": "decode_%s_32" % m, "batch": 32, "mean_ms": step32, "ms_per_token": step32,
        "tokens_per_s": b["speed_tg"], "pp6x32_ms": b["t_pp"] * 1e3}]
family = m.split("_")[0]
if m.endswith("_tiny"):                                     # all.lua's rows: 6-token prompt, 44 new tokens
    out.append({"id": "%s_generate_1" % family, "batch": 1, "mean_ms": 6e3 / pp["avg_ts"] + 44 * step1})
    out.append({"id": "%s_generate_32" % family, "batch": 32, "mean_ms": b["t_pp"] * 1e3 + 44 * step32})
for r in out:
    r.update(status="ok", model=m, threads=threads, framework="llama.cpp", dtype="bf16")
    print(json.dumps(r))
EOF
done

# 4. the JSON
python3 - "$ROWS" "$OUT" "$THREADS" "$VERSION" <<'EOF'
import datetime, json, platform, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
doc = {"schema": "keng-bench/1", "framework": "llama.cpp", "llama_cpp_version": sys.argv[4], "tier": "cpu",
       "device": cpu, "threads": int(sys.argv[3]), "dtype": "bf16", "date": datetime.date.today().isoformat(),
       "rows": rows}
json.dump(doc, open(sys.argv[2], "w"), indent=2, sort_keys=True)
for r in rows:
    print("%-24s %8.3f ms" % (r["id"], r["mean_ms"]))
print("wrote " + sys.argv[2])
EOF
