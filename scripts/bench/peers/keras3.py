#!/usr/bin/env python3
"""keras3.py — the CPU-tier benchmark rows run with Keras 3 (JAX backend, XLA) and keras-hub, so
that `keng scripts/bench/all.lua --compare bench-results/keras3.json` prints keng/Keras 3.

Models: keras-hub BertTextClassifier, GemmaCausalLM, MistralCausalLM and SAMBackbone built from the
CPU-tier configs of BENCH_SPEC.md (the same sizes as keng's bert_tiny, gemma_tiny, mistral_tiny,
sam_tiny and as peer_rows.py) with random weights; the same synthetic inputs (scripts/bench/config.lua's words
and token ids, as peer_rows.py), batch, dtype, LoRA placement and rank,
optimizer settings. Stable Diffusion rows are "not available": keras-hub ships Stable Diffusion 3
only (an MMDiT, not the v1 UNet of the rows).

Timing follows the published Keras benchmark (keras-team/keras-benchmarks): fit and predict run
`model.fit` / `model.predict` over steps + 1 identical batches and a callback times each batch
(begin to end); the first batch (tracing and XLA compilation) is dropped. Generate: one untimed
`generate()` call (compilation), then each of N calls timed (keng's difference rule measures the
same per-call time). Threads: the process is pinned to the first N cores
(os.sched_setaffinity) before JAX starts, so XLA's pool has N threads, as keng and PyTorch do.
Writes the keng-bench/1 JSON schema (framework "keras3-jax").

Optional, never needed by tests. Requirements:
    pip install keras keras-hub jax     # CPU jaxlib
Usage:
    python3 scripts/bench/peers/keras3.py [--steps 10] [--only bert,gemma] [--threads N]
        [--out bench-results/keras3.json]
"""
import argparse
import datetime
import json
import os
import sys
import time


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", default=None, help="families or row ids, comma-separated")
    ap.add_argument("--threads", type=int,
                    default=int(os.environ.get("KENG_NUM_THREADS", 0)) or os.cpu_count())
    ap.add_argument("--out", default="bench-results/keras3.json")
    return ap.parse_args()


A = parse()
# before JAX loads: its CPU client sizes the thread pool from the cores it may run on
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:A.threads])
os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))     # peer_spec.py beside this file

import jax  # noqa: E402
import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402

# ---- rows, sizes, inputs, statistics and --only: peer_spec.py, shared with peer_rows.py (which
# imports torch, whose LLVM clashes with XLA's in one process; peer_spec imports no framework)
from peer_spec import SAM_LABELS, TIERS, bert_rows, cpu_name, git_commit, lm_rows, prompt_rows  # noqa: E402
from peer_spec import select_rows, stats, time_steps  # noqa: E402

CPU = TIERS["cpu"]


def bert_tokens(B, T, vocab=28996):
    return np.array(bert_rows(B, T, vocab), "int32")


def lm_batch(family, B, T, vocab):
    seqs = np.array(lm_rows(family, B, T, vocab), "int32")
    return seqs[:, :T], seqs[:, 1:T + 1]


def lm_prompts(family, B, nwords, vocab):
    return np.array(prompt_rows(family, B, nwords, vocab), "int32")


DTYPE = {"f32": "float32", "bf16": "bfloat16"}
MAX_LENGTH, PROMPT_WORDS, LLM_SEQ = 50, 5, 128


class NotAvailable(Exception):
    pass


class BatchTimer(keras.callbacks.Callback):
    """per-batch wall time of fit or predict (the keras-benchmarks callback)"""

    def __init__(self):
        super().__init__()
        self.secs, self.t0 = [], None

    def _begin(self, batch, logs=None):
        self.t0 = time.perf_counter()

    def _end(self, batch, logs=None):
        self.secs.append(time.perf_counter() - self.t0)

    on_train_batch_begin = on_predict_batch_begin = _begin
    on_train_batch_end = on_predict_batch_end = _end


def repeat(x, n):
    """n copies of a batch along the batch axis (dict or array)"""
    if isinstance(x, dict):
        return {k: repeat(v, n) for k, v in x.items()}
    return np.concatenate([x] * n, axis=0)


def time_fit(model, x, y, B, steps):
    cb = BatchTimer()
    model.fit(repeat(x, steps + 1), repeat(y, steps + 1), batch_size=B, epochs=1, shuffle=False, verbose=0,
              callbacks=[cb])
    return cb.secs[1:]                                   # the first batch compiles


def time_predict(model, x, B, steps):
    cb = BatchTimer()
    model.predict(repeat(x, steps + 1), batch_size=B, verbose=0, callbacks=[cb])
    return cb.secs[1:]


def count(model):
    return int(sum(np.prod(w.shape) for w in model.weights))


def count_trainable(model):
    return int(sum(np.prod(w.shape) for w in model.trainable_weights))


# ---- the families --------------------------------------------------------------------------
def bert(task, B, steps):
    c, T = CPU["bert"], CPU["bert_seq"]
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=c["vocab_size"], num_layers=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
        hidden_dim=c["hidden_size"], intermediate_dim=c["intermediate_size"], max_sequence_length=512, dtype="float32")
    model = keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None)
    ids = bert_tokens(B, T)
    x = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids)}
    info = {"params": count(model), "shapes": {"token_ids": [B, T]}}
    if task == "fit":
        y = (np.arange(B) % 2).astype("int32")
        model.compile(optimizer=keras.optimizers.AdamW(learning_rate=1e-3, weight_decay=0.004, beta_1=0.9,
                                                       beta_2=0.999, epsilon=1e-7),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
        return info, time_fit(model, x, y, B, steps), B
    return info, time_predict(model, x, B, steps), B


def llm(family, task, B, dtype, steps):
    c = CPU[family]
    kw = dict(vocabulary_size=c["vocab_size"], num_layers=c["num_hidden_layers"],
              num_query_heads=c["num_attention_heads"], num_key_value_heads=c["num_key_value_heads"],
              hidden_dim=c["hidden_size"], head_dim=c["head_dim"], dtype=DTYPE[dtype])
    if family == "gemma":
        # keras-hub's Gemma counts the gate and up projections together: 2 x the HF width
        backbone = keras_hub.models.GemmaBackbone(intermediate_dim=2 * c["intermediate_size"], **kw)
        model = keras_hub.models.GemmaCausalLM(backbone, preprocessor=None)
    else:
        backbone = keras_hub.models.MistralBackbone(intermediate_dim=c["intermediate_size"], sliding_window=4096,
                                                    layer_norm_epsilon=1e-5, **kw)
        model = keras_hub.models.MistralCausalLM(backbone, preprocessor=None)
    vocab = c["vocab_size"]
    info = {"params": count(model)}
    if task == "fit":
        backbone.enable_lora(rank=4)                     # query and value of every layer, as the rows
        x, y = lm_batch(family, B, LLM_SEQ, vocab)
        model.compile(optimizer=keras.optimizers.AdamW(),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
        info.update(trainable=count_trainable(model), shapes={"x": [B, LLM_SEQ], "y": [B, LLM_SEQ]})
        return info, time_fit(model, {"token_ids": x, "padding_mask": np.ones_like(x)}, y, B, steps), B * LLM_SEQ
    prompts = lm_prompts(family, B, PROMPT_WORDS, vocab)   # [B, 6]
    P = prompts.shape[1]
    ids = np.zeros((B, MAX_LENGTH), "int32")
    ids[:, :P] = prompts
    mask = np.zeros((B, MAX_LENGTH), bool)
    mask[:, :P] = True
    inputs = {"token_ids": ids, "padding_mask": mask}
    # no preprocessor: generate fills every padded position; stop_token_ids=None never stops early
    # the warm-up call compiles
    secs = time_steps(lambda: jax.block_until_ready(model.generate(inputs, stop_token_ids=None)["token_ids"]), steps)
    info["shapes"] = {"prompts": [B, P], "output": [B, MAX_LENGTH]}
    return info, secs, B * (MAX_LENGTH - P)


def sam(task, B, steps):
    v, S = CPU["sam_vision"], CPU["sam_image"]
    from keras_hub.layers import SAMMaskDecoder, SAMPromptEncoder
    image_encoder = keras_hub.models.ViTDetBackbone(
        hidden_size=v["hidden_size"], num_layers=v["num_hidden_layers"], intermediate_dim=v["mlp_dim"],
        num_heads=v["num_attention_heads"], global_attention_layer_indices=v["global_attn_indexes"],
        window_size=v["window_size"], image_shape=(S, S, 3), dtype="float32")
    prompt_encoder = SAMPromptEncoder(hidden_size=256, image_embedding_size=(S // 16, S // 16),
                                      input_image_size=(S, S), mask_in_channels=16, dtype="float32")
    mask_decoder = SAMMaskDecoder(hidden_size=256, num_layers=2, intermediate_dim=2048, num_heads=8,
                                  embedding_dim=256, num_multimask_outputs=3, iou_head_depth=3,
                                  iou_head_hidden_dim=256, dtype="float32")
    backbone = keras_hub.models.SAMBackbone(image_encoder=image_encoder, prompt_encoder=prompt_encoder,
                                            mask_decoder=mask_decoder, dtype="float32")
    rng = np.random.default_rng(0)
    images = rng.random((B, S, S, 3), dtype=np.float32)
    info = {"params": count(backbone)}
    if task == "fit":
        h = S // 16
        enc = image_encoder
        # the encoder alone to a [B, h, h, 256] target, MSE, Adam (the SAM fit row)
        enc.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-3, epsilon=1e-7), loss="mse", jit_compile=True)
        target = rng.random((B, h, h, 256), dtype=np.float32)
        info.update(params=count(enc), shapes={"images": [B, S, S, 3], "target": [B, h, h, 256]})
        return info, time_fit(enc, images, target, B, steps), B
    pts = np.array(CPU["sam_points"], np.float32)[None].repeat(B, 0)                 # [B, 2, 2]
    x = {"images": images, "points": pts, "labels": np.array([SAM_LABELS] * B, np.float32),
         "boxes": np.zeros((B, 0, 2, 2), np.float32), "masks": np.zeros((B, 0, S // 4, S // 4, 1), np.float32)}
    info["shapes"] = {"images": [B, S, S, 3], "points": [B, 2, 2]}
    secs = time_predict(backbone, x, B, steps)
    # the parts' own weights (the functional backbone lists the encoder's only)
    info["params"] = count(image_encoder) + count(prompt_encoder) + count(mask_decoder)
    return info, secs, B


def run_row(family, task, B, dtype, steps):
    if family == "stable_diffusion":
        raise NotAvailable("keras-hub has Stable Diffusion 3 only, not the v1 UNet/VAE of the rows")
    if family == "bert":
        info, secs, items = bert(task, B, steps)
    elif family == "sam":
        info, secs, items = sam(task, B, steps)
    else:
        info, secs, items = llm(family, task, B, dtype, steps)
    return dict(info, **stats(secs, len(secs), items))


def main():
    rows = select_rows(A.only)
    device = cpu_name()
    threads = len(os.sched_getaffinity(0))
    print(f"keras {keras.__version__} (jax {jax.__version__}), keras-hub {keras_hub.__version__} · cpu tier · "
          f"{device} · {threads} threads · {A.steps} timed steps per row")
    doc = {"schema": "keng-bench/1", "framework": "keras3-jax", "keras_version": keras.__version__,
           "keras_hub_version": keras_hub.__version__, "jax_version": jax.__version__,
           "commit": git_commit(), "date": datetime.date.today().isoformat(), "tier": "cpu",
           "device": device, "threads": threads, "steps": A.steps, "dtype": "keras", "rows": []}
    ok = True
    for rid, name, family, task, B, dtype in rows:
        preset = CPU["preset"][family]
        res = {"id": rid, "row": name, "family": family, "task": task, "batch": B, "dtype": dtype, "tier": "cpu",
               "device": device, "threads": threads, "preset": preset, "framework": "keras3-jax"}
        print(f"{name:24s} batch {B:<3d} {dtype:4s} {preset} ... ", end="", flush=True)
        t0 = time.monotonic()
        try:
            res.update(run_row(family, task, B, dtype, A.steps))
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
        keras.backend.clear_session()
        os.makedirs(os.path.dirname(A.out) or ".", exist_ok=True)
        with open(A.out, "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.write("\n")
    print("wrote " + A.out)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
