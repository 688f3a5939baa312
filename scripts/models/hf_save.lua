-- models.hf_save — writing Hugging Face checkpoint directories: config.json plus safetensors
-- under Hugging Face names, split into shards with a model.safetensors.index.json when larger
-- than max_shard_size (transformers' layout, so from_pretrained in transformers and keng both
-- read it). The decoder LMs call it as lm:save_pretrained(dir, {max_shard_size = "5GB"}).
local keng = require "keng"
local json = require "keng.json"
local options = require "keng.options"

local M = {}

local HF_DTYPE = {f32 = "float32", bf16 = "bfloat16", f16 = "float16", f64 = "float64"}

-- "5GB" -> 5e9 bytes (KB/MB/GB/TB are powers of 10, KiB/MiB/GiB/TiB of 2, as transformers reads
-- them); a number is bytes
function M.parse_size(v, who, level)
  if math.type(v) == "integer" and v > 0 then return v end
  local units = {B = 1, KB = 1e3, MB = 1e6, GB = 1e9, TB = 1e12, KIB = 2^10, MIB = 2^20, GIB = 2^30, TIB = 2^40}
  local n, u = tostring(v):upper():match("^%s*([%d%.]+)%s*(%a+)%s*$")
  local size = n and tonumber(n) and units[u] and math.floor(tonumber(n) * units[u])
  if not size or size <= 0 then
    error(string.format("%s: max_shard_size must be a positive byte count or a string such as \"5GB\" or \"500MiB\", got %s",
      who, tostring(v)), level + 1)
  end
  return size
end

local function nbytes(t) return t:numel() * (require("keng.util").dtype_size(t.dtype) or 4) end

local function write_text(path, text, who, level)
  local f, err = io.open(path .. ".tmp", "w")
  if not f then error(who .. ": cannot write " .. path .. ": " .. tostring(err), level + 1) end
  f:write(text)
  f:close()
  local ok, rerr = os.rename(path .. ".tmp", path)
  if not ok then error(who .. ": cannot rename to " .. path .. ": " .. tostring(rerr), level + 1) end
end

-- write(dir, tensors, config, {max_shard_size =}, who, level): dir/config.json and the weights.
-- Shards fill in name order; a tensor larger than the limit gets a shard of its own (as
-- transformers). Files left from an earlier save in the other layout are removed, so a loader
-- cannot pick a stale one.
function M.write(dir, tensors, config, opts, who, level, base)
  level = level + 1
  base = base or "model"                             -- diffusers: "diffusion_pytorch_model"
  local max = M.parse_size(opts.max_shard_size or "5GB", who, level)
  local names, total = {}, 0
  for k, t in pairs(tensors) do
    if t.device == "meta" then error(who .. ": " .. k .. " is on the meta device (no values to save)", level) end
    names[#names + 1] = k
    total = total + nbytes(t)
  end
  table.sort(names)
  os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "'")
  local meta = {format = "pt"}
  local index = dir .. "/" .. base .. ".safetensors.index.json"
  if total <= max then
    keng.save(dir .. "/" .. base .. ".safetensors", tensors, meta)
    os.remove(index)
  else
    local shards, cur, size = {}, {}, 0
    for _, k in ipairs(names) do
      local b = nbytes(tensors[k])
      if size > 0 and size + b > max then shards[#shards + 1], cur, size = cur, {}, 0 end
      cur[#cur + 1], size = k, size + b
    end
    shards[#shards + 1] = cur
    local map = {}
    for i, list in ipairs(shards) do
      local file = string.format("%s-%05d-of-%05d.safetensors", base, i, #shards)
      local part = {}
      for _, k in ipairs(list) do part[k], map[k] = tensors[k], file end
      keng.save(dir .. "/" .. file, part, meta)
    end
    write_text(index, json.encode({metadata = {total_size = total}, weight_map = map}, {indent = "  "}) .. "\n", who, level)
    os.remove(dir .. "/" .. base .. ".safetensors")
  end
  write_text(dir .. "/config.json", json.encode(config, {indent = "  "}) .. "\n", who, level)
  return dir
end

-- the decoder LMs (models.causal_lm families) ---------------------------------------------------

local ARCH = {llama = "LlamaForCausalLM", qwen2 = "Qwen2ForCausalLM", mistral = "MistralForCausalLM",
              gemma = "GemmaForCausalLM"}
local ACT = {silu = "silu", gelu = "gelu", gelu_tanh = "gelu_pytorch_tanh"}

-- config.json for cfg (the inverse of causal_lm.parse_config)
local function lm_config(lm, family, dtype)
  local c = lm.cfg
  local j = {architectures = {ARCH[family]}, model_type = family, vocab_size = c.vocab, hidden_size = c.hidden,
    num_hidden_layers = c.layers, num_attention_heads = c.heads, num_key_value_heads = c.kv_heads,
    head_dim = c.head_dim, intermediate_size = c.ffn, rms_norm_eps = c.eps, hidden_act = ACT[c.act],
    tie_word_embeddings = c.tie and true or false, bos_token_id = c.bos_id, pad_token_id = c.pad_id,
    eos_token_id = c.eos_ids and json.array({table.unpack(c.eos_ids)}) or c.eos_id, dtype = HF_DTYPE[dtype],
    attention_dropout = 0.0}
  local r = c.rope
  if r then
    local p = {rope_type = r.type, rope_theta = r.base}
    for k, v in pairs(r) do if k ~= "type" and k ~= "base" and k ~= "max_pos" then p[k] = v end end
    j.rope_parameters, j.max_position_embeddings = p, r.max_pos
  else
    j.rope_parameters = {rope_type = "default", rope_theta = c.rope_base}
  end
  if family == "llama" then j.attention_bias, j.mlp_bias = c.qkv_bias and true or false, c.mlp_bias and true or false end
  if family == "mistral" then j.sliding_window = c.window or json.null end
  if family == "qwen2" then j.use_sliding_window = false end
  if family == "gemma" then j.attention_bias = false end
  return j
end

-- causal_lm(lm, dir, {max_shard_size = "5GB"}) -> dir
function M.causal_lm(lm, dir, opts, level)
  level = (level or 1) + 1
  local who = "save_pretrained"
  opts = options.check(who, opts, {"max_shard_size"}, level)
  if type(dir) ~= "string" then error(who .. ": dir must be a string, got " .. type(dir), level) end
  local family = rawget(lm, "family")
  if not ARCH[family] then
    error(who .. ": the model has no Hugging Face family (build it with a family's from_preset / from_pretrained)", level)
  end
  local cm = require "models.causal_lm"
  local tensors, dtype = {}, nil
  for k, t in pairs(lm:state_dict()) do
    if k:find("%.lora_[ab]$") then
      error(who .. ": the model has LoRA adapters (" .. k .. "): lora.merge(lm) first, or save them with lora.save_adapters", level)
    end
    tensors[cm.keng_to_hf(k)] = t
    if k == "model.embed_tokens.weight" then dtype = t.dtype end
  end
  return M.write(dir, tensors, lm_config(lm, family, dtype), opts, who, level)
end

-- diffusers models (UNet, VAE): keng's names are diffusers' and model.config is the config.json
-- that built the model, so both are written back as they are -------------------------------

function M.diffusers(model, dir, opts, class_name, level)
  level = (level or 1) + 1
  local who = model.__name .. ":save_pretrained"
  opts = options.check(who, opts, {"max_shard_size"}, level)
  if type(dir) ~= "string" then error(who .. ": dir must be a string, got " .. type(dir), level) end
  local tensors = {}
  for k, t in pairs(model:state_dict()) do
    if k:find("%.lora_[ab]$") then error(who .. ": the model has LoRA adapters (" .. k .. "): lora.merge first", level) end
    tensors[k] = t
  end
  local cfg = {_class_name = class_name}
  for k, v in pairs(model.config) do cfg[k] = v end
  return M.write(dir, tensors, cfg, opts, who, level, "diffusion_pytorch_model")
end

-- BERT (models.bert): the backbone as BertModel, the classifier as BertForSequenceClassification
-- (names under "bert." plus classifier.*) ---------------------------------------------------

local BERT_LAYER = {["attention.query"] = "attention.self.query", ["attention.key"] = "attention.self.key",
  ["attention.value"] = "attention.self.value", ["attention.out"] = "attention.output.dense",
  attention_norm = "attention.output.LayerNorm", ffn_in = "intermediate.dense", ffn_out = "output.dense",
  ffn_norm = "output.LayerNorm"}
local BERT_TOP = {token_embedding = "embeddings.word_embeddings", position_embedding = "embeddings.position_embeddings",
  segment_embedding = "embeddings.token_type_embeddings", embeddings_norm = "embeddings.LayerNorm",
  pooler = "pooler.dense"}
local BERT_ACT = {gelu = "gelu", gelu_tanh = "gelu_pytorch_tanh", relu = "relu", silu = "silu", tanh = "tanh"}

-- our backbone name -> Hugging Face's (the inverse of bert.hf_name)
local function bert_name(name)
  local path, leaf = name:match("^(.*)%.([%w_]+)$")
  if BERT_TOP[path] then return BERT_TOP[path] .. "." .. leaf end
  local i, rest = path:match("^layers%.(%d+)%.(.+)$")
  if i and BERT_LAYER[rest] then return string.format("encoder.layer.%d.%s.%s", require("models.common").hf_layer(i), BERT_LAYER[rest], leaf) end
  return nil
end

function M.bert(model, dir, opts, level)
  level = (level or 1) + 1
  local who = "bert:save_pretrained"
  opts = options.check(who, opts, {"max_shard_size"}, level)
  if type(dir) ~= "string" then error(who .. ": dir must be a string, got " .. type(dir), level) end
  local classifier = model.__name == "BertClassifier"
  local tensors, dtype = {}, nil
  for k, t in pairs(model:state_dict()) do
    local hf
    if classifier then
      hf = k:match("^classifier%.") and k or (k:match("^backbone%.(.*)$") and bert_name(k:match("^backbone%.(.*)$")))
      if hf and not k:match("^classifier%.") then hf = "bert." .. hf end
    else
      hf = bert_name(k)
    end
    if not hf then error(who .. ": no Hugging Face name for " .. k .. " (LoRA adapters: lora.merge first)", level) end
    tensors[hf] = t
    dtype = dtype or (HF_DTYPE[t.dtype] and t.dtype)
  end
  local c = model.config
  local j = {architectures = {classifier and "BertForSequenceClassification" or "BertModel"}, model_type = "bert",
    vocab_size = c.vocab, hidden_size = c.hidden, num_hidden_layers = c.layers, num_attention_heads = c.heads,
    intermediate_size = c.ffn, max_position_embeddings = c.max_positions, type_vocab_size = c.segments,
    layer_norm_eps = c.eps, hidden_act = BERT_ACT[c.activation], hidden_dropout_prob = c.dropout,
    attention_probs_dropout_prob = c.dropout, position_embedding_type = "absolute", dtype = HF_DTYPE[dtype]}
  if not j.hidden_act then error(who .. ": activation '" .. tostring(c.activation) .. "' has no Hugging Face name", level) end
  if classifier then
    j.id2label, j.label2id = {}, {}
    for i = 0, model.num_classes - 1 do j.id2label[tostring(i)], j.label2id["LABEL_" .. i] = "LABEL_" .. i, i end
  end
  return M.write(dir, tensors, j, opts, who, level)
end

return M
