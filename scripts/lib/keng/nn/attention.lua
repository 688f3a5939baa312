-- keng.nn.MultiHeadAttention — query/key/value projections, the fused scaled-dot-product
-- attention op, and an output projection (Vaswani et al. 2017, fig. 2; grouped-query
-- attention when kv_heads < heads, Ainslie et al. 2023).
-- Shape letters: B batch, T query length, S key length, C model dim, H heads, Hkv key/value
-- heads, D head dim.
local keng = require "keng"
local Module = require "keng.nn.module"
local L = require "keng.nn.layers"
local options = require "keng.options"
local util = require "keng.util"

local MultiHeadAttention = Module:extend("MultiHeadAttention")

-- MultiHeadAttention(C, H, {kv_heads=H, head_dim=C/H, bias=true, causal=false, dropout=0,
-- dtype=, device=, weight_init=, std=, names=, order=}). Submodules query [H·D, C], key and value
-- [Hkv·D, C], out [C, H·D], initialised by weight_init (default Linear's). `names` renames them
-- after a checkpoint's layout ({query = "q_proj", key = "k_proj", ...}); they are made in `order`
-- (a list of those four roles, default query, key, value, out), the order random weights draw in.
-- The fused kernel has no dropout on the attention probabilities, so `dropout` applies to the
-- attended values before the output projection.
local ROLES = {"query", "key", "value", "out"}

function MultiHeadAttention:init(dim, heads, opts)
  opts = options.check("MultiHeadAttention", opts, {"kv_heads", "head_dim", "bias", "causal", "dropout", "dtype",
    "device", "weight_init", "std", "names", "order"}, 3)
  local kv_heads = opts.kv_heads or heads
  local head_dim = opts.head_dim or dim // heads
  if not opts.head_dim and dim % heads ~= 0 then
    Module.error(string.format("MultiHeadAttention: dim %d does not split into %d heads", dim, heads), 2)
  end
  if heads % kv_heads ~= 0 then
    Module.error(string.format("MultiHeadAttention: %d heads are not a multiple of kv_heads %d", heads, kv_heads), 2)
  end
  self.dim, self.heads, self.kv_heads, self.head_dim = dim, heads, kv_heads, head_dim
  self.causal, self.dropout_p = opts.causal or false, opts.dropout or 0
  local names = {}
  for _, role in ipairs(ROLES) do names[role] = opts.names and opts.names[role] or role end
  self.names = names
  local lo = {bias = opts.bias ~= false, dtype = opts.dtype, device = opts.device, weight_init = opts.weight_init,
              std = opts.std}
  local sizes = {query = {dim, heads * head_dim}, key = {dim, kv_heads * head_dim},
                 value = {dim, kv_heads * head_dim}, out = {heads * head_dim, dim}}
  for _, role in ipairs(opts.order or ROLES) do self[names[role]] = L.Linear(sizes[role][1], sizes[role][2], lo) end
end

-- forward(x, opts) or forward(x, context): x [B, T, C]; opts.context [B, S, C] for
-- cross-attention (default x), opts.mask (bool, true = attend, or additive float, broadcast to
-- [B, H, T, S]), opts.causal (default the module's) -> [B, T, C]
function MultiHeadAttention:forward(x, opts)
  if keng.is_tensor(opts) then opts = {context = opts} end
  opts = options.check("MultiHeadAttention:forward", opts, {"context", "mask", "causal"}, 3)
  Module.check_tensor("MultiHeadAttention", x)
  if x.ndim ~= 3 or x.shape[3] ~= self.dim then
    Module.error(string.format("MultiHeadAttention: x %s is not [B, T, %d]", util.shape_str(x, ","), self.dim), 2)
  end
  local ctx = opts.context or x
  local B, T, S = x.shape[1], x.shape[2], ctx.shape[2]
  local H, Hkv, D = self.heads, self.kv_heads, self.head_dim
  local P = self.names
  local q = self[P.query](x):view{B, T, H, D}:transpose(2, 3)     -- [B, H, T, D]
  local k = self[P.key](ctx):view{B, S, Hkv, D}:transpose(2, 3)   -- [B, Hkv, S, D]
  local v = self[P.value](ctx):view{B, S, Hkv, D}:transpose(2, 3) -- [B, Hkv, S, D]
  local causal = opts.causal
  if causal == nil then causal = self.causal end
  local a = keng.scaled_dot_product_attention(q, k, v, {mask = opts.mask, causal = causal})  -- [B, H, T, D]
  a = a:transpose(2, 3):reshape{B, T, H * D}                      -- [B, T, H·D]
  if self.dropout_p > 0 then a = keng.dropout(a, self.dropout_p, self.training) end
  return self[P.out](a)                                           -- [B, T, C]
end

function MultiHeadAttention:extra_repr()
  return string.format("%d, heads=%d%s%s", self.dim, self.heads,
    self.kv_heads ~= self.heads and ", kv_heads=" .. self.kv_heads or "", self.causal and ", causal" or "")
end

return MultiHeadAttention
