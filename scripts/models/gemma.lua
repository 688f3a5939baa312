-- models.gemma — Gemma (Gemma Team 2024) presets on the shared decoder (models/causal_lm.lua).
--
--   local gemma = require "models.gemma"
--   local lm = gemma.from_preset("gemma_tiny", {dtype = "bf16"})       -- random weights
--   local lm = gemma.from_pretrained("path/to/hf_checkpoint")          -- config.json + safetensors
--   lm:logits(ids)                    -- ids i64 [B, T] (0-based) -> f32 [B, T, V]
--   lm:generate({{2, 651, 1}}, {max_length = 50})
--
-- Gemma's facts: RMSNorm scales by (1 + w) in f32, eps 1e-6; GeGLU FFN with gelu (tanh form);
-- embeddings scaled by sqrt(C) (rounded to the compute dtype) and tied to the LM head; RoPE base
-- 10000 over the whole head dim; query scale 1/sqrt(D); no biases. Token ids: pad 0, eos 1, bos 2.
-- Sizes from keras-hub's presets and docs/benchmarks.md (gemma_tiny is the CPU tier).
local lm = require "models.causal_lm"

local presets = {
  gemma_tiny = {vocab = 32000, layers = 2, hidden = 256, heads = 4, kv_heads = 4, head_dim = 64, ffn = 1024},
  gemma_2b_en = {vocab = 256000, layers = 18, hidden = 2048, heads = 8, kv_heads = 1, head_dim = 256, ffn = 16384},
  gemma_7b_en = {vocab = 256000, layers = 28, hidden = 3072, heads = 16, kv_heads = 16, head_dim = 256, ffn = 24576},
}
presets.gemma_instruct_2b_en = presets.gemma_2b_en
presets.gemma_instruct_7b_en = presets.gemma_7b_en

return lm.family{
  name = "gemma",
  presets = presets,
  defaults = {eps = 1e-6, unit_offset = true, act = "gelu_tanh", tie = true, embed_scale = true,
              rope_base = 10000, pad_id = 0, eos_id = 1, bos_id = 2},
  -- config.json (transformers' GemmaConfig): "gelu" means the tanh form there; head_dim 256
  -- when absent; Gemma 2's soft-capping and query_pre_attn_scalar are refused as unknown keys
  model_types = {gemma = true},
  config_keys = {attention_bias = true, hidden_activation = true, use_bidirectional_attention = true},
  gelu_tanh = true,
  head_dim = 256,
}
