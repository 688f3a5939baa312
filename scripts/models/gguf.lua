-- models.gguf — llama.cpp's GGUF files as keng causal LMs (docs/gguf.md).
--
--   local gguf = require "models.gguf"
--   local lm = gguf.from_gguf("model-Q4_K_M.gguf", {dtype = "auto", device = "cpu"})
--   local lm = require("models.mistral").from_gguf(path)         -- the same, checking the family
--   lm:generate({"The capital of France is"}, {max_length = 32})  -- lm.tokenizer from tokenizer.ggml.*
--   local cfg, family = gguf.config(metadata, tensor_info)        -- the keng config alone
--
-- The file is read by keng.gguf.open (engine/io/gguf.c, validated), one tensor at a time. Metadata of the "llama" and
-- "gemma" architectures (Mistral's GGUFs use "llama") becomes keng's config: every key under
-- "<arch>." is either read or known not to change the numbers, anything else raises naming it.
-- Tensors: F32/F16/BF16 as stored; Q4_0 as keng int4 layers (the same codes and scales, exactly);
-- Q8_0, Q4_K, Q6_K dequantized at load into the model's dtype (no integer kernel for them yet).
-- Conventions of llama.cpp's convert_hf_to_gguf.py that are undone here:
--   * llama: q_proj / k_proj rows are permuted (pairs (i, i + D/2) made adjacent for ggml's
--     interleaved RoPE); the inverse permutation restores Hugging Face's row order;
--   * gemma: RMSNorm weights are stored as 1 + w, so the model is built with unit_offset = false
--     and multiplies by them as stored (the same f32 value Gemma's 1 + w gives).
local keng = require "keng"
local options = require "keng.options"

local M = {}

local FAMILY = {llama = "llama", gemma = "gemma"}   -- general.architecture -> keng family

-- keys under "<arch>.": the sizes and what they set, and the OTHER keys config reads itself (or,
-- context_length and vocab_size, does not need: the vocabulary is token_embd's row count)
local SIZE_KEYS = {{"block_count", "layers"}, {"embedding_length", "hidden"}, {"feed_forward_length", "ffn"},
                   {"attention.head_count", "heads"}, {"attention.head_count_kv", "kv_heads"},
                   {"attention.key_length", "head_dim"}}
local SIZES = {}
for _, e in ipairs(SIZE_KEYS) do SIZES[e[1]] = e[2] end
local OTHER = {context_length = true, vocab_size = true, ["rope.dimension_count"] = true,
                ["attention.value_length"] = true, ["attention.layer_norm_rms_epsilon"] = true,
                ["rope.freq_base"] = true, ["rope.scaling.type"] = true, ["rope.scaling.factor"] = true}

local function fail(who, level, fmt, ...) error(who .. ": " .. string.format(fmt, ...), level + 1) end

-- config(meta, info) -> cfg, family: keng's causal-LM config from GGUF metadata
function M.config(meta, info, who, level)
  who, level = who or "gguf.config", (level or 1) + 1
  local arch = meta["general.architecture"]
  local family = FAMILY[arch]
  if not family then
    fail(who, level, "general.architecture '%s' is not supported (keng reads: llama, gemma; Mistral files use llama)",
      tostring(arch))
  end
  local cfg = {}
  local prefix = arch .. "."
  local keys = {}
  for k in pairs(meta) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    if k:sub(1, #prefix) == prefix then
      local key = k:sub(#prefix + 1)
      if not (SIZES[key] or OTHER[key]) then
        fail(who, level, "metadata '%s' is not implemented by keng's %s (it reads: %s)", k, family,
          "block_count, embedding_length, feed_forward_length, attention.head_count(_kv), attention.key_length, " ..
          "attention.value_length, attention.layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count, " ..
          "rope.scaling.type (none, linear), rope.scaling.factor, context_length, vocab_size")
      end
    end
  end
  local function size(key, optional)
    local v = meta[prefix .. key]
    if v == nil and optional then return nil end
    if math.type(v) ~= "integer" or v < 1 then
      fail(who, level, "metadata '%s%s' must be a positive integer, got %s", prefix, key, tostring(v))
    end
    return v
  end
  for _, e in ipairs(SIZE_KEYS) do
    cfg[e[2]] = size(e[1], e[1] == "attention.head_count_kv" or e[1] == "attention.key_length")
  end
  cfg.kv_heads = cfg.kv_heads or cfg.heads
  cfg.head_dim = cfg.head_dim or cfg.hidden // cfg.heads
  local vlen, rdim = size("attention.value_length", true), size("rope.dimension_count", true)
  if vlen and vlen ~= cfg.head_dim then
    fail(who, level, "attention.value_length %d differs from the key length %d (not implemented)", vlen, cfg.head_dim)
  end
  if rdim and rdim ~= cfg.head_dim then
    fail(who, level, "rope.dimension_count %d is not the head dim %d (partial rotary is not implemented)", rdim, cfg.head_dim)
  end
  if cfg.heads % cfg.kv_heads ~= 0 then
    fail(who, level, "attention.head_count %d is not a multiple of attention.head_count_kv %d", cfg.heads, cfg.kv_heads)
  end
  local eps = meta[prefix .. "attention.layer_norm_rms_epsilon"]
  if type(eps) ~= "number" or not (eps >= 0) then
    fail(who, level, "metadata '%sattention.layer_norm_rms_epsilon' must be a number >= 0, got %s", prefix, tostring(eps))
  end
  cfg.eps = eps
  cfg.rope_base = meta[prefix .. "rope.freq_base"] or 10000
  local scaling = meta[prefix .. "rope.scaling.type"]
  if scaling == "linear" then
    local f = meta[prefix .. "rope.scaling.factor"]
    if type(f) ~= "number" or not (f > 0) then
      fail(who, level, "metadata '%srope.scaling.factor' must be a positive number, got %s", prefix, tostring(f))
    end
    cfg.rope = {type = "linear", base = cfg.rope_base, factor = f}
  elseif scaling ~= nil and scaling ~= "none" then
    fail(who, level, "metadata '%srope.scaling.type' '%s' is not implemented (keng reads: none, linear)", prefix,
      tostring(scaling))
  end
  local embd = info["token_embd.weight"]
  if not embd then fail(who, level, "the file has no token_embd.weight") end
  cfg.vocab = embd.shape[1]
  cfg.tie = info["output.weight"] == nil
  cfg.act, cfg.unit_offset, cfg.embed_scale = "silu", false, false
  if family == "gemma" then cfg.act, cfg.embed_scale = "gelu_tanh", true end
  cfg.qkv_bias = info["blk.0.attn_q.bias"] ~= nil or nil
  cfg.o_bias = info["blk.0.attn_output.bias"] ~= nil or nil
  cfg.mlp_bias = info["blk.0.ffn_up.bias"] ~= nil or nil
  cfg.bos_id = meta["tokenizer.ggml.bos_token_id"]
  cfg.eos_id = meta["tokenizer.ggml.eos_token_id"]
  cfg.pad_id = meta["tokenizer.ggml.padding_token_id"]
  return cfg, family
end

-- GGUF tensor name -> keng's (nil for an unknown one)
local BLOCK = {attn_norm = "input_layernorm", ffn_norm = "post_attention_layernorm",
               attn_q = "self_attn.query", attn_k = "self_attn.key", attn_v = "self_attn.value",
               attn_output = "self_attn.output", ffn_gate = "mlp.gate_proj", ffn_up = "mlp.up_proj",
               ffn_down = "mlp.down_proj"}
local TOP = {["token_embd.weight"] = "model.embed_tokens.weight", ["output_norm.weight"] = "model.norm.weight",
             ["output.weight"] = "lm_head.weight"}
function M.keng_name(name)
  if TOP[name] then return TOP[name] end
  local n, part, field = name:match("^blk%.(%d+)%.([%w_]+)%.(%w+)$")
  if n and BLOCK[part] and (field == "weight" or field == "bias") then
    return string.format("model.layers.%d.%s.%s", tonumber(n) + 1, BLOCK[part], field)
  end
end

-- the inverse of convert_hf_to_gguf.py's LlamaModel.permute on the rows of w (any dtype; Q4_0
-- codes and scales alike, whose rows are whole)
local function unpermute(w, n_head)
  local shape = w.shape
  local rest = {n_head, shape[1] // n_head // 2, 2}
  for i = 2, #shape do rest[#rest + 1] = shape[i] end
  return w:reshape(rest):transpose(2, 3):contiguous():reshape(shape)
end

-- rope_freqs.weight (llama.cpp's per-frequency divisors: Llama 3.1's band-wise RoPE, written
-- by convert_hf_to_gguf.py) -> cfg.rope: each inverse frequency base^(-2i/D) divided by its
-- factor, as ggml's rope with freq_factors does; models.rope's "longrope" computes exactly that
-- when both factor lists are these and no attention scale applies
function M.rope_factors(t, cfg, who, level)
  if cfg.rope then fail(who, level, "rope_freqs.weight and rope.scaling.type both set the RoPE frequencies") end
  if t.ndim ~= 1 or t.shape[1] ~= cfg.head_dim // 2 then
    fail(who, level, "rope_freqs.weight has shape [%s], expected [%d] (head dim / 2)",
      table.concat(t.shape, ","), cfg.head_dim // 2)
  end
  local f = t:to("f64"):tolist()
  cfg.rope = {type = "longrope", base = cfg.rope_base, short_factor = f, long_factor = f, factor = 1,
              attention_factor = 1, original_max_position_embeddings = math.maxinteger}
end

-- one GGUF tensor as keng state-dict entries {name = tensor} (w, and a Q4_0 / Q8_0 Linear's
-- scale): renamed, llama's q/k rows unpermuted, a Q4_0 / Q8_0 tensor outside the Linear layers
-- dequantized
function M.convert(name, w, s, cfg, family, dtype, type_name, who, level)
  local k = M.keng_name(name)
  if not k then fail(who, level, "tensor '%s' (%s) is not part of a %s model keng builds", name, type_name, family) end
  if family == "llama" then
    local heads = name:find("%.attn_q%.") and cfg.heads or name:find("%.attn_k%.") and cfg.kv_heads
    if heads then
      w = unpermute(w, heads)
      if s then s = unpermute(s, heads) end
    end
  end
  if s and not (k:find("^lm_head") or k:find("self_attn") or k:find("mlp")) then
    -- quantized only in Linear layers: the rest (the embedding) is float
    w, s = (w.dtype == "i8" and keng.dequantize_q8 or keng.dequantize_q4)(w, s, dtype), nil
  end
  local out = {[k] = w}
  if s then out[k .. "_scale"] = s end
  return out
end

-- a serialized SentencePiece ModelProto (the protobuf keng.sentencepiece reads) from the
-- "llama" tokenizer's metadata, as llama.cpp's SPM tokenizer uses it: BPE over the pieces' scores,
-- byte fallback when <0xNN> pieces exist, " " escaped to U+2581, add_space_prefix
local function varint(n)
  local b = {}
  repeat
    local x = n & 0x7f
    n = n >> 7
    b[#b + 1] = string.char(n ~= 0 and (x | 0x80) or x)
  until n == 0
  return table.concat(b)
end
local function field(num, wire, payload)
  if wire == 0 then return varint(num << 3) .. varint(payload) end
  if wire == 5 then return varint(num << 3 | 5) .. payload end
  return varint(num << 3 | 2) .. varint(#payload) .. payload
end

local function sentencepiece_proto(meta, who, level)
  local tokens, scores, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"],
    meta["tokenizer.ggml.token_type"]
  if type(tokens) ~= "table" or #tokens == 0 then fail(who, level, "tokenizer.ggml.tokens must be a list of strings") end
  if type(scores) ~= "table" or #scores ~= #tokens then
    fail(who, level, "tokenizer.ggml.scores must list one score per token (%d)", #tokens)
  end
  if types ~= nil and (type(types) ~= "table" or #types ~= #tokens) then
    fail(who, level, "tokenizer.ggml.token_type must list one type per token (%d)", #tokens)
  end
  local out, has_bytes = {}, false
  for i, tok in ipairs(tokens) do
    local ty = types and types[i] or 1
    if type(tok) ~= "string" or type(scores[i]) ~= "number" or math.type(ty) ~= "integer" or ty < 1 or ty > 6 then
      fail(who, level, "tokenizer token %d: a string, a score and a type 1..6 expected", i - 1)
    end
    if ty == 6 then has_bytes = true end
    out[i] = field(1, 2, field(1, 2, tok) .. field(2, 5, string.pack("<f", scores[i])) .. field(3, 0, ty))
  end
  local function piece(key)
    local id = meta[key]
    if math.type(id) == "integer" and id >= 0 and id < #tokens then return tokens[id + 1] end
  end
  local trainer = field(3, 0, 2) .. field(35, 0, has_bytes and 1 or 0)
  for num, key in pairs{[45] = "unknown_token_id", [46] = "bos_token_id", [47] = "eos_token_id",
                        [48] = "padding_token_id"} do
    local p = piece("tokenizer.ggml." .. key)
    if p then trainer = trainer .. field(num, 2, p) end
  end
  local prefix, extra = meta["tokenizer.ggml.add_space_prefix"], meta["tokenizer.ggml.remove_extra_whitespaces"]
  local normalizer = field(1, 2, "identity") .. field(3, 0, prefix == false and 0 or 1) ..
    field(4, 0, extra == true and 1 or 0) .. field(5, 0, 1)
  out[#out + 1] = field(2, 2, trainer)
  out[#out + 1] = field(3, 2, normalizer)
  return table.concat(out)
end

-- llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) -> the split regex and whether merges
-- are skipped for whole words found in the vocabulary (llama.cpp's ignore_merges)
local PRE = {
  ["llama-bpe"] = {regex = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
                   ignore_merges = true},
  gpt2 = {regex = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
}
PRE.default = PRE.gpt2

-- a tokenizer.json (Hugging Face tokenizers' byte-level BPE) from the "gpt2" tokenizer's
-- metadata: tokens, token_type (3 control -> special added tokens, 4 user-defined -> added
-- tokens), merges "a b", tokenizer.ggml.pre naming the split regex; BOS by a template when
-- add_bos_token is set (llama.cpp's default for llama-bpe)
local function bpe_json(meta, who, level)
  local tokens, types, merges = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"],
    meta["tokenizer.ggml.merges"]
  local pre_name = meta["tokenizer.ggml.pre"] or "default"
  local pre = PRE[pre_name]
  if not pre then
    fail(who, level, "tokenizer.ggml.pre '%s' is not supported (keng knows: default, gpt2, llama-bpe)", tostring(pre_name))
  end
  if type(tokens) ~= "table" or #tokens == 0 then fail(who, level, "tokenizer.ggml.tokens must be a list of strings") end
  if type(merges) ~= "table" then fail(who, level, "tokenizer.ggml.merges must be a list of \"a b\" strings") end
  local json = require "keng.json"
  local vocab, added = {}, {}
  for i, tok in ipairs(tokens) do
    if type(tok) ~= "string" then fail(who, level, "tokenizer token %d is not a string", i - 1) end
    vocab[tok] = i - 1
    local ty = types and types[i] or 1
    if ty == 3 or ty == 4 then
      added[#added + 1] = {id = i - 1, content = tok, single_word = false, lstrip = false, rstrip = false,
                           normalized = false, special = ty == 3}
    end
  end
  local pairs_ = {}
  for i, m in ipairs(merges) do
    local a, b
    if type(m) == "string" then a, b = m:match("^(%S+) (%S+)$") end
    if not a then fail(who, level, "tokenizer.ggml.merges[%d] '%s' is not \"a b\"", i, tostring(m)) end
    pairs_[i] = json.array{a, b}
  end
  local post
  local bos = meta["tokenizer.ggml.bos_token_id"]
  if meta["tokenizer.ggml.add_bos_token"] ~= false and math.type(bos) == "integer" and tokens[bos + 1] then
    local b = tokens[bos + 1]
    post = {type = "TemplateProcessing",
            single = json.array{{SpecialToken = {id = b, type_id = 0}}, {Sequence = {id = "A", type_id = 0}}},
            pair = json.array{{SpecialToken = {id = b, type_id = 0}}, {Sequence = {id = "A", type_id = 0}},
                              {SpecialToken = {id = b, type_id = 0}}, {Sequence = {id = "B", type_id = 1}}},
            special_tokens = {[b] = {id = b, ids = json.array{bos}, tokens = json.array{b}}}}
  end
  return json.encode{
    version = "1.0", added_tokens = json.array(added),
    pre_tokenizer = {type = "Sequence", pretokenizers = json.array{
      {type = "Split", pattern = {Regex = pre.regex}, behavior = "Isolated", invert = false},
      {type = "ByteLevel", add_prefix_space = false, trim_offsets = true, use_regex = false}}},
    post_processor = post,
    decoder = {type = "ByteLevel", add_prefix_space = true, trim_offsets = true, use_regex = true},
    model = {type = "BPE", byte_fallback = false, fuse_unk = false, ignore_merges = pre.ignore_merges or false,
             vocab = vocab, merges = json.array(pairs_)},
  }
end

-- hands `bytes` to a keng loader that reads a file, through a temp file removed at once
local function via_file(bytes, load)
  local tmp = os.tmpname()
  local f = assert(io.open(tmp, "wb"))
  f:write(bytes)
  f:close()
  local ok, r = pcall(load, tmp)
  os.remove(tmp)
  return ok, r
end

-- tokenizer.chat_template and the BOS / EOS strings, as keng.chat_template.attach takes them
-- from a tokenizer_config.json (tok:apply_chat_template renders the formats keng knows)
local function with_chat(tok, meta)
  local tokens = meta["tokenizer.ggml.tokens"]
  local function str(key)
    local id = meta["tokenizer.ggml." .. key]
    return math.type(id) == "integer" and tokens[id + 1] or nil
  end
  if type(meta["tokenizer.chat_template"]) == "string" then tok.chat_template = meta["tokenizer.chat_template"] end
  tok.bos_token, tok.eos_token = str("bos_token_id") or tok.bos_token, str("eos_token_id") or tok.eos_token
  return tok
end

-- keng tokenizer from tokenizer.ggml.* (nil when the file has none)
function M.tokenizer(meta, who, level)
  who, level = who or "gguf.tokenizer", (level or 1) + 1
  local model = meta["tokenizer.ggml.model"]
  if model == nil then return nil end
  if model == "gpt2" then
    local ok, tok = via_file(bpe_json(meta, who, level + 1), require("keng.tokenizers").from_file)
    if not ok then fail(who, level, "%s", tostring(tok)) end
    local function id(key)
      local v = meta["tokenizer.ggml." .. key]
      return math.type(v) == "integer" and v or -1
    end
    tok.bos_id, tok.eos_id = id("bos_token_id"), id("eos_token_id")
    tok.pad_id = id("padding_token_id") >= 0 and id("padding_token_id") or (tok.eos_id >= 0 and tok.eos_id or 0)
    return with_chat(tok, meta)
  end
  if model ~= "llama" then
    fail(who, level, "tokenizer.ggml.model '%s' is not supported (keng builds: llama, the SentencePiece kind, and " ..
      "gpt2, byte-level BPE); load the model with {tokenizer = false} and tokenize elsewhere", tostring(model))
  end
  if meta["tokenizer.ggml.precompiled_charsmap"] ~= nil then
    fail(who, level, "tokenizer.ggml.precompiled_charsmap (a normalizer) is not supported")
  end
  local ok, tok = via_file(sentencepiece_proto(meta, who, level + 1), require("keng.tokenizers").sentencepiece)
  if not ok then fail(who, level, "%s", tostring(tok)) end
  if meta["tokenizer.ggml.add_bos_token"] == false then tok.add_bos = false end
  return with_chat(tok, meta)
end

-- from_gguf(path, {dtype = "auto", device =, tokenizer = true}, family) -> CausalLM.
-- dtype "auto": the file's float weight dtype (f32, f16, bf16), bf16 when the embedding is quantized.
-- The model is built on the meta device and each tensor is converted and loaded in turn, so the
-- peak memory is the model plus one tensor (float tensors of the file's dtype are not even copied:
-- they stay views of the file's mapping, as safetensors checkpoints do).
function M.from_gguf(path, opts, want_family, level)
  level = (level or 1) + 1
  local who = (want_family or "gguf") .. ".from_gguf"
  options.check(who, opts, {"dtype", "device", "tokenizer"}, level)
  opts = opts or {}
  if type(path) ~= "string" then fail(who, level, "path must be a string, got %s", type(path)) end
  local ok, file = pcall(keng.gguf.open, path)
  if not ok then error(who .. ": " .. tostring(file):gsub("^[^:]*:%d+: ", ""), level) end
  local meta, info = file:metadata(), file:info()
  local cfg, family = M.config(meta, info, who, level)
  if want_family and want_family ~= family and not (want_family == "mistral" and family == "llama") then
    fail(who, level, "the file's general.architecture '%s' is not a %s model", meta["general.architecture"], want_family)
  end
  local dtype = opts.dtype or "auto"
  if dtype == "auto" then
    dtype = ({F32 = "f32", F16 = "f16", BF16 = "bf16"})[info["token_embd.weight"].type] or "bf16"
  end
  local tok = opts.tokenizer ~= false and M.tokenizer(meta, who, level) or nil   -- refused before the weights load
  local conv = {dtype = (dtype == "f32" or dtype == "bf16" or dtype == "f16") and dtype or "f32"}
  if info["rope_freqs.weight"] then M.rope_factors(file:tensor("rope_freqs.weight"), cfg, who, level + 1) end
  local lm = require("models." .. (want_family or family)).build(cfg, {dtype = dtype, device = "meta"})
  local names = {}
  for name in pairs(info) do if name ~= "rope_freqs.weight" then names[#names + 1] = name end end
  table.sort(names)
  local quantize, loaded = require "keng.quantize", {}
  for _, name in ipairs(names) do
    local w, s = file:tensor(name, conv)
    local part = M.convert(name, w, s, cfg, family, dtype, info[name].type, who, level + 1)
    quantize.prepare(lm, part)
    local okl, e = pcall(lm.load_state_dict, lm, part, {strict = false})
    if not okl then error(who .. ": " .. tostring(e):gsub("^[^:]*:%d+: ", ""), level) end
    for k in pairs(part) do
      if loaded[k] then fail(who, level, "two tensors of the file load into '%s'", k) end
      if #e.unexpected > 0 then fail(who, level, "tensor '%s' does not fit this model (no '%s' in it)", name, k) end
      loaded[k] = true
    end
  end
  file:close()
  local missing = {}
  for k in pairs(lm:state_dict()) do if not loaded[k] then missing[#missing + 1] = k end end
  table.sort(missing)
  if #missing > 0 then fail(who, level, "the file lacks tensors for: %s", table.concat(missing, ", ")) end
  if opts.device and opts.device ~= "cpu" then lm:to(opts.device) end
  rawset(lm, "tokenizer", tok)
  if family == "gemma" then   -- its norms hold 1 + w: a Gemma config.json would add the 1 again
    rawset(lm, "save_pretrained", function()
      error("save_pretrained: this Gemma was loaded from a GGUF file, whose RMSNorm weights hold 1 + w " ..
        "(unit_offset = false); writing them for transformers' Gemma is not supported", 2)
    end)
  end
  return lm
end

return M
