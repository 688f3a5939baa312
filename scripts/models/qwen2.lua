-- models.qwen2 — Qwen 2 and Qwen 2.5 (Qwen Team 2024) presets on the shared decoder
-- (models/causal_lm.lua).
--
--   local qwen2 = require "models.qwen2"
--   local lm = qwen2.from_preset("qwen2_5_0_5b", {device = "meta"})    -- shapes only
--   local lm = qwen2.from_pretrained("path/to/hf_checkpoint")          -- config.json + safetensors
--   lm:logits(ids, {attention_mask = m})   -- ids i64 [B, T] (0-based) -> f32 [B, T, V]
--
-- Qwen 2's facts: as Llama (grouped-query attention, RMSNorm by w, SwiGLU, RoPE over the whole
-- head dim, base 1000000 in 2.5) plus biases on the q, k and v projections (none on the output
-- projection and the MLP); eps 1e-6; LM head tied in 0.5B and 1.5B. Its tokenizer adds no BOS.
-- Sliding-window layers (use_sliding_window with max_window_layers < layers) are refused: no
-- released Qwen 2.5 uses them. Sizes from the published config.json files (Qwen on the Hugging
-- Face Hub); parameter counts checked in tests/lua/llama_spec.lua.
local lm = require "models.causal_lm"

local Q = {vocab = 151936, eps = 1e-6, rope_base = 1000000, bos_id = 151643, eos_id = 151643}
local function preset(t)
  for k, v in pairs(Q) do if t[k] == nil then t[k] = v end end
  return t
end

local presets = {
  qwen2_5_0_5b = preset{layers = 24, hidden = 896, heads = 14, kv_heads = 2, head_dim = 64, ffn = 4864, tie = true},
  qwen2_5_1_5b = preset{layers = 28, hidden = 1536, heads = 12, kv_heads = 2, head_dim = 128, ffn = 8960, tie = true},
  qwen2_5_7b = preset{vocab = 152064, layers = 28, hidden = 3584, heads = 28, kv_heads = 4, head_dim = 128,
                      ffn = 18944, tie = false},
}

return lm.family{
  name = "qwen2",
  presets = presets,
  add_bos = false,
  -- transformers' Qwen2Config defaults (a config.json's keys override them)
  defaults = {eps = 1e-6, unit_offset = false, act = "silu", tie = false, embed_scale = false, qkv_bias = true,
              rope_base = 10000},
  qkv_bias = true,
  model_types = {qwen2 = true},
  config_keys = {use_sliding_window = true, sliding_window = true, max_window_layers = true, layer_types = true},
}
