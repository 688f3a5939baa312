"""peer_rows.py — the benchmark rows of scripts/bench/config.lua in PyTorch + Hugging Face
transformers (and diffusers for Stable Diffusion), shared by the two peers:

    pytorch_cpu.py   the CPU tier (docs/benchmarks.md's tiny configs) on the CPU
    pytorch_gpu.py   the GPU tier (docs/benchmarks.md's full sizes) on a CUDA device, eager

Same work as scripts/bench/{sam,stable_diffusion,bert,llm}.lua: SamModel /
BertForSequenceClassification / GemmaForCausalLM / MistralForCausalLM and CLIPTextModel +
UNet2DConditionModel + AutoencoderKL + DDIMScheduler with random weights, the same synthetic inputs
(scripts/bench/config.lua), batch and dtype, and the same timing rules (one untimed warm-up step,
the device synchronised before each clock read; generate: (t(1 + N calls) - t(1 call)) / N; SD
predict: (t(2 + N diffusion steps) - t(2 steps)) / N). Writes the keng-bench/1 JSON schema
(framework "pytorch") with the row ids of all.lua, so `all.lua --compare` and tests/gpu's summary
pair the rows.
"""
import datetime
import gc
import json
import math
import os
import time

import torch
import torch.nn as nn
import transformers
from transformers import (BertConfig, BertForSequenceClassification, CLIPTextConfig, CLIPTextModel, GemmaConfig,
                          GemmaForCausalLM, MistralConfig, MistralForCausalLM, SamConfig, SamModel)

# ---- the rows, tiers and inputs: peer_spec.py (shared with keras3.py) -------------------------
from peer_spec import (ROWS, SAM_LABELS, SD_PROMPT, TIERS, TOKEN_IDS, WORDS, bert_rows, cpu_name,  # noqa: E402,F401
                       git_commit, lm_rows, prompt_rows, select_rows, stats, time_steps, tuple_n, word_ids)

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def bert_tokens(B, T, vocab=28996):
    return torch.tensor(bert_rows(B, T, vocab), dtype=torch.long)


def lm_batch(family, B, T, vocab):
    t = torch.tensor(lm_rows(family, B, T, vocab), dtype=torch.long)
    return t[:, :T].contiguous(), t[:, 1:].contiguous()


def lm_prompts(family, B, nwords, vocab):
    return torch.tensor(prompt_rows(family, B, nwords, vocab), dtype=torch.long)


# ---- models ----------------------------------------------------------------------------------
def bert_model(tier):
    cfg = BertConfig(**TIERS[tier]["bert"], max_position_embeddings=512, type_vocab_size=2,
                     hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-12, hidden_dropout_prob=0.1,
                     attention_probs_dropout_prob=0.1, num_labels=2)
    return BertForSequenceClassification(cfg)


def lm_model(family, tier):
    if family == "gemma":
        cfg = GemmaConfig(**TIERS[tier]["gemma"], hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                          rope_theta=10000.0, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2)
        return GemmaForCausalLM(cfg)
    cfg = MistralConfig(**TIERS[tier]["mistral"], hidden_act="silu", sliding_window=4096, rms_norm_eps=1e-5,
                        rope_theta=10000.0, tie_word_embeddings=False, pad_token_id=0, eos_token_id=2, bos_token_id=1)
    return MistralForCausalLM(cfg)


class LoRALinear(nn.Module):
    """Keras-style LoRA: y = x·Wᵀ + (x·A)·B, A [in, r] he_uniform, B [r, out] zeros, no alpha scaling."""

    def __init__(self, base, rank):
        super().__init__()
        self.base = base
        fan_in = base.in_features
        bound = math.sqrt(6.0 / fan_in)
        w = base.weight
        self.lora_a = nn.Parameter(torch.empty(fan_in, rank, dtype=w.dtype, device=w.device).uniform_(-bound, bound))
        self.lora_b = nn.Parameter(torch.zeros(rank, base.out_features, dtype=w.dtype, device=w.device))

    def forward(self, x):
        return self.base(x) + (x @ self.lora_a) @ self.lora_b


def enable_lora(model, rank=4, targets=("q_proj", "v_proj")):
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.model.layers:
        for name in targets:
            setattr(layer.self_attn, name, LoRALinear(getattr(layer.self_attn, name), rank))
    return [p for p in model.parameters() if p.requires_grad]


def sam_model(tier):
    t = TIERS[tier]
    vision = dict(t["sam_vision"], output_channels=256, patch_size=16, layer_norm_eps=1e-6, hidden_act="gelu",
                  qkv_bias=True, use_abs_pos=True, use_rel_pos=True)
    prompt = dict(hidden_size=256, image_size=t["sam_image"], patch_size=16, mask_input_channels=16)
    decoder = dict(hidden_size=256, mlp_dim=2048, num_hidden_layers=2, num_attention_heads=8,
                   attention_downsample_rate=2, num_multimask_outputs=3, iou_head_depth=3, iou_head_hidden_dim=256)
    return SamModel(SamConfig(vision_config=vision, prompt_encoder_config=prompt, mask_decoder_config=decoder))


def diffusers_version():
    try:
        import diffusers
        return diffusers.__version__
    except ImportError:
        return None


class NotAvailable(Exception):
    """a row this machine cannot run (a missing package): reported as status 'not available'"""


def sd_parts(tier):
    try:
        from diffusers import AutoencoderKL, UNet2DConditionModel
    except ImportError as e:
        raise NotAvailable(f"diffusers is not installed ({e}); carry its wheel (tests/gpu/prepare.sh)") from None
    t = TIERS[tier]
    te = CLIPTextModel(CLIPTextConfig(vocab_size=49408, **t["clip"], max_position_embeddings=77,
                                      hidden_act="quick_gelu", layer_norm_eps=1e-5, bos_token_id=49406,
                                      eos_token_id=49407, pad_token_id=49407))
    unet = UNet2DConditionModel(sample_size=t["sd_image"] // 8, in_channels=4, out_channels=4, norm_eps=1e-5,
                                **t["unet"])
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=2, latent_channels=4,
                        sample_size=t["sd_image"], scaling_factor=0.18215, **t["vae"])
    return te, unet, vae


def ddim_scheduler():
    """SD v1's DDIM schedule; made outside Runner.build so that its tables stay on the host, as in
    diffusers' pipelines"""
    from diffusers import DDIMScheduler
    return DDIMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                         clip_sample=False, set_alpha_to_one=False, steps_offset=1, timestep_spacing="leading",
                         prediction_type="epsilon")


def byte_tokens(texts, vocab=49408, T=77):
    """keng's stand-in tokenizer for random-weight presets (models/stable_diffusion.lua ByteTokenizer):
    BOS (vocab - 2), one id per byte, EOS (vocab - 1), EOS padding"""
    rows = []
    for text in texts:
        row = [vocab - 2] + list(text.encode()[:T - 2]) + [vocab - 1]
        rows.append(row + [vocab - 1] * (T - len(row)))
    return torch.tensor(rows, dtype=torch.long)


# ---- timing (the rules of scripts/lib/keng/bench.lua) ------------------------------------------
class Runner:
    """one tier on one device: builds the row's models there and times them"""

    def __init__(self, tier, device, diff_repeats):
        self.tier, self.device, self.repeats = tier, torch.device(device), diff_repeats
        self.sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)

    def clock(self):
        self.sync()
        return time.perf_counter()

    def time_steps(self, fn, steps):
        """peer_spec.time_steps on this device (a cuda step is synchronised before each clock read)"""
        return time_steps(fn, steps, self.sync)

    def time_diff(self, fn, steps, short=1):
        """(t(short + steps) - t(short)) / steps, `repeats` times (one value each), as keng's
        bench.run_diff with config.diff_repeats of the tier"""
        fn(short)  # untimed
        per = []
        for _ in range(self.repeats):
            t0 = self.clock()
            fn(short)
            t_short = self.clock() - t0
            t0 = self.clock()
            fn(short + steps)
            t_long = self.clock() - t0
            if t_long < t_short:
                print(f"(noise: t({short}+N) {t_long:.3f}s < t({short}) {t_short:.3f}s) ", end="")
            per.append(max(t_long - t_short, 0.0) / steps)
        return per

    def to(self, t):
        return t.to(self.device)

    def build(self, make, dtype=torch.float32):
        """make() under this device and dtype: weights are initialised where they live (a 7B model
        is not built on the host first)"""
        old = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with self.device:
                return make()
        finally:
            torch.set_default_dtype(old)

    # ---- the families
    def sam(self, task, B, steps):
        t = TIERS[self.tier]
        S, h = t["sam_image"], t["sam_image"] // 16
        model = self.build(lambda: sam_model(self.tier))
        info = {"params": sum(p.numel() for p in model.parameters())}
        mean = self.to(torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        std = self.to(torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))
        images = self.to(torch.rand(B, 3, S, S))
        if task == "fit":
            enc = model.vision_encoder
            target = self.to(torch.rand(B, 256, h, h))
            opt = torch.optim.Adam(enc.parameters(), lr=1e-3, eps=1e-7)
            enc.train()

            def step():
                pred = enc((images - mean) / std).last_hidden_state    # [B, 256, h, h]
                loss = nn.functional.mse_loss(pred, target)
                opt.zero_grad(set_to_none=False)
                loss.backward()
                opt.step()
            info.update(params=sum(p.numel() for p in enc.parameters()),
                        shapes={"images": [B, 3, S, S], "target": [B, 256, h, h]})
            return dict(info, **stats(self.time_steps(step, steps), steps, B))
        points = self.to(torch.tensor(t["sam_points"]).view(1, 1, 2, 2).expand(B, 1, 2, 2))
        labels = self.to(torch.tensor(SAM_LABELS).view(1, 1, 2).expand(B, 1, 2))
        model.eval()

        # multimask_output=True: the decoder computes all four mask tokens (as keng and Keras return
        # them) and HF keeps the last three, a free slice; the work is the same
        def step():
            return model(pixel_values=(images - mean) / std, input_points=points, input_labels=labels,
                         multimask_output=True)
        with torch.inference_mode():
            info["shapes"] = {"images": [B, 3, S, S], "points": [B, 2, 2], "masks": [B, 4, 4 * h, 4 * h],
                              "iou_pred": [B, 4]}
            return dict(info, **stats(self.time_steps(step, steps), steps, B))

    def sd(self, task, B, steps):
        S = TIERS[self.tier]["sd_image"]
        s = S // 8
        te, unet, vae = self.build(lambda: sd_parts(self.tier))
        sched = ddim_scheduler()
        if task == "fit":
            enc = vae.encoder                                               # up to the 8-channel conv_out
            images, target = self.to(torch.rand(B, 3, S, S)), self.to(torch.rand(B, 8, s, s))
            opt = torch.optim.Adam(enc.parameters(), lr=1e-3, eps=1e-7)
            enc.train()

            def step():
                loss = nn.functional.mse_loss(enc(images), target)
                opt.zero_grad(set_to_none=False)
                loss.backward()
                opt.step()
            info = {"params": sum(p.numel() for p in enc.parameters()),
                    "shapes": {"images": [B, 3, S, S], "target": [B, 8, s, s]}}
            return dict(info, **stats(self.time_steps(step, steps), steps, B))
        for m in (te, unet, vae):
            m.eval()
        ids, neg = self.to(byte_tokens([SD_PROMPT] * B)), self.to(byte_tokens([""]))

        def text_to_image(k):
            """what keng's Pipeline:text_to_image does: encode, seeded noise, k DDIM steps with
            UNet(uncond) and UNet(cond) each at batch B and guidance 7.5, VAE decode to u8"""
            with torch.inference_mode():
                cond = te(ids).last_hidden_state                                 # [B, 77, C]
                uncond = te(neg).last_hidden_state.expand(B, -1, -1).contiguous()
                gen = torch.Generator(device=self.device).manual_seed(0)
                lat = torch.randn(B, 4, s, s, generator=gen, device=self.device) * sched.init_noise_sigma
                sched.set_timesteps(k)
                for t in sched.timesteps:
                    eu = unet(lat, t, encoder_hidden_states=uncond).sample
                    ec = unet(lat, t, encoder_hidden_states=cond).sample
                    lat = sched.step(eu + 7.5 * (ec - eu), t, lat, eta=0.0).prev_sample
                img = vae.decode(lat / vae.config.scaling_factor).sample
                return ((img / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)
        r = stats(self.time_diff(text_to_image, steps, short=2), steps, B)
        r.update({"shapes": {"images": [B, S, S, 3], "latents": [B, 4, s, s]}, "prompt": SD_PROMPT,
                  "guidance_scale": 7.5, "rule": f"(t({2 + steps} steps) - t(2 steps)) / {steps}",
                  "params": sum(p.numel() for m in (te, unet, vae) for p in m.parameters())})
        return r

    def bert(self, task, B, steps):
        T = TIERS[self.tier]["bert_seq"]
        model = self.build(lambda: bert_model(self.tier))
        x = self.to(bert_tokens(B, T))
        seg, mask = self.to(torch.zeros(B, T, dtype=torch.long)), self.to(torch.ones(B, T, dtype=torch.long))
        info = {"shapes": {"token_ids": [B, T], "segment_ids": [B, T], "padding_mask": [B, T]},
                "params": sum(p.numel() for p in model.parameters())}
        if task == "fit":
            y = self.to(torch.tensor([i % 2 for i in range(B)], dtype=torch.long))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.004, betas=(0.9, 0.999), eps=1e-7)
            model.train()

            def step():
                logits = model(input_ids=x, token_type_ids=seg, attention_mask=mask).logits
                loss = nn.functional.cross_entropy(logits.float(), y)
                opt.zero_grad(set_to_none=False)
                loss.backward()
                opt.step()
            return dict(info, **stats(self.time_steps(step, steps), steps, B))
        model.eval()
        with torch.inference_mode():
            return dict(info, **stats(self.time_steps(lambda: model(input_ids=x, token_type_ids=seg,
                                                                    attention_mask=mask).logits, steps), steps, B))

    def llm(self, family, task, B, dtype, steps):
        model = self.build(lambda: lm_model(family, self.tier), DTYPES[dtype])
        vocab = model.config.vocab_size
        if task == "fit":
            T = 128
            params = enable_lora(model)
            x, y = lm_batch(family, B, T, vocab)
            x, y = self.to(x), self.to(y)
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
            return dict(info, **stats(self.time_steps(step, steps), steps, B * T))
        prompts = self.to(lm_prompts(family, B, 5, vocab))
        attn = torch.ones_like(prompts)
        model.eval()

        def gen(k):
            with torch.inference_mode():
                for _ in range(k):
                    # min_length = max_length: EOS never stops a row, as in llm.lua (stop_token_ids = {})
                    model.generate(input_ids=prompts, attention_mask=attn, max_length=50, min_length=50,
                                   do_sample=False, pad_token_id=0)
        r = stats(self.time_diff(gen, steps), steps, B * (50 - prompts.shape[1]))
        r.update({"shapes": {"prompts": list(prompts.shape), "output": [B, 50]}, "max_length": 50,
                  "params": sum(p.numel() for p in model.parameters())})
        return r

    def run_row(self, family, task, B, dtype, steps):
        torch.manual_seed(0)
        if family == "sam":
            return self.sam(task, B, steps)
        if family == "stable_diffusion":
            return self.sd(task, B, steps)
        if family == "bert":
            return self.bert(task, B, steps)
        return self.llm(family, task, B, dtype, steps)


# docs/benchmarks.md's parameter counts of the GPU-tier presets: the acceptance check that a peer
# model is built at the right size (pytorch_gpu.py --check-params, on the meta device)
SPEC_PARAMS = {"bert": 108311810, "sam": 641090864, "gemma": 8537680896, "mistral": 7241732096,
               "sd_unet": 859520964, "sd_vae_encoder": 34163592}


def check_params():
    """builds each GPU-tier model on the meta device (no memory) and compares its parameter count
    with docs/benchmarks.md; returns a list of mismatch messages"""
    r = Runner("gpu", "meta", 1)

    def n(m):
        return sum(p.numel() for p in m.parameters())
    got = {"bert": lambda: n(r.build(lambda: bert_model("gpu"))),
           "sam": lambda: n(r.build(lambda: sam_model("gpu"))),
           "gemma": lambda: n(r.build(lambda: lm_model("gemma", "gpu"), torch.bfloat16)),
           "mistral": lambda: n(r.build(lambda: lm_model("mistral", "gpu"), torch.bfloat16))}
    try:
        sd = r.build(lambda: sd_parts("gpu"))
        got.update(sd_unet=lambda: n(sd[1]), sd_vae_encoder=lambda: n(sd[2].encoder))
    except NotAvailable as e:
        print(f"sd: not available ({e})")
    bad = []
    for name, f in got.items():
        v = f()
        ok = v == SPEC_PARAMS[name]
        print(f"{name:16s} {v:>14,d} params  expected {SPEC_PARAMS[name]:>14,d}  {'ok' if ok else 'MISMATCH'}")
        if not ok:
            bad.append(f"{name}: {v} parameters, docs/benchmarks.md says {SPEC_PARAMS[name]}")
    return bad


def run_suite(runner, rows, steps, out, device_name, extra=None, budget=None, threads=None, steps_of=None):
    """runs rows in order, rewriting `out` (keng-bench/1 JSON) after each row so a run cut short
    keeps what it measured; with a budget (seconds) a row is skipped once less than a minimum is
    left; steps_of(row) gives a row its own step count. Returns True when no row failed."""
    t_start = time.monotonic()
    doc = {"schema": "keng-bench/1", "framework": "pytorch", "torch_version": torch.__version__,
           "transformers_version": transformers.__version__, "diffusers_version": diffusers_version(),
           "commit": git_commit(), "date": datetime.date.today().isoformat(), "tier": runner.tier,
           "device": device_name, "threads": threads or torch.get_num_threads(), "steps": steps, "dtype": "keras",
           "rows": []}
    doc.update(extra or {})

    def write():
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        with open(out + ".tmp", "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(out + ".tmp", out)

    ok = True
    for row in rows:
        rid, name, family, task, B, dtype = row
        preset = TIERS[runner.tier]["preset"][family]
        res = {"id": rid, "row": name, "family": family, "task": task, "batch": B, "dtype": dtype,
               "tier": runner.tier, "device": device_name, "threads": doc["threads"], "preset": preset,
               "framework": "pytorch"}
        print(f"{name:24s} batch {B:<3d} {dtype:4s} {preset} ... ", end="", flush=True)
        left = budget - (time.monotonic() - t_start) if budget else None
        if left is not None and left < 15:
            res.update(status="skipped", reason=f"time budget: {left:.0f} s left of {budget:.0f}")
            print("skipped: " + res["reason"])
        else:
            t0 = time.monotonic()
            try:
                res.update(runner.run_row(family, task, B, dtype, steps_of(row) if steps_of else steps))
                res["status"] = "ok"
                print(f"{res['mean_ms']:.2f} ms/step (median {res['median_ms']:.2f}, min {res['min_ms']:.2f})",
                      flush=True)
            except NotAvailable as e:
                res.update(status="not available", reason=str(e))
                print("not available: " + res["reason"])
            except Exception as e:  # a row that fails is reported and the suite goes on
                ok = False
                res.update(status="failed", reason=f"{type(e).__name__}: {e}".splitlines()[0][:500])
                print("failed: " + res["reason"])
            res["seconds"] = round(time.monotonic() - t0, 1)
        doc["rows"].append(res)
        write()
        gc.collect()
        if runner.device.type == "cuda":
            torch.cuda.empty_cache()
    write()
    print("wrote " + out)
    return ok
