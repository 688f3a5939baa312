-- quant_bench.lua — int8 weight-only decode (docs/quantization.md): generate at batch 1 with the
-- tiny Gemma / Mistral presets in bf16, without and with keng.quantize(lm, "int8" / "int4"); best of
-- `runs` process CPU times (os.clock) of one generate call (4-token prompt, 32 new tokens).
--   keng tests/lab/quant_bench.lua [runs]
local keng = require "keng"
local runs = tonumber(arg[1]) or 3
local fams = {gemma = require "models.gemma", mistral = require "models.mistral"}
print(string.format("keng %d threads (CPU ms, best of %d)", keng.num_threads(), runs))
for _, name in ipairs({"gemma", "mistral"}) do
  for _, q in ipairs({false, "int8", "int4"}) do
    local lm = fams[name].from_preset(name .. "_tiny", {dtype = "bf16"})
    if q then lm:quantize(q) end
    local prompt = {{2, 5, 7, 9}}
    lm:generate(prompt, {max_length = 8})   -- warm up
    local best = math.huge
    for _ = 1, runs do
      local t = os.clock()
      lm:generate(prompt, {max_length = 36})
      best = math.min(best, os.clock() - t)
    end
    print(string.format("%-8s %-11s %8.2f ms per call  %6.3f ms/token", name .. "_tiny", q and "bf16 + " .. q or "bf16",
      best * 1e3, best * 1e3 / 32))
  end
end

-- resident size: keng.memory_stats().allocated of mistral_tiny in bf16, then after quantizing
-- (the float weights are released; the embeddings stay bf16)
for _, fmt in ipairs({"int8", "int4"}) do
  collectgarbage()
  keng.empty_cache()
  local base = keng.memory_stats().allocated
  local lm = fams.mistral.from_preset("mistral_tiny", {dtype = "bf16"})
  collectgarbage()
  local before = keng.memory_stats().allocated - base
  lm:quantize(fmt)
  collectgarbage()
  local after = keng.memory_stats().allocated - base
  print(string.format("mistral_tiny resident: bf16 %.2f MiB, %s %.2f MiB (of which bf16 embeddings %.2f MiB)",
    before / 2 ^ 20, fmt, after / 2 ^ 20, lm.model.embed_tokens.weight:numel() * 2 / 2 ^ 20))
end
