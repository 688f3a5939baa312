-- models.mistral — Mistral 7B (Jiang et al. 2023) presets on the shared decoder
-- (models/causal_lm.lua).
--
--   local mistral = require "models.mistral"
--   local lm = mistral.from_preset("mistral_tiny", {dtype = "bf16"})
--   local lm = mistral.from_pretrained("path/to/hf_checkpoint")
--
-- Mistral's facts: grouped-query attention (32 query heads over 8 KV heads in the 7B), RMSNorm
-- eps 1e-5 scaling by w, SwiGLU FFN (silu), RoPE base 10000, sliding-window attention (each
-- query sees the 4096 most recent keys, itself included), untied LM head, no biases.
-- Token ids: unk 0, bos 1, eos 2. Sizes from keras-hub and docs/benchmarks.md (mistral_tiny is the CPU tier).
local lm = require "models.causal_lm"

local presets = {
  mistral_tiny = {vocab = 32000, layers = 2, hidden = 256, heads = 8, kv_heads = 2, head_dim = 32, ffn = 768},
  mistral_7b_en = {vocab = 32000, layers = 32, hidden = 4096, heads = 32, kv_heads = 8, head_dim = 128, ffn = 14336},
}
presets.mistral_instruct_7b_en = presets.mistral_7b_en

return lm.family{
  name = "mistral",
  presets = presets,
  uses_window = true,
  defaults = {eps = 1e-5, unit_offset = false, act = "silu", tie = false, embed_scale = false,
              window = 4096, rope_base = 10000, pad_id = 0, bos_id = 1, eos_id = 2},
  model_types = {mistral = true},
  config_keys = {sliding_window = true},                            -- transformers' MistralConfig
}
