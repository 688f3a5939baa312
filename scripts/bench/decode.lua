-- decode.lua — decode speed of a causal LM on random weights (docs/benchmarks.md, "Decode vs
-- llama.cpp"): ms per generated token at a batch size, and the weight bytes it streams per second.
--
--   keng scripts/bench/decode.lua [--model mistral_tiny|gemma_tiny|mistral_1b|<preset>]
--        [--batch 1] [--threads N] [--tokens 64] [--prompt 6] [--repeats 3] [--dtype bf16]
--        [--save DIR] [--compare FILE.json] [--format text|json] [--profile N]
--
-- ms/token is the difference of two greedy generate calls (prompt + tokens new tokens and prompt
-- + 1), divided by tokens - 1: prefill and the call's fixed cost drop out (cpu: the same in
-- process CPU time, which a busy machine inflates less; with more threads it sums them). The best of --repeats
-- pairs is reported (a shared machine only ever slows a run). GB/s counts every weight byte the
-- decode step reads once per token (all parameters but the embedding table, of which one row per
-- token is read; a tied head reads it whole). --save DIR writes the model as a Hugging Face
-- checkpoint (config.json + model.safetensors) for the peers (scripts/bench/peers/llama_cpp.sh).
-- mistral_tiny_v256: mistral_tiny's layers with a 256-word head (the per-token fixed cost).
-- mistral_1b: the ~1B Mistral shape of TinyLlama (hidden 2048, intermediate 5632, 22 layers,
-- 32 / 4 heads, vocab 32000), a memory-bound decode (2.2 GB of bf16 weights, past any LLC).
-- --profile N: after the timing, the op profile of one decode step (the difference of the
-- long and the 1-token call, keng.profile) as its N most costly op lines (text format only).
local here = (arg and arg[0] or ""):match("^(.*)/bench/[^/]*$")
if here then package.path = here .. "/?.lua;" .. here .. "/lib/?.lua;" .. package.path end
local keng = require "keng"

local MODELS = {
  gemma_tiny = {family = "gemma", preset = "gemma_tiny"},
  mistral_tiny = {family = "mistral", preset = "mistral_tiny"},
  -- mistral_tiny with a 256-word vocabulary: what a token costs besides the 16 MB LM head
  mistral_tiny_v256 = {family = "mistral", cfg = {vocab = 256}},
  mistral_1b = {family = "mistral", cfg = {vocab = 32000, layers = 22, hidden = 2048, heads = 32, kv_heads = 4,
                                           head_dim = 64, ffn = 5632}},
}

local usage = [==[usage: keng scripts/bench/decode.lua [--model mistral_tiny|gemma_tiny|mistral_1b|<family preset>]
       [--batch 1] [--threads N] [--tokens 64] [--prompt 6] [--repeats 3] [--dtype bf16] [--save DIR]
       [--compare FILE.json] [--format text|json] [--profile N]]==]

local function die(msg)
  io.stderr:write("decode.lua: ", msg, "\n", usage, "\n")
  os.exit(2)
end

local o = {model = "mistral_tiny", batch = 1, tokens = 64, prompt = 6, repeats = 3, dtype = "bf16", format = "text"}
local NUM = {batch = true, threads = true, tokens = true, prompt = true, repeats = true, profile = true}
local i = 1
while i <= #arg do
  local key = arg[i]:match("^%-%-([%w_]+)$")
  if not key then die("unexpected argument '" .. arg[i] .. "'") end
  if key == "help" then print(usage) os.exit(0) end
  if o[key] == nil and not NUM[key] and key ~= "save" and key ~= "compare" then die("unknown option --" .. key) end
  local v = arg[i + 1]
  if v == nil then die("--" .. key .. " needs a value") end
  if NUM[key] then
    v = math.tointeger(tonumber(v))
    if not v or v < 1 then die("--" .. key .. " must be a positive integer") end
  end
  o[key] = v
  i = i + 2
end
if o.tokens < 2 then die("--tokens must be >= 2") end
if o.format ~= "text" and o.format ~= "json" then die("--format must be text or json") end
if o.threads then keng.set_num_threads(o.threads) end

local spec = MODELS[o.model]
if not spec then
  local fam = o.model:match("^(%a+)_")
  if not fam then die("unknown model '" .. o.model .. "'") end
  spec = {family = fam, preset = o.model}
end
local family = require("models." .. spec.family)
keng.manual_seed(0)
local lm
if spec.cfg then
  local cfg = family.config(spec.family .. "_tiny")
  for k, v in pairs(spec.cfg) do cfg[k] = v end
  lm = family.build(cfg, {dtype = o.dtype})
else
  lm = family.from_preset(spec.preset, {dtype = o.dtype})
end
lm:eval()
if o.save then
  lm:save_pretrained(o.save)
  print("wrote " .. o.save)
  os.exit(0)
end

-- the peer's row for this model and batch (keng-bench/1 JSON of scripts/bench/peers/llama_cpp.sh)
local peer
if o.compare then
  local f = io.open(o.compare)
  if not f then die("--compare: cannot open " .. o.compare) end
  local ok, doc = pcall(require("keng.json").decode, f:read("a"))
  f:close()
  if not ok or type(doc) ~= "table" or type(doc.rows) ~= "table" then die("--compare: " .. o.compare .. " is not a benchmark JSON") end
  local id = string.format("decode_%s_%d", o.model, o.batch)
  for _, r in ipairs(doc.rows) do
    if r.id == id and r.status == "ok" then peer = {name = doc.framework or "peer", ms = r.mean_ms, threads = r.threads} end
  end
  if not peer then die("--compare: " .. o.compare .. " has no row " .. id) end
end

-- weight bytes read per token
local bytes, embed = 0, lm.model.embed_tokens.weight
for _, p in ipairs(lm:parameters()) do
  if p ~= embed or lm.cfg.tie then bytes = bytes + p:numel() * ({f32 = 4, f64 = 8, bf16 = 2, f16 = 2})[p.dtype] end
end

local B, P = o.batch, o.prompt
local prompts = keng.randint(3, math.min(lm.cfg.vocab, 250), {B, P})   -- [B, P], no special ids
local best, best_cpu = require("keng.bench").decode_per_token(lm, prompts, {tokens = o.tokens, repeats = o.repeats})
local ms = best * 1e3
local gbs = bytes / best / 1e9
local r = {id = string.format("decode_%s_%d", o.model, B), model = o.model, batch = B, threads = keng.num_threads(), tokens = o.tokens, ms_per_token = ms,
           cpu_ms_per_token = best_cpu * 1e3,
           tokens_per_s = B / best, weight_bytes = bytes, gb_per_s = gbs}
if peer then
  r.peer, r.peer_ms_per_token, r.peer_threads, r.ratio = peer.name, peer.ms, peer.threads, ms / peer.ms
end
if o.format == "json" then
  print(require("keng.json").encode(r))
else
  print(string.format("%s batch %d threads %d: %.3f ms/token (cpu %.3f)  %.1f tok/s  weights %.1f MB  %.2f GB/s",
    o.model, B, r.threads, ms, r.cpu_ms_per_token, r.tokens_per_s, bytes / 1e6, gbs))
  if peer then
    print(string.format("  %s: %.3f ms/token (%s threads)  keng/%s %.2f", peer.name, peer.ms, tostring(peer.threads),
      peer.name, r.ratio))
  end
  if o.profile then -- one step's ops: (long call - 1-token call) / (tokens - 1)
    local profile = require "keng.profile"
    local runs = {}
    keng.no_grad(function()
      for _, count in ipairs({o.tokens, 1}) do
        profile.start()
        lm:generate(prompts, {max_new_tokens = count, sampler = "greedy", stop_token_ids = {}})
        runs[#runs + 1] = profile.stop()
      end
    end)
    local n = o.tokens - 1
    print(profile.report(profile.combine({{runs[1], 1 / n}, {runs[2], -1 / n}}), {top = o.profile}))
  end
end
