-- models.causal_lm — the decoder-only transformer that Gemma and Mistral share, with KV-cache
-- generation. References: Hugging Face modeling_gemma.py / modeling_mistral.py (module names,
-- checkpoint layout), keras-hub GemmaBackbone / MistralBackbone (presets, LoRA targets).
--
-- Shape letters: B batch, T tokens in this call, S keys (cached + new), L cache length,
-- C hidden, H query heads, Hkv key/value heads, D head dim, F FFN width, V vocabulary.
--
-- Module tree (state_dict names) and the Hugging Face names they load from:
--   model.embed_tokens.weight                 [V, C]
--   model.layers.N.input_layernorm.weight     [C]        HF layer n is our N = n + 1
--   model.layers.N.self_attn.query.weight     [H·D, C]   HF self_attn.q_proj
--   model.layers.N.self_attn.key.weight       [Hkv·D, C] HF self_attn.k_proj
--   model.layers.N.self_attn.value.weight     [Hkv·D, C] HF self_attn.v_proj
--   model.layers.N.self_attn.output.weight    [C, H·D]   HF self_attn.o_proj
--   model.layers.N.post_attention_layernorm.weight [C]
--   model.layers.N.mlp.{gate,up}_proj.weight  [F, C];  mlp.down_proj.weight [C, F]
--   model.norm.weight                         [C]
--   lm_head.weight                            [V, C]     untied models only (Mistral)
-- The projections are named query/key/value/output (as in Keras) so that
-- lora.enable(m, {targets = {"query", "value"}}) finds them.
--
-- cfg fields: vocab, hidden, layers, heads, kv_heads, head_dim, ffn, eps, unit_offset (Gemma's
-- RMSNorm scale 1 + w), act ("gelu_tanh" GeGLU | "silu" SwiGLU), tie (LM head = embedding),
-- embed_scale (multiply embeddings by sqrt(C)), window (sliding window or nil), rope_base,
-- bos_id, eos_id, pad_id.
local keng = require "keng"
local nn = require "keng.nn"
local common = require "models.common"

local M = {}

local function shape_str(t) return "[" .. table.concat(t.shape, ",") .. "]" end

---------------------------------------------------------------------------------------------
-- attention: q/k/v projections, RoPE, grouped-query SDPA, output projection

local Attention = nn.Module:extend("Attention")
M.Attention = Attention

function Attention:init(cfg, o)
  local C, H, Hkv, D = cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim
  self.heads, self.kv_heads, self.head_dim = H, Hkv, D
  self.window, self.rope_base = cfg.window, cfg.rope_base or 10000
  local lo = {bias = false, dtype = o.dtype, device = o.device}
  self.query = nn.Linear(C, H * D, lo)
  self.key = nn.Linear(C, Hkv * D, lo)
  self.value = nn.Linear(C, Hkv * D, lo)
  self.output = nn.Linear(H * D, C, lo)
  -- Keras keeps these kernels as [C, heads, D] einsums and its LoRA gives each head its own A
  -- [C, r] with one shared B [r, D]; the hint tells keng.lora how the outputs split into heads
  self.query.einsum_heads, self.key.einsum_heads, self.value.einsum_heads = H, Hkv, Hkv
end

-- x [B, T, C]; ctx.positions i64 [T] or [B, T] (0-based); ctx.mask bool [B, 1, T, S] or nil
-- (nil: causal with the sliding window); ctx.cache {k=, v=} [B, Hkv, L, D] written at column
-- ctx.start (1-based) -> [B, T, C]. The decode step of keng.generate instead gives ctx.col (i64
-- [T] on the device, 0-based columns): keng.decode_qkv ropes q and k and writes k and v into the
-- cache columns there in one op, and the query attends over the whole fixed-length cache under
-- ctx.mask [B, 1, T, L] (or the first ctx.keys columns, eagerly), so the step can have one shape
-- for every token (capturable as a CUDA graph);
-- ctx.qkv (this layer's [q; k; v] weights in one matrix) makes the projections one GEMM.
function Attention:forward(x, ctx)
  local B, T = x.shape[1], x.shape[2]
  local H, Hkv, D = self.heads, self.kv_heads, self.head_dim
  local q, k, v
  local cache = ctx.cache
  if ctx.qkv and cache and ctx.col then                             -- decode: one GEMM, one fused op
    q = keng.decode_qkv(keng.linear(x, ctx.qkv), ctx.positions, cache.k, cache.v, ctx.col,
      {heads = H, kv_heads = Hkv, base = self.rope_base})           -- [B, H, T, D]; k, v cached
  elseif ctx.col then                                               -- decode, unfused weights (LoRA)
    local qkv = keng.cat({self.query(x), self.key(x), self.value(x)}, 3):to(cache.k.dtype)  -- [B, T, (H+2Hkv)·D]
    q = keng.decode_qkv(qkv, ctx.positions, cache.k, cache.v, ctx.col, {heads = H, kv_heads = Hkv, base = self.rope_base})
  else
    q = self.query(x):view{B, T, H, D}:transpose(2, 3)              -- [B, H, T, D]
    k = self.key(x):view{B, T, Hkv, D}:transpose(2, 3)              -- [B, Hkv, T, D]
    v = self.value(x):view{B, T, Hkv, D}:transpose(2, 3)            -- [B, Hkv, T, D]
    q = keng.rope(q, ctx.positions, {base = self.rope_base})
    k = keng.rope(k, ctx.positions, {base = self.rope_base})
  end
  if ctx.col then                                                   -- the first ctx.keys (or all L) columns
    k, v = cache.k, cache.v                                         -- [B, Hkv, L, D]
    if ctx.keys then k, v = k:narrow(3, 1, ctx.keys), v:narrow(3, 1, ctx.keys) end
  elseif cache then                                                 -- write in place, read a view
    cache.k:narrow(3, ctx.start, T):copy_(k)
    cache.v:narrow(3, ctx.start, T):copy_(v)
    k = cache.k:narrow(3, 1, ctx.start + T - 1)                     -- [B, Hkv, S, D]
    v = cache.v:narrow(3, 1, ctx.start + T - 1)
  end
  local a
  if ctx.mask then
    a = keng.scaled_dot_product_attention(q, k, v, {mask = ctx.mask})                -- [B, H, T, D]
  else
    a = keng.scaled_dot_product_attention(q, k, v, {causal = true, window = self.window})
  end
  a = a:transpose(2, 3):reshape{B, T, H * D}                        -- [B, T, H·D]
  return self.output(a)                                             -- [B, T, C]
end

-- the [q; k; v] weight [(H + 2·Hkv)·D, C] for the decode step's one GEMM, or nil where the
-- three projections are not plain bias-free Linears of one dtype (LoRA adapters, quantized)
function Attention:fused_qkv()
  local ws = {}
  for i, m in ipairs({self.query, self.key, self.value}) do
    if m.__name ~= "Linear" or rawget(m, "forward") or m.bias or not keng.is_tensor(m.weight) then return nil end
    if i > 1 and m.weight.dtype ~= ws[1].dtype then return nil end
    ws[i] = m.weight
  end
  return keng.cat(ws, 1)
end

---------------------------------------------------------------------------------------------
-- gated MLP: down(act(gate(x)) * up(x)), GeGLU (gelu tanh) for Gemma, SwiGLU (silu) for Mistral

local MLP = nn.Module:extend("MLP")
M.MLP = MLP

function MLP:init(cfg, o)
  local lo = {bias = false, dtype = o.dtype, device = o.device}
  self.act = cfg.act
  self.gate_proj = nn.Linear(cfg.hidden, cfg.ffn, lo)
  self.up_proj = nn.Linear(cfg.hidden, cfg.ffn, lo)
  self.down_proj = nn.Linear(cfg.ffn, cfg.hidden, lo)
end

function MLP:forward(x)                                             -- x [B, T, C]
  local g = self.gate_proj(x)                                       -- [B, T, F]
  g = self.act == "silu" and g:silu() or g:gelu{approximate = "tanh"}
  return self.down_proj(g * self.up_proj(x))                        -- [B, T, C]
end

---------------------------------------------------------------------------------------------
-- decoder block (pre-norm): x + attn(norm(x)), then x + mlp(norm(x))

local Block = nn.Module:extend("DecoderBlock")
M.Block = Block

function Block:init(cfg, o)
  local no = {eps = cfg.eps, unit_offset = cfg.unit_offset, dtype = o.dtype, device = o.device}
  self.input_layernorm = nn.RMSNorm(cfg.hidden, no)
  self.self_attn = Attention(cfg, o)
  self.post_attention_layernorm = nn.RMSNorm(cfg.hidden, no)
  self.mlp = MLP(cfg, o)
end

function Block:forward(x, ctx)                                      -- x [B, T, C]
  x = x + self.self_attn(self.input_layernorm(x), ctx)              -- [B, T, C]
  return x + self.mlp(self.post_attention_layernorm(x))             -- [B, T, C]
end

local Backbone = nn.Module:extend("DecoderBackbone")

function Backbone:init(cfg, o)
  self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden, {dtype = o.dtype, device = o.device,
    init = function(shape, io) return keng.randn(shape, io) * 0.02 end})
  local layers = {}
  for i = 1, cfg.layers do layers[i] = Block(cfg, o) end
  self.layers = nn.ModuleList(layers)
  self.norm = nn.RMSNorm(cfg.hidden, {eps = cfg.eps, unit_offset = cfg.unit_offset, dtype = o.dtype, device = o.device})
end

---------------------------------------------------------------------------------------------
-- the language model

local CausalLM = nn.Module:extend("CausalLM")
M.CausalLM = CausalLM

-- CausalLM(cfg, {dtype = "f32", device = "cpu"})
function CausalLM:init(cfg, opts)
  opts = opts or {}
  local o = {dtype = opts.dtype or "f32", device = opts.device or "cpu"}
  self.cfg = cfg
  self.model = Backbone(cfg, o)
  if not cfg.tie then self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, {bias = false, dtype = o.dtype, device = o.device}) end
end

-- ids: i64 tensor [B, T] / [T] or a list (of lists) of 0-based ids -> i64 [B, T]; ids >= V raise
function CausalLM:check_ids(ids, level)
  if not keng.is_tensor(ids) then ids = keng.tensor(ids, {dtype = "i64", device = self:param_device()}) end
  if ids.ndim == 1 then ids = ids:unsqueeze(1) end
  if ids.ndim ~= 2 then error("CausalLM: token ids must be [B, T], got " .. shape_str(ids), level) end
  if ids.dtype ~= "i64" and ids.dtype ~= "i32" then
    error("CausalLM: token ids must be an integer tensor, got " .. ids.dtype, level)
  end
  if ids.device ~= "meta" and ids:numel() > 0 then
    local hi, lo = ids:max():item(), ids:min():item()
    if hi >= self.cfg.vocab then
      error(string.format("CausalLM: token id %d is out of range for vocabulary size %d", hi, self.cfg.vocab), level)
    elseif lo < 0 then
      error(string.format("CausalLM: token id %d is negative", lo), level)
    end
  end
  return ids
end

-- where and in what dtype the weights live (they follow m:to(...))
function CausalLM:param_device() return self.model.embed_tokens.weight.device end
function CausalLM:param_dtype() return self.model.embed_tokens.weight.dtype end

-- hidden(ids [B, T], ctx, caches) -> final-normed hidden states [B, T, C] in the model dtype
function CausalLM:hidden(ids, ctx, caches)
  local x = self.model.embed_tokens(ids)                            -- [B, T, C]
  if self.cfg.embed_scale then x = x * math.sqrt(self.cfg.hidden) end  -- rounded to x's dtype, as HF
  local fused = ctx.fused
  for i, layer in ipairs(self.model.layers) do
    ctx.cache, ctx.qkv = caches and caches[i], fused and fused[i]
    x = layer(x, ctx)                                               -- [B, T, C]
  end
  ctx.cache, ctx.qkv = nil, nil
  return self.model.norm(x)                                         -- [B, T, C]
end

-- head(h [B, T, C], raw) -> f32 logits [B, T, V]: the matmul runs in the model dtype with f32
-- accumulation, then the logits are cast to f32 (softmax and the loss see f32); raw keeps the
-- model dtype (greedy decoding needs only the argmax, which the exact cast does not change)
-- (h is flattened to [B·T, C] first: one GEMM, not one per batch row, which matters on the CPU
-- where a bf16 weight is converted per GEMM call)
function CausalLM:head(h, raw)
  local B, T, C = h.shape[1], h.shape[2], h.shape[3]
  local x = h:reshape{B * T, C}                                     -- [B·T, C]
  local y = self.lm_head and self.lm_head(x) or keng.linear(x, self.model.embed_tokens.weight:to(h.dtype))
  if not raw then y = y:float() end
  return y:view{B, T, -1}                                           -- [B, T, V]
end

-- logits(ids) -> f32 [B, T, V] over the whole sequence (causal, sliding window)
function CausalLM:logits(ids)
  ids = self:check_ids(ids, 3)
  local T = ids.shape[2]
  local pos = keng.arange(T, {device = ids.device})                 -- [T]
  return self:head(self:hidden(ids, {positions = pos}))
end

function CausalLM:forward(ids) return self:logits(ids) end

function CausalLM:extra_repr()
  local c = self.cfg
  return string.format("vocab=%d, hidden=%d, layers=%d, heads=%d/%d, head_dim=%d, ffn=%d%s",
    c.vocab, c.hidden, c.layers, c.heads, c.kv_heads, c.head_dim, c.ffn, c.window and (", window=" .. c.window) or "")
end

---------------------------------------------------------------------------------------------
-- generation: the loop, samplers and stopping rules are keng.generate's (shared by every causal
-- LM); the model supplies the KV cache and the two passes below

-- new_cache(B, L) -> per layer {k =, v =} zeros [B, Hkv, L, D] in the weights' dtype and device
function CausalLM:new_cache(B, L)
  local cfg, o = self.cfg, {dtype = self:param_dtype(), device = self:param_device()}
  local caches = {}
  for i = 1, cfg.layers do
    caches[i] = {k = keng.zeros({B, cfg.kv_heads, L, cfg.head_dim}, o), v = keng.zeros({B, cfg.kv_heads, L, cfg.head_dim}, o)}
  end
  return caches
end

-- decode_weights() -> per layer the fused [q; k; v] weight (or nil: the layer runs unfused);
-- made once per generate call, so weights changed between calls are seen
function CausalLM:decode_weights()
  local fused = {}
  for i, layer in ipairs(self.model.layers) do fused[i] = layer.self_attn:fused_qkv() or false end
  return fused
end

-- prefill(ids [B, P], positions [B, P], mask [B, 1, P, P] or nil (causal), caches, raw) ->
-- logits [B, V] of the last column (f32, or the model dtype when raw)
function CausalLM:prefill(ids, positions, mask, caches, raw)
  local P = ids.shape[2]
  local h = self:hidden(ids, {positions = positions, mask = mask, start = 1}, caches)  -- [B, P, C]
  return self:head(h:narrow(2, P, 1), raw):select(2, 1)             -- [B, V]
end

-- decode(ids [B, 1], positions [B, 1], mask [B, 1, 1, S], col i64 [1] (0-based cache column),
-- caches, fused, raw, keys) -> logits [B, V]: one token per row attending to the first `keys`
-- cache columns (S = keys), or to all L when keys is nil (every shape fixed by (B, L): the CUDA
-- Graph step)
function CausalLM:decode(ids, positions, mask, col, caches, fused, raw, keys)
  local h = self:hidden(ids, {positions = positions, mask = mask, col = col, fused = fused, keys = keys}, caches)
  return self:head(h, raw):select(2, 1)                             -- [B, V]
end

-- generate(prompts, opts) -> list of id lists (prompt + generated, EOS included), and the
-- decoded strings when a tokenizer is present. See keng.generate and docs/models.md.
function CausalLM:generate(prompts, opts)
  local ids, texts = require("keng.generate").generate(self, prompts, opts, 3)  -- no tail call: level 3 is the caller
  return ids, texts
end

---------------------------------------------------------------------------------------------
-- loading helpers shared by gemma.lua and mistral.lua

-- the checkpoint name -> our name: "model.layers.0.self_attn.q_proj.weight" ->
-- "model.layers.1.self_attn.query.weight" (nil for names we do not keep, e.g. rotary buffers)
local PROJ = {q_proj = "query", k_proj = "key", v_proj = "value", o_proj = "output"}
function M.hf_to_keng(name)
  local n, rest = name:match("^model%.layers%.(%d+)%.(.*)$")
  if n then
    rest = rest:gsub("^self_attn%.(%a_proj)", function(p) return "self_attn." .. (PROJ[p] or p) end)
    return string.format("model.layers.%d.%s", tonumber(n) + 1, rest)
  end
  if name:find("rotary_emb") then return nil end
  return name
end

-- load_hf(lm, tensors): copies a Hugging Face state dict into lm (strict: every missing,
-- unexpected and mis-shaped tensor is named, with both shapes)
function M.load_hf(lm, tensors, level)
  local sd = {}
  for name, t in pairs(tensors) do
    local k = M.hf_to_keng(name)
    if k == "lm_head.weight" and lm.cfg.tie then k = nil end        -- tied: the embedding is the head
    if k then sd[k] = t end
  end
  local ok, e = pcall(lm.load_state_dict, lm, sd)
  if not ok then error(tostring(e):gsub("^[^:]*:%d+: ", ""), level) end
  return lm
end

-- keng.tokenizers.sentencepiece(dir/tokenizer.model) when the file and the binding exist, else
-- nil; with tokenizer_config.json's chat_template and BOS / EOS strings (keng.chat_template)
function M.load_tokenizer(dir)
  local path = dir .. "/tokenizer.model"
  local f = io.open(path, "rb")
  if not f then return nil end
  f:close()
  if not keng.sentencepiece then return nil end
  return require("keng.chat_template").attach(require("keng.tokenizers").sentencepiece(path), dir)
end

---------------------------------------------------------------------------------------------
-- a model family: presets, from_preset, from_pretrained (gemma.lua and mistral.lua)

-- family{name=, presets=, defaults=} -> module table {presets, config, from_preset,
-- from_pretrained, build}. defaults: the family's fixed facts (act, unit_offset, tie, ...).
function M.family(spec)
  local F = {presets = spec.presets, name = spec.name}

  -- config(name) -> a full cfg (a copy) for a preset name
  function F.config(name, level)
    local cfg = common.overlay(spec.defaults,
      common.preset(spec.name .. ".from_preset", spec.presets, name, (level or 1) + 1))
    cfg.head_dim = cfg.head_dim or cfg.hidden // cfg.heads
    return cfg
  end

  -- build(cfg, opts) -> CausalLM (random weights, or shapes only on device = "meta")
  function F.build(cfg, opts)
    local lm = CausalLM(cfg, opts)
    if spec.add_bos ~= false then rawset(lm, "add_bos", true) end
    return lm
  end

  -- from_preset(name, {dtype = "f32", device = "cpu", weights = path}) -> CausalLM
  function F.from_preset(name, opts)
    opts = opts or {}
    local lm = F.build(F.config(name, 2), opts)
    if opts.weights then M.load_hf(lm, common.load_tensors(opts.weights, spec.name .. ".from_preset", 2), 3) end
    return lm
  end

  -- from_pretrained(dir, {dtype =, device =}) -> CausalLM with dir's config.json, weights
  -- (model.safetensors or sharded model-*.safetensors + index) and tokenizer.model
  function F.from_pretrained(dir, opts)
    opts = opts or {}
    local j = common.read_config(dir, spec.name .. ".from_pretrained", 2)   -- nulls read as absent
    local cfg = common.overlay(spec.defaults)
    local function req(key)
      if j[key] == nil then error(spec.name .. ".from_pretrained: config.json lacks " .. key, 3) end
      return j[key]
    end
    cfg.vocab, cfg.hidden, cfg.layers = req("vocab_size"), req("hidden_size"), req("num_hidden_layers")
    cfg.heads, cfg.ffn = req("num_attention_heads"), req("intermediate_size")
    cfg.kv_heads = j.num_key_value_heads or cfg.heads
    cfg.head_dim = j.head_dim or cfg.hidden // cfg.heads
    cfg.eps = j.rms_norm_eps or cfg.eps
    cfg.rope_base = j.rope_theta or (j.rope_parameters and j.rope_parameters.rope_theta) or 10000
    if j.tie_word_embeddings ~= nil then cfg.tie = j.tie_word_embeddings end
    if spec.uses_window then cfg.window = j.sliding_window end       -- null or absent: no window
    local act = j.hidden_activation or j.hidden_act
    if act then
      if act == "silu" or act == "swish" then cfg.act = "silu"
      elseif act:find("gelu") then cfg.act = "gelu_tanh"
      else error(spec.name .. ".from_pretrained: unsupported activation " .. act, 2) end
    end
    local function first(v) return type(v) == "table" and v[1] or v end
    cfg.bos_id = first(j.bos_token_id) or cfg.bos_id
    cfg.eos_id = first(j.eos_token_id) or cfg.eos_id
    cfg.pad_id = first(j.pad_token_id) or cfg.pad_id
    local lm = F.build(cfg, opts)
    M.load_hf(lm, common.load_tensors(dir, spec.name .. ".from_pretrained", 2), 3)
    rawset(lm, "tokenizer", M.load_tokenizer(dir))
    return lm
  end

  return F
end

return M
