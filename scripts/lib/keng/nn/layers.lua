-- keng.nn layers — Linear, Embedding, the norms, convolutions, Dropout, activations and the
-- containers Sequential and ModuleList. Each forward is one or two fused engine calls.
-- Shape letters: B batch, T length, C channels/features, V vocabulary, H/W image height/width.
-- Parameter names follow PyTorch / Hugging Face (weight, bias); initialisers follow Keras
-- (glorot_uniform kernels, zero biases, uniform(-0.05, 0.05) embeddings).
-- Under a mixed precision policy Linear, Conv2d, ConvTranspose2d and Embedding cast inputs and
-- weights to the compute dtype; norms take the input's dtype and reduce in f32 in the engine.
local keng = require "keng"
local Module = require "keng.nn.module"
local options = require "keng.options"
local util = require "keng.util"

local L = {}

local FLOAT = {f32 = true, f64 = true, bf16 = true, f16 = true}

-- t in dtype (integer tensors and nil pass through)
local function cast(t, dtype)
  if t == nil or t.dtype == dtype or not FLOAT[t.dtype] then return t end
  return t:to(dtype)
end

local function shape_str(t) return util.shape_str(t, ",") end

local function pair(v) return type(v) == "table" and v or {v, v} end

-- the options of a layer constructor, unknown keys refused at the user's line (Class(...) ->
-- new_instance -> init -> here)
local function layer_opts(self, opts, valid)
  local checked = options.check(self.__name, opts, valid, Module.user_level(3))
  return checked  -- not a tail call: the level above counts this frame
end
local DD = {"dtype", "device"}
local function with(list, ...)
  local out = {...}
  for _, k in ipairs(list) do out[#out + 1] = k end
  return out
end
local check = Module.check_tensor

---------------------------------------------------------------------------------------------
-- Linear: y = x·Wᵀ + b

local Linear = Module:extend("Linear")
L.Linear = Linear

-- Linear(in, out, {bias=true, dtype=, device=, weight_init="glorot_uniform", bias_init="zeros"})
function Linear:init(in_features, out_features, opts)
  opts = layer_opts(self, opts, with(DD, "bias", "weight_init", "bias_init", "std"))
  self:configure(opts)
  self.in_features, self.out_features = in_features, out_features
  self:param("weight", {out_features, in_features}, opts.weight_init or "glorot_uniform",  -- [out, in]
    {std = opts.std})
  if opts.bias ~= false then self:param("bias", {out_features}, opts.bias_init or "zeros") end
end

function Linear:forward(x)  -- x [..., in] -> [..., out]
  check("Linear", x)
  local C = x.shape[x.ndim]
  if C ~= self.in_features then
    Module.error(string.format("Linear(%d -> %d): input %s has %s features, expected %d", self.in_features,
      self.out_features, shape_str(x), tostring(C), self.in_features), 2)
  end
  local w = self.weight
  local ws = self.weight_scale
  if ws then  -- keng.quantize: int8 (row scales) or int4 (block scales), dequantized in the kernel
    local cd = self:compute_dtype()
    return (w.dtype == "i8" and keng.linear_q8 or keng.linear_q4)(cast(x, cd), w, ws, cast(self.bias, cd))
  end
  local cd = self:compute_dtype(w)
  return keng.linear(cast(x, cd), cast(w, cd), cast(self.bias, cd))
end

function Linear:extra_repr()
  return string.format("%d -> %d%s", self.in_features, self.out_features, self.bias and "" or ", bias=false")
end

---------------------------------------------------------------------------------------------
-- Embedding: rows of a [V, C] table picked by 0-based ids

local Embedding = Module:extend("Embedding")
L.Embedding = Embedding

-- Embedding(V, C, {dtype=, device=, init="uniform"})
function Embedding:init(num_embeddings, dim, opts)
  opts = layer_opts(self, opts, with(DD, "init", "std"))
  self:configure(opts)
  self.num_embeddings, self.embedding_dim = num_embeddings, dim
  self:param("weight", {num_embeddings, dim}, opts.init or "uniform", {std = opts.std})  -- [V, C]
end

function Embedding:forward(ids)  -- ids [...] (0-based integers) -> [..., C]
  check("Embedding", ids, "ids")
  -- gather in the stored dtype, then cast the rows: the same values as casting the table
  return cast(keng.embedding(ids, self.weight), self:compute_dtype(self.weight))
end

function Embedding:extra_repr() return string.format("%d, %d", self.num_embeddings, self.embedding_dim) end

---------------------------------------------------------------------------------------------
-- norms

local LayerNorm = Module:extend("LayerNorm")
L.LayerNorm = LayerNorm

-- LayerNorm(C, {eps=1e-5, affine=true, bias=true}) over the last dim
function LayerNorm:init(dim, opts)
  opts = layer_opts(self, opts, with(DD, "eps", "affine", "elementwise_affine", "bias"))
  self:configure(opts)
  if type(dim) == "table" then dim = dim[#dim] end
  self.dim, self.eps = dim, opts.eps or 1e-5
  if opts.affine ~= false and opts.elementwise_affine ~= false then
    self:param("weight", {dim}, "ones")
    if opts.bias ~= false then self:param("bias", {dim}, "zeros") end
  end
end

function LayerNorm:forward(x)  -- x [..., C]
  check("LayerNorm", x)
  return keng.layer_norm(x, self.weight, self.bias, self.eps)
end

function LayerNorm:extra_repr() return string.format("%d, eps=%g", self.dim, self.eps) end

local RMSNorm = Module:extend("RMSNorm")
L.RMSNorm = RMSNorm

-- RMSNorm(C, {eps=1e-6, unit_offset=false}); unit_offset scales by (1 + w), w starting at 0
-- (Gemma), otherwise by w starting at 1
function RMSNorm:init(dim, opts)
  opts = layer_opts(self, opts, with(DD, "eps", "unit_offset"))
  self:configure(opts)
  self.dim, self.eps, self.unit_offset = dim, opts.eps or 1e-6, opts.unit_offset or false
  self:param("weight", {dim}, self.unit_offset and "zeros" or "ones")
end

function RMSNorm:forward(x)  -- x [..., C]
  check("RMSNorm", x)
  return keng.rms_norm(x, self.weight, self.eps, {unit_offset = self.unit_offset})
end

function RMSNorm:extra_repr()
  return string.format("%d, eps=%g%s", self.dim, self.eps, self.unit_offset and ", unit_offset" or "")
end

local GroupNorm = Module:extend("GroupNorm")
L.GroupNorm = GroupNorm

-- GroupNorm(G, C, {eps=1e-5, affine=true}) over groups of C/G channels of x [B, C, ...]
function GroupNorm:init(groups, channels, opts)
  opts = layer_opts(self, opts, with(DD, "eps", "affine"))
  if channels % groups ~= 0 then
    Module.error(string.format("GroupNorm: %d channels do not split into %d groups", channels, groups), 2)
  end
  self:configure(opts)
  self.groups, self.channels, self.eps = groups, channels, opts.eps or 1e-5
  if opts.affine ~= false then
    self:param("weight", {channels}, "ones")
    self:param("bias", {channels}, "zeros")
  end
end

function GroupNorm:forward(x)  -- x [B, C, ...]
  check("GroupNorm", x)
  return keng.group_norm(x, self.groups, self.weight, self.bias, self.eps)
end

function GroupNorm:extra_repr() return string.format("%d, %d, eps=%g", self.groups, self.channels, self.eps) end

---------------------------------------------------------------------------------------------
-- convolutions (NCHW)

-- "same" padding for stride 1 and odd effective kernels; "valid" is 0
local function resolve_padding(padding, k, dilation)
  if padding == "valid" or padding == nil then return 0 end
  if padding == "same" then
    local kk, dd = pair(k), pair(dilation or 1)
    local p = {}
    for i = 1, 2 do
      local span = dd[i] * (kk[i] - 1)
      if span % 2 ~= 0 then Module.error("Conv2d: padding='same' needs an odd effective kernel size", 3) end
      p[i] = span // 2
    end
    return p
  end
  return padding
end

local Conv2d = Module:extend("Conv2d")
L.Conv2d = Conv2d

-- Conv2d(Cin, Cout, k, {stride=1, padding=0|"same"|"valid", dilation=1, groups=1, bias=true,
-- dtype=, device=}); weight [Cout, Cin/groups, kh, kw]
function Conv2d:init(in_channels, out_channels, kernel_size, opts)
  opts = layer_opts(self, opts, with(DD, "stride", "padding", "dilation", "groups", "bias", "weight_init", "bias_init"))
  local groups = opts.groups or 1
  if in_channels % groups ~= 0 or out_channels % groups ~= 0 then
    Module.error(string.format("Conv2d: %d in and %d out channels must both divide by groups=%d", in_channels,
      out_channels, groups), 2)
  end
  self:configure(opts)
  local k = pair(kernel_size)
  self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, k
  self.stride, self.dilation, self.groups = opts.stride or 1, opts.dilation or 1, groups
  self.padding = resolve_padding(opts.padding, k, self.dilation)
  self:param("weight", {out_channels, in_channels // groups, k[1], k[2]}, opts.weight_init or "glorot_uniform")
  if opts.bias ~= false then self:param("bias", {out_channels}, opts.bias_init or "zeros") end
end

function Conv2d:forward(x)  -- x [B, Cin, H, W] -> [B, Cout, H', W']
  check(self.__name, x)
  local cd = self:compute_dtype(self.weight)
  return keng.conv2d(cast(x, cd), cast(self.weight, cd), cast(self.bias, cd),
    {stride = self.stride, padding = self.padding, dilation = self.dilation, groups = self.groups})
end

function Conv2d:extra_repr()
  return string.format("%d, %d, k=%dx%d", self.in_channels, self.out_channels, self.kernel_size[1], self.kernel_size[2])
end

local ConvTranspose2d = Module:extend("ConvTranspose2d")
L.ConvTranspose2d = ConvTranspose2d

-- ConvTranspose2d(Cin, Cout, k, {stride=1, padding=0, output_padding=0, dilation=1, groups=1,
-- bias=true}); weight [Cin, Cout/groups, kh, kw] as in PyTorch
function ConvTranspose2d:init(in_channels, out_channels, kernel_size, opts)
  opts = layer_opts(self, opts, with(DD, "stride", "padding", "output_padding", "dilation", "groups", "bias",
    "weight_init", "bias_init"))
  local groups = opts.groups or 1
  if in_channels % groups ~= 0 or out_channels % groups ~= 0 then
    Module.error(string.format("ConvTranspose2d: %d in and %d out channels must both divide by groups=%d",
      in_channels, out_channels, groups), 2)
  end
  self:configure(opts)
  local k = pair(kernel_size)
  self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, k
  self.stride, self.padding, self.output_padding = opts.stride or 1, opts.padding or 0, opts.output_padding or 0
  self.dilation, self.groups = opts.dilation or 1, groups
  self:param("weight", {in_channels, out_channels // groups, k[1], k[2]}, opts.weight_init or "glorot_uniform")
  if opts.bias ~= false then self:param("bias", {out_channels}, opts.bias_init or "zeros") end
end

function ConvTranspose2d:forward(x)  -- x [B, Cin, H, W] -> [B, Cout, H', W']
  check(self.__name, x)
  local cd = self:compute_dtype(self.weight)
  return keng.conv_transpose2d(cast(x, cd), cast(self.weight, cd), cast(self.bias, cd),
    {stride = self.stride, padding = self.padding, output_padding = self.output_padding,
     dilation = self.dilation, groups = self.groups})
end

ConvTranspose2d.extra_repr = Conv2d.extra_repr

---------------------------------------------------------------------------------------------
-- Dropout and activations

local Dropout = Module:extend("Dropout")
L.Dropout = Dropout

-- Dropout(p=0.5): inverted dropout while training, the identity in eval mode
function Dropout:init(p)
  p = p or 0.5
  if type(p) ~= "number" or p < 0 or p > 1 then Module.error("Dropout: p must be in [0, 1], got " .. tostring(p), 2) end
  self.p = p
end

function Dropout:forward(x) return keng.dropout(check("Dropout", x), self.p, self.training) end
function Dropout:extra_repr() return string.format("p=%g", self.p) end

local function activation(name, fn)
  local cls = Module:extend(name)
  cls.forward = function(_, x) return fn(check(name, x)) end
  L[name] = cls
  return cls
end

local GELU = activation("GELU")
-- GELU({approximate="none"|"tanh"}) (also GELU("tanh"))
function GELU:init(opts)
  local approx = type(opts) == "table" and layer_opts(self, opts, {"approximate"}).approximate or opts
  if approx ~= nil and approx ~= "none" and approx ~= "tanh" then
    Module.error("GELU: approximate must be \"none\" or \"tanh\", got " .. tostring(approx), 2)
  end
  self.approximate = approx or "none"
end
function GELU:forward(x)
  check("GELU", x)
  if self.approximate == "tanh" then return keng.gelu(x, {approximate = "tanh"}) end
  return keng.gelu(x)
end
function GELU:extra_repr() return self.approximate == "tanh" and "approximate=tanh" or nil end

local Softplus = activation("Softplus")
-- Softplus({beta = 1, threshold = 20}): log(1 + exp(beta x)) / beta, x where beta x > threshold
function Softplus:init(opts)
  opts = layer_opts(self, opts, {"beta", "threshold"})
  local beta, threshold = opts.beta or 1, opts.threshold or 20
  if type(beta) ~= "number" or beta == 0 or beta ~= beta or math.abs(beta) == math.huge then
    Module.error("Softplus: beta must be a finite non-zero number, got " .. tostring(beta), 2)
  end
  if type(threshold) ~= "number" or threshold ~= threshold then
    Module.error("Softplus: threshold must be a number, got " .. tostring(threshold), 2)
  end
  self.beta, self.threshold = beta, threshold
end
function Softplus:forward(x) return keng.softplus(check("Softplus", x), {beta = self.beta, threshold = self.threshold}) end
function Softplus:extra_repr()
  if self.beta == 1 and self.threshold == 20 then return nil end
  return string.format("beta=%g, threshold=%g", self.beta, self.threshold)
end

activation("SiLU", keng.silu)
activation("ReLU", keng.relu)
activation("Tanh", keng.tanh)
activation("Sigmoid", keng.sigmoid)
activation("QuickGELU", keng.quick_gelu)
activation("Identity", function(x) return x end)

local Softmax = Module:extend("Softmax")
L.Softmax = Softmax
function Softmax:init(dim) self.dim = dim or -1 end
function Softmax:forward(x) return keng.softmax(check("Softmax", x), self.dim) end

local Flatten = Module:extend("Flatten")
L.Flatten = Flatten
-- Flatten(): [B, ...] -> [B, prod(...)]
function Flatten:forward(x) check("Flatten", x); return x:reshape{x.shape[1], -1} end

---------------------------------------------------------------------------------------------
-- containers

local Sequential = Module:extend("Sequential")
L.Sequential = Sequential

-- Sequential(m1, m2, ...) or Sequential({m1, m2, ...}); children are named "1", "2", ...
function Sequential:init(...)
  local list = {...}
  if #list == 1 and not Module.is_module(list[1]) and type(list[1]) == "table" then list = list[1] end
  for i, m in ipairs(list) do
    if not Module.is_module(m) then
      Module.error(string.format("Sequential: argument %d is a %s, not a module", i, type(m)), 2)
    end
    self[tostring(i)] = m
  end
end

function Sequential:append(m)
  if not Module.is_module(m) then error("append: a module expected, got " .. type(m), 2) end
  self[tostring(#self + 1)] = m
  return self
end

function Sequential:forward(x, ...)
  for i = 1, #self do x = self[i](x, ...) end
  return x
end
Module.plumbing[Sequential.forward] = true  -- a child's input error names the user's call

function Sequential.__len(self)
  local n = 0
  while rawget(self, "_modules")[tostring(n + 1)] do n = n + 1 end
  return n
end

local ModuleList = Module:extend("ModuleList")
L.ModuleList = ModuleList
Module.ModuleList = ModuleList

-- ModuleList({m1, m2, ...}, {first = 1}): holds modules named "1", "2", ...; ml[i], #ml,
-- ipairs(ml), ml:append(m). {first = 0} names them "0", "1", ... as PyTorch's ModuleList does:
-- the one rule for Hugging Face's 0-based layer names is that a model whose own names are the
-- checkpoint's (SAM, CLIP, UNet, VAE) keeps its lists with first = 0 and walks them as
-- `for i = 0, #ml - 1 do ml[i] ... end` (docs/adding_a_model.md)
function ModuleList:init(list, opts)
  opts = layer_opts(self, opts, {"first"})
  local first = opts.first or 1
  if first ~= 0 and first ~= 1 then
    Module.error("ModuleList: first must be 0 or 1, got " .. tostring(first), 2)
  end
  self.first = first
  for i, m in ipairs(list or {}) do
    if not Module.is_module(m) then
      Module.error(string.format("ModuleList: element %d is a %s, not a module", i, type(m)), 2)
    end
    self[tostring(first + i - 1)] = m
  end
end

function ModuleList:append(m)
  if not Module.is_module(m) then error("append: a module expected, got " .. type(m), 2) end
  self[tostring(self.first + #self)] = m
  return self
end

function ModuleList.__len(self)
  local first, mods, n = rawget(self, "first") or 1, rawget(self, "_modules"), 0
  while mods[tostring(first + n)] do n = n + 1 end
  return n
end

function ModuleList:extra_repr() return self.first == 0 and "first=0" or nil end

function ModuleList:forward()
  error("forward: a ModuleList has no forward; call its elements", 2)
end

return L
