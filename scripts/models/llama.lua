-- models.llama — Llama 2/3 (Touvron et al. 2023; Llama Team 2024) presets on the shared decoder
-- (models/causal_lm.lua).
--
--   local llama = require "models.llama"
--   local lm = llama.from_preset("llama3_2_1b", {device = "meta"})     -- shapes only
--   local lm = llama.from_pretrained("path/to/hf_checkpoint")          -- config.json + safetensors
--   lm:logits(ids, {attention_mask = m})   -- ids i64 [B, T] (0-based) -> f32 [B, T, V]
--   lm:generate({{128000, 791, 1217}}, {max_length = 50})
--
-- Llama's facts: grouped-query attention, RMSNorm scaling by w (eps 1e-5 in Llama 3), SwiGLU FFN
-- (silu), RoPE over the whole head dim (base 500000 and the "llama3" frequency bands in Llama 3.1
-- and 3.2), no biases unless attention_bias / mlp_bias, LM head tied to the embedding in the
-- 3.2 1B and 3B, untied in 3.1 8B. Sizes from the published config.json files (meta-llama on the
-- Hugging Face Hub); parameter counts checked in tests/lua/llama_spec.lua.
local lm = require "models.causal_lm"

-- Llama 3.1/3.2's RoPE: base 500000, frequencies below 8192/4 tokens of wavelength kept, above
-- 8192 divided by factor, smoothly in between
local function llama3_rope(factor)
  return {type = "llama3", base = 500000, factor = factor, low_freq_factor = 1, high_freq_factor = 4,
          original_max_position_embeddings = 8192, max_pos = 131072}
end

local L3 = {vocab = 128256, eps = 1e-5, rope_base = 500000, bos_id = 128000, eos_id = 128001}
local function preset(t)
  for k, v in pairs(L3) do if t[k] == nil then t[k] = v end end
  return t
end

local presets = {
  llama3_2_1b = preset{layers = 16, hidden = 2048, heads = 32, kv_heads = 8, head_dim = 64, ffn = 8192, tie = true,
                       rope = llama3_rope(32)},
  llama3_2_3b = preset{layers = 28, hidden = 3072, heads = 24, kv_heads = 8, head_dim = 128, ffn = 8192, tie = true,
                       rope = llama3_rope(32)},
  llama3_1_8b = preset{layers = 32, hidden = 4096, heads = 32, kv_heads = 8, head_dim = 128, ffn = 14336, tie = false,
                       rope = llama3_rope(8)},
}

return lm.family{
  name = "llama",
  presets = presets,
  -- transformers' LlamaConfig defaults (a config.json's keys override them)
  defaults = {eps = 1e-6, unit_offset = false, act = "silu", tie = false, embed_scale = false,
              rope_base = 10000, bos_id = 1, eos_id = 2},
  model_types = {llama = true},
  config_keys = {attention_bias = true, mlp_bias = true},
}
