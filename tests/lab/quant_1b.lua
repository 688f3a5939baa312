-- quant_1b.lua — decode speed and resident memory of a ~1.1B-parameter Mistral-shaped model
-- (TinyLlama's shape: hidden 2048, 22 layers, 32 heads over 4 KV heads, FFN 5632, vocab 32000),
-- bf16 vs quantized, batch 1 (docs/quantization.md; scripts/bench/quant.sh runs it next to
-- llama.cpp on the same GGUF files).
--
--   keng tests/lab/quant_1b.lua [--gguf FILE] [--quantize int8|int4] [--threads N] [--tokens 64]
--        [--prompt 6] [--repeats 3] [--act int8|f32] [--format text|json]
--   keng tests/lab/quant_1b.lua --accuracy 1 [--gguf BF16.gguf] [--threads N]
--
-- Without --gguf: random bf16 weights (seed 0, scripts/bench/decode.lua's mistral_1b). With it:
-- models.gguf.from_gguf(FILE) (a bf16 file stays a view of the mapping; Q8_0 / Q4_0 Linear layers
-- stay quantized). --quantize then runs keng.quantize. --act sets keng.backends.quant_activations.
-- ms/token is decode.lua's (keng.bench.decode_per_token): the difference of two greedy generate
-- calls (prompt + tokens and prompt + 1 new tokens) over tokens - 1, best of --repeats, wall time
-- (and process CPU time, which a busy machine inflates less; summed over threads); bytes/token counts every
-- weight (codes and scales) but the embedding table; rss_mib / peak_mib are VmRSS / VmHWM,
-- alloc_mib keng.memory_stats().allocated (the engine's tensors; file views not included).
-- --accuracy: the bf16 model's logits of a 32-token prompt against those of its int8 and int4
-- quantizations, each with int8 and f32 activations (max and mean |error| over the largest
-- |logit|), and how many of 50 greedy tokens agree with bf16's.
local keng = require "keng"

local usage = "usage: keng tests/lab/quant_1b.lua [--gguf FILE] [--quantize int8|int4] [--threads N] " ..
  "[--tokens 64] [--prompt 6] [--repeats 3] [--act int8|f32] [--format text|json]"
local o = {tokens = 64, prompt = 6, repeats = 3, format = "text"}
local NUM = {threads = true, tokens = true, prompt = true, repeats = true}
local KNOWN = {gguf = true, quantize = true, act = true, format = true, accuracy = true}
local i = 1
while i <= #arg do
  local key = arg[i]:match("^%-%-([%w_]+)$")
  local v = arg[i + 1]
  if not key or not (NUM[key] or KNOWN[key]) or v == nil then
    io.stderr:write("quant_1b.lua: bad argument '", tostring(arg[i]), "'\n", usage, "\n")
    os.exit(2)
  end
  o[key] = NUM[key] and math.tointeger(tonumber(v)) or v
  i = i + 2
end
if o.threads then keng.set_num_threads(o.threads) end
if o.act then keng.backends.quant_activations = o.act end

local function make()
  if o.gguf then return require("models.gguf").from_gguf(o.gguf, {tokenizer = false}) end
  local mistral = require "models.mistral"
  local cfg = mistral.config("mistral_tiny")
  cfg.vocab, cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn = 32000, 22, 2048, 32, 4, 64, 5632
  keng.manual_seed(0)
  return mistral.build(cfg, {dtype = "bf16"})
end
local lm = make()
lm:eval()
if o.accuracy then
  local ids = keng.randint(3, 250, {1, 32})
  local gen = {max_new_tokens = 50, sampler = "greedy", stop_token_ids = {}}
  local ref, ref_toks
  keng.no_grad(function() ref, ref_toks = lm:logits(ids):float(), lm:generate(ids, gen)[1] end)
  local amax = ref:abs():max():item()
  for _, fmt in ipairs({"int8", "int4"}) do
    local q = keng.quantize(make(), fmt)
    q:eval()
    for _, act in ipairs({"int8", "f32"}) do
      keng.backends.quant_activations = act
      keng.no_grad(function()
        local d = (q:logits(ids):float() - ref):abs()
        local toks, same = q:generate(ids, gen)[1], 0
        for t = 33, #ref_toks do
          if toks[t] ~= ref_toks[t] then break end
          same = same + 1
        end
        print(string.format("%s weights, %-4s x (reads %s): logits max |err| %.2f%%, mean %.3f%% of max |logit| %.2f; " ..
          "greedy: first %d of %d tokens equal bf16's", fmt, act, keng.backends.quant_activations,
          d:max():item() / amax * 100, d:mean():item() / amax * 100, amax, same, #ref_toks - 32))
      end)
    end
  end
  os.exit(0)
end
if o.quantize then keng.quantize(lm, o.quantize) end
collectgarbage()
collectgarbage()

-- weight bytes read per token: every state-dict tensor (codes, scales, norms) but the embedding
local bytes = 0
local SIZE = {f32 = 4, f64 = 8, bf16 = 2, f16 = 2, i8 = 1, u8 = 1}
for k, t in pairs(lm:state_dict()) do
  if k ~= "model.embed_tokens.weight" or lm.cfg.tie then bytes = bytes + t:numel() * SIZE[t.dtype] end
end

local prompts = keng.randint(3, 250, {1, o.prompt})
local best, best_cpu = require("keng.bench").decode_per_token(lm, prompts, {tokens = o.tokens, repeats = o.repeats})

local function status(key)
  local f = io.open("/proc/self/status")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  local kb = s:match(key .. ":%s+(%d+) kB")
  return kb and tonumber(kb) / 1024
end

local w = lm.model.layers[1].mlp.up_proj
local r = {
  weights = o.gguf and (o.gguf:match("([^/]+)$") .. (o.quantize and " + " .. o.quantize or "")) or
    ("random bf16" .. (o.quantize and " + " .. o.quantize or "")),
  linear = w.weight.dtype .. (w.weight_scale and (" + " .. w.weight_scale.dtype .. " scales") or ""),
  act = keng.backends.quant_activations, threads = keng.num_threads(), tokens = o.tokens,
  ms_per_token = best * 1e3, cpu_ms_per_token = best_cpu * 1e3, tokens_per_s = 1 / best, weight_bytes = bytes, gb_per_s = bytes / best / 1e9,
  rss_mib = status("VmRSS"), peak_mib = status("VmHWM"), alloc_mib = keng.memory_stats().allocated / 2 ^ 20,
}
if o.format == "json" then
  print(require("keng.json").encode(r))
else
  print(string.format("%-28s %-22s act %-4s %d threads: %7.2f ms/token (cpu %.2f) %6.2f tok/s  %7.1f MB/token " ..
    "%5.2f GB/s  RSS %.0f MiB (peak %.0f, tensors %.0f)", r.weights, r.linear, r.act, r.threads, r.ms_per_token,
    r.cpu_ms_per_token, r.tokens_per_s, bytes / 1e6, r.gb_per_s, r.rss_mib or -1, r.peak_mib or -1, r.alloc_mib))
end
