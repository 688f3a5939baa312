#!/usr/bin/env python3
"""make_corpus.py — writes the seed corpora tests/fuzz/corpus/<target>/ from the test fixtures
plus hand-made malformed files (truncated, huge lengths, overlapping offsets, bad UTF-8, deep
nesting). Deterministic; rerun after fixtures change. Standard library only."""
import json, os, struct, zlib

TOP = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FIX = os.path.join(TOP, "tests", "fixtures")
OUT = os.path.join(TOP, "tests", "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(*p):
    with open(os.path.join(FIX, *p), "rb") as f:
        return f.read()


def st(header, data=b"", hlen=None):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


# ---- safetensors -----------------------------------------------------------------------------
ok = {"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
      "b": {"dtype": "I64", "shape": [1], "data_offsets": [16, 24]},
      "__metadata__": {"format": "pt"}}
put("safetensors", "ok", st(ok, bytes(range(24))))
put("safetensors", "golden_head", read("bert", "golden.safetensors")[:4096])
put("safetensors", "empty_tensor", st({"e": {"dtype": "BF16", "shape": [0, 3], "data_offsets": [0, 0]}}))
put("safetensors", "truncated", st(ok, bytes(range(24)))[:40])
put("safetensors", "huge_header_len", st(ok, b"", hlen=2**63))
put("safetensors", "header_past_end", st(ok, b"", hlen=5000))
put("safetensors", "overlap", st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)))
put("safetensors", "offsets_past_end", st({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 2**64 - 1]}}, bytes(4)))
put("safetensors", "shape_overflow", st({"a": {"dtype": "F64", "shape": [2**32, 2**32, 16], "data_offsets": [0, 0]}}))
put("safetensors", "size_mismatch", st({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)))
put("safetensors", "bad_dtype", st({"a": {"dtype": "Q4_K", "shape": [1], "data_offsets": [0, 1]}}, bytes(1)))
put("safetensors", "bad_utf8_name", st(b'{"\xff\xfe":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"x"))
put("safetensors", "dup_name", st(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"x"))
put("safetensors", "deep", st(b'{"a":' + b"[" * 200 + b"]" * 200 + b"}"))
put("safetensors", "pickle", b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01" + bytes(32))
put("safetensors", "zip", b"PK\x03\x04" + bytes(60))
put("safetensors", "gap", st({"a": {"dtype": "U8", "shape": [1], "data_offsets": [4, 5]}}, bytes(5)))

# ---- JSON (safetensors headers, index.json, config.json) ------------------------------------
for name, path in [("bert_config", ("bert", "config.json")), ("gemma_config", ("gemma", "config.json")),
                   ("unet_config", ("sd", "unet", "config.json")), ("sam_config", ("sam", "config.json")),
                   ("clip_config", ("clip", "text_encoder", "config.json"))]:
    put("json", name, read(*path))
    put("config", name, read(*path))
idx = {"metadata": {"total_size": 11}, "weight_map": {"a": "shard.safetensors", "b": "shard.safetensors"}}
put("json", "index", json.dumps(idx))
json_bad = {
    "deep_array": "[" * 60000,
    "deep_object": '{"a":' * 5000 + "1" + "}" * 5000,
    "bad_utf8": b'{"k\xc0\xaf": "\xed\xa0\x80"}',
    "lone_surrogate": '["\\ud800", "\\udc00x"]',
    "pair": '["\\ud83d\\ude00", "\\u0000"]',
    "control": '["a\x01b"]',
    "dup_keys": '{"a": 1, "a": 2}',
    "numbers": "[1e999, -0, 18446744073709551615, 18446744073709551616, 1.5e-400, -1, 0.1e+2]",
    "trailing": '{"a": 1} x',
    "unterminated": '{"a": "abc',
    "bom": b'\xef\xbb\xbf{"a": 1}',
    "literals": "[true, false, null, tru, nul]",
    "empty": "",
}
for k, v in json_bad.items():
    put("json", k, v)
    put("config", k, v)
put("config", "bad_escape", '{"a": "\\u12", "b": "\\x"}')
put("config", "neg", '{"n": -, "m": 1e}')
# nulls read as absent by models.common.read_json (HF writes unset options as null)
put("config", "nulls", '{"sliding_window": null, "head_dim": null, "ids": [1, null, 2, null], '
                       '"vision_config": {"mlp_dim": null, "global": [null]}, "a": null}')
# Python's non-finite tokens: read by keng.json (config), refused by the strict reader (json)
nonfinite = '{"lambda_min_clipped": -Infinity, "x": [NaN, Infinity, -NaN, Inf, -Infinityx]}'
put("config", "nonfinite", nonfinite)
put("json", "nonfinite", nonfinite)
put("config", "dpm_scheduler", read("json", "dpm", "scheduler_config.json"))
put("config", "top_null", "null")
put("config", "not_object", "[1, 2]")

# ---- index.json (next to a valid shard.safetensors holding a and b) ---------------------------
put("safetensors_index", "ok", json.dumps(idx))
put("safetensors_index", "escape", json.dumps({"weight_map": {"a": "../shard.safetensors"}}))
put("safetensors_index", "absolute", json.dumps({"weight_map": {"a": "/etc/passwd"}}))
put("safetensors_index", "missing", json.dumps({"weight_map": {"a": "shard.safetensors", "c": "shard.safetensors"}}))
put("safetensors_index", "wrong_shard", json.dumps({"weight_map": {"a": "other.safetensors", "b": "shard.safetensors"}}))
put("safetensors_index", "inner_nul", '{"weight_map": {"a": "shard.safetensors\\u0000x"}}')
put("safetensors_index", "not_object", '{"weight_map": []}')
put("safetensors_index", "self", json.dumps({"weight_map": {"a": "model.safetensors.index.json"}}))

# ---- SentencePiece ---------------------------------------------------------------------------
for m in ("bpe.model", "bpe_gemma.model"):
    put("sentencepiece", m, read("sentencepiece", m))
uni = read("sentencepiece", "unigram.model")
put("sentencepiece", "unigram_head", uni[:8000])
put("sentencepiece", "truncated", read("sentencepiece", "bpe.model")[:777])


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def field(num, wire, payload):
    return varint(num << 3 | wire) + (varint(len(payload)) + payload if wire == 2 else payload)


def piece(s, score=0.0, typ=1):
    body = field(1, 2, s) + field(2, 5, struct.pack("<f", score)) + field(3, 0, varint(typ))
    return field(1, 2, body)


good = piece(b"<unk>", 0, 2) + piece(b"<s>", 0, 3) + piece(b"</s>", 0, 3) + piece(b"\xe2\x96\x81a", -1) + piece(b"b", -2)
put("sentencepiece", "tiny", good + field(2, 2, field(3, 0, varint(2))))
put("sentencepiece", "huge_len", field(1, 2, b"")[:1] + varint(2**62) + b"abc")
put("sentencepiece", "bad_utf8_piece", good + piece(b"\xff\xfe"))
put("sentencepiece", "byte_pieces", good + piece(b"<0x41>", 0, 6) + piece(b"<0xZZ>", 0, 6) + field(2, 2, field(3, 0, varint(2)) + field(35, 0, varint(1))))
put("sentencepiece", "deep_group", b"\x0b" * 50 + b"\x0c" * 50)
put("sentencepiece", "varint_overlong", b"\x08" + b"\xff" * 12)

# ---- WordPiece vocab.txt ---------------------------------------------------------------------
put("wordpiece", "bert_vocab", read("bert", "vocab.txt"))
put("wordpiece", "no_unk", "hello\n##lo\nworld\n")
put("wordpiece", "bad_utf8", b"[UNK]\n\xff\xfe\n##\xc3\n\xed\xa0\x80\n")
put("wordpiece", "crlf_dups", "[UNK]\r\n[CLS]\r\n[CLS]\r\n\r\n##\r\nhello\r\n")
put("wordpiece", "long_line", "[UNK]\n" + "x" * 5000 + "\n")
put("wordpiece", "empty", "")

# ---- CLIP vocab.json + merges.txt (NUL separates the two files) --------------------------------
cv, cm = read("clip", "tokenizer", "vocab.json"), read("clip", "tokenizer", "merges.txt")
put("clip_bpe", "fixture", cv + b"\0" + cm)
small_v = b'{"a": 0, "b": 1, "ab": 2, "a</w>": 3, "b</w>": 4, "<|startoftext|>": 5, "<|endoftext|>": 6}'
put("clip_bpe", "small", small_v + b"\0#version: 0.2\na b\n")
put("clip_bpe", "vocab_only", small_v)
put("clip_bpe", "bad_ids", b'{"a": -1, "b": 99999999999, "c": 1.5, "d": "x", "<|endoftext|>": 0}\0a b\n')
put("clip_bpe", "dup_ids", b'{"a": 0, "b": 0, "<|startoftext|>": 1, "<|endoftext|>": 1}\0a b\na\n b \n\n')
put("clip_bpe", "merges_unknown", small_v + b"\0#version: 0.2\nzz yy\na\nab b c\n\xff \xfe\n")
put("clip_bpe", "no_specials", b'{"a": 0}\0')

# ---- PNG ---------------------------------------------------------------------------------------
def chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)


def png(w, h, depth=8, ctype=2, rows=None, extra=b"", interlace=0):
    ch = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[ctype]
    bpr = (w * ch * depth + 7) // 8
    raw = rows if rows is not None else b"".join(b"\0" + bytes((x * 7 + y) % 256 for x in range(bpr)) for y in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, interlace)) + extra
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


put("png", "rgb", png(4, 3))
put("png", "gray16", png(3, 2, 16, 0))
put("png", "rgba", png(2, 2, 8, 6))
put("png", "palette", png(2, 2, 8, 3, extra=chunk(b"PLTE", bytes(range(12)))))
put("png", "interlaced", png(5, 5, 8, 2, interlace=1))
put("png", "truncated", png(4, 3)[:50])
put("png", "huge_dims", png(100000, 100000, rows=b"\0" * 64))
put("png", "big_dims", png(30000, 30000, rows=b"\0" * 64))
good = png(4, 3)
put("png", "bad_crc", good[:41] + bytes([good[41] ^ 1]) + good[42:])  # a flipped IDAT byte
put("png", "short_idat", png(8, 8, rows=b"\0\1\2"))

# ---- JPEG (PIL-written fixtures of tests/fixtures/gen/gen_image.py, and damaged copies) ------
for name in ["photo", "progressive", "gray", "cmyk"]:
    put("jpeg", name, read("image", name + ".jpg"))
jp = read("image", "photo.jpg")
put("jpeg", "truncated", jp[:300])
sof = jp.index(b"\xff\xc0") + 5  # SOF0: length, precision, then height and width
put("jpeg", "huge_dims", jp[:sof] + struct.pack(">HH", 65000, 65000) + jp[sof + 4:])
put("jpeg", "zero_dims", jp[:sof] + struct.pack(">HH", 0, 0) + jp[sof + 4:])
put("jpeg", "garbage_scan", jp[:-40] + bytes(range(30)) + b"\xff\xd9")

# ---- tokenizer.json: the JSON, then a NUL and the text to encode ------------------------------
TEXT = "Hello w\u00f6rld  I'm <|endoftext|> 123 \u4e2d\u6587 e\u0301 \U0001F600\r\n\t x".encode()
for name in ["gpt2", "llama3", "bert", "t5", "unigram_bf", "misc", "pieces", "regex_deepseek"]:
    put("tokenizer_json", name, read("tokenizer_json", name + ".json") + b"\0" + TEXT)


def tj(model, **parts):
    j = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": parts.pop("added", []),
         "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None, "model": model}
    j.update(parts)
    return json.dumps(j).encode()


bpe = {"type": "BPE", "dropout": None, "unk_token": "u", "continuing_subword_prefix": "##", "end_of_word_suffix": "</w>",
       "fuse_unk": True, "byte_fallback": True, "ignore_merges": True,
       "vocab": {"u": 0, "a": 1, "b": 2, "##b": 3, "ab": 4, "<0x41>": 5, "a</w>": 6}, "merges": [["a", "##b"], "a b"]}
put("tokenizer_json", "bpe_affixes", tj(bpe, added=[{"id": 7, "content": "<x>", "single_word": True, "lstrip": True,
    "rstrip": True, "normalized": True, "special": True}]) + b"\0ab <x> A b\xc3\xa9")
put("tokenizer_json", "every_component", tj(
    {"type": "WordPiece", "unk_token": "[U]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 5,
     "vocab": {"[U]": 0, "a": 1, "##b": 2, "[S]": 3}},
    normalizer={"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "BertNormalizer", "clean_text": True,
        "handle_chinese_chars": True, "strip_accents": None, "lowercase": True}, {"type": "Prepend", "prepend": "_"},
        {"type": "Replace", "pattern": {"Regex": "(?i:x+?y|(?>a+)b)"}, "content": "-"}, {"type": "Strip",
        "strip_left": True, "strip_right": False}, {"type": "Nmt"}, {"type": "NFD"}, {"type": "StripAccents"}]},
    pre_tokenizer={"type": "Sequence", "pretokenizers": [{"type": "Metaspace", "replacement": "_", "prepend_scheme": "first",
        "split": True}, {"type": "Split", "pattern": {"Regex": "\\p{L}{1,3}+|\\s+(?!\\S)|[^\\w\\s]"}, "behavior": "Contiguous",
        "invert": True}, {"type": "Punctuation", "behavior": "MergedWithNext"}, {"type": "Digits", "individual_digits": True},
        {"type": "BertPreTokenizer"}, {"type": "Whitespace"}, {"type": "WhitespaceSplit"}]},
    post_processor={"type": "Sequence", "processors": [{"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
        "use_regex": True}, {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "[S]", "type_id": 0}},
        {"Sequence": {"id": "A", "type_id": 0}}], "pair": [{"Sequence": {"id": "A", "type_id": 0}},
        {"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": {"[S]": {"id": "[S]", "ids": [3, 0], "tokens": ["[S]", "[U]"]}}}]},
    decoder={"type": "Sequence", "decoders": [{"type": "WordPiece", "prefix": "##", "cleanup": True}, {"type": "ByteFallback"},
        {"type": "Metaspace", "replacement": "_", "prepend_scheme": "always", "split": True}, {"type": "Strip", "content": "a",
        "start": 3, "stop": 9}, {"type": "Replace", "pattern": {"String": "b"}, "content": "cc"}, {"type": "Fuse"},
        {"type": "ByteLevel"}, {"type": "BPEDecoder", "suffix": "</w>"}]}) + b"\0aB ab xxy 12 \xe4\xb8\xad,!")
put("tokenizer_json", "unigram_unk", tj({"type": "Unigram", "unk_id": 0, "byte_fallback": True,
    "vocab": [["<unk>", 0.0], ["a", -1.5], ["ab", -2.0], ["<0x62>", -3.0], ["\u2581", -1.0]]},
    pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}) + b"\0abbc a\xc3\xa9")
put("tokenizer_json", "bad_regex", tj(bpe, pre_tokenizer={"type": "Split", "pattern": {"Regex": "((a|b)*)*c(?<=x)"},
    "behavior": "Isolated", "invert": False}))
put("tokenizer_json", "deep_regex", tj(bpe, pre_tokenizer={"type": "Split", "pattern": {"Regex": "(" * 60 + "a" + ")*" * 60},
    "behavior": "Removed", "invert": False}) + b"\0" + b"a" * 3000)
put("tokenizer_json", "precompiled_bad", tj(bpe, normalizer={"type": "Precompiled", "precompiled_charsmap": "CAAAAP////8AAAAA"}))
put("tokenizer_json", "not_object", b"[1, 2]\0x")

# ---- GGUF (engine/io/gguf.c): fixtures small enough, and malformed files, also kept as
# tests/fixtures/bad/gguf_*.gguf (tests/lua/bad_files_spec.lua) -----------------------------------
def gstr(s):
    b = s if isinstance(s, bytes) else s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf(kvs=(), tensors=(), data=b"", version=3, nt=None, nkv=None, align=32):
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if nt is None else nt, len(kvs) if nkv is None else nkv)
    for key, typ, payload in kvs:
        out += gstr(key) + struct.pack("<I", typ) + payload
    for name, dims, typ, off in tensors:
        out += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", typ, off)
    out += bytes(-len(out) % align)
    return out + data


def put_bad_gguf(name, data):
    put("gguf", name, data)
    with open(os.path.join(FIX, "bad", "gguf_" + name + ".gguf"), "wb") as f:
        f.write(data)


for name in ["types", "gemma-q8_0", "mistral-q4_0", "spm", "bpe"]:
    put("gguf", name, read("gguf", name + ".gguf"))
u32 = lambda k, v: (k, 4, struct.pack("<I", v))
f32_4 = ("w", [4], 0, 0)
okg = gguf([u32("a.b", 7), ("s", 8, gstr("hi")), ("arr", 9, struct.pack("<IQ", 8, 2) + gstr("x") + gstr("yz"))],
           [f32_4, ("h", [2, 2], 1, 32)], bytes(range(40)))
put("gguf", "ok", okg)
put("gguf", "q4_0", gguf([], [("q", [32, 2], 2, 0)], bytes(range(36))))
put("gguf", "q4_k", gguf([], [("k", [256], 12, 0), ("s", [256], 14, 160)], bytes(range(144)) + bytes(16) + bytes(range(210))))
put("gguf", "nested", gguf([("n", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 5, 1) + struct.pack("<i", -3))]))
put("gguf", "align_1", gguf([u32("general.alignment", 1)], [("w", [3], 1, 1), ("v", [1], 0, 7)], bytes(11), align=1))
put_bad_gguf("truncated", okg[:-60])
put_bad_gguf("huge_tensor_count", gguf(nt=2**62))
put_bad_gguf("huge_kv_count", gguf(nkv=2**63))
put_bad_gguf("huge_string", gguf([("k", 8, struct.pack("<Q", 2**63) + b"x")]))
put_bad_gguf("huge_array", gguf([("k", 9, struct.pack("<IQ", 6, 2**60) + bytes(8))]))
put_bad_gguf("offset_past_end", gguf([], [("w", [4], 0, 64)], bytes(16)))
put_bad_gguf("misaligned", gguf([], [("w", [2], 0, 4)], bytes(16)))
put_bad_gguf("bad_alignment", gguf([u32("general.alignment", 3)], [f32_4], bytes(16)))
put_bad_gguf("unknown_type", gguf([], [("w", [4], 99, 0)], bytes(16)))
put_bad_gguf("unsupported_type", gguf([], [("w", [256], 13, 0)], bytes(176)))
put_bad_gguf("overlap", gguf([], [("a", [8], 0, 0), ("b", [8], 0, 0)], bytes(32)))
put_bad_gguf("dims_overflow", gguf([], [("w", [2**32, 2**32, 2**32], 0, 0)], bytes(16)))
put_bad_gguf("block_row", gguf([], [("w", [33], 2, 0)], bytes(36)))
put_bad_gguf("too_many_dims", gguf([], [("w", [1, 1, 1, 1, 1], 0, 0)], bytes(16)))
put_bad_gguf("version_1", gguf(version=1))
put_bad_gguf("big_endian", b"GGUF" + struct.pack(">IQQ", 3, 0, 0))
put_bad_gguf("bad_bool", gguf([("b", 7, b"\x02")]))
put_bad_gguf("dup_key", gguf([u32("k", 1), u32("k", 2)]))
put_bad_gguf("dup_tensor", gguf([], [("w", [4], 0, 0), ("w", [4], 0, 32)], bytes(48)))
put_bad_gguf("deep_array", gguf([("d", 9, struct.pack("<IQ", 9, 1) * 9 + struct.pack("<IQ", 0, 0))]))
put_bad_gguf("not_gguf", b"GGML" + bytes(20))
