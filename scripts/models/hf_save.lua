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

-- encode_json(v) -> JSON text as transformers writes config.json (json.dumps(indent=2,
-- sort_keys=True)): objects with sorted keys, arrays for sequences (and json.array tables),
-- json.null as null; numbers as keng.json writes them (Python's way: floats exactly and with a
-- fraction, since transformers 5 refuses initializer_factor = 1 where it wants a float; -Infinity)
function M.encode_json(v, depth)
  depth = depth or 0
  local pad, inner = string.rep("  ", depth), string.rep("  ", depth + 1)
  if v == nil or v == json.null then return "null" end
  local ty = type(v)
  if ty == "number" then return json.encode(v) end
  if ty == "boolean" then return tostring(v) end
  if ty == "string" then return json.encode(v) end
  if ty ~= "table" then error("hf_save: cannot write a " .. ty .. " to JSON", 2) end
  local n, keys = #v, {}
  for k in pairs(v) do keys[#keys + 1] = k end
  local is_array = getmetatable(v) == json.array_mt or (n > 0 and #keys == n)
  if #keys == 0 then return is_array and "[]" or "{}" end
  local parts = {}
  if is_array then
    for i = 1, n do parts[i] = inner .. M.encode_json(v[i], depth + 1) end
    return "[\n" .. table.concat(parts, ",\n") .. "\n" .. pad .. "]"
  end
  for _, k in ipairs(keys) do
    if type(k) ~= "string" then error("hf_save: a JSON object key must be a string, got " .. tostring(k), 2) end
  end
  table.sort(keys)
  for i, k in ipairs(keys) do parts[i] = inner .. json.encode(k) .. ": " .. M.encode_json(v[k], depth + 1) end
  return "{\n" .. table.concat(parts, ",\n") .. "\n" .. pad .. "}"
end

local function write_text(path, text, who, level)
  local f, err = io.open(path .. ".tmp", "w")
  if not f then error(who .. ": cannot write " .. path .. ": " .. tostring(err), level + 1) end
  f:write(text)
  f:close()
  local ok, rerr = os.rename(path .. ".tmp", path)
  if not ok then error(who .. ": cannot rename to " .. path .. ": " .. tostring(rerr), level + 1) end
end

local function mkdir(dir) os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "'") end

local function read_all(path, who, level)
  local f, err = io.open(path, "rb")
  if not f then error(who .. ": cannot read " .. path .. ": " .. tostring(err), level + 1) end
  local s = f:read("a")
  f:close()
  return s
end

-- tokenizer_config.json as transformers 5 writes it for the tokenizer class `class`, for a
-- tokenizer loaded without one (a bare vocab.txt, tokenizer.model, vocab.json + merges.txt or
-- tokenizer.json): the special tokens by name, and the options keng used
local function tokenizer_config(tok, class)
  local T = require "keng.tokenizers"
  local mt = getmetatable(tok)
  local c = {tokenizer_class = class, backend = "tokenizers"}
  local function name(id, lookup) if id and id >= 0 then return lookup(id) end end
  if mt == T.Bert then
    c.tokenizer_class = "BertTokenizer"
    c.do_lower_case, c.tokenize_chinese_chars = tok.lowercase, tok.tokenize_chinese_chars
    c.strip_accents = tok.strip_accents == nil and json.null or tok.strip_accents
    c.cls_token, c.sep_token, c.pad_token, c.unk_token, c.mask_token = "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"
    c.model_max_length = tok.max_length
  elseif mt == T.SentencePiece then
    local sp = tok.sp
    local piece = function(id) return sp:id_to_piece(id) end
    c.bos_token, c.eos_token, c.unk_token = name(sp.bos_id, piece), name(sp.eos_id, piece), name(sp.unk_id, piece)
    c.pad_token = name(sp.pad_id, piece)
    -- keng's prompts start with BOS (lm.add_bos) and end without EOS, as the real checkpoints' configs say
    c.add_bos_token, c.add_eos_token = sp.bos_id >= 0, false
  elseif mt == T.Json then                                          -- the tokens it was given by name only
    local named = tok.named or {}
    c.bos_token, c.eos_token, c.pad_token = named.bos, named.eos, named.pad
    c.model_max_length = tok.max_length
  elseif tok.raw and tok.bos_id and tok.eos_id then                 -- keng.clip_tokenize
    c.tokenizer_class = "CLIPTokenizer"
    local t = function(id) return tok:id_to_token(id) end
    c.bos_token, c.eos_token, c.unk_token = t(tok.bos_id), t(tok.eos_id), t(tok.eos_id)
    c.pad_token, c.model_max_length = t(tok.pad_id), tok.max_length
  end
  return c
end

-- save_tokenizer(tok, dir, class, who, level): the files tok was loaded from (tok.files, as
-- loaded: tokenizer.json, vocab.txt, tokenizer.model, vocab.json + merges.txt, and the
-- tokenizer_config.json / special_tokens_map.json / chat template files beside them), plus a
-- tokenizer_config.json as transformers writes one when tok had none. Tokenizer files of other
-- kinds left in dir by an earlier save are removed (a loader would pick a stale tokenizer.json).
function M.save_tokenizer(tok, dir, class, who, level)
  level = level + 1
  local files = type(tok) == "table" and rawget(tok, "files")
  if type(files) ~= "table" then
    error(who .. ": the tokenizer has no files to save (not loaded from a file); set it to nil to save the weights alone",
      level)
  end
  mkdir(dir)
  for _, name in ipairs(require("keng.tokenizers").FILES) do
    if files[name] then
      write_text(dir .. "/" .. name, read_all(files[name], who, level), who, level)
    else
      os.remove(dir .. "/" .. name)
    end
  end
  if not files["tokenizer_config.json"] then
    write_text(dir .. "/tokenizer_config.json", M.encode_json(tokenizer_config(tok, class)) .. "\n", who, level)
  end
end

-- the model's tokenizer (rawget: a field, not a child module), checked before anything is written
local function model_tokenizer(model, who, level)
  local tok = rawget(model, "tokenizer")
  if tok ~= nil and (type(tok) ~= "table" or type(rawget(tok, "files")) ~= "table") then
    error(who .. ": the model's tokenizer has no files to save (not loaded from a file); set model.tokenizer = nil " ..
      "to save the weights alone", level + 1)
  end
  return tok
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
  mkdir(dir)
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
    write_text(index, M.encode_json({metadata = {total_size = total}, weight_map = map}) .. "\n", who, level)
    os.remove(dir .. "/" .. base .. ".safetensors")
  end
  write_text(dir .. "/config.json", M.encode_json(config) .. "\n", who, level)
  return dir
end

-- the decoder LMs (models.causal_lm families) ---------------------------------------------------

local ARCH = {llama = "LlamaForCausalLM", qwen2 = "Qwen2ForCausalLM", mistral = "MistralForCausalLM",
              gemma = "GemmaForCausalLM"}
local ACT = {silu = "silu", gelu = "gelu", gelu_tanh = "gelu_pytorch_tanh"}
local TOKENIZER_CLASS = {llama = "LlamaTokenizer", mistral = "LlamaTokenizer", gemma = "GemmaTokenizer",
                         qwen2 = "Qwen2Tokenizer"}

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
  local tok = model_tokenizer(lm, who, level)
  M.write(dir, tensors, lm_config(lm, family, dtype), opts, who, level)
  if tok then M.save_tokenizer(tok, dir, TOKENIZER_CLASS[family], who, level) end
  return dir
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
  local tok = model_tokenizer(model, who, level)
  M.write(dir, tensors, j, opts, who, level)
  if tok then M.save_tokenizer(tok, dir, "BertTokenizer", who, level) end
  return dir
end

-- CLIP text encoder (models.clip) as transformers 5's CLIPTextModel: names without keng's
-- "text_model." prefix; config.json from the one it was loaded with (model.hf_config: ids,
-- projection_dim kept), else CLIPTextConfig's defaults for what keng does not hold --------------

local CLIP_ACT = {quick_gelu = "quick_gelu", gelu = "gelu"}

local function clip_config(model, dtype, ids)
  local c = model.config
  local j = {}
  for k, v in pairs(rawget(model, "hf_config") or {bos_token_id = 49406, eos_token_id = 49407, pad_token_id = 1,
    projection_dim = 512, initializer_factor = 1.0, initializer_range = 0.02, attention_dropout = 0.0}) do
    j[k] = v
  end
  for k, v in pairs(ids or {}) do if j[k] == nil or not rawget(model, "hf_config") then j[k] = v end end
  j.transformers_version = nil
  j.architectures, j.model_type = {"CLIPTextModel"}, "clip_text_model"
  j.vocab_size, j.hidden_size, j.intermediate_size = c.vocab, c.width, c.mlp
  j.num_hidden_layers, j.num_attention_heads, j.max_position_embeddings = c.layers, c.heads, c.max_positions
  j.layer_norm_eps, j.hidden_act, j.dtype = c.eps, CLIP_ACT[c.activation], HF_DTYPE[dtype]
  return j
end

local function check_dir(who, dir, level)
  if type(dir) ~= "string" then error(who .. ": dir must be a string, got " .. type(dir), level + 1) end
end

-- clip(model, dir, {max_shard_size =}, level, ids) -> dir; ids: {bos_token_id =, ...} of the
-- pipeline's tokenizer for a model without hf_config
function M.clip(model, dir, opts, level, ids)
  level = (level or 1) + 1
  local who = "CLIPTextModel:save_pretrained"
  opts = options.check(who, opts, {"max_shard_size"}, level)
  check_dir(who, dir, level)
  local tensors, dtype = {}, nil
  for k, t in pairs(model:state_dict()) do
    if k:find("%.lora_[ab]$") then error(who .. ": the model has LoRA adapters (" .. k .. "): lora.merge first", level) end
    tensors[k:gsub("^text_model%.", "")] = t
    dtype = dtype or (HF_DTYPE[t.dtype] and t.dtype)
  end
  return M.write(dir, tensors, clip_config(model, dtype, ids), opts, who, level)
end

-- SAM (models.sam) as transformers' SamModel: keng's names are its names, except the tied
-- positional Gaussian, which transformers saves as shared_image_embedding.positional_embedding;
-- config.json from the one it was loaded with (model.hf_config), else built from the config --

local function sam_config(model)
  local c = model.cfg
  local patch_grid = c.image_size // c.patch
  return {architectures = {"SamModel"}, model_type = "sam", initializer_range = 0.02, tie_word_embeddings = true,
    vision_config = {model_type = "sam_vision_model", hidden_size = c.width, num_hidden_layers = c.depth,
      num_attention_heads = c.heads, mlp_dim = c.mlp, image_size = c.image_size, patch_size = c.patch,
      window_size = c.window, global_attn_indexes = json.array({table.unpack(c.global)}), layer_norm_eps = c.eps,
      output_channels = c.out_chans, qkv_bias = c.qkv_bias ~= false, use_abs_pos = c.abs_pos ~= false,
      use_rel_pos = c.rel_pos ~= false, num_pos_feats = c.prompt_dim // 2, hidden_act = "gelu", num_channels = 3,
      attention_dropout = 0.0, dropout = 0.0, initializer_range = 1e-10, mlp_ratio = c.mlp / c.width},
    prompt_encoder_config = {model_type = "sam_prompt_encoder", hidden_size = c.prompt_dim, image_size = c.image_size,
      patch_size = c.patch, image_embedding_size = patch_grid, mask_input_channels = c.mask_in_chans,
      num_point_embeddings = 4, hidden_act = "gelu", layer_norm_eps = 1e-6},
    mask_decoder_config = {model_type = "sam_mask_decoder", hidden_size = c.prompt_dim, num_hidden_layers = c.dec_depth,
      num_attention_heads = c.dec_heads, mlp_dim = c.dec_mlp, attention_downsample_rate = c.dec_downsample,
      num_multimask_outputs = c.multimask, iou_head_hidden_dim = c.iou_hidden, iou_head_depth = c.iou_depth,
      hidden_act = "relu", layer_norm_eps = 1e-6}}
end

function M.sam(model, dir, opts, level)
  level = (level or 1) + 1
  local who = "SamModel:save_pretrained"
  opts = options.check(who, opts, {"max_shard_size"}, level)
  check_dir(who, dir, level)
  local tensors, dtype = {}, nil
  for k, t in pairs(model:state_dict()) do
    if k:find("%.lora_[ab]$") then error(who .. ": the model has LoRA adapters (" .. k .. "): lora.merge first", level) end
    if k == "prompt_encoder.shared_embedding.positional_embedding" then k = "shared_image_embedding.positional_embedding" end
    tensors[k] = t
    dtype = dtype or (HF_DTYPE[t.dtype] and t.dtype)
  end
  local j = {}
  for k, v in pairs(rawget(model, "hf_config") or sam_config(model)) do j[k] = v end
  j.transformers_version, j.dtype = nil, HF_DTYPE[dtype]
  return M.write(dir, tensors, j, opts, who, level)
end

-- a whole Stable Diffusion pipeline (models.stable_diffusion) in diffusers' layout:
-- model_index.json, unet/, vae/, text_encoder/, tokenizer/, scheduler/ ----------------------

-- the diffusers class and config of a keng scheduler (models.schedulers or SD's DDIM)
local function scheduler_config(sched, who, level)
  local S = require "models.schedulers"
  local class
  if getmetatable(sched) == require("models.stable_diffusion").DDIM then
    class = "DDIMScheduler"
  else
    for c, name in pairs(S.by_class) do if name == sched.name then class = c end end
    if sched.name == "dpmpp_2m_karras" then class = "DPMSolverMultistepScheduler" end
  end
  if not class or type(sched.config) ~= "table" then
    error(who .. ": the scheduler has no diffusers class (a models.schedulers scheduler or DDIM expected)", level + 1)
  end
  local j = {_class_name = class}
  for k, v in pairs(sched.config) do if k:sub(1, 1) ~= "_" then j[k] = v end end
  if sched.name == "dpmpp_2m_karras" then j.use_karras_sigmas = true end
  return j, class
end

function M.pipeline(pipe, dir, opts, level)
  level = (level or 1) + 1
  local who = "StableDiffusionPipeline:save_pretrained"
  opts = options.check(who, opts, {"max_shard_size"}, level)
  check_dir(who, dir, level)
  local tok = rawget(pipe, "tokenizer")
  if type(tok) ~= "table" or type(rawget(tok, "files")) ~= "table" then
    error(who .. ": the pipeline's tokenizer has no files to save (from_preset without {tokenizer = dir} tokenizes " ..
      "byte by byte): build it with a CLIP tokenizer directory", level)
  end
  for _, part in ipairs{"unet", "vae", "text_encoder"} do
    if not pipe[part] then error(who .. ": the pipeline has no " .. part, level) end
  end
  local sched, sched_class = scheduler_config(pipe.scheduler, who, level)
  pipe.unet:save_pretrained(dir .. "/unet", opts)
  pipe.vae:save_pretrained(dir .. "/vae", opts)
  M.clip(pipe.text_encoder, dir .. "/text_encoder", opts, level,
    {bos_token_id = tok.bos_id, eos_token_id = tok.eos_id, pad_token_id = tok.pad_id})
  M.save_tokenizer(tok, dir .. "/tokenizer", "CLIPTokenizer", who, level)
  mkdir(dir .. "/scheduler")
  write_text(dir .. "/scheduler/scheduler_config.json", M.encode_json(sched) .. "\n", who, level)
  local none = json.array({json.null, json.null})
  local index = {_class_name = rawget(pipe, "inpainting") and "StableDiffusionInpaintPipeline" or "StableDiffusionPipeline",
    feature_extractor = none, image_encoder = none, safety_checker = none, requires_safety_checker = false,
    scheduler = {"diffusers", sched_class}, text_encoder = {"transformers", "CLIPTextModel"},
    tokenizer = {"transformers", "CLIPTokenizer"}, unet = {"diffusers", "UNet2DConditionModel"},
    vae = {"diffusers", "AutoencoderKL"}}
  write_text(dir .. "/model_index.json", M.encode_json(index) .. "\n", who, level)
  return dir
end

return M
