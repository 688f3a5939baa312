#!/usr/bin/env bash
# quant.sh — quantized decode on the ~1B Mistral (scripts/bench/decode.lua's mistral_1b, random
# weights from seed 0), keng vs llama.cpp, batch 1, one table (docs/quantization.md, "Speed"):
#
#   scripts/bench/quant.sh LLAMA_CPP_SRC [--llama-bin DIR] [--gguf BF16.gguf] [--work DIR]
#       [--threads "1 2"] [--tokens 64] [--repeats 3] [--keng build/keng]
#
# Rows, each at every --threads count:
#   keng bf16 / + int8 / + int4   the random bf16 model (seed 0) as built in memory, then
#                                 keng.quantize "int8" (per-row scales) or "int4" (Q4_0 layout)
#   keng Q8_0 / Q4_0 GGUF         models.gguf.from_gguf of llama.cpp's own files: the Linear layers
#                                 keep the file's codes and block scales (the bytes llama.cpp reads)
#   llama.cpp bf16 / Q8_0 / Q4_0  llama-bench -p 0 -n TOKENS -r REPEATS on the same three GGUFs
# keng's ms/token is tests/lab/quant_1b.lua's (decode steps only, best of --repeats); llama-bench's
# is 1000 / its mean tokens/s over tg TOKENS. Resident memory: keng's VmRSS after loading (its peak
# VmHWM also counts the bf16 model a quantized one was made from; "tensors" is the engine's
# keng.memory_stats().allocated, file views not included); llama.cpp's peak RSS (getrusage; the
# file is mmapped, plus the copies its CPU backend repacks Q4_0 / Q8_0 weights into).
#
# LLAMA_CPP_SRC is a llama.cpp source checkout. The script builds llama-bench and llama-quantize
# into WORK/build once (or takes them from --llama-bin: a directory with llama-bench, and
# llama-quantize if there is one), makes the bf16 GGUF with scripts/bench/peers/keng_to_gguf.sh
# (or takes --gguf), and quantizes it with `llama-quantize --pure` (every tensor Q8_0 / Q4_0, as
# keng's layers are; without llama-quantize, with the source tree's gguf-py, the same rounding). Needs cmake, a C++
# compiler, python3 with numpy, torch, sentencepiece. Optional: no test needs it. Run it on a
# quiet machine: every row streams 0.6-2.2 GB per token.
set -euo pipefail

die() { echo "quant.sh: $*" >&2; exit 2; }
[ $# -ge 1 ] || die "usage: $0 LLAMA_CPP_SRC [--llama-bin DIR] [--gguf BF16.gguf] [--work DIR] [--threads \"1 2\"] [--tokens N] [--repeats N] [--keng PATH]"
SRC=$(cd "$1" && pwd) || die "no directory $1"
shift
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK="$ROOT/bench-results/quant"
THREADS="1 2"
TOKENS=64
REPEATS=3
KENG="$ROOT/build/keng"
BIN=""
GGUF=""
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || die "$1 needs a value"
  case "$1" in
    --llama-bin) BIN=$(cd "$2" && pwd) ;;
    --gguf) GGUF=$2 ;;
    --work) WORK=$2 ;;
    --threads) THREADS=$2 ;;
    --tokens) TOKENS=$2 ;;
    --repeats) REPEATS=$2 ;;
    --keng) KENG=$2 ;;
    *) die "unknown option $1 (valid: --llama-bin, --gguf, --work, --threads, --tokens, --repeats, --keng)" ;;
  esac
  shift 2
done
[ -x "$KENG" ] || die "no keng at $KENG (build it, or pass --keng)"
KENG=$(cd "$(dirname "$KENG")" && pwd)/$(basename "$KENG")
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)

# 1. llama-bench (and llama-quantize; without it the files are made by the source tree's gguf-py)
if [ -z "$BIN" ]; then
  BIN="$WORK/build/bin"
  if [ ! -x "$BIN/llama-bench" ] || [ ! -x "$BIN/llama-quantize" ]; then
    [ -f "$SRC/CMakeLists.txt" ] || die "$SRC is not a llama.cpp source checkout"
    echo "building llama-bench and llama-quantize from $SRC into $WORK/build"
    cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >"$WORK/cmake.log"
    cmake --build "$WORK/build" -j 2 --target llama-bench llama-quantize >"$WORK/build.log"
  fi
fi
[ -x "$BIN/llama-bench" ] || die "no llama-bench in $BIN"

# 2. the bf16 GGUF of mistral_1b (keng's seed-0 weights), made as for scripts/bench/peers/llama_cpp.sh
if [ -z "$GGUF" ]; then
  GGUF="$WORK/mistral_1b-bf16.gguf"
  if [ ! -f "$GGUF" ]; then
    echo "writing mistral_1b (keng, seed 0) and converting it to $GGUF"
    "$ROOT/scripts/bench/peers/keng_to_gguf.sh" mistral_1b "$SRC" "$KENG" "$GGUF"
  fi
fi
[ -f "$GGUF" ] || die "no GGUF at $GGUF"

# 3. Q8_0 and Q4_0, every tensor (--pure: no Q6_K head or other k-quant mixtures). Without
# llama-quantize: gguf-py's quantizers (ggml's reference rounding) on every 2-D tensor, the 1-D
# norms kept F32, the metadata copied
for Q in Q8_0 Q4_0; do
  F="$WORK/mistral_1b-$Q.gguf"
  [ -f "$F" ] && continue
  if [ -x "$BIN/llama-quantize" ]; then
    echo "llama-quantize --pure $Q -> $F"
    "$BIN/llama-quantize" --pure "$GGUF" "$F" "$Q" >"$WORK/quantize-$Q.log" 2>&1 || die "llama-quantize failed (see $WORK/quantize-$Q.log)"
  else
    echo "gguf-py ($SRC/gguf-py) $Q -> $F"
    python3 - "$SRC/gguf-py" "$GGUF" "$F.part" "$Q" <<'EOF' || die "gguf-py quantization failed"
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import gguf
src, dst, qname = sys.argv[2], sys.argv[3], sys.argv[4]
T = gguf.GGMLQuantizationType
qtype = T[qname]
r = gguf.GGUFReader(src)
w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
for f in r.fields.values():
    if f.name.startswith("GGUF.") or f.name == "general.architecture":
        continue
    vt = f.types[0]
    w.add_key_value(f.name, f.contents(), vt, sub_type=f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
for t in r.tensors:
    data = np.asarray(t.data)
    if t.tensor_type == T.BF16:
        data = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    data = data.astype(np.float32).reshape(-1, int(t.shape[0]))
    if len(t.shape) >= 2 and t.shape[0] % 32 == 0:
        w.add_tensor(t.name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)  # shape from the bytes
    else:
        w.add_tensor(t.name, data.reshape(-1))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
EOF
    mv "$F.part" "$F"
  fi
done

# 4. the rows: each command under a wrapper that adds its peak RSS (getrusage of the child)
ROWS="$WORK/rows.jsonl"
: >"$ROWS"
measure() { # label framework threads cmd...
  python3 - "$@" >>"$ROWS" <<'EOF'
import json, resource, subprocess, sys
label, fw, threads, cmd = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
if r.returncode != 0:
    sys.stderr.write(r.stderr[-2000:])
    print(json.dumps({"label": label, "framework": fw, "threads": threads, "status": "failed"}))
    sys.exit(0)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
row = {"label": label, "framework": fw, "threads": threads, "status": "ok", "peak_mib": peak}
if fw == "keng":
    k = json.loads(r.stdout.strip().splitlines()[-1])
    row.update(ms_per_token=k["ms_per_token"], cpu_ms_per_token=k["cpu_ms_per_token"], alloc_mib=k["alloc_mib"], rss_mib=k["rss_mib"], peak_mib=k["peak_mib"], gb_per_s=k["gb_per_s"],
               weight_bytes=k["weight_bytes"], act=k["act"])
else:
    tg = next(x for x in json.loads(r.stdout) if x["n_gen"] > 0)
    row.update(ms_per_token=1e3 / tg["avg_ts"], rss_mib=peak, stddev_ts=tg["stddev_ts"])
print(json.dumps(row))
EOF
}
Q1B=(tests/lab/quant_1b.lua --tokens "$TOKENS" --repeats "$REPEATS" --format json)
cd "$ROOT"
for T in $THREADS; do
  echo "threads $T"
  measure "bf16" keng "$T" "$KENG" "${Q1B[@]}" --threads "$T"
  measure "int8 (keng.quantize)" keng "$T" "$KENG" "${Q1B[@]}" --threads "$T" --quantize int8
  measure "int4 (keng.quantize)" keng "$T" "$KENG" "${Q1B[@]}" --threads "$T" --quantize int4
  measure "Q8_0 GGUF" keng "$T" "$KENG" "${Q1B[@]}" --threads "$T" --gguf "$WORK/mistral_1b-Q8_0.gguf"
  measure "Q4_0 GGUF" keng "$T" "$KENG" "${Q1B[@]}" --threads "$T" --gguf "$WORK/mistral_1b-Q4_0.gguf"
  for Q in bf16 Q8_0 Q4_0; do
    F=$([ $Q = bf16 ] && echo "$GGUF" || echo "$WORK/mistral_1b-$Q.gguf")
    measure "$Q GGUF" llama.cpp "$T" "$BIN/llama-bench" -m "$F" -t "$T" -p 0 -n "$TOKENS" -r "$REPEATS" -o json
  done
done

# 5. the table
python3 - "$ROWS" "$(uptime)" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("\nmistral_1b decode, batch 1 (%s)" % sys.argv[2].strip())
print("%-22s %-9s %3s %10s %8s %8s %9s %9s %9s %9s" % ("weights", "framework", "thr", "ms/token", "cpu ms", "tok/s", "vs bf16",
      "RSS MiB", "peak MiB", "tensors"))
base = {(r["framework"], r["threads"]): r["ms_per_token"] for r in rows if r.get("status") == "ok" and r["label"].startswith("bf16")}
for r in rows:
    if r.get("status") != "ok":
        print("%-22s %-9s %3d  failed" % (r["label"], r["framework"], r["threads"]))
        continue
    b = base.get((r["framework"], r["threads"]))
    cpu = "%8.2f" % r["cpu_ms_per_token"] if "cpu_ms_per_token" in r else "%8s" % "-"
    alloc = "%9.0f" % r["alloc_mib"] if "alloc_mib" in r else "%9s" % "-"
    print("%-22s %-9s %3d %10.2f %s %8.2f %8.2fx %9.0f %9.0f %s" % (r["label"], r["framework"], r["threads"], r["ms_per_token"],
          cpu, 1e3 / r["ms_per_token"], b / r["ms_per_token"] if b else float("nan"), r["rss_mib"], r["peak_mib"], alloc))
kg = {(r["label"][:4], r["threads"]): r["ms_per_token"] for r in rows if r.get("status") == "ok" and r["framework"] == "keng"}
for r in rows:
    if r.get("status") == "ok" and r["framework"] == "llama.cpp" and r["label"][:4] in ("Q8_0", "Q4_0"):
        k = kg.get((r["label"][:4], r["threads"]))
        if k: print("keng %s / llama.cpp %s, %d threads: %.2fx the time" % (r["label"][:4], r["label"][:4], r["threads"], k / r["ms_per_token"]))
EOF
