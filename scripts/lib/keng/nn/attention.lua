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

-- MultiHeadAttention(C, H, {kv_heads=H, head_dim=C/H, kdim=C, vdim=C, bias=true, out_bias=bias,
-- causal=false, dropout=0, dtype=, device=, weight_init=, std=, names=, order=}). Submodules query
-- [H·D, C], key [Hkv·D, kdim] and value [Hkv·D, vdim] (kdim / vdim: the widths of the key and
-- value inputs, when they differ from C, as the UNet's cross-attention to a text context), out
-- [C, H·D], initialised by weight_init (default Linear's); bias is the query/key/value
-- projections', out_bias the output's. `names` renames them after a checkpoint's layout
-- ({query = "q_proj", key = "k_proj", ...}); a name "list.0" puts the projection first in a
-- ModuleList{first = 0} named list (diffusers' to_out.0, whose to_out.1 is a dropout without
-- weights). They are made in `order` (a list of those four roles, default query, key, value,
-- out), the order random weights draw in. The fused kernel has no dropout on the attention
-- probabilities, so `dropout` applies to the attended values before the output projection.
local ROLES = {"query", "key", "value", "out"}

-- name -> {field} or {list field, 0}: where a projection lives
local function place_of(name)
  local list, i = name:match("^([%w_]+)%.(%d+)$")
  if not list then return {name} end
  if i ~= "0" then
    Module.error("MultiHeadAttention: a projection name 'list.N' must end in .0, got '" .. name .. "'", 4)
  end
  return {list, 0}
end

local function projection(self, role)
  local p = self.places[role]
  if p[2] then return self[p[1]][p[2]] end
  return self[p[1]]
end

function MultiHeadAttention:init(dim, heads, opts)
  opts = options.check("MultiHeadAttention", opts, {"kv_heads", "head_dim", "kdim", "vdim", "bias", "out_bias",
    "causal", "dropout", "dtype", "device", "weight_init", "std", "names", "order"}, 3)
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
  local names, places = {}, {}
  for _, role in ipairs(ROLES) do
    names[role] = opts.names and opts.names[role] or role
    places[role] = place_of(names[role])
  end
  self.names, self.places = names, places
  local bias = opts.bias ~= false
  local out_bias = opts.out_bias
  if out_bias == nil then out_bias = bias end
  local sizes = {query = {dim, heads * head_dim}, key = {opts.kdim or dim, kv_heads * head_dim},
                 value = {opts.vdim or dim, kv_heads * head_dim}, out = {heads * head_dim, dim}}
  for _, role in ipairs(opts.order or ROLES) do
    local lo = {bias = bias, dtype = opts.dtype, device = opts.device, weight_init = opts.weight_init, std = opts.std}
    if role == "out" then lo.bias = out_bias end
    local m = L.Linear(sizes[role][1], sizes[role][2], lo)
    local p = places[role]
    if p[2] then self[p[1]] = L.ModuleList({m}, {first = 0}) else self[p[1]] = m end
  end
end

-- forward(x, opts) or forward(x, context): x [B, T, C]; opts.context [B, S, kdim] for
-- cross-attention (default x), opts.value [B, S, vdim] when the values come from another input
-- than the keys (default the context; SAM's mask decoder), opts.mask (bool, true = attend, or
-- additive float, broadcast to [B, H, T, S]), opts.causal (default the module's) -> [B, T, C]
function MultiHeadAttention:forward(x, opts)
  if keng.is_tensor(opts) then opts = {context = opts} end
  opts = options.check("MultiHeadAttention:forward", opts, {"context", "value", "mask", "causal"}, 3)
  Module.check_tensor("MultiHeadAttention", x)
  if x.ndim ~= 3 or x.shape[3] ~= self.dim then
    Module.error(string.format("MultiHeadAttention: x %s is not [B, T, %d]", util.shape_str(x, ","), self.dim), 2)
  end
  local ctx = opts.context or x
  local B, T, S = x.shape[1], x.shape[2], ctx.shape[2]
  local H, Hkv, D = self.heads, self.kv_heads, self.head_dim
  local q = projection(self, "query")(x):view{B, T, H, D}:transpose(2, 3)                -- [B, H, T, D]
  local k = projection(self, "key")(ctx):view{B, S, Hkv, D}:transpose(2, 3)              -- [B, Hkv, S, D]
  local v = projection(self, "value")(opts.value or ctx):view{B, S, Hkv, D}:transpose(2, 3)  -- [B, Hkv, S, D]
  local causal = opts.causal
  if causal == nil then causal = self.causal end
  local a = keng.scaled_dot_product_attention(q, k, v, {mask = opts.mask, causal = causal})  -- [B, H, T, D]
  a = a:transpose(2, 3):reshape{B, T, H * D}                      -- [B, T, H·D]
  if self.dropout_p > 0 then a = keng.dropout(a, self.dropout_p, self.training) end
  return projection(self, "out")(a)                               -- [B, T, C]
end

function MultiHeadAttention:extra_repr()
  return string.format("%d, heads=%d%s%s", self.dim, self.heads,
    self.kv_heads ~= self.heads and ", kv_heads=" .. self.kv_heads or "", self.causal and ", causal" or "")
end

return MultiHeadAttention
