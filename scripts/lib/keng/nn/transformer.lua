-- keng.nn.TransformerEncoderLayer — one Transformer encoder layer (Vaswani et al. 2017, fig. 1):
-- self-attention, then a two-layer MLP, each a residual branch with a LayerNorm, either
--   post-LN (norm_first=false; BERT):       x = LN1(x + attn(x));  x = LN2(x + fc2(act(fc1(x))))
--   pre-LN  (norm_first=true; CLIP, SAM's ViT, GPT-2): x = x + attn(LN1(x));  x = x + fc2(act(fc1(LN2(x))))
-- with dropout (when given) on each branch's output. Models keep the submodule names of the
-- checkpoints they load by passing `names` (roles -> names), so weights load without renaming.
-- Shape letters: B batch, T tokens, C width, H heads, F MLP width.
local keng = require "keng"
local Module = require "keng.nn.module"
local L = require "keng.nn.layers"
local MultiHeadAttention = require "keng.nn.attention"
local options = require "keng.options"

-- roles: attn (MultiHeadAttention), attn_norm (its branch's LayerNorm), mlp (a submodule that
-- holds fc1 and fc2, or nil to hold them in the layer itself), fc1 [F, C], fc2 [C, F], mlp_norm;
-- proj and proj_order are MultiHeadAttention's names and order options
local DEFAULT_NAMES = {attn = "attn", attn_norm = "attn_norm", fc1 = "fc1", fc2 = "fc2", mlp_norm = "mlp_norm"}

-- the MLP's two Linears in a submodule of their own (layouts such as CLIP's "mlp.fc1")
local MLP = Module:extend("MLP")

function MLP:init(dim, ffn, names, lo)
  self[names.fc1] = L.Linear(dim, ffn, lo)  -- [F, C]
  self[names.fc2] = L.Linear(ffn, dim, lo)  -- [C, F]
end

local TransformerEncoderLayer = Module:extend("TransformerEncoderLayer")

-- TransformerEncoderLayer(C, H, F, {norm_first=false, causal=false, eps=1e-5, activation=exact GELU
-- (a function of a tensor), dropout=nil (no dropout module), dtype=, device=, linear= (the MLP's
-- Linear options: weight_init=, std=), attention_init= ({weight_init=, std=} of the projections;
-- default Linear's), names= (see DEFAULT_NAMES), attention= (a module called as attention(x,
-- attn_opts) -> [.., C] in place of the MultiHeadAttention, made by the caller and registered
-- after its norm: SAM's windowed attention with relative positions)})
function TransformerEncoderLayer:init(dim, heads, ffn, opts)
  opts = options.check("TransformerEncoderLayer", opts, {"norm_first", "causal", "eps", "activation", "dropout",
    "dtype", "device", "linear", "attention_init", "names", "attention"}, 3)
  local n = {}
  for k, v in pairs(DEFAULT_NAMES) do n[k] = v end
  for k, v in pairs(opts.names or {}) do n[k] = v end
  self.names, self.norm_first = n, opts.norm_first or false
  self.act = opts.activation or keng.gelu
  local ai = opts.attention_init or {}
  local lo = opts.linear or {dtype = opts.dtype, device = opts.device}
  local no = {eps = opts.eps, dtype = opts.dtype, device = opts.device}
  if opts.attention then
    self[n.attn_norm] = L.LayerNorm(dim, no)
    self[n.attn] = opts.attention
  else
    self[n.attn] = MultiHeadAttention(dim, heads, {causal = opts.causal, dtype = opts.dtype, device = opts.device,
      weight_init = ai.weight_init, std = ai.std, names = n.proj, order = n.proj_order})
    self[n.attn_norm] = L.LayerNorm(dim, no)
  end
  if n.mlp then
    self[n.mlp] = MLP(dim, ffn, n, lo)
  else
    self[n.fc1] = L.Linear(dim, ffn, lo)  -- [F, C]
    self[n.fc2] = L.Linear(ffn, dim, lo)  -- [C, F]
  end
  self[n.mlp_norm] = L.LayerNorm(dim, no)
  if opts.dropout then self.dropout = L.Dropout(opts.dropout) end
end

-- fc2(act(fc1(x))): x [B, T, C] -> [B, T, C]
function TransformerEncoderLayer:feed_forward(x)
  local n = self.names
  local m = n.mlp and self[n.mlp] or self
  return m[n.fc2](self.act(m[n.fc1](x)))
end

-- forward(x, attn_opts): x [B, T, C] (any leading dims with a given attention); attn_opts goes to
-- the attention ({mask=} for padding)
function TransformerEncoderLayer:forward(x, attn_opts)
  local n, drop = self.names, self.dropout
  local attn, attn_norm, mlp_norm = self[n.attn], self[n.attn_norm], self[n.mlp_norm]
  if self.norm_first then
    local a = attn(attn_norm(x), attn_opts)                       -- [B, T, C]
    x = x + (drop and drop(a) or a)
    local h = self:feed_forward(mlp_norm(x))                      -- [B, T, C]
    return x + (drop and drop(h) or h)
  end
  local a = attn(x, attn_opts)                                    -- [B, T, C]
  x = attn_norm(x + (drop and drop(a) or a))
  local h = self:feed_forward(x)                                  -- [B, T, C]
  return mlp_norm(x + (drop and drop(h) or h))
end

function TransformerEncoderLayer:extra_repr() return self.norm_first and "pre-LN" or "post-LN" end

return TransformerEncoderLayer
