"""peer_spec.py — what every benchmark peer shares, without importing a framework: the rows of
scripts/bench/config.lua (ids, batches, dtypes), the sizes of each tier, the synthetic inputs
(token ids as lists), the timing loop and statistics of the keng-bench/1 schema, the machine's name and the
commit, and --only's row selection. peer_rows.py (PyTorch: pytorch_cpu.py, pytorch_gpu.py) and
keras3.py (Keras 3 on JAX, which cannot share a process with torch: their LLVMs clash) import it,
so the rows stay in step with config.lua in one place.
"""
import platform
import statistics
import subprocess
import time

# ---- the rows (ids, batches and dtypes as in scripts/bench/config.lua) -----------------------
WORDS = 14
TOKEN_IDS = {
    "bert": {"cls": 101, "sep": 102,
             "words": [146, 1128, 1243, 1321, 1122, 1104, 1111, 1121, 1169, 1136, 1202, 1329, 1156, 4208]},
    "gemma": {"bos": 2, "words": [235285, 692, 947, 1987, 665, 576, 604, 774, 798, 780, 749, 1281, 1134, 3276]},
    "mistral": {"bos": 1, "words": [315, 368, 625, 1388, 378, 302, 354, 477, 541, 459, 511, 938, 682, 5081]},
}
# id, name, family, task, batch, dtype
ROWS = [
    ("sam_fit", "SegmentAnything fit", "sam", "fit", 1, "f32"),
    ("sam_predict", "SegmentAnything predict", "sam", "predict", 4, "f32"),
    ("sd_fit", "StableDiffusion fit", "stable_diffusion", "fit", 8, "f32"),
    ("sd_predict", "StableDiffusion predict", "stable_diffusion", "predict", 13, "f32"),
    ("bert_fit", "BERT fit", "bert", "fit", 32, "f32"),
    ("bert_predict", "BERT predict", "bert", "predict", 256, "f32"),
    ("gemma_fit", "Gemma fit", "gemma", "fit", 8, "bf16"),
    ("gemma_generate_32", "Gemma generate", "gemma", "generate", 32, "bf16"),
    ("gemma_generate_1", "Gemma generate", "gemma", "generate", 1, "bf16"),
    ("mistral_fit", "Mistral fit", "mistral", "fit", 8, "bf16"),
    ("mistral_generate_32", "Mistral generate", "mistral", "generate", 32, "bf16"),
    ("mistral_generate_1", "Mistral generate", "mistral", "generate", 1, "bf16"),
]

# the sizes of each tier (docs/benchmarks.md): presets and inputs
TIERS = {
    "cpu": {
        "preset": {"sam": "sam_tiny", "stable_diffusion": "sd_tiny", "bert": "bert_tiny", "gemma": "gemma_tiny",
                   "mistral": "mistral_tiny"},
        "bert": dict(vocab_size=28996, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=512),
        "bert_seq": 128,
        "gemma": dict(vocab_size=32000, hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, head_dim=64),
        "mistral": dict(vocab_size=32000, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=2, head_dim=32),
        "sam_vision": dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=3, image_size=256, mlp_dim=768,
                           window_size=7, global_attn_indexes=[1, 3]),
        "sam_image": 256,
        "sam_points": [[125.0, 93.75], [62.5, 93.75]],      # [[500, 375], [250, 375]] scaled to 256 / 1024
        "clip": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256),
        # attention_head_dim is the number of heads in diffusers' SD v1 configs
        "unet": dict(block_out_channels=(32, 64, 128, 128), layers_per_block=1, cross_attention_dim=64,
                     attention_head_dim=2, norm_num_groups=8),
        "vae": dict(block_out_channels=(32, 64, 128, 128), norm_num_groups=8),
        "sd_image": 128,
    },
    "gpu": {
        "preset": {"sam": "sam_huge_sa1b", "stable_diffusion": "stable_diffusion_v1", "bert": "bert_base_en",
                   "gemma": "gemma_7b_en", "mistral": "mistral_7b_en"},
        "bert": dict(vocab_size=28996, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                     intermediate_size=3072),
        "bert_seq": 512,
        "gemma": dict(vocab_size=256000, hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
                      num_attention_heads=16, num_key_value_heads=16, head_dim=256),
        "mistral": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=128),
        "sam_vision": dict(hidden_size=1280, num_hidden_layers=32, num_attention_heads=16, image_size=1024,
                           mlp_dim=5120, window_size=14, global_attn_indexes=[7, 15, 23, 31]),
        "sam_image": 1024,
        "sam_points": [[500.0, 375.0], [250.0, 375.0]],
        "clip": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
        "unet": dict(block_out_channels=(320, 640, 1280, 1280), layers_per_block=2, cross_attention_dim=768,
                     attention_head_dim=8, norm_num_groups=32),
        "vae": dict(block_out_channels=(128, 256, 512, 512), norm_num_groups=32),
        "sd_image": 512,
    },
}
SAM_LABELS = [1, 2]
SD_PROMPT = "a photograph of an astronaut riding a horse"


def tuple_n(n, length, k=WORDS):
    """the n-th (0-based) tuple of the cartesian product: n in base k, most significant first"""
    out = [0] * length
    for i in range(length - 1, -1, -1):
        out[i] = n % k
        n //= k
    return out


def word_ids(family, vocab):
    return [i % vocab for i in TOKEN_IDS[family]["words"]]


def bert_rows(B, T, vocab=28996):
    """B token-id lists of length T: [CLS] words... [SEP], the n-th tuple of words in row n"""
    ids, words = TOKEN_IDS["bert"], word_ids("bert", vocab)
    return [[ids["cls"]] + [words[w] for w in tuple_n(n, T - 2)] + [ids["sep"]] for n in range(B)]


def lm_rows(family, B, T, vocab):
    """B token-id lists of length T + 1: BOS then the n-th tuple of T words (x = [:T], y = [1:])"""
    ids, words = TOKEN_IDS[family], word_ids(family, vocab)
    return [[ids["bos"]] + [words[w] for w in tuple_n(n, T)] for n in range(B)]


def prompt_rows(family, B, nwords, vocab):
    """B prompts: BOS then the n-th tuple of nwords words"""
    ids, words = TOKEN_IDS[family], word_ids(family, vocab)
    return [[ids["bos"]] + [words[w] for w in tuple_n(n, nwords)] for n in range(B)]


def time_steps(fn, steps, sync=lambda: None):
    """fn() once untimed (the warm-up: builds, compiles), then `steps` timed calls -> seconds each.
    sync() runs before each clock read, so queued device work counts in the step that queued it
    (torch.cuda.synchronize; JAX's block_until_ready goes inside fn): keng.bench.run's rule."""
    fn()
    secs = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        secs.append(time.perf_counter() - t0)
    return secs


def stats(secs, steps, items):
    ms = [s * 1e3 for s in secs]
    mean = statistics.fmean(ms)
    return {"steps": steps, "times_ms": ms, "mean_ms": mean, "median_ms": statistics.median(ms),
            "min_ms": min(ms), "max_ms": max(ms), "stddev_ms": statistics.stdev(ms) if len(ms) > 1 else 0.0,
            "items_per_s": items / (mean / 1e3) if mean > 0 else 0.0, "warmup": 1}


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def select_rows(only):
    """the rows named by `only` (families or row ids, comma-separated; "sd" = stable_diffusion) in
    the order named, else every row in config.lua's order; unknown names raise"""
    if not only:
        return list(ROWS)
    out = []
    for name in (s.strip() for s in only.split(",") if s.strip()):
        name = "stable_diffusion" if name == "sd" else name
        hit = [r for r in ROWS if name in (r[0], r[2])]
        if not hit:
            raise SystemExit(f"--only: '{name}' is no row id or family (rows: {', '.join(r[0] for r in ROWS)})")
        out += [r for r in hit if r not in out]
    return out
