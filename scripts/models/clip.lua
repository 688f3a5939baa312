-- models.clip — the CLIP text encoder (Radford et al. 2021), as Hugging Face's CLIPTextModel:
-- token + learned position embeddings, pre-LN Transformer layers with causal self-attention and
-- a quick-GELU MLP, a final LayerNorm. Stable Diffusion v1 conditions on last_hidden_state.
--
--   local clip = require "models.clip"
--   local te = clip.from_preset("clip_vit_l14_text", {device = "meta"})   -- te:num_params() 123060480
--   local te = clip.from_pretrained("sd/text_encoder")                   -- config.json + model.safetensors
--   local h = te(ids)                 -- ids i64 [B, T] (0-based, T <= 77) -> last_hidden_state [B, T, C]
--   local tok = clip.tokenizer("sd/tokenizer")   -- keng.clip_tokenize: tok:encode_batch(prompts) -> [B, 77]
--
-- Shape letters: B batch, T tokens, C width, H heads, D head dim (C/H), F MLP width, V vocab.
-- Module names are Hugging Face's (text_model.embeddings.token_embedding,
-- text_model.encoder.layers.0.self_attn.q_proj, ..., text_model.final_layer_norm), so a
-- transformers / diffusers text_encoder checkpoint loads with no renaming.
local keng = require "keng"
local nn = require "keng.nn"
local common = require "models.common"
local options = require "keng.options"

local M = {}

M.presets = {
  clip_vit_l14_text = {vocab = 49408, width = 768, layers = 12, heads = 12, mlp = 3072},  -- SD v1
  sd_tiny_text = {vocab = 49408, width = 64, layers = 2, heads = 4, mlp = 256},           -- CPU tier
}
local DEFAULTS = {max_positions = 77, eps = 1e-5, activation = "quick_gelu"}

local ACT = {
  quick_gelu = keng.quick_gelu,
  gelu = function(x) return keng.gelu(x) end,
}

local shape_str = require("keng.util").shape_str

---------------------------------------------------------------------------------------------
-- the layers: nn.TransformerEncoderLayer, pre-LN with causal self-attention:
-- h = h + attn(LN1(h)); h = h + fc2(act(fc1(LN2(h)))), its submodules named as Hugging Face's

local LAYER_NAMES = {attn = "self_attn", attn_norm = "layer_norm1", mlp = "mlp", fc1 = "fc1", fc2 = "fc2",
                     mlp_norm = "layer_norm2",
                     proj = {query = "q_proj", key = "k_proj", value = "v_proj", out = "out_proj"},
                     proj_order = {"key", "value", "query", "out"}}  -- the reference's order


---------------------------------------------------------------------------------------------
-- embeddings, encoder, final norm

local Embeddings = nn.Module:extend("CLIPTextEmbeddings")

function Embeddings:init(c, o)
  local eo = {dtype = o.dtype, device = o.device, init = "normal", std = 0.02}
  self.token_embedding = nn.Embedding(c.vocab, c.width, eo)             -- [V, C]
  self.position_embedding = nn.Embedding(c.max_positions, c.width, eo)  -- [77, C]
end

function Embeddings:forward(ids)  -- ids [B, T] -> [B, T, C]
  local T = ids.shape[2]
  local pos = self.position_embedding.weight:narrow(1, 1, T)  -- [T, C]
  return self.token_embedding(ids) + pos
end

local Encoder = nn.Module:extend("CLIPEncoder")

-- layers named "0", "1", ... as in the checkpoints (nn.ModuleList's one rule for 0-based names)
function Encoder:init(c, lo, no)
  local layers = {}
  for i = 1, c.layers do
    layers[i] = nn.TransformerEncoderLayer(c.width, c.heads, c.mlp, {norm_first = true, causal = true,
      eps = no.eps, activation = ACT[c.activation], dtype = lo.dtype, device = lo.device, linear = lo,
      attention_init = lo, names = LAYER_NAMES})
  end
  self.layers = nn.ModuleList(layers, {first = 0})
end

function Encoder:forward(h)
  for i = 0, #self.layers - 1 do h = self.layers[i](h) end
  return h
end

local TextTransformer = nn.Module:extend("CLIPTextTransformer")

function TextTransformer:init(c, o)
  local lo = {dtype = o.dtype, device = o.device, weight_init = "normal", std = 0.02}
  local no = {eps = c.eps, dtype = o.dtype, device = o.device}
  self.embeddings = Embeddings(c, o)
  self.encoder = Encoder(c, lo, no)
  self.final_layer_norm = nn.LayerNorm(c.width, no)
end

function TextTransformer:forward(ids)
  return self.final_layer_norm(self.encoder(self.embeddings(ids)))
end

local TextModel = nn.Module:extend("CLIPTextModel")
M.TextModel = TextModel

-- TextModel(cfg, {dtype=, device=}); cfg: vocab, width, layers, heads, mlp, max_positions (77),
-- eps (1e-5), activation ("quick_gelu" | "gelu")
function TextModel:init(cfg, opts)
  opts = opts or {}
  local c = common.encoder_config("clip", DEFAULTS, cfg, ACT, "width", 3)
  self.config = c
  self.text_model = TextTransformer(c, opts)
end

-- m:save_pretrained(dir, {max_shard_size = "5GB"}): a transformers CLIPTextModel directory
-- (config.json + safetensors, models.hf_save)
function TextModel:save_pretrained(dir, opts) return require("models.hf_save").clip(self, dir, opts, 2) end

-- forward(ids): ids i64 [B, T] (0-based, T <= max_positions) -> last_hidden_state [B, T, C]
function TextModel:forward(ids)
  local c = self.config
  if not keng.is_tensor(ids) or ids.ndim ~= 2 then
    nn.Module.error("clip: token ids must be an integer tensor [B, T], got " ..
      (keng.is_tensor(ids) and shape_str(ids.shape) or type(ids)), 2)
  end
  if ids.shape[2] > c.max_positions then
    nn.Module.error(string.format("clip: %d tokens exceed the %d positions of the model (encode_batch truncates)",
      ids.shape[2], c.max_positions), 2)
  end
  common.check_token_ids("clip", ids, c.vocab, nn.Module.user_level(2))
  return self.text_model(ids)
end

---------------------------------------------------------------------------------------------
-- constructors

-- loads a state dict in Hugging Face names (ours are the same) with every tensor checked;
-- transformers 5 writes the names without the "text_model." prefix, diffusers checkpoints with it
local function load_weights(m, sd, where)
  local sub = {}
  for name, t in pairs(sd) do
    if not name:match("position_ids$") then  -- older checkpoints keep this buffer
      sub[name:match("^text_model%.") and name or "text_model." .. name] = t
    end
  end
  local ok, err = pcall(m.load_state_dict, m, sub)
  if not ok then error("clip: " .. where .. ": " .. tostring(err), 3) end
end

-- from_preset(name, {dtype=, device=, weights=path}) -> TextModel with random weights (normal 0.02),
-- or the tensors of `weights` (a .safetensors file or a directory)
function M.from_preset(name, opts)
  opts = options.check("clip.from_preset", opts, {"dtype", "device", "weights"})
  local p = common.preset("clip.from_preset", M.presets, name, 2)
  local device = opts.device
  if opts.weights and not device then device = "meta" end
  local sd = opts.weights and common.load_tensors(opts.weights, "clip.from_preset", 2)
  local dtype = opts.dtype                                          -- with weights: "auto" by default
  if sd or dtype == "auto" then dtype = sd and common.model_dtype(opts, nil, sd, "clip.from_preset", 2) or nil end
  local m = TextModel(p, {dtype = dtype, device = device})
  if sd then load_weights(m, sd, opts.weights) end
  return m
end

local HF_ACT = {quick_gelu = "quick_gelu", gelu = "gelu"}

-- CLIPTextConfig's keys: those keng reads, and those that leave the text model's forward pass as
-- it is (the CLIPModel's projection, initialisation, token ids, PretrainedConfig's bookkeeping).
-- Any other key may change the numbers and raises naming it, as the causal LMs' configs do.
M.CONFIG_KEYS = {}
for k in ([[vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads
  max_position_embeddings hidden_act layer_norm_eps attention_dropout dropout projection_dim
  initializer_range initializer_factor bos_token_id eos_token_id pad_token_id
  _name_or_path architectures model_type transformers_version torch_dtype dtype use_cache id2label
  label2id is_encoder_decoder is_decoder output_attentions output_hidden_states return_dict
  chunk_size_feed_forward problem_type tokenizer_class use_bfloat16 torchscript pruned_heads
  tie_word_embeddings tie_encoder_decoder add_cross_attention finetuning_task prefix sep_token_id
  decoder_start_token_id task_specific_params _attn_implementation _attn_implementation_autoset
  _commit_hash]]):gmatch("%S+") do
  M.CONFIG_KEYS[k] = true
end
-- of those, the ones keng implements at one value only (dropout in training; a text config of
-- another model family)
M.CONFIG_RULES = {attention_dropout = 0, dropout = 0, is_decoder = false, add_cross_attention = false}
local MODEL_TYPES = {clip_text_model = true, clip = true}

-- Hugging Face CLIPTextConfig (json table) -> our config; a key outside CONFIG_KEYS, a
-- CONFIG_RULES key at another value, or another model_type raises naming it
function M.config_from_hf(j)
  for k in pairs(j) do
    if not M.CONFIG_KEYS[k] then
      local read = {}
      for key in pairs(M.CONFIG_KEYS) do
        if key:sub(1, 1) ~= "_" then read[#read + 1] = key end
      end
      table.sort(read)
      error(string.format("clip: config.json key '%s' is not implemented by keng's CLIP text model (it knows: %s)",
        tostring(k), table.concat(read, ", ")), 3)
    end
  end
  if j.model_type ~= nil and not MODEL_TYPES[j.model_type] then
    error(string.format("clip: config.json model_type '%s' is not a CLIP text model (clip_text_model)", tostring(j.model_type)), 3)
  end
  options.config("clip: config.json", j, M.CONFIG_RULES, 3)
  local act = HF_ACT[j.hidden_act or "quick_gelu"]
  if not act then error("clip: unsupported hidden_act '" .. tostring(j.hidden_act) .. "'", 3) end
  return {vocab = j.vocab_size, width = j.hidden_size, layers = j.num_hidden_layers, heads = j.num_attention_heads,
          mlp = j.intermediate_size, max_positions = j.max_position_embeddings or 77, eps = j.layer_norm_eps or 1e-5,
          activation = act}
end

-- from_pretrained(dir, {dtype = "auto", device=}) -> TextModel from a transformers / diffusers
-- text_encoder directory (config.json + model.safetensors or a sharded index); "auto" keeps the
-- checkpoint's dtype (config.json's dtype / torch_dtype, else the weights')
function M.from_pretrained(dir, opts)
  opts = options.check("clip.from_pretrained", opts, {"dtype", "device"})
  local top = common.read_config(dir, "clip.from_pretrained", 2)
  local j = top.text_config or top               -- a full CLIPModel config
  for _, key in ipairs{"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"} do
    if type(j[key]) ~= "number" then error("clip.from_pretrained: " .. dir .. "/config.json lacks " .. key, 2) end
  end
  local tensors = common.load_tensors(dir, "clip.from_pretrained", 2)
  local m = TextModel(M.config_from_hf(j),
    {dtype = common.model_dtype(opts, top, tensors, "clip.from_pretrained", 2), device = "meta"})
  rawset(m, "hf_config", j)                                        -- save_pretrained writes its ids back
  load_weights(m, tensors, dir)
  if opts.device and opts.device ~= "cpu" and opts.device ~= "meta" then m:to(opts.device) end
  return m
end

-- tokenizer(dir or vocab.json, merges.txt?, {pad_id=}) -> keng.clip_tokenize tokenizer
function M.tokenizer(...) return require("keng.clip_tokenize").load(...) end

return M
