#!/usr/bin/env python3
"""pytorch_cpu.py — the CPU-tier benchmark rows run with PyTorch + Hugging Face transformers,
so that `keng scripts/bench/all.lua --compare bench-results/pytorch.json` prints keng/PyTorch.

Same work as scripts/bench/{sam,stable_diffusion,bert,llm}.lua: the tiny configs of BENCH_SPEC.md
("CPU tier") built in SamModel / BertForSequenceClassification / GemmaForCausalLM /
MistralForCausalLM (transformers) and CLIPTextModel + UNet2DConditionModel + AutoencoderKL +
DDIMScheduler (diffusers) with random weights, the same synthetic inputs (scripts/bench/config.lua),
batch, dtype and thread count, and the same timing rules (one untimed warm-up step; generate:
(t(1 + N calls) - t(1 call)) / N; SD predict: (t(2 + N diffusion steps) - t(2 steps)) / N).
Writes the keng-bench/1 JSON schema (framework "pytorch").

Optional, never needed by tests. Requirements (pip):
    pip install torch==2.15.0 transformers==5.24.0 diffusers==0.42.1   # CPU wheels are enough
Usage:
    python3 scripts/bench/peers/pytorch_cpu.py [--steps 10] [--only bert,gemma] [--threads N]
        [--out bench-results/pytorch.json]
"""
import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import time

import torch
import torch.nn as nn
import transformers
from transformers import (BertConfig, BertForSequenceClassification, CLIPTextConfig, CLIPTextModel, GemmaConfig,
                          GemmaForCausalLM, MistralConfig, MistralForCausalLM, SamConfig, SamModel)

# ---- the rows (ids, Keras figures and CPU-tier sizes as in scripts/bench/config.lua) ---------
WORDS = 14
TOKEN_IDS = {
    "bert": {"cls": 101, "sep": 102,
             "words": [146, 1128, 1243, 1321, 1122, 1104, 1111, 1121, 1169, 1136, 1202, 1329, 1156, 4208]},
    "gemma": {"bos": 2, "words": [235285, 692, 947, 1987, 665, 576, 604, 774, 798, 780, 749, 1281, 1134, 3276]},
    "mistral": {"bos": 1, "words": [315, 368, 625, 1388, 378, 302, 354, 477, 541, 459, 511, 938, 682, 5081]},
}
ROWS = [
    ("sam_fit", "SegmentAnything fit", "sam", "fit", 1, "f32", "sam_tiny"),
    ("sam_predict", "SegmentAnything predict", "sam", "predict", 4, "f32", "sam_tiny"),
    ("sd_fit", "StableDiffusion fit", "stable_diffusion", "fit", 8, "f32", "sd_tiny"),
    ("sd_predict", "StableDiffusion predict", "stable_diffusion", "predict", 13, "f32", "sd_tiny"),
    ("bert_fit", "BERT fit", "bert", "fit", 32, "f32", "bert_tiny"),
    ("bert_predict", "BERT predict", "bert", "predict", 256, "f32", "bert_tiny"),
    ("gemma_fit", "Gemma fit", "gemma", "fit", 8, "bf16", "gemma_tiny"),
    ("gemma_generate_32", "Gemma generate", "gemma", "generate", 32, "bf16", "gemma_tiny"),
    ("gemma_generate_1", "Gemma generate", "gemma", "generate", 1, "bf16", "gemma_tiny"),
    ("mistral_fit", "Mistral fit", "mistral", "fit", 8, "bf16", "mistral_tiny"),
    ("mistral_generate_32", "Mistral generate", "mistral", "generate", 32, "bf16", "mistral_tiny"),
    ("mistral_generate_1", "Mistral generate", "mistral", "generate", 1, "bf16", "mistral_tiny"),
]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def tuple_n(n, length, k=WORDS):
    """the n-th (0-based) tuple of the cartesian product: n in base k, most significant first"""
    out = [0] * length
    for i in range(length - 1, -1, -1):
        out[i] = n % k
        n //= k
    return out


def word_ids(family, vocab):
    return [i % vocab for i in TOKEN_IDS[family]["words"]]


def bert_tokens(B, T, vocab=28996):
    ids, words = TOKEN_IDS["bert"], word_ids("bert", vocab)
    rows = [[ids["cls"]] + [words[w] for w in tuple_n(n, T - 2)] + [ids["sep"]] for n in range(B)]
    return torch.tensor(rows, dtype=torch.long)


def lm_batch(family, B, T, vocab):
    ids, words = TOKEN_IDS[family], word_ids(family, vocab)
    seqs = [[ids["bos"]] + [words[w] for w in tuple_n(n, T)] for n in range(B)]
    t = torch.tensor(seqs, dtype=torch.long)
    return t[:, :T].contiguous(), t[:, 1:].contiguous()


def lm_prompts(family, B, nwords, vocab):
    ids, words = TOKEN_IDS[family], word_ids(family, vocab)
    return torch.tensor([[ids["bos"]] + [words[w] for w in tuple_n(n, nwords)] for n in range(B)], dtype=torch.long)


# ---- models ----------------------------------------------------------------------------------
def bert_model():
    cfg = BertConfig(vocab_size=28996, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=512, max_position_embeddings=512, type_vocab_size=2,
                     hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-12, hidden_dropout_prob=0.1,
                     attention_probs_dropout_prob=0.1, num_labels=2)
    return BertForSequenceClassification(cfg)


def lm_model(family, dtype):
    if family == "gemma":
        cfg = GemmaConfig(vocab_size=32000, hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4, head_dim=64,
                          hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, rope_theta=10000.0,
                          tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2)
        m = GemmaForCausalLM(cfg)
    else:
        cfg = MistralConfig(vocab_size=32000, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                            num_attention_heads=8, num_key_value_heads=2, head_dim=32, hidden_act="silu",
                            sliding_window=4096, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                            pad_token_id=0, eos_token_id=2, bos_token_id=1)
        m = MistralForCausalLM(cfg)
    return m.to(dtype)


class LoRALinear(nn.Module):
    """Keras-style LoRA: y = x·Wᵀ + (x·A)·B, A [in, r] he_uniform, B [r, out] zeros, no alpha scaling."""

    def __init__(self, base, rank):
        super().__init__()
        self.base = base
        fan_in = base.in_features
        bound = math.sqrt(6.0 / fan_in)
        self.lora_a = nn.Parameter(torch.empty(fan_in, rank, dtype=base.weight.dtype).uniform_(-bound, bound))
        self.lora_b = nn.Parameter(torch.zeros(rank, base.out_features, dtype=base.weight.dtype))

    def forward(self, x):
        return self.base(x) + (x @ self.lora_a) @ self.lora_b


def enable_lora(model, rank=4, targets=("q_proj", "v_proj")):
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.model.layers:
        for name in targets:
            setattr(layer.self_attn, name, LoRALinear(getattr(layer.self_attn, name), rank))
    return [p for p in model.parameters() if p.requires_grad]


# ---- timing (the rules of scripts/lib/keng/bench.lua) ------------------------------------------
def time_steps(fn, steps):
    fn()  # warm-up, untimed
    secs = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        secs.append(time.perf_counter() - t0)
    return secs


# repeats of a difference-rule row (scripts/bench/config.lua diff_repeats.cpu)
DIFF_REPEATS = 3


def time_diff(fn, steps, short=1, repeats=DIFF_REPEATS):
    """(t(short + steps) - t(short)) / steps, `repeats` times (one value each), as keng's
    bench.run_diff with config.diff_repeats on the CPU tier"""
    fn(short)  # untimed
    per = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(short)
        t_short = time.perf_counter() - t0
        t0 = time.perf_counter()
        fn(short + steps)
        t_long = time.perf_counter() - t0
        if t_long < t_short:
            print(f"(noise: t({short}+N) {t_long:.3f}s < t({short}) {t_short:.3f}s) ", end="")
        per.append(max(t_long - t_short, 0.0) / steps)
    return per


# ---- SAM and Stable Diffusion (sizes of scripts/models/sam.lua sam_tiny and stable_diffusion.lua sd_tiny)
SAM_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
SAM_STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
SAM_POINTS = [[125.0, 93.75], [62.5, 93.75]]        # [[500, 375], [250, 375]] scaled to 256 / 1024
SAM_LABELS = [1, 2]
SD_PROMPT = "a photograph of an astronaut riding a horse"


def sam_model():
    vision = dict(hidden_size=192, output_channels=256, num_hidden_layers=4, num_attention_heads=3, image_size=256,
                  patch_size=16, mlp_dim=768, window_size=7, global_attn_indexes=[1, 3], layer_norm_eps=1e-6,
                  hidden_act="gelu", qkv_bias=True, use_abs_pos=True, use_rel_pos=True)
    prompt = dict(hidden_size=256, image_size=256, patch_size=16, mask_input_channels=16)
    decoder = dict(hidden_size=256, mlp_dim=2048, num_hidden_layers=2, num_attention_heads=8,
                   attention_downsample_rate=2, num_multimask_outputs=3, iou_head_depth=3, iou_head_hidden_dim=256)
    return SamModel(SamConfig(vision_config=vision, prompt_encoder_config=prompt, mask_decoder_config=decoder))


def sd_parts():
    from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel
    te = CLIPTextModel(CLIPTextConfig(vocab_size=49408, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=256, max_position_embeddings=77, hidden_act="quick_gelu",
                                      layer_norm_eps=1e-5, bos_token_id=49406, eos_token_id=49407, pad_token_id=49407))
    # attention_head_dim is the number of heads in diffusers' SD v1 configs (2 here)
    unet = UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4, block_out_channels=(32, 64, 128, 128),
                                layers_per_block=1, cross_attention_dim=64, attention_head_dim=2, norm_num_groups=8,
                                norm_eps=1e-5)
    vae = AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(32, 64, 128, 128),
                        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                        layers_per_block=2, latent_channels=4, norm_num_groups=8, sample_size=128,
                        scaling_factor=0.18215)
    sched = DDIMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                          clip_sample=False, set_alpha_to_one=False, steps_offset=1, timestep_spacing="leading",
                          prediction_type="epsilon")
    return te, unet, vae, sched


def byte_tokens(texts, vocab=49408, T=77):
    """keng's stand-in tokenizer for random-weight presets (models/stable_diffusion.lua ByteTokenizer):
    BOS (vocab - 2), one id per byte, EOS (vocab - 1), EOS padding"""
    rows = []
    for text in texts:
        row = [vocab - 2] + list(text.encode()[:T - 2]) + [vocab - 1]
        rows.append(row + [vocab - 1] * (T - len(row)))
    return torch.tensor(rows, dtype=torch.long)


def run_sam(task, B, steps):
    model = sam_model()
    info = {"params": sum(p.numel() for p in model.parameters())}
    images = torch.rand(B, 3, 256, 256)
    if task == "fit":
        enc = model.vision_encoder
        target = torch.rand(B, 256, 16, 16)
        opt = torch.optim.Adam(enc.parameters(), lr=1e-3, eps=1e-7)
        enc.train()

        def step():
            pred = enc((images - SAM_MEAN) / SAM_STD).last_hidden_state    # [B, 256, 16, 16]
            loss = nn.functional.mse_loss(pred, target)
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
        info.update(params=sum(p.numel() for p in enc.parameters()),
                    shapes={"images": [B, 3, 256, 256], "target": [B, 256, 16, 16]})
        return dict(info, **stats(time_steps(step, steps), steps, B))
    points = torch.tensor(SAM_POINTS).view(1, 1, 2, 2).expand(B, 1, 2, 2)
    labels = torch.tensor(SAM_LABELS).view(1, 1, 2).expand(B, 1, 2)
    model.eval()

    # multimask_output=True: the decoder computes all four mask tokens (as keng and Keras return
    # them) and HF keeps the last three, a free slice; the work is the same
    def step():
        return model(pixel_values=(images - SAM_MEAN) / SAM_STD, input_points=points, input_labels=labels,
                     multimask_output=True)
    with torch.inference_mode():
        info["shapes"] = {"images": [B, 3, 256, 256], "points": [B, 2, 2], "masks": [B, 4, 64, 64], "iou_pred": [B, 4]}
        return dict(info, **stats(time_steps(step, steps), steps, B))


def run_sd(task, B, steps):
    te, unet, vae, sched = sd_parts()
    if task == "fit":
        enc = vae.encoder                                                     # up to the 8-channel conv_out
        images, target = torch.rand(B, 3, 128, 128), torch.rand(B, 8, 16, 16)
        opt = torch.optim.Adam(enc.parameters(), lr=1e-3, eps=1e-7)
        enc.train()

        def step():
            loss = nn.functional.mse_loss(enc(images), target)
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
        info = {"params": sum(p.numel() for p in enc.parameters()),
                "shapes": {"images": [B, 3, 128, 128], "target": [B, 8, 16, 16]}}
        return dict(info, **stats(time_steps(step, steps), steps, B))
    for m in (te, unet, vae):
        m.eval()
    ids, neg = byte_tokens([SD_PROMPT] * B), byte_tokens([""])

    def text_to_image(k):
        """what keng's Pipeline:text_to_image does: encode, seeded noise, k DDIM steps with
        UNet(uncond) and UNet(cond) each at batch B and guidance 7.5, VAE decode to u8"""
        with torch.inference_mode():
            cond = te(ids).last_hidden_state                                 # [B, 77, 64]
            uncond = te(neg).last_hidden_state.expand(B, -1, -1).contiguous()
            lat = torch.randn(B, 4, 16, 16, generator=torch.Generator().manual_seed(0)) * sched.init_noise_sigma
            sched.set_timesteps(k)
            for t in sched.timesteps:
                eu = unet(lat, t, encoder_hidden_states=uncond).sample
                ec = unet(lat, t, encoder_hidden_states=cond).sample
                lat = sched.step(eu + 7.5 * (ec - eu), t, lat, eta=0.0).prev_sample
            img = vae.decode(lat / vae.config.scaling_factor).sample
            return ((img / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)
    r = stats(time_diff(text_to_image, steps, short=2), steps, B)
    r.update({"shapes": {"images": [B, 128, 128, 3], "latents": [B, 4, 16, 16]}, "prompt": SD_PROMPT,
              "guidance_scale": 7.5, "rule": f"(t({2 + steps} steps) - t(2 steps)) / {steps}",
              "params": sum(p.numel() for m in (te, unet, vae) for p in m.parameters())})
    return r


def stats(secs, steps, items):
    ms = [s * 1e3 for s in secs]
    mean = statistics.fmean(ms)
    return {"steps": steps, "times_ms": ms, "mean_ms": mean, "median_ms": statistics.median(ms),
            "min_ms": min(ms), "max_ms": max(ms), "stddev_ms": statistics.stdev(ms) if len(ms) > 1 else 0.0,
            "items_per_s": items / (mean / 1e3) if mean > 0 else 0.0, "warmup": 1}


def run_row(rid, family, task, B, dtype, steps):
    torch.manual_seed(0)
    if family == "sam":
        return run_sam(task, B, steps)
    if family == "stable_diffusion":
        return run_sd(task, B, steps)
    if family == "bert":
        T = 128
        model = bert_model()
        x = bert_tokens(B, T)
        seg, mask = torch.zeros(B, T, dtype=torch.long), torch.ones(B, T, dtype=torch.long)
        info = {"shapes": {"token_ids": [B, T], "segment_ids": [B, T], "padding_mask": [B, T]},
                "params": sum(p.numel() for p in model.parameters())}
        if task == "fit":
            y = torch.tensor([i % 2 for i in range(B)], dtype=torch.long)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.004, betas=(0.9, 0.999), eps=1e-7)
            model.train()

            def step():
                logits = model(input_ids=x, token_type_ids=seg, attention_mask=mask).logits
                loss = nn.functional.cross_entropy(logits.float(), y)
                opt.zero_grad(set_to_none=False)
                loss.backward()
                opt.step()
            return dict(info, **stats(time_steps(step, steps), steps, B))
        model.eval()
        with torch.inference_mode():
            return dict(info, **stats(time_steps(lambda: model(input_ids=x, token_type_ids=seg,
                                                               attention_mask=mask).logits, steps), steps, B))
    # Gemma / Mistral
    model = lm_model(family, DTYPES[dtype])
    vocab = model.config.vocab_size
    if task == "fit":
        T = 128
        params = enable_lora(model)
        x, y = lm_batch(family, B, T, vocab)
        opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.004, eps=1e-7)
        model.train()

        def step():
            logits = model(input_ids=x).logits.float()
            loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
        info = {"shapes": {"x": [B, T], "y": [B, T], "logits": [B, T, vocab]},
                "params": sum(p.numel() for p in model.parameters()), "trainable": sum(p.numel() for p in params)}
        return dict(info, **stats(time_steps(step, steps), steps, B * T))
    prompts = lm_prompts(family, B, 5, vocab)
    attn = torch.ones_like(prompts)
    model.eval()

    def gen(k):
        with torch.inference_mode():
            for _ in range(k):
                # min_length = max_length: EOS never stops a row, as in llm.lua (stop_token_ids = {})
                model.generate(input_ids=prompts, attention_mask=attn, max_length=50, min_length=50,
                               do_sample=False, pad_token_id=0)
    r = stats(time_diff(gen, steps), steps, B * (50 - prompts.shape[1]))
    r.update({"shapes": {"prompts": list(prompts.shape), "output": [B, 50]}, "max_length": 50,
              "params": sum(p.numel() for p in model.parameters())})
    return r


def diffusers_version():
    try:
        import diffusers
        return diffusers.__version__
    except ImportError:
        return None


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", default=None, help="families or row ids, comma-separated")
    ap.add_argument("--threads", type=int,
                    default=int(os.environ.get("KENG_NUM_THREADS", 0)) or os.cpu_count())
    ap.add_argument("--out", default="bench-results/pytorch.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    only = set(s.strip() for s in a.only.split(",")) if a.only else None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    device = cpu_name()
    print(f"pytorch {torch.__version__}, transformers {transformers.__version__} · cpu tier · {device} · "
          f"{torch.get_num_threads()} threads · {a.steps} timed steps per row")
    rows, failed = [], False
    for rid, name, family, task, B, dtype, preset in ROWS:
        if only and family not in only and rid not in only and not (family == "stable_diffusion" and "sd" in only):
            continue
        res = {"id": rid, "row": name, "family": family, "task": task, "batch": B, "dtype": dtype, "tier": "cpu",
               "device": device, "threads": torch.get_num_threads(), "preset": preset, "framework": "pytorch"}
        print(f"{name:24s} batch {B:<3d} {dtype:4s} {preset} ... ", end="", flush=True)
        try:
            res.update(run_row(rid, family, task, B, dtype, a.steps))
            res["status"] = "ok"
            print(f"{res['mean_ms']:.2f} ms/step (median {res['median_ms']:.2f}, min {res['min_ms']:.2f})")
        except Exception as e:  # a row that fails is reported and the suite goes on
            failed = True
            res.update(status="failed", reason=f"{type(e).__name__}: {e}".splitlines()[0])
            print("failed: " + res["reason"])
        rows.append(res)
    doc = {"schema": "keng-bench/1", "framework": "pytorch", "torch_version": torch.__version__,
           "transformers_version": transformers.__version__, "diffusers_version": diffusers_version(), "commit": commit,
           "date": datetime.date.today().isoformat(), "tier": "cpu", "device": device,
           "threads": torch.get_num_threads(), "steps": a.steps, "dtype": "keras", "rows": rows}
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")
    print("wrote " + a.out)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
