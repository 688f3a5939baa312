-- models.causal_lm — the decoder-only transformer that Gemma, Mistral, Llama and Qwen 2 share,
-- with KV-cache generation. References: Hugging Face modeling_gemma.py / modeling_mistral.py /
-- modeling_llama.py / modeling_qwen2.py (module names, checkpoint layout, config keys),
-- keras-hub GemmaBackbone / MistralBackbone (presets, LoRA targets).
--
-- Shape letters: B batch, T tokens in this call, S keys (cached + new), L cache length,
-- C hidden, H query heads, Hkv key/value heads, D head dim, F FFN width, V vocabulary.
--
-- Module tree (state_dict names) and the Hugging Face names they load from:
--   model.embed_tokens.weight                 [V, C]
--   model.layers.N.input_layernorm.weight     [C]        HF layer n is our N = n + 1
--   model.layers.N.self_attn.query.weight     [H·D, C]   HF self_attn.q_proj (.bias [H·D]: Qwen 2,
--   model.layers.N.self_attn.key.weight       [Hkv·D, C] HF self_attn.k_proj  attention_bias)
--   model.layers.N.self_attn.value.weight     [Hkv·D, C] HF self_attn.v_proj
--   model.layers.N.self_attn.output.weight    [C, H·D]   HF self_attn.o_proj (.bias: attention_bias)
--   model.layers.N.post_attention_layernorm.weight [C]
--   model.layers.N.mlp.{gate,up}_proj.weight  [F, C];  mlp.down_proj.weight [C, F] (.bias: mlp_bias)
--   model.norm.weight                         [C]
--   lm_head.weight                            [V, C]     untied models only (Mistral)
-- The projections are named query/key/value/output (as in Keras) so that
-- lora.enable(m, {targets = {"query", "value"}}) finds them.
--
-- cfg fields: vocab, hidden, layers, heads, kv_heads, head_dim, ffn, eps, unit_offset (Gemma's
-- RMSNorm scale 1 + w), act ("gelu_tanh" GeGLU | "gelu" exact GeGLU | "silu" SwiGLU), tie (LM
-- head = embedding), embed_scale (multiply embeddings by sqrt(C)), window (sliding window or nil),
-- qkv_bias (biases on q/k/v), o_bias (on the output projection), mlp_bias (on the three MLP
-- projections), rope_base, rope (nil: plain RoPE at rope_base; else a models.rope table: scaled
-- RoPE), bos_id, eos_id (eos_ids: all of them when config.json lists several), pad_id.
local keng = require "keng"
local nn = require "keng.nn"
local common = require "models.common"
local json = require "keng.json"
local rope = require "models.rope"

local M = {}

local function shape_str(t) return require("keng.util").shape_str(t, ",") end

---------------------------------------------------------------------------------------------
-- attention: q/k/v projections, RoPE, grouped-query SDPA, output projection

local Attention = nn.Module:extend("DecoderAttention")
M.Attention = Attention

function Attention:init(cfg, o)
  local C, H, Hkv, D = cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim
  self.heads, self.kv_heads, self.head_dim = H, Hkv, D
  self.window, self.rope_base, self.rope = cfg.window, cfg.rope_base or 10000, cfg.rope
  local lo = {bias = cfg.qkv_bias or false, dtype = o.dtype, device = o.device}
  self.query = nn.Linear(C, H * D, lo)
  self.key = nn.Linear(C, Hkv * D, lo)
  self.value = nn.Linear(C, Hkv * D, lo)
  self.output = nn.Linear(H * D, C, {bias = cfg.o_bias or false, dtype = o.dtype, device = o.device})
  -- Keras keeps these kernels as [C, heads, D] einsums and its LoRA gives each head its own A
  -- [C, r] with one shared B [r, D]; the hint tells keng.lora how the outputs split into heads
  self.query.einsum_heads, self.key.einsum_heads, self.value.einsum_heads = H, Hkv, Hkv
end

-- rope_options(r, base, D, positions, device) -> the options of keng.rope for this call: {base}
-- for plain RoPE; {inv_freq = f64 [D/2], scale} for a scaled one (r: a models.rope table). The
-- frequencies are made once per (scheme, device) and kept (longrope: its short and long sets),
-- except dynamic NTK's past max_position_embeddings, which change with every length
local FREQS = setmetatable({}, {__mode = "k"})                      -- r -> {[key] = options}
local function rope_options(r, base, D, positions, device)
  if not r or r.type == "default" then return {base = r and r.base or base} end
  local seq_len = 0
  if rope.depends_on_length(r) and positions.device ~= "meta" and positions:numel() > 0 then
    seq_len = positions:max():item() + 1                            -- one sync, for these two types only
  end
  if r.type == "dynamic" and seq_len > r.max_pos then
    local f, scale = rope.frequencies(r, D, seq_len)
    return {inv_freq = keng.tensor(f, {dtype = "f64", device = device}), scale = scale}
  end
  local long = r.type == "longrope" and seq_len > r.original_max_position_embeddings
  local key = string.format("%s/%d/%s", device, D, long and "long" or "")
  local per = FREQS[r] or {}
  FREQS[r] = per
  if not per[key] then
    local f, scale = rope.frequencies(r, D, seq_len)
    per[key] = {inv_freq = keng.tensor(f, {dtype = "f64", device = device}), scale = scale}
  end
  return per[key]
end
M.rope_options = rope_options

-- decode_rope_options(r, base, D, positions, device) -> rope_options' result for a decode
-- step, with no host read: where the frequencies depend on the length (dynamic NTK, longrope)
-- they are derived on the device from positions (seq_len = max + 1, as transformers), by the
-- f64 operations of rope.frequencies in the same order (the same bits), so the step can be
-- captured as a CUDA Graph and replayed at every length
local function decode_rope_options(r, base, D, positions, device)
  if not (r and rope.depends_on_length(r)) or positions.device == "meta" then
    return rope_options(r, base, D, positions, device)
  end
  local per = FREQS[r] or {}
  FREQS[r] = per
  local key = string.format("%s/%d/device", device, D)
  local c = per[key]
  if not c then
    local f64 = {dtype = "f64", device = device}
    c = {}
    if r.type == "dynamic" then
      local e = {}
      for i = 0, D // 2 - 1 do e[i + 1] = -2 * i / D end           -- plain()'s exponents
      c.exps = keng.tensor(e, f64)
    else
      local short, scale = rope.frequencies(r, D, 0)
      c.short, c.scale = keng.tensor(short, f64), scale
      c.long = keng.tensor((rope.frequencies(r, D, r.original_max_position_embeddings + 1)), f64)
    end
    per[key] = c
  end
  local seq_len = positions:max():double() + 1                     -- [] f64, on the device
  if r.type == "dynamic" then                                      -- base·((f·L / max) - (f - 1))^(D / (D - 2))
    local L = seq_len:clamp{min = r.max_pos}
    local b = ((L * r.factor) / r.max_pos - (r.factor - 1)) ^ (D / (D - 2)) * r.base
    return {inv_freq = keng.pow(b:view{1}, c.exps), scale = 1}
  end
  return {inv_freq = keng.where(seq_len:gt(r.original_max_position_embeddings), c.long, c.short), scale = c.scale}
end
M.decode_rope_options = decode_rope_options

-- x [B, T, C]; ctx.positions i64 [T] or [B, T] (0-based); ctx.mask bool [B, 1, T, S] or nil
-- (nil: causal with the sliding window); ctx.cache {k=, v=} [B, Hkv, L, D] written at column
-- ctx.start (1-based); ctx.rope: keng.rope's options (made per call when absent) -> [B, T, C].
-- The decode step of keng.generate instead gives ctx.col (i64 [T] on the device, 0-based
-- columns): keng.decode_qkv ropes q and k and writes k and v into the cache columns there in one
-- op, and the query attends over the whole fixed-length cache under ctx.mask [B, 1, T, L] (or the
-- first ctx.keys columns, eagerly), so the step can have one shape for every token (capturable as
-- a CUDA graph); ctx.qkv (this layer's [q; k; v] weights in one matrix) makes the projections one
-- GEMM. decode_qkv takes keng.rope's options (a scaled RoPE's inv_freq and scale too), so every
-- RoPE scheme decodes fused.
function Attention:forward(x, ctx)
  local B, T = x.shape[1], x.shape[2]
  local H, Hkv, D = self.heads, self.kv_heads, self.head_dim
  local ro = ctx.rope or (ctx.col and decode_rope_options or rope_options)(self.rope, self.rope_base, D, ctx.positions,
    x.device)
  local q, k, v
  local cache = ctx.cache
  -- decode_qkv rotates as keng.rope does with ro's options (plain or scaled RoPE)
  local dq = ctx.col and {heads = H, kv_heads = Hkv, base = ro.base, inv_freq = ro.inv_freq, scale = ro.scale}
  if ctx.qkv and cache and ctx.col then                             -- decode: one GEMM, one fused op
    q = keng.decode_qkv(keng.linear(x, ctx.qkv), ctx.positions, cache.k, cache.v, ctx.col, dq)  -- [B, H, T, D]; k, v cached
  elseif ctx.col then                                               -- decode, unfused weights (LoRA, biases)
    local qkv = keng.cat({self.query(x), self.key(x), self.value(x)}, 3):to(cache.k.dtype)  -- [B, T, (H+2Hkv)·D]
    q = keng.decode_qkv(qkv, ctx.positions, cache.k, cache.v, ctx.col, dq)
  else
    q = self.query(x):view{B, T, H, D}:transpose(2, 3)              -- [B, H, T, D]
    k = self.key(x):view{B, T, Hkv, D}:transpose(2, 3)              -- [B, Hkv, T, D]
    v = self.value(x):view{B, T, Hkv, D}:transpose(2, 3)            -- [B, Hkv, T, D]
    q = keng.rope(q, ctx.positions, ro)
    k = keng.rope(k, ctx.positions, ro)
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
    if m.__name ~= "Linear" or rawget(m, "forward") or m.bias or not keng.is_tensor(m.weight)
      or m.weight_scale ~= nil then return nil end                  -- quantized: linear_q8/q4 per projection
    if i > 1 and m.weight.dtype ~= ws[1].dtype then return nil end
    ws[i] = m.weight
  end
  return keng.cat(ws, 1)
end

---------------------------------------------------------------------------------------------
-- gated MLP: down(act(gate(x)) * up(x)), GeGLU (gelu tanh) for Gemma, SwiGLU (silu) for the others

local MLP = nn.Module:extend("GatedMLP")
M.MLP = MLP

function MLP:init(cfg, o)
  local lo = {bias = cfg.mlp_bias or false, dtype = o.dtype, device = o.device}
  self.act = cfg.act
  self.gate_proj = nn.Linear(cfg.hidden, cfg.ffn, lo)
  self.up_proj = nn.Linear(cfg.hidden, cfg.ffn, lo)
  self.down_proj = nn.Linear(cfg.ffn, cfg.hidden, lo)
end

function MLP:forward(x)                                             -- x [B, T, C]
  local g = self.gate_proj(x)                                       -- [B, T, F]
  if self.act == "silu" then g = g:silu()
  elseif self.act == "gelu" then g = g:gelu()                       -- exact (erf)
  else g = g:gelu{approximate = "tanh"} end
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
-- (unless no_range: that check reads ids on the host)
function CausalLM:check_ids(ids, level, no_range)
  if not keng.is_tensor(ids) then ids = keng.tensor(ids, {dtype = "i64", device = self:param_device()}) end
  if ids.ndim == 1 then ids = ids:unsqueeze(1) end
  if ids.ndim ~= 2 then error("CausalLM: token ids must be [B, T], got " .. shape_str(ids), level) end
  if ids.dtype ~= "i64" and ids.dtype ~= "i32" then
    error("CausalLM: token ids must be an integer tensor, got " .. ids.dtype, level)
  end
  if not no_range and ids.device ~= "meta" and ids:numel() > 0 then
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
  local own_rope = not ctx.rope                                     -- one frequency table per call
  if own_rope then
    ctx.rope = (ctx.col and decode_rope_options or rope_options)(self.cfg.rope, self.cfg.rope_base or 10000,
      self.cfg.head_dim, ctx.positions, x.device)
  end
  if self.cfg.embed_scale then x = x * math.sqrt(self.cfg.hidden) end  -- rounded to x's dtype, as HF
  local fused = ctx.fused
  for i, layer in ipairs(self.model.layers) do
    ctx.cache, ctx.qkv = caches and caches[i], fused and fused[i]
    x = layer(x, ctx)                                               -- [B, T, C]
  end
  ctx.cache, ctx.qkv = nil, nil
  if own_rope then ctx.rope = nil end
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

-- padding_mask(m [B, T] (1/true = real token), window, device) -> bool [B, 1, T, T]: query i
-- sees key j when j <= i, j is a real token and i - j < window (as transformers' causal mask for
-- a padded batch); a padding query sees itself only, so that no softmax row is empty (its
-- output is meaningless, as in transformers). (generate makes its own decode-time masks.)
local function padding_mask(m, window, device)
  local B, T = m.shape[1], m.shape[2]
  local i = keng.arange(T, {device = device}):view{T, 1}            -- [T, 1] query
  local j = keng.arange(T, {device = device}):view{1, T}            -- [1, T] key
  local ok = j:le(i):float()                                        -- [T, T] causal
  if window then ok = ok * (i - j):lt(window):float() end
  ok = ok * (m.dtype == "bool" and m or m:ne(0)):float():view{B, 1, 1, T}  -- [B, 1, T, T] real keys
  local eye = j:eq(i):float()                                       -- [T, T]
  return (ok + eye):gt(0)                                           -- [B, 1, T, T] bool
end

local LOGITS_OPTS = {attention_mask = true, position_ids = true, check_ids = true}

-- logits(ids, {attention_mask =, position_ids =}) -> f32 [B, T, V] over the whole sequence
-- (causal, sliding window). attention_mask [B, T] (tensor or nested list; 1/true = real token)
-- hides padding keys, left or right; position_ids [B, T] or [T] (default 0 .. T-1 whatever the
-- mask, as transformers' model(input_ids, attention_mask = m)). Logits at padding positions are
-- meaningless. check_ids = false skips the range check of ids (ids:max():item() reads them on the
-- host, which a CUDA Graph capture cannot do): the caller vouches for ids in [0, V).
-- (raw: logits in the model dtype, for forward)
function CausalLM:logits(ids, opts, raw)
  opts = opts or {}
  if type(opts) ~= "table" then error("CausalLM:logits: options must be a table, got " .. type(opts), 2) end
  for k in pairs(opts) do
    if not LOGITS_OPTS[k] then
      error(string.format("CausalLM:logits: unknown option '%s' (valid: attention_mask, check_ids, position_ids)",
        tostring(k)), 2)
    end
  end
  ids = self:check_ids(ids, 3, opts.check_ids == false)
  local B, T, dev = ids.shape[1], ids.shape[2], ids.device
  if T == 0 then error("CausalLM:logits: token ids " .. shape_str(ids) .. " hold no tokens (T = 0)", 2) end
  local pos
  if opts.position_ids == nil then
    pos = keng.arange(T, {device = dev})                            -- [T]
  else
    pos = opts.position_ids
    if not keng.is_tensor(pos) then pos = keng.tensor(pos, {dtype = "i64", device = dev}) end
    local okshape = (pos.ndim == 1 and pos.shape[1] == T) or (pos.ndim == 2 and pos.shape[2] == T and
      (pos.shape[1] == B or pos.shape[1] == 1))
    if not okshape then
      error(string.format("CausalLM:logits: position_ids %s must be [T] or [B, T] for ids %s", shape_str(pos),
        shape_str(ids)), 2)
    end
  end
  local ctx = {positions = pos}
  if opts.attention_mask ~= nil then
    local m = opts.attention_mask
    if not keng.is_tensor(m) then m = keng.tensor(m, {dtype = "i64", device = dev}) end
    if m.ndim == 1 then m = m:unsqueeze(1) end
    if m.ndim ~= 2 or m.shape[1] ~= B or m.shape[2] ~= T then
      error(string.format("CausalLM:logits: attention_mask %s must be [B, T] like ids %s", shape_str(m),
        shape_str(ids)), 2)
    end
    ctx.mask = padding_mask(m:to(dev), self.cfg.window, dev)
  end
  return self:head(self:hidden(ids, ctx), raw)
end

-- lm(ids), lm(ids, {attention_mask =, position_ids =}) or lm(ids, mask): fit passes a table x
-- {ids, mask} as lm(ids, mask), so padded batches train with their mask. The logits stay in the
-- model dtype (as transformers' forward): cross_entropy reads bf16 logits directly with f32 math
-- and gives their gradient in bf16, so no f32 copy of the [B, T, V] logits is made either way
-- (docs/kernels.md); lm:logits casts to f32.
function CausalLM:forward(ids, opts)
  if keng.is_tensor(opts) then opts = {attention_mask = opts} end
  return self:logits(ids, opts, true)
end

function CausalLM:extra_repr()
  local c = self.cfg
  return string.format("vocab=%d, hidden=%d, layers=%d, heads=%d/%d, head_dim=%d, ffn=%d%s%s",
    c.vocab, c.hidden, c.layers, c.heads, c.kv_heads, c.head_dim, c.ffn, c.window and (", window=" .. c.window) or "",
    c.rope and (", rope=" .. c.rope.type) or "")
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

-- plain(m, class): m is a module of that class running its class's own forward on an
-- unquantized weight in the weight's dtype (no LoRA adapter, no compute dtype of its own), so
-- the decode step may call its kernel directly with the same result
local function plain(m, class)
  return m ~= nil and m.__name == class and not rawget(m, "forward") and not rawget(m, "_compute_dtype")
    and keng.is_tensor(m.weight) and m.weight_scale == nil
end

-- the [gate; up] weight [2F, C] of an MLP for one GEMM, or nil (as fused_qkv)
function MLP:fused_gate_up()
  local g, u = self.gate_proj, self.up_proj
  if not (plain(g, "Linear") and plain(u, "Linear")) or g.bias or u.bias or g.weight.dtype ~= u.weight.dtype then
    return nil
  end
  return keng.cat({g.weight, u.weight}, 1)
end

-- decode_weights() -> per layer the fused [q; k; v] weight (or false: the layer runs unfused),
-- and .mlp: per layer the fused [gate; up] weight (or false); made once per generate call, so
-- weights changed between calls are seen
function CausalLM:decode_weights()
  local fused = {mlp = {}}
  for i, layer in ipairs(self.model.layers) do
    fused[i] = layer.self_attn:fused_qkv() or false
    fused.mlp[i] = layer.mlp:fused_gate_up() or false
  end
  return fused
end

-- decode_plan(fused) -> the flat decode step's weights, or false when some module is not plain
-- (then decode runs the modules). Per layer {n1, n2 (norm weights), qkv, gu ([gate; up]), o,
-- ob, down, db (weights, biases), act}; eps and norm_o (rms_norm's options) for all. The step
-- calls the kernels directly: a token costs no module plumbing, and the MLP is one GEMM for gate
-- and up. Kept in fused (it holds only references).
function CausalLM:decode_plan(fused)
  if fused.plan ~= nil then return fused.plan end
  local m, cfg = self.model, self.cfg
  local ok = plain(m.embed_tokens, "Embedding") and plain(m.norm, "RMSNorm")
    and (cfg.tie or (plain(self.lm_head, "Linear") and not self.lm_head.bias))
  local layers, dtype = {}, m.embed_tokens.weight.dtype
  ok = ok and (cfg.tie or self.lm_head.weight.dtype == dtype)
  for i, layer in ipairs(m.layers) do
    local a, mlp = layer.self_attn, layer.mlp
    ok = ok and fused[i] and fused.mlp and fused.mlp[i] and layer.__name == "DecoderBlock"
      and a.__name == "DecoderAttention" and mlp.__name == "GatedMLP" and not rawget(layer, "forward")
      and not rawget(a, "forward") and not rawget(mlp, "forward") and plain(a.output, "Linear")
      and plain(mlp.down_proj, "Linear") and plain(layer.input_layernorm, "RMSNorm")
      and plain(layer.post_attention_layernorm, "RMSNorm")
    if not ok then break end
    for _, t in ipairs({a.output.weight, mlp.down_proj.weight, fused[i], fused.mlp[i]}) do
      ok = ok and t.dtype == dtype                                  -- no cast between the kernels
    end
    for _, n in ipairs({layer.input_layernorm, layer.post_attention_layernorm}) do
      ok = ok and n.eps == m.norm.eps and n.unit_offset == m.norm.unit_offset   -- one eps, one offset
    end
    if not ok then break end
    layers[i] = {n1 = layer.input_layernorm.weight, n2 = layer.post_attention_layernorm.weight, qkv = fused[i],
                 gu = fused.mlp[i], o = a.output.weight, ob = a.output.bias, down = mlp.down_proj.weight,
                 db = mlp.down_proj.bias, act = mlp.act}
  end
  if ok then layers.eps, layers.norm_o = m.norm.eps, {unit_offset = m.norm.unit_offset} end
  fused.plan = ok and layers or false
  return fused.plan
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
  local plan = fused and self:decode_plan(fused)
  if not plan then
    local h = self:hidden(ids, {positions = positions, mask = mask, col = col, fused = fused, keys = keys}, caches)
    return self:head(h, raw):select(2, 1)                           -- [B, V]
  end
  -- the flat step: what hidden + head compute for plain modules, op for op
  local cfg, m = self.cfg, self.model
  local B, C, H, Hkv, D, F = ids.shape[1], cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn
  local eps, norm_o = plan.eps, plan.norm_o
  local dq = plan.dq                                                -- kept unless the frequencies follow the length
  if not dq then
    local ro = decode_rope_options(cfg.rope, cfg.rope_base or 10000, D, positions, ids.device)
    dq = {heads = H, kv_heads = Hkv, base = ro.base, inv_freq = ro.inv_freq, scale = ro.scale}
    if not (cfg.rope and rope.depends_on_length(cfg.rope)) then plan.dq = dq end
  end
  local ao = {mask = mask}
  local x = keng.embedding(ids, m.embed_tokens.weight)              -- [B, 1, C]
  if cfg.embed_scale then x = x * math.sqrt(C) end
  for i, w in ipairs(plan) do
    local cache = caches[i]
    local q = keng.decode_qkv(keng.linear(keng.rms_norm(x, w.n1, eps, norm_o), w.qkv), positions, cache.k, cache.v,
      col, dq)                                                      -- [B, H, 1, D]
    local k, v = cache.k, cache.v                                   -- [B, Hkv, L, D]
    if keys then k, v = k:narrow(3, 1, keys), v:narrow(3, 1, keys) end
    local a = keng.scaled_dot_product_attention(q, k, v, ao):view{B, 1, H * D}  -- T = 1: [B, H, 1, D] is [B, 1, H·D]
    x:add_(keng.linear(a, w.o, w.ob))                               -- x is this step's own: in place
    local gu = keng.linear(keng.rms_norm(x, w.n2, eps, norm_o), w.gu)  -- [B, 1, 2F]
    local g = gu:narrow(3, 1, F)
    if w.act == "silu" then g = g:silu()
    elseif w.act == "gelu" then g = g:gelu()                        -- exact (erf)
    else g = g:gelu{approximate = "tanh"} end
    x:add_(keng.linear(g * gu:narrow(3, F + 1, F), w.down, w.db))
  end
  local h = keng.rms_norm(x, m.norm.weight, eps, norm_o):view{B, C}
  local y = self.lm_head and keng.linear(h, self.lm_head.weight) or keng.linear(h, m.embed_tokens.weight)
  return raw and y or y:float()                                     -- [B, V]
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
    return string.format("model.layers.%d.%s", common.keng_layer(n), rest)
  end
  if name:find("rotary_emb") then return nil end
  return name
end

-- the inverse: our name -> the checkpoint name ("model.layers.1.self_attn.query.weight" ->
-- "model.layers.0.self_attn.q_proj.weight"); module names map too (keng.lora's PEFT adapters)
local PROJ_HF = {query = "q_proj", key = "k_proj", value = "v_proj", output = "o_proj"}
function M.keng_to_hf(name)
  local n, rest = name:match("^model%.layers%.(%d+)%.(.*)$")
  if not n then return name end
  local field, tail = rest:match("^self_attn%.([%w_]+)(.*)$")
  if field and PROJ_HF[field] then rest = "self_attn." .. PROJ_HF[field] .. tail end
  return string.format("model.layers.%d.%s", common.hf_layer(n), rest)
end
function CausalLM:hf_name(name) return M.keng_to_hf(name) end
function CausalLM:keng_name(name) return M.hf_to_keng(name) end
-- lm:save_pretrained(dir, {max_shard_size = "5GB"}): config.json + safetensors under HF names
function CausalLM:save_pretrained(dir, opts) return require("models.hf_save").causal_lm(self, dir, opts, 2) end

-- load_hf(lm, tensors): copies a Hugging Face state dict into lm (strict: every missing,
-- unexpected and mis-shaped tensor is named, with both shapes)
function M.load_hf(lm, tensors, level)
  local sd = {}
  for name, t in pairs(tensors) do
    local k = M.hf_to_keng(name)
    if k == "lm_head.weight" and lm.cfg.tie then k = nil end        -- tied: the embedding is the head
    if k then sd[k] = t end
  end
  require("keng.quantize").prepare(lm, sd)  -- a quantized checkpoint's int8 layers (docs/quantization.md)
  local ok, e = pcall(lm.load_state_dict, lm, sd)
  if not ok then error(tostring(e):gsub("^[^:]*:%d+: ", ""), level) end
  return lm
end

-- keng.tokenizers.from_dir(dir) when there is a tokenizer.json (transformers 5), else
-- keng.tokenizers.sentencepiece(dir/tokenizer.model) when the file and the binding exist, else
-- nil; with tokenizer_config.json's chat_template and BOS / EOS strings (keng.chat_template)
function M.load_tokenizer(dir)
  local T = require "keng.tokenizers"
  local files = T.dir_files(dir, "from_pretrained", 2)             -- a symlink out of dir is refused
  if files["tokenizer.json"] then return require("keng.chat_template").attach(T.from_dir(dir), dir) end
  if not files["tokenizer.model"] or not keng.sentencepiece then return nil end
  local tok = T.sentencepiece(files["tokenizer.model"])
  tok.files = files                                                -- what save_pretrained copies
  return require("keng.chat_template").attach(tok, dir)
end

---------------------------------------------------------------------------------------------
-- config.json -> cfg. Every key is either read (and a value keng does not implement raises
-- naming it), or known not to change the numbers (ids, dtypes, generation defaults, bookkeeping);
-- any other key raises, so that nothing in a checkpoint's config is silently ignored.

-- keys that do not change the forward pass (PretrainedConfig's bookkeeping in transformers 4
-- and 5, generation defaults, initialisation)
local HARMLESS = {}
for k in ([[_name_or_path architectures model_type transformers_version torch_dtype dtype use_cache
  initializer_range id2label label2id is_encoder_decoder is_decoder output_attentions
  output_hidden_states return_dict chunk_size_feed_forward problem_type tokenizer_class
  use_bfloat16 torchscript pruned_heads tie_encoder_decoder add_cross_attention finetuning_task
  prefix sep_token_id decoder_start_token_id task_specific_params tf_legacy_loss max_length
  min_length do_sample early_stopping num_beams num_beam_groups diversity_penalty temperature top_k
  top_p typical_p repetition_penalty length_penalty no_repeat_ngram_size
  encoder_no_repeat_ngram_size bad_words_ids num_return_sequences output_scores
  return_dict_in_generate forced_bos_token_id forced_eos_token_id remove_invalid_values
  exponential_decay_length_penalty suppress_tokens begin_suppress_tokens _attn_implementation
  _attn_implementation_autoset _commit_hash pretraining_tp]]):gmatch("%S+") do
  HARMLESS[k] = true
end

-- keys every family reads (the rest are in spec.config_keys)
local COMMON_KEYS = {}
for k in ([[vocab_size hidden_size num_hidden_layers num_attention_heads num_key_value_heads
  intermediate_size head_dim rms_norm_eps hidden_act rope_theta rope_scaling rope_parameters
  partial_rotary_factor original_max_position_embeddings max_position_embeddings tie_word_embeddings bos_token_id
  eos_token_id pad_token_id attention_dropout]]):gmatch("%S+") do
  COMMON_KEYS[k] = true
end

-- hidden_act -> cfg.act, as transformers' ACT2FN ("gelu" is exact, except in Gemma, whose config
-- class rewrites it to the tanh form)
local ACTS = {silu = "silu", swish = "silu", gelu = "gelu", gelu_pytorch_tanh = "gelu_tanh", gelu_new = "gelu_tanh"}

-- parse_config(j, spec, who, level, nulls) -> cfg from config.json j for the family spec
-- (nulls: the set of keys that were null in the file, common.read_config's second value)
-- (spec.config_keys: the family's own keys -> true; spec.model_types; spec.gelu_tanh: "gelu"
-- means the tanh form; spec.head_dim: head_dim when absent; spec.qkv_bias: q/k/v biases always)
function M.parse_config(j, spec, who, level, nulls)
  level = level + 1
  local own = spec.config_keys or {}
  for k in pairs(j) do
    if not (COMMON_KEYS[k] or own[k] or HARMLESS[k]) then
      local read = {}
      for key in pairs(COMMON_KEYS) do read[#read + 1] = key end
      for key in pairs(own) do read[#read + 1] = key end
      table.sort(read)
      error(string.format("%s: config.json key '%s' is not implemented by keng's %s (it reads: %s)", who,
        tostring(k), spec.name, table.concat(read, ", ")), level)
    end
  end
  if j.model_type and spec.model_types and not spec.model_types[j.model_type] then
    error(string.format("%s: config.json model_type '%s' is not a %s model", who, tostring(j.model_type), spec.name),
      level)
  end
  local cfg = common.overlay(spec.defaults)
  -- size(key, optional) -> config.json's positive integer at key (nil when optional and absent)
  local function size(key, optional)
    local v = j[key]
    if v == nil and optional then return nil end
    if v == nil then error(who .. ": config.json lacks " .. key, level + 1) end
    local n = math.type(v) and math.tointeger(v)
    if not n or n <= 0 then
      error(string.format("%s: config.json %s must be a positive integer, got %s", who, key, tostring(v)), level + 1)
    end
    return n
  end
  -- flag(key) -> config.json's boolean at key (false when absent)
  local function flag(key)
    local v = j[key]
    if v ~= nil and type(v) ~= "boolean" then
      error(string.format("%s: config.json %s must be true or false, got %s", who, key, tostring(v)), level + 1)
    end
    return v or false
  end
  cfg.vocab, cfg.hidden, cfg.layers = size("vocab_size"), size("hidden_size"), size("num_hidden_layers")
  cfg.heads, cfg.ffn = size("num_attention_heads"), size("intermediate_size")
  cfg.kv_heads = size("num_key_value_heads", true) or cfg.heads
  cfg.head_dim = size("head_dim", true) or spec.head_dim or cfg.hidden // cfg.heads
  if cfg.heads % cfg.kv_heads ~= 0 then
    error(string.format("%s: config.json num_attention_heads %d is not a multiple of num_key_value_heads %d", who,
      cfg.heads, cfg.kv_heads), level)
  end
  cfg.eps = j.rms_norm_eps or 1e-6                                  -- the config classes' default
  if type(cfg.eps) ~= "number" or not (cfg.eps >= 0) then
    error(who .. ": config.json rms_norm_eps must be a number >= 0, got " .. tostring(cfg.eps), level)
  end
  if j.tie_word_embeddings ~= nil then cfg.tie = flag("tie_word_embeddings") end
  if (j.attention_dropout or 0) ~= 0 then
    error(string.format("%s: config.json attention_dropout %s is not implemented (keng's attention has no dropout)",
      who, tostring(j.attention_dropout)), level)
  end
  -- activation
  local act = j.hidden_act
  if act ~= nil then
    if spec.gelu_tanh and act == "gelu" then act = "gelu_pytorch_tanh" end
    cfg.act = ACTS[act] or error(string.format("%s: config.json hidden_act '%s' is not implemented (valid: %s)", who,
      tostring(act), "silu, swish, gelu, gelu_pytorch_tanh, gelu_new"), level)
  end
  if j.hidden_activation ~= nil then                                -- transformers 4's Gemma key
    local a = ACTS[j.hidden_activation]
    if not a then
      error(string.format("%s: config.json hidden_activation '%s' is not implemented (valid: %s)", who,
        tostring(j.hidden_activation), "silu, swish, gelu, gelu_pytorch_tanh, gelu_new"), level)
    end
    if a ~= cfg.act then                                            -- transformers 4 and 5 would disagree
      error(string.format("%s: config.json hidden_activation '%s' and hidden_act '%s' name different functions",
        who, j.hidden_activation, tostring(j.hidden_act or cfg.act)), level)
    end
    cfg.act = a
  end
  -- biases
  if flag("attention_bias") then cfg.qkv_bias, cfg.o_bias = true, true end
  if spec.qkv_bias then cfg.qkv_bias = true end
  if flag("mlp_bias") then cfg.mlp_bias = true end
  if flag("use_bidirectional_attention") then
    error(who .. ": config.json use_bidirectional_attention = true is not implemented (causal attention only)", level)
  end
  -- sliding windows: Mistral's on every layer; Qwen 2's only from layer max_window_layers on
  -- (transformers' MistralConfig: sliding_window absent is its default 4096 — spec.defaults.window —
  -- and null is no window; nulls: the set of config.json's null keys, or json.null values in j)
  if spec.uses_window and (j.sliding_window ~= nil or (nulls and nulls.sliding_window)) then
    cfg.window = j.sliding_window ~= json.null and size("sliding_window", true) or nil
  end
  if own.use_sliding_window then
    local slides = {}
    if j.layer_types then
      for i, t in ipairs(j.layer_types) do
        if t ~= "full_attention" then
          if t ~= "sliding_attention" then
            error(string.format("%s: config.json layer_types[%d] '%s' is not implemented", who, i, tostring(t)), level)
          end
          slides[#slides + 1] = i
        end
      end
    elseif flag("use_sliding_window") and size("sliding_window", true) then
      for i = (size("max_window_layers", true) or 28) + 1, cfg.layers do slides[#slides + 1] = i end
    end
    if #slides > 0 then
      error(string.format("%s: config.json asks for sliding-window attention on layer %d (use_sliding_window, " ..
        "max_window_layers, layer_types): per-layer windows are not implemented", who, slides[1]), level)
    end
  end
  -- RoPE
  local r = rope.from_config(j, cfg.head_dim, who, level, spec.default_theta)
  cfg.rope_base = r.base
  cfg.rope = r.type ~= "default" and r or nil
  local function first(v) return type(v) == "table" and v[1] or v end
  cfg.bos_id = first(j.bos_token_id) or cfg.bos_id
  cfg.eos_id = first(j.eos_token_id) or cfg.eos_id
  -- every end token (Llama 3.1 Instruct lists three; transformers' generate stops at any)
  if type(j.eos_token_id) == "table" then cfg.eos_ids = {table.unpack(j.eos_token_id)} end
  cfg.pad_id = first(j.pad_token_id) or cfg.pad_id
  return cfg
end

---------------------------------------------------------------------------------------------
-- a model family: presets, from_preset, from_pretrained (gemma.lua, mistral.lua, llama.lua, qwen2.lua)

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

  -- config_from_hf(j) -> a full cfg from a decoded config.json (keys checked as from_pretrained does)
  function F.config_from_hf(j, level)
    return M.parse_config(j, spec, spec.name .. ".config_from_hf", (level or 1) + 1)
  end

  -- build(cfg, opts) -> CausalLM (random weights, or shapes only on device = "meta")
  function F.build(cfg, opts)
    local lm = CausalLM(cfg, opts)
    rawset(lm, "family", spec.name)                                 -- save_pretrained's model_type
    if spec.add_bos ~= false then rawset(lm, "add_bos", true) end
    return lm
  end

  -- from_preset(name, {dtype =, device = "cpu", weights = path}) -> CausalLM; dtype defaults to
  -- f32 for random weights and to the weights' dtype ("auto") with weights
  function F.from_preset(name, opts)
    opts = opts or {}
    for k in pairs(opts) do
      if k ~= "dtype" and k ~= "device" and k ~= "weights" then
        error(string.format("%s.from_preset: unknown option '%s' (valid: dtype, device, weights)", spec.name,
          tostring(k)), 2)
      end
    end
    local cfg = F.config(name, 2)
    if not opts.weights then
      return F.build(cfg, {dtype = opts.dtype ~= "auto" and opts.dtype or nil, device = opts.device})
    end
    local tensors = common.load_tensors(opts.weights, spec.name .. ".from_preset", 2)
    local dtype = common.model_dtype(opts, nil, tensors, spec.name .. ".from_preset", 2)   -- the weights' when "auto"
    return M.load_hf(F.build(cfg, {dtype = dtype, device = opts.device}), tensors, 3)
  end

  -- from_pretrained(dir, {dtype = "auto", device =, tensor_parallel =}) -> CausalLM with dir's
  -- config.json, weights (model.safetensors or sharded model-*.safetensors + index) and
  -- tokenizer.model; dtype "auto" keeps the checkpoint's (config.json's dtype / torch_dtype, else
  -- the weights'); tensor_parallel = true: this rank's shards (keng.tensor_parallel)
  function F.from_pretrained(dir, opts)
    opts = opts or {}
    local who = spec.name .. ".from_pretrained"
    for k in pairs(opts) do
      if k ~= "dtype" and k ~= "device" and k ~= "tensor_parallel" then
        error(string.format("%s: unknown option '%s' (valid: device, dtype, tensor_parallel)", who, tostring(k)), 2)
      end
    end
    local j, nulls = common.read_config(dir, who, 2)                -- nulls read as absent
    local cfg = M.parse_config(j, spec, who, 2, nulls)
    -- this rank's shards only (keng.tensor_parallel, docs/distributed.md)
    if opts.tensor_parallel then
      local lm = require("keng.tensor_parallel").from_pretrained(F, dir, cfg, j, opts, who, 2)
      return lm                                                     -- no tail call: level 2 is the caller
    end
    local tensors = common.load_tensors(dir, who, 2)
    local dtype = common.model_dtype(opts, j, tensors, who, 2)
    local lm = F.build(cfg, {dtype = dtype, device = opts.device})
    M.load_hf(lm, tensors, 3)
    rawset(lm, "tokenizer", M.load_tokenizer(dir))
    return lm
  end

  -- from_gguf(path, {dtype = "auto", device =, tokenizer = true}) -> CausalLM from a llama.cpp
  -- GGUF file of this family (models/gguf.lua, docs/gguf.md)
  function F.from_gguf(path, opts) return require("models.gguf").from_gguf(path, opts, spec.name, 2) end

  return F
end

return M
