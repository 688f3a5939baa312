#!/usr/bin/env bash
# keng_to_gguf.sh — one of scripts/bench/decode.lua's models (random weights, seed 0) as a bf16
# GGUF made by llama.cpp's own converter, for the llama.cpp rows (peers/llama_cpp.sh, quant.sh):
#
#   scripts/bench/peers/keng_to_gguf.sh MODEL LLAMA_CPP_SRC KENG OUT.gguf
#
#   1. keng writes the model as a Hugging Face checkpoint (`decode.lua --model MODEL --save`) in
#      OUT.gguf's directory, named MODEL;
#   2. a stand-in sentencepiece tokenizer.model of the checkpoint's vocab_size is added (<unk>,
#      <s>, </s>, then words): convert_hf_to_gguf.py needs one, decode speed does not depend on it;
#   3. LLAMA_CPP_SRC/convert_hf_to_gguf.py --outtype bf16 writes OUT.gguf (its log beside it,
#      MODEL-convert.log).
# Needs python3 with numpy, torch, sentencepiece (the converter's requirements).
set -euo pipefail

die() { echo "keng_to_gguf.sh: $*" >&2; exit 2; }
[ $# -eq 4 ] || die "usage: $0 MODEL LLAMA_CPP_SRC KENG OUT.gguf"
M=$1 SRC=$2 KENG=$3 OUT=$4
[ -f "$SRC/convert_hf_to_gguf.py" ] || die "$SRC has no convert_hf_to_gguf.py (not a llama.cpp source checkout)"
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
KENG=$(cd "$(dirname "$KENG")" && pwd)/$(basename "$KENG")
DIR=$(cd "$(dirname "$OUT")" && pwd)
CK="$DIR/$M"

rm -rf "$CK"
(cd "$ROOT" && "$KENG" scripts/bench/decode.lua --model "$M" --save "$CK")
VOCAB=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$CK/config.json")
[ -f "$CK/tokenizer.model" ] || python3 - "$CK/tokenizer.model" "$VOCAB" <<'PY'
import sys
from sentencepiece import sentencepiece_model_pb2 as pb
path, n = sys.argv[1], int(sys.argv[2])
m = pb.ModelProto()
for i in range(n):
    p = m.pieces.add()
    p.piece, p.score, p.type = {0: ("<unk>", 0.0, 2), 1: ("<s>", 0.0, 3), 2: ("</s>", 0.0, 3)}.get(
        i, ("\u2581w%d" % i, -float(i), 1))
m.trainer_spec.model_type = 1
m.trainer_spec.vocab_size = n
m.trainer_spec.unk_id, m.trainer_spec.bos_id, m.trainer_spec.eos_id, m.trainer_spec.pad_id = 0, 1, 2, -1
m.normalizer_spec.name = "identity"
m.normalizer_spec.add_dummy_prefix = False
open(path, "wb").write(m.SerializeToString())
PY
python3 "$SRC/convert_hf_to_gguf.py" "$CK" --outtype bf16 --outfile "$OUT" >"$DIR/$M-convert.log" 2>&1 ||
  die "convert_hf_to_gguf.py failed on $CK (see $DIR/$M-convert.log)"
