-- models.bert — BERT (Devlin et al. 2018): a post-LN Transformer encoder with learned positions
-- and segment (token type) embeddings, a tanh pooler on the first token, and a classifier head.
--
--   local bert = require "models.bert"
--   local m = bert.from_preset("bert_base_en", {num_classes = 2})   -- classifier, random weights
--   local m = bert.from_pretrained("path/to/hf_bert")                -- config.json + model.safetensors
--   local out = m{token_ids = ids, segment_ids = segs, padding_mask = mask}
--   -- backbone: out.sequence_output [B, T, C], out.pooled_output [B, C]; classifier: logits [B, K]
--
-- Shape letters: B batch, T tokens, C hidden, H heads, F feed-forward width, V vocabulary,
-- K classes. Token ids are 0-based. Sizes follow keras-hub's presets (docs/benchmarks.md); the
-- Hugging Face BertModel checkpoint layout is mapped by hf_name() below.
local keng = require "keng"
local nn = require "keng.nn"
local common = require "models.common"
local options = require "keng.options"

local M = {}

-- keras-hub's bert_base_en uses the tanh form of GELU; Hugging Face's "gelu" is the exact one
M.presets = {
  bert_tiny = {vocab = 28996, layers = 2, hidden = 128, heads = 2, ffn = 512},              -- CPU tier
  bert_small_en = {vocab = 30522, layers = 4, hidden = 512, heads = 8, ffn = 2048},
  bert_medium_en = {vocab = 30522, layers = 8, hidden = 512, heads = 8, ffn = 2048},
  bert_base_en = {vocab = 28996, layers = 12, hidden = 768, heads = 12, ffn = 3072},          -- cased
  bert_base_en_uncased = {vocab = 30522, layers = 12, hidden = 768, heads = 12, ffn = 3072},
}
local DEFAULTS = {max_positions = 512, segments = 2, eps = 1e-12, dropout = 0.1, activation = "gelu_tanh"}

-- Hugging Face hidden_act -> our activation names
local HF_ACT = {gelu = "gelu", gelu_new = "gelu_tanh", gelu_pytorch_tanh = "gelu_tanh", gelu_fast = "gelu_tanh",
                relu = "relu", silu = "silu", swish = "silu", tanh = "tanh"}
local ACT = {
  gelu = function(x) return keng.gelu(x) end,
  gelu_tanh = function(x) return keng.gelu(x, {approximate = "tanh"}) end,
  relu = function(x) return keng.relu(x) end,
  silu = function(x) return keng.silu(x) end,
  tanh = function(x) return keng.tanh(x) end,
}

local shape_str = require("keng.util").shape_str

---------------------------------------------------------------------------------------------
-- the encoder blocks: nn.TransformerEncoderLayer, post-LN: x = LN(x + attn(x)); x = LN(x + W2·act(W1·x)),
-- its submodules named as below (attention.query/key/value/out; HF names map onto them in hf_name)

local BLOCK_NAMES = {attn = "attention", attn_norm = "attention_norm", fc1 = "ffn_in", fc2 = "ffn_out",
                     mlp_norm = "ffn_norm"}

local function block(cfg, lo)
  return nn.TransformerEncoderLayer(cfg.hidden, cfg.heads, cfg.ffn, {eps = cfg.eps, activation = ACT[cfg.activation],
    dropout = cfg.dropout, dtype = lo.dtype, device = lo.device, linear = lo, names = BLOCK_NAMES})
end

---------------------------------------------------------------------------------------------
-- the backbone: embeddings, blocks, pooler

local Backbone = nn.Module:extend("BertBackbone")
M.Backbone = Backbone

-- Backbone(cfg, {dtype=, device=}); cfg: vocab, layers, hidden, heads, ffn, max_positions,
-- segments, eps, dropout, activation ("gelu_tanh" | "gelu" | "relu" | ...)
function Backbone:init(cfg, opts)
  opts = opts or {}
  local c = common.encoder_config("bert", DEFAULTS, cfg, ACT, "hidden", 3)
  self.config = c
  local lo = {dtype = opts.dtype, device = opts.device, weight_init = "truncated_normal", std = 0.02}
  local eo = {dtype = opts.dtype, device = opts.device, init = "truncated_normal", std = 0.02}
  local C = c.hidden
  self.token_embedding = nn.Embedding(c.vocab, C, eo)             -- [V, C]
  self.position_embedding = nn.Embedding(c.max_positions, C, eo)  -- [P, C]
  self.segment_embedding = nn.Embedding(c.segments, C, eo)        -- [2, C]
  self.embeddings_norm = nn.LayerNorm(C, {eps = c.eps, dtype = opts.dtype, device = opts.device})
  self.dropout = nn.Dropout(c.dropout)
  local blocks = {}
  for i = 1, c.layers do blocks[i] = block(c, lo) end
  self.layers = blocks
  self.pooler = nn.Linear(C, C, lo)                               -- [C, C]
end

-- the inputs table (or a bare token_ids tensor) checked and completed
local function inputs(self, x, segs, mask)
  if keng.is_tensor(x) then x = {token_ids = x, segment_ids = segs, padding_mask = mask} end
  if type(x) ~= "table" or not keng.is_tensor(x.token_ids) then
    nn.Module.error("bert: inputs must be {token_ids=, segment_ids=, padding_mask=} with token_ids a tensor", 3)
  end
  local ids, c = x.token_ids, self.config
  if ids.ndim ~= 2 then nn.Module.error("bert: token_ids must be [B, T], got " .. shape_str(ids.shape), 3) end
  local B, T = ids.shape[1], ids.shape[2]
  if T == 0 then
    nn.Module.error("bert: token_ids " .. shape_str(ids.shape) .. " hold no tokens (T = 0): a sequence needs at "
      .. "least one ([CLS] for the pooled output)", 3)
  end
  if T > c.max_positions then
    nn.Module.error(string.format("bert: %d tokens exceed the %d positions of the model", T, c.max_positions), 3)
  end
  common.check_token_ids("bert", ids, c.vocab, nn.Module.user_level(3))
  local segs = x.segment_ids or keng.zeros({B, T}, {dtype = "i64", device = ids.device})
  local mask = x.padding_mask
  for name, t in pairs{segment_ids = segs, padding_mask = mask} do
    local s = t.shape
    if s[1] ~= B or s[2] ~= T or #s ~= 2 then
      nn.Module.error(string.format("bert: %s %s does not match token_ids %s", name, shape_str(s), shape_str(ids.shape)), 3)
    end
  end
  if mask and mask.dtype ~= "bool" then mask = mask:ne(0) end
  if mask then mask = mask:reshape{B, 1, 1, T} end               -- true = attend to this key
  return ids, segs, mask
end

-- forward{token_ids=, segment_ids=, padding_mask=} (or forward(token_ids, segment_ids,
-- padding_mask), as keng.train passes a list) -> {sequence_output [B, T, C], pooled_output [B, C]}
function Backbone:forward(...)
  local ids, segs, mask = inputs(self, ...)
  local T = ids.shape[2]
  local pos = self.position_embedding.weight:narrow(1, 1, T)      -- [T, C]
  local h = self.token_embedding(ids) + self.segment_embedding(segs) + pos:to(self:compute_dtype(pos))
  h = self.dropout(self.embeddings_norm(h))                       -- [B, T, C]
  for i = 1, #self.layers do h = self.layers[i](h, {mask = mask}) end  -- [B, T, C]
  local first = h:select(2, 1)                                    -- [B, C], the [CLS] token
  return {sequence_output = h, pooled_output = keng.tanh(self.pooler(first))}
end

---------------------------------------------------------------------------------------------
-- the classifier: pooled output -> dropout -> Dense(K)

local Classifier = nn.Module:extend("BertClassifier")
M.Classifier = Classifier

function Classifier:init(backbone, num_classes, opts)
  opts = opts or {}
  self.backbone = backbone
  self.config = backbone.config
  self.num_classes = num_classes
  self.dropout = nn.Dropout(opts.dropout or 0.1)
  self.classifier = nn.Linear(backbone.config.hidden, num_classes,
    {dtype = opts.dtype, device = opts.device, weight_init = "truncated_normal", std = 0.02})  -- [K, C]
end

function Classifier:forward(...)  -- inputs table (or the three tensors) -> logits [B, K]
  return self.classifier(self.dropout(self.backbone(...).pooled_output))
end
nn.Module.plumbing[Classifier.forward] = true  -- the backbone's input errors name the user's call

-- m:save_pretrained(dir, {max_shard_size = "5GB"}): a Hugging Face BertModel (backbone) or
-- BertForSequenceClassification (classifier) directory (scripts/models/hf_save.lua)
function Backbone:save_pretrained(dir, opts) return require("models.hf_save").bert(self, dir, opts, 2) end
function Classifier:save_pretrained(dir, opts) return require("models.hf_save").bert(self, dir, opts, 2) end

---------------------------------------------------------------------------------------------
-- Hugging Face names -> ours

local HF_LAYER = {
  ["attention.self.query"] = "attention.query", ["attention.self.key"] = "attention.key",
  ["attention.self.value"] = "attention.value", ["attention.output.dense"] = "attention.out",
  ["attention.output.LayerNorm"] = "attention_norm", ["intermediate.dense"] = "ffn_in",
  ["output.dense"] = "ffn_out", ["output.LayerNorm"] = "ffn_norm",
}
local HF_TOP = {
  ["embeddings.word_embeddings"] = "token_embedding", ["embeddings.position_embeddings"] = "position_embedding",
  ["embeddings.token_type_embeddings"] = "segment_embedding", ["embeddings.LayerNorm"] = "embeddings_norm",
  ["pooler.dense"] = "pooler",
}
local HF_LEAF = {weight = "weight", bias = "bias", gamma = "weight", beta = "bias"}

-- hf_name("bert.encoder.layer.0.attention.self.query.weight") -> "layers.1.attention.query.weight"
-- (a backbone name), "classifier.weight" -> "classifier.weight"; nil for tensors we do not use
-- (the MLM / NSP heads under cls., position_ids)
function M.hf_name(name)
  if name:match("^classifier%.") then return name end
  name = name:gsub("^bert%.", "")
  local path, leaf = name:match("^(.*)%.([%w_]+)$")
  if not path or not HF_LEAF[leaf] then return nil end
  leaf = HF_LEAF[leaf]
  if HF_TOP[path] then return HF_TOP[path] .. "." .. leaf end
  local i, rest = path:match("^encoder%.layer%.(%d+)%.(.+)$")
  if i and HF_LAYER[rest] then return string.format("layers.%d.%s.%s", common.keng_layer(i), HF_LAYER[rest], leaf) end
  return nil
end

-- loads a Hugging Face (or our own) state dict into model; every expected tensor must be there
-- with its shape, and a shape difference names the tensor in both spellings with both shapes
local function load_weights(model, sd, where)
  local classifier = getmetatable(model) == Classifier
  local want = model:state_dict({keep_vars = true})
  local ours, origin = {}, {}
  for name, t in pairs(sd) do
    local n = want[name] and name or M.hf_name(name)
    if n and classifier and not n:match("^classifier%.") and not n:match("^backbone%.") then n = "backbone." .. n end
    if n then ours[n], origin[n] = t, name end
  end
  local missing = {}
  for n, p in pairs(want) do
    local t = ours[n]
    if t == nil then
      missing[#missing + 1] = n
    else
      local a, b = t.shape, p.shape
      local same = #a == #b
      for i = 1, #a do same = same and a[i] == b[i] end
      if not same then
        error(string.format("bert: %s: tensor '%s' (our %s) has shape %s, the model expects %s", where,
          origin[n], n, shape_str(a), shape_str(b)), 3)
      end
    end
  end
  if #missing > 0 then
    table.sort(missing)
    error(string.format("bert: %s: missing tensor(s) %s", where, table.concat(missing, ", ")), 3)
  end
  local sub = {}
  for n in pairs(want) do sub[n] = ours[n] end
  model:load_state_dict(sub)
end

---------------------------------------------------------------------------------------------
-- constructors

local function build(cfg, opts)
  local device = opts.device
  if opts.weights and not device then device = "meta" end  -- materialised by the load
  local bo = {dtype = opts.dtype, device = device}
  local m = Backbone(cfg, bo)
  if opts.num_classes then
    if math.type(opts.num_classes) ~= "integer" or opts.num_classes < 1 then
      error("bert: num_classes must be a positive integer, got " .. tostring(opts.num_classes), 3)
    end
    m = Classifier(m, opts.num_classes, bo)
  end
  return m
end

-- from_preset(name, {num_classes=, dtype=, device=, weights=path.safetensors}) -> the backbone,
-- or the classifier when num_classes is given. Random weights (truncated normal 0.02) unless
-- `weights` names a checkpoint in our names or Hugging Face's; dtype then defaults to ("auto")
-- the checkpoint's.
function M.from_preset(name, opts)
  opts = options.check("bert.from_preset", opts, {"num_classes", "dtype", "device", "weights"})
  local p = common.preset("bert.from_preset", M.presets, name, 2)
  local sd = opts.weights and common.load_tensors(opts.weights, "bert.from_preset", 2)
  local dtype = opts.dtype
  if sd or dtype == "auto" then dtype = sd and common.model_dtype(opts, nil, sd, "bert.from_preset", 2) or nil end
  local m = build(p, {num_classes = opts.num_classes, dtype = dtype, device = opts.device, weights = opts.weights})
  if sd then load_weights(m, sd, opts.weights) end
  if opts.weights and opts.device and opts.device ~= "meta" then m:to(opts.device) end
  return m
end

-- config(json table) -> our config; hidden_act decides the activation
-- BertConfig keys that change the numbers, at the values keng implements
M.CONFIG_RULES = {position_embedding_type = "absolute", is_decoder = false, add_cross_attention = false}

function M.config_from_hf(j)
  options.config("bert: config.json", j, M.CONFIG_RULES, 3)
  local act = HF_ACT[j.hidden_act or "gelu"]
  if not act then error("bert: unsupported hidden_act '" .. tostring(j.hidden_act) .. "'", 3) end
  return {vocab = j.vocab_size, layers = j.num_hidden_layers, hidden = j.hidden_size, heads = j.num_attention_heads,
          ffn = j.intermediate_size, max_positions = j.max_position_embeddings or 512,
          segments = j.type_vocab_size or 2, eps = j.layer_norm_eps or 1e-12,
          dropout = j.hidden_dropout_prob or 0.1, activation = act}
end

-- from_pretrained(dir, {num_classes=, dtype=, device=}) -> backbone (or classifier) with the
-- weights of a Hugging Face BertModel / BertForSequenceClassification directory:
-- config.json + model.safetensors (or a sharded index); m.tokenizer is the directory's
-- tokenizer.json (keng.tokenizers.from_dir), else its vocab.txt (tokenizers.bert), else nil
function M.from_pretrained(dir, opts)
  opts = options.check("bert.from_pretrained", opts, {"num_classes", "dtype", "device"})
  local j = common.read_config(dir, "bert.from_pretrained", 2)
  for _, key in ipairs{"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"} do
    if type(j[key]) ~= "number" then error("bert.from_pretrained: config.json lacks " .. key, 2) end
  end
  local cfg = M.config_from_hf(j)
  if not opts.num_classes and j.id2label and j.architectures and tostring(j.architectures[1]):match("Classification") then
    local n = 0
    for _ in pairs(j.id2label) do n = n + 1 end
    opts = setmetatable({num_classes = n}, {__index = opts})
  end
  local sd = common.load_tensors(dir, "bert.from_pretrained", 2)
  local dtype = common.model_dtype(opts, j, sd, "bert.from_pretrained", 2)   -- "auto": the checkpoint's
  local m = build(cfg, {num_classes = opts.num_classes, dtype = dtype, device = "meta"})
  if opts.num_classes and sd["classifier.weight"] == nil then
    -- a backbone checkpoint under a new head: the head keeps fresh weights
    local head = nn.Linear(cfg.hidden, opts.num_classes, {dtype = dtype, weight_init = "truncated_normal", std = 0.02})
    sd["classifier.weight"], sd["classifier.bias"] = head.weight, head.bias
  end
  load_weights(m, sd, dir)
  if opts.device and opts.device ~= "cpu" and opts.device ~= "meta" then m:to(opts.device) end
  m.vocab_path = dir .. "/vocab.txt"
  -- the directory's tokenizer, as transformers' AutoTokenizer picks it: tokenizer.json (all
  -- transformers 5 writes) before vocab.txt; nil when there is neither
  rawset(m, "tokenizer", require("keng.tokenizers").find(dir))
  return m
end

return M
