-- quant_1b.lua — decode ms/token of a ~1.1B-parameter Mistral-shaped model (TinyLlama's shape:
-- hidden 2048, 22 layers, 32 heads over 4 KV heads, FFN 5632, vocab 32000; random bf16 weights),
-- bf16 vs keng.quantize "int8" vs "int4", batch 1: best of 3 generate calls of 17 new tokens
-- (prefill of 4 included), wall time, and keng.memory_stats().allocated after quantizing.
--   keng tests/lab/quant_1b.lua          (about 2.5 GB of memory; minutes on a busy machine)
local keng = require "keng"
local mistral = require "models.mistral"
local cfg = mistral.config("mistral_tiny")
cfg.vocab, cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn = 32000, 22, 2048, 32, 4, 64, 5632
local function run(fmt)
  keng.manual_seed(0)
  local lm = mistral.build(cfg, {dtype = "bf16"})
  if fmt then keng.quantize(lm, fmt) end
  collectgarbage(); collectgarbage()
  local prompt = {{1, 5, 6, 7}}
  local gen = {max_length = 4 + 17, sampler = "greedy", stop_token_ids = {}}
  keng.no_grad(function() lm:generate(prompt, {max_length = 6, sampler = "greedy", stop_token_ids = {}}) end)
  local best = math.huge
  for _ = 1, 3 do
    local t0 = keng.time()
    keng.no_grad(function() lm:generate(prompt, gen) end)
    best = math.min(best, keng.time() - t0)
  end
  print(string.format("%-5s %.1f ms/token (best of 3 calls of 17 new tokens incl. prefill), resident %.0f MiB",
    fmt or "bf16", best / 17 * 1000, keng.memory_stats().allocated / 2^20))
end
for _, f in ipairs{false, "int8", "int4"} do run(f or nil) end
