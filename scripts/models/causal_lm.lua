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
-- ctx.start (1-based) -> [B, T, C]
function Attention:forward(x, ctx)
  local B, T = x.shape[1], x.shape[2]
  local H, Hkv, D = self.heads, self.kv_heads, self.head_dim
  local q = self.query(x):view{B, T, H, D}:transpose(2, 3)          -- [B, H, T, D]
  local k = self.key(x):view{B, T, Hkv, D}:transpose(2, 3)          -- [B, Hkv, T, D]
  local v = self.value(x):view{B, T, Hkv, D}:transpose(2, 3)        -- [B, Hkv, T, D]
  q = keng.rope(q, ctx.positions, {base = self.rope_base})
  k = keng.rope(k, ctx.positions, {base = self.rope_base})
  local cache = ctx.cache
  if cache then                                                     -- write in place, read a view
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
  for i, layer in ipairs(self.model.layers) do
    ctx.cache = caches and caches[i]
    x = layer(x, ctx)                                               -- [B, T, C]
  end
  ctx.cache = nil
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
-- generation

local SAMPLERS = {greedy = true, temperature = true, top_k = true, top_p = true}

-- pick(logits [B, V] f32 (any float dtype for greedy), o) -> list of B ids.
-- Order: temperature -> top_k -> top_p -> sample.
local function pick(logits, o)
  if o.sampler == "greedy" then return logits:argmax(-1):tolist() end
  if o.temperature ~= 1 then logits = logits / o.temperature end
  local ids                                                         -- [B, K] vocabulary ids kept
  if o.top_k then
    logits, ids = logits:topk(math.min(o.top_k, logits.shape[2]), -1)
  end
  if o.top_p then
    local vals, idx = logits:topk(logits.shape[2], -1)              -- sorted, descending
    local p = vals:softmax(-1)
    local before = p:cumsum(-1) - p                                 -- mass ranked above each token
    logits = keng.where(before:lt(o.top_p), vals, -math.huge)       -- the top one always stays
    ids = ids and ids:gather(2, idx) or idx
  end
  local j = keng.multinomial(logits:softmax(-1), 1)                 -- [B, 1]
  if ids then j = ids:gather(2, j) end
  return j:view{-1}:tolist()
end

-- prompts -> list of id lists, and whether they came as text
function CausalLM:prompt_rows(prompts, level)
  if type(prompts) == "string" then prompts = {prompts} end
  if keng.is_tensor(prompts) then
    local t = self:check_ids(prompts, level + 1)
    return t:tolist(), false
  end
  if type(prompts) ~= "table" or #prompts == 0 then
    error("generate: prompts must be a string, a list of strings, a list of id lists or an i64 tensor", level)
  end
  local rows, text = {}, type(prompts[1]) == "string"
  for i, p in ipairs(prompts) do
    if type(p) == "string" then
      if not self.tokenizer then
        error("generate: string prompts need a tokenizer (from_pretrained with tokenizer.model, or set lm.tokenizer)", level)
      end
      local tok = self.tokenizer                                    -- BOS first, as HF and Keras do
      local bos = self.add_bos and (tok.bos_id == nil or tok.bos_id >= 0)
      local ids = tok:encode(p, {add_bos = bos})
      if keng.is_tensor(ids) then ids = ids:view{-1}:tolist() end
      rows[i] = ids
    elseif keng.is_tensor(p) then
      rows[i] = p:view{-1}:tolist()
    elseif type(p) == "table" then
      rows[i] = p
    else
      error(string.format("generate: prompt %d is a %s", i, type(p)), level)
    end
    if #rows[i] == 0 then error(string.format("generate: prompt %d is empty", i), level) end
    for _, id in ipairs(rows[i]) do
      if math.type(id) ~= "integer" or id < 0 or id >= self.cfg.vocab then
        error(string.format("generate: token id %s in prompt %d is out of range for vocabulary size %d",
          tostring(id), i, self.cfg.vocab), level)
      end
    end
  end
  return rows, text
end

-- bool mask [B, 1, T, S]: query t (column P0 + t) of row b sees key column j when the key is
-- not left padding, not in the future and inside the sliding window; a padding query sees
-- itself only, so that no softmax row is empty
local function make_mask(pads, q0, T, S, window, device)
  local rows = {}
  for b, pad in ipairs(pads) do
    local plane = {}
    for t = 1, T do
      local i = q0 + t - 1                                          -- 0-based column of the query
      local line = {}
      for j = 0, S - 1 do
        local ok = j <= i and j >= pad and (window == nil or i - j < window)
        line[j + 1] = ok or (i < pad and j == i)
      end
      plane[t] = line
    end
    rows[b] = {plane}
  end
  return keng.tensor(rows, {dtype = "bool", device = device})
end

-- generate(prompts, opts) -> list of id lists (prompt + generated, EOS included), and the
-- decoded strings when a tokenizer is present. See docs/models.md for the options.
function CausalLM:generate(prompts, opts)
  opts = opts or {}
  local o = {sampler = opts.sampler or "greedy", temperature = opts.temperature or 1,
             top_k = opts.top_k, top_p = opts.top_p}
  if not SAMPLERS[o.sampler] then
    error("generate: unknown sampler '" .. tostring(o.sampler) .. "' (greedy, temperature, top_k or top_p)", 2)
  end
  if o.sampler == "top_k" then o.top_k = o.top_k or 50 end
  if o.sampler == "top_p" then o.top_p = o.top_p or 0.9 end
  if o.temperature <= 0 then error("generate: temperature must be > 0", 2) end
  local max_length = opts.max_length or 50
  local rows, text = self:prompt_rows(prompts, 3)
  local stop = {}
  local stop_ids = opts.stop_token_ids or {self.cfg.eos_id}
  for _, id in ipairs(stop_ids) do stop[id] = true end
  local B, P, Lmin = #rows, 0, math.huge
  for i, r in ipairs(rows) do
    if #r > max_length then
      error(string.format("generate: prompt %d has %d tokens, more than max_length %d", i, #r, max_length), 2)
    end
    P, Lmin = math.max(P, #r), math.min(Lmin, #r)
  end
  if opts.seed then keng.manual_seed(opts.seed) end
  local cfg, dev, dtype = self.cfg, self:param_device(), self:param_dtype()
  local steps = max_length - Lmin                                   -- decode steps of the shortest row
  local out, done, pads = {}, {}, {}
  for b, r in ipairs(rows) do
    out[b], pads[b] = {table.unpack(r)}, P - #r
    done[b] = #r >= max_length
  end
  local was_training = self.training
  self:eval()
  keng.no_grad(function()
    -- left-padded prompt [B, P] and its positions (0 from each row's first real token)
    local ids, pos = {}, {}
    for b, r in ipairs(rows) do
      ids[b], pos[b] = {}, {}
      for j = 1, P do
        ids[b][j] = j > pads[b] and r[j - pads[b]] or cfg.pad_id or 0
        pos[b][j] = math.max(0, j - 1 - pads[b])
      end
    end
    local caches = {}                                               -- per layer k, v [B, Hkv, L, D]
    local L = P + steps
    for i = 1, cfg.layers do
      caches[i] = {k = keng.zeros({B, cfg.kv_heads, L, cfg.head_dim}, {dtype = dtype, device = dev}),
                   v = keng.zeros({B, cfg.kv_heads, L, cfg.head_dim}, {dtype = dtype, device = dev})}
    end
    -- prefill: the whole prompt in one pass, logits of the last column only
    local ctx = {positions = keng.tensor(pos, {dtype = "i64", device = dev}), start = 1,
                 mask = make_mask(pads, 0, P, P, cfg.window, dev)}
    local h = self:hidden(keng.tensor(ids, {dtype = "i64", device = dev}), ctx, caches)  -- [B, P, C]
    local raw = o.sampler == "greedy"                               -- argmax of the model-dtype logits
    local logits = self:head(h:narrow(2, P, 1), raw):select(2, 1)   -- [B, V]
    for s = 1, steps do
      local next_ids = pick(logits, o)
      local all_done, feed, fpos = true, {}, {}
      for b = 1, B do
        if not done[b] then
          local id = next_ids[b]
          out[b][#out[b] + 1] = id
          done[b] = stop[id] or #out[b] >= max_length
        end
        all_done = all_done and done[b]
        feed[b] = {done[b] and (cfg.pad_id or 0) or next_ids[b]}
        fpos[b] = {P + s - 1 - pads[b]}
      end
      if all_done or s == steps then break end
      -- one token per row at column P + s (1-based), attending to columns 1 .. P + s
      ctx = {positions = keng.tensor(fpos, {dtype = "i64", device = dev}), start = P + s,
             mask = make_mask(pads, P + s - 1, 1, P + s, cfg.window, dev)}
      h = self:hidden(keng.tensor(feed, {dtype = "i64", device = dev}), ctx, caches)  -- [B, 1, C]
      logits = self:head(h, raw):select(2, 1)                       -- [B, V]
    end
  end)
  if was_training then self:train() end
  if self.tokenizer and (text or opts.decode) then
    local strs = {}
    for b, r in ipairs(out) do strs[b] = self.tokenizer:decode(r) end
    return out, strs
  end
  return out
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

-- keng.tokenizers.from_dir(dir) when there is a tokenizer.json (transformers 5), else
-- keng.sentencepiece(dir/tokenizer.model) when the file and the binding exist, else nil
function M.load_tokenizer(dir)
  local tj = io.open(dir .. "/tokenizer.json", "rb")
  if tj then tj:close() return require("keng.tokenizers").from_dir(dir) end
  local path = dir .. "/tokenizer.model"
  local f = io.open(path, "rb")
  if not f then return nil end
  f:close()
  if not keng.sentencepiece then return nil end
  return keng.sentencepiece(path)
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
