-- models.unet — the Stable Diffusion denoiser, diffusers' UNet2DConditionModel as SD v1 builds
-- it, plus the blocks the VAE shares (ResnetBlock2D, Downsample2D, Upsample2D).
-- Reference: diffusers models/unets/unet_2d_condition.py, unet_2d_blocks.py, resnet.py,
-- transformers/transformer_2d.py, attention.py (module names, layouts and block order);
-- Rombach et al. 2022 (latent diffusion).
--
-- Shape letters: B batch, C channels, H/W latent height/width, T = H·W spatial tokens,
-- S context tokens, X context width, E time-embedding width (4·C0), N heads, D head dim.
--
-- Module tree = diffusers' state_dict names, 0-based, so unet/diffusion_pytorch_model.safetensors
-- loads as is:
--   conv_in                                  Conv2d(Cin, C0, 3)
--   time_embedding.linear_1 / linear_2       Linear(C0, E), Linear(E, E)
--   down_blocks.i.resnets.j                  ResnetBlock2D (norm1, conv1, time_emb_proj, norm2,
--                                            conv2, conv_shortcut when channels change)
--   down_blocks.i.attentions.j               Transformer2DModel (norm, proj_in,
--                                            transformer_blocks.0.{norm1, attn1, norm2, attn2,
--                                            norm3, ff.net.0.proj, ff.net.2}, proj_out)
--   down_blocks.i.downsamplers.0.conv        Conv2d(C, C, 3, stride 2)
--   mid_block.resnets.0 / attentions.0 / resnets.1
--   up_blocks.i.resnets.j (+ skip channels), up_blocks.i.attentions.j, up_blocks.i.upsamplers.0.conv
--   conv_norm_out, conv_out
-- cfg keys are diffusers' config.json keys (block_out_channels, layers_per_block, ...), so a
-- preset and a config.json build the same way.
local keng = require "keng"
local nn = require "keng.nn"
local common = require "models.common"
local options = require "keng.options"

local M = {}

local function shape_str(t) return require("keng.util").shape_str(t, ",") end

M.presets = {
  -- SD v1 (CompVis/stable-diffusion-v1-4 unet/config.json): 859,520,964 parameters
  sd_v1 = {
    in_channels = 4, out_channels = 4, sample_size = 64,
    block_out_channels = {320, 640, 1280, 1280}, layers_per_block = 2,
    down_block_types = {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"},
    up_block_types = {"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"},
    attention_head_dim = 8, cross_attention_dim = 768, norm_num_groups = 32, norm_eps = 1e-5,
    flip_sin_to_cos = true, freq_shift = 0, downsample_padding = 1,
  },
  -- docs/benchmarks.md CPU tier: channels 32/64/128/128, 1 res block per level, 2 heads, context 64 wide
  sd_tiny = {
    in_channels = 4, out_channels = 4, sample_size = 16,
    block_out_channels = {32, 64, 128, 128}, layers_per_block = 1,
    down_block_types = {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"},
    up_block_types = {"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"},
    attention_head_dim = 2, cross_attention_dim = 64, norm_num_groups = 8, norm_eps = 1e-5,
    flip_sin_to_cos = true, freq_shift = 0, downsample_padding = 1,
  },
}
M.presets.stable_diffusion_v1 = M.presets.sd_v1

---------------------------------------------------------------------------------------------
-- children named "0", "1", ... as diffusers' (nn.ModuleList's one rule for 0-based names)

local function List0(list) return nn.ModuleList(list, {first = 0}) end

---------------------------------------------------------------------------------------------
-- ResnetBlock2D: x + conv2(silu(norm2(conv1(silu(norm1(x))) + proj(silu(temb))))),
-- with a 1x1 conv on the shortcut when channels change; no time projection when E is nil (VAE)

local ResnetBlock2D = nn.Module:extend("ResnetBlock2D")
M.ResnetBlock2D = ResnetBlock2D

-- ResnetBlock2D(Cin, Cout, E or nil, groups, eps, o)
function ResnetBlock2D:init(cin, cout, temb, groups, eps, o)
  local no = {eps = eps, dtype = o.dtype, device = o.device}
  local co = {padding = 1, dtype = o.dtype, device = o.device}
  self.norm1 = nn.GroupNorm(groups, cin, no)
  self.conv1 = nn.Conv2d(cin, cout, 3, co)
  if temb then self.time_emb_proj = nn.Linear(temb, cout, o) end
  self.norm2 = nn.GroupNorm(groups, cout, no)
  self.conv2 = nn.Conv2d(cout, cout, 3, co)
  if cin ~= cout then self.conv_shortcut = nn.Conv2d(cin, cout, 1, o) end
  self.cout = cout
end

function ResnetBlock2D:forward(x, temb)                        -- x [B, Cin, H, W], temb [B, E]
  local h = self.conv1(self.norm1(x):silu())                    -- [B, Cout, H, W]
  if self.time_emb_proj and temb then
    local B = temb.shape[1]
    h = h + self.time_emb_proj(temb:silu()):view{B, self.cout, 1, 1}
  end
  h = self.conv2(self.norm2(h):silu())                          -- dropout: identity at inference
  local skip = self.conv_shortcut and self.conv_shortcut(x) or x
  return skip + h                                               -- [B, Cout, H, W]
end

---------------------------------------------------------------------------------------------
-- Downsample2D: stride-2 3x3 conv; padding 0 pads right and bottom by one first (VAE encoder)

local Downsample2D = nn.Module:extend("Downsample2D")
M.Downsample2D = Downsample2D

function Downsample2D:init(c, padding, o)
  self.pad_right = padding == 0
  self.conv = nn.Conv2d(c, c, 3, {stride = 2, padding = padding, dtype = o.dtype, device = o.device})
end

function Downsample2D:forward(x)                               -- [B, C, H, W] -> [B, C, H/2, W/2]
  if self.pad_right then x = keng.pad(x, {0, 1, 0, 1}, 0) end
  return self.conv(x)
end

-- Upsample2D: nearest x2 then a 3x3 conv
local Upsample2D = nn.Module:extend("Upsample2D")
M.Upsample2D = Upsample2D

function Upsample2D:init(c, o)
  self.conv = nn.Conv2d(c, c, 3, {padding = 1, dtype = o.dtype, device = o.device})
end

function Upsample2D:forward(x)                                 -- [B, C, H, W] -> [B, C, 2H, 2W]
  return self.conv(keng.interpolate(x, {scale = 2, mode = "nearest"}))
end

---------------------------------------------------------------------------------------------
-- attention with diffusers' names: to_q, to_k, to_v, to_out.0 (nn.MultiHeadAttention; the
-- cross-attention's keys and values come from the cdim-wide text context)

local DIFFUSERS_NAMES = {query = "to_q", key = "to_k", value = "to_v", out = "to_out.0"}

-- Attention(query dim, context dim, N, D, bias, o): no bias on to_q/k/v (bias = false), to_out has one
local function Attention(qdim, cdim, heads, dim_head, bias, o)
  return nn.MultiHeadAttention(qdim, heads, {head_dim = dim_head, kdim = cdim, vdim = cdim, bias = bias,
    out_bias = true, names = DIFFUSERS_NAMES, dtype = o.dtype, device = o.device})
end

-- GEGLU feed-forward: net.0.proj to 2·F, hidden · gelu(gate), net.2 back to C (F = 4·C)
local GEGLU = nn.Module:extend("GEGLU")
function GEGLU:init(dim, inner, o) self.proj = nn.Linear(dim, 2 * inner, o) end
function GEGLU:forward(x)
  local h, gate = table.unpack(self.proj(x):chunk(2, -1))       -- [B, T, F] each
  return h * gate:gelu()
end

local FeedForward = nn.Module:extend("FeedForward")
function FeedForward:init(dim, o)
  self.net = List0({GEGLU(dim, 4 * dim, o), nn.Dropout(0), nn.Linear(4 * dim, dim, o)})
end
function FeedForward:forward(x) return self.net[2](self.net[0](x)) end

-- BasicTransformerBlock: self-attention, cross-attention to the context, GEGLU, each pre-LN
local TransformerBlock = nn.Module:extend("BasicTransformerBlock")
M.BasicTransformerBlock = TransformerBlock

function TransformerBlock:init(dim, heads, dim_head, cross_dim, o)
  local lo = {eps = 1e-5, dtype = o.dtype, device = o.device}
  self.norm1 = nn.LayerNorm(dim, lo)
  self.attn1 = Attention(dim, dim, heads, dim_head, false, o)
  self.norm2 = nn.LayerNorm(dim, lo)
  self.attn2 = Attention(dim, cross_dim, heads, dim_head, false, o)
  self.norm3 = nn.LayerNorm(dim, lo)
  self.ff = FeedForward(dim, o)
end

function TransformerBlock:forward(x, context)                  -- x [B, T, C], context [B, S, X]
  x = x + self.attn1(self.norm1(x))
  x = x + self.attn2(self.norm2(x), context)
  return x + self.ff(self.norm3(x))                             -- [B, T, C]
end

-- Transformer2DModel: GroupNorm (eps 1e-6), proj_in (1x1 conv, or Linear with
-- use_linear_projection), transformer blocks over the H·W tokens, proj_out, residual
local Transformer2D = nn.Module:extend("Transformer2DModel")
M.Transformer2DModel = Transformer2D

function Transformer2D:init(c, heads, cfg, o)
  local dim_head = c // heads
  local inner = heads * dim_head
  self.linear = cfg.use_linear_projection or false
  self.inner = inner
  self.norm = nn.GroupNorm(cfg.norm_num_groups, c, {eps = 1e-6, dtype = o.dtype, device = o.device})
  self.proj_in = self.linear and nn.Linear(c, inner, o) or nn.Conv2d(c, inner, 1, o)
  local blocks = {}
  for i = 1, cfg.transformer_layers_per_block or 1 do
    blocks[i] = TransformerBlock(inner, heads, dim_head, cfg.cross_attention_dim, o)
  end
  self.transformer_blocks = List0(blocks)
  self.proj_out = self.linear and nn.Linear(inner, c, o) or nn.Conv2d(inner, c, 1, o)
end

function Transformer2D:forward(x, context)                     -- x [B, C, H, W]
  local B, C, H, W = table.unpack(x.shape)
  local h = self.norm(x)
  if not self.linear then h = self.proj_in(h) end               -- [B, inner, H, W]
  h = h:permute{1, 3, 4, 2}:reshape{B, H * W, -1}               -- [B, T, inner or C]
  if self.linear then h = self.proj_in(h) end
  for i = 0, #self.transformer_blocks - 1 do h = self.transformer_blocks[i](h, context) end
  if self.linear then h = self.proj_out(h) end
  h = h:reshape{B, H, W, -1}:permute{1, 4, 2, 3}:contiguous()   -- [B, inner or C, H, W]
  if not self.linear then h = self.proj_out(h) end
  return h + x                                                  -- [B, C, H, W]
end

---------------------------------------------------------------------------------------------
-- down, mid and up blocks

local DownBlock = nn.Module:extend("DownBlock2D")

-- DownBlock(Cin, Cout, heads or nil (no attention), add_downsample, cfg, o)
function DownBlock:init(cin, cout, heads, add_down, cfg, o)
  local E, g, eps = cfg.block_out_channels[1] * 4, cfg.norm_num_groups, cfg.norm_eps
  local res, att = {}, {}
  for j = 1, cfg.layers_per_block do
    res[j] = ResnetBlock2D(j == 1 and cin or cout, cout, E, g, eps, o)
    if heads then att[j] = Transformer2D(cout, heads, cfg, o) end
  end
  self.resnets = List0(res)
  if heads then self.attentions = List0(att) end
  if add_down then self.downsamplers = List0({Downsample2D(cout, cfg.downsample_padding, o)}) end
end

-- appends each output to skips (the UNet's skip stack)
function DownBlock:forward(h, temb, context, skips)
  for j = 0, #self.resnets - 1 do
    h = self.resnets[j](h, temb)
    if self.attentions then h = self.attentions[j](h, context) end
    skips[#skips + 1] = h
  end
  if self.downsamplers then
    h = self.downsamplers[0](h)
    skips[#skips + 1] = h
  end
  return h
end

local UpBlock = nn.Module:extend("UpBlock2D")

-- UpBlock(Cprev, Cout, Cin (the skip width of the last resnet), heads or nil, add_upsample, cfg, o)
function UpBlock:init(cprev, cout, cin, heads, add_up, cfg, o)
  local E, g, eps = cfg.block_out_channels[1] * 4, cfg.norm_num_groups, cfg.norm_eps
  local n = cfg.layers_per_block + 1
  local res, att = {}, {}
  for j = 1, n do
    local skip_c = j == n and cin or cout
    local res_in = j == 1 and cprev or cout
    res[j] = ResnetBlock2D(res_in + skip_c, cout, E, g, eps, o)
    if heads then att[j] = Transformer2D(cout, heads, cfg, o) end
  end
  self.resnets = List0(res)
  if heads then self.attentions = List0(att) end
  if add_up then self.upsamplers = List0({Upsample2D(cout, o)}) end
end

-- pops one skip per resnet and concatenates it on the channel dim
function UpBlock:forward(h, temb, context, skips)
  for j = 0, #self.resnets - 1 do
    local s = table.remove(skips)
    h = self.resnets[j](keng.cat({h, s}, 2), temb)              -- [B, C + Cskip, H, W] -> [B, Cout, H, W]
    if self.attentions then h = self.attentions[j](h, context) end
  end
  if self.upsamplers then h = self.upsamplers[0](h) end
  return h
end

local MidBlock = nn.Module:extend("UNetMidBlock2DCrossAttn")

function MidBlock:init(c, heads, cfg, o)
  local E, g, eps = cfg.block_out_channels[1] * 4, cfg.norm_num_groups, cfg.norm_eps
  self.attentions = List0({Transformer2D(c, heads, cfg, o)})
  self.resnets = List0({ResnetBlock2D(c, c, E, g, eps, o), ResnetBlock2D(c, c, E, g, eps, o)})
end

function MidBlock:forward(h, temb, context)
  h = self.resnets[0](h, temb)
  h = self.attentions[0](h, context)
  return self.resnets[1](h, temb)
end

---------------------------------------------------------------------------------------------
-- timestep embedding

-- sinusoidal features of timesteps t [B] -> [B, C0]: exp(-ln(10000)·i/(half - shift)) · t,
-- [cos, sin] when flip_sin_to_cos (computed in f32 as diffusers does)
function M.timestep_features(t, dim, flip, shift, device)
  local half = dim // 2
  local freqs = (keng.arange(0, half):float() * (-math.log(10000)) / (half - shift)):exp()  -- [half]
  if device and device ~= "cpu" then freqs = freqs:to(device) end
  local arg = t:float():view{-1, 1} * freqs:view{1, half}       -- [B, half]
  local s, c = arg:sin(), arg:cos()
  local emb = flip and keng.cat({c, s}, 2) or keng.cat({s, c}, 2)
  if dim % 2 == 1 then emb = keng.pad(emb, {0, 1}, 0) end
  return emb
end

local TimestepEmbedding = nn.Module:extend("TimestepEmbedding")
function TimestepEmbedding:init(cin, E, o)
  self.linear_1 = nn.Linear(cin, E, o)
  self.linear_2 = nn.Linear(E, E, o)
end
function TimestepEmbedding:forward(x) return self.linear_2(self.linear_1(x):silu()) end

---------------------------------------------------------------------------------------------
-- the UNet

local UNet = nn.Module:extend("UNet2DConditionModel")
-- m:save_pretrained(dir, {max_shard_size = "5GB"}): a diffusers directory (config.json +
-- diffusion_pytorch_model.safetensors, or shards + index; scripts/models/hf_save.lua)
function UNet:save_pretrained(dir, opts) return require("models.hf_save").diffusers(self, dir, opts, "UNet2DConditionModel", 2) end
M.UNet2DConditionModel = UNet

local SUPPORTED_DOWN = {CrossAttnDownBlock2D = true, DownBlock2D = true}
local SUPPORTED_UP = {CrossAttnUpBlock2D = true, UpBlock2D = true}

-- heads per level: diffusers reads attention_head_dim as the head count when
-- num_attention_heads is unset (SD v1's config says 8 and means 8 heads)
local function heads_list(cfg)
  local h = cfg.num_attention_heads or cfg.attention_head_dim
  local out = {}
  for i = 1, #cfg.block_out_channels do out[i] = type(h) == "table" and h[i] or h end
  return out
end

-- UNet(cfg, {dtype = "f32", device = "cpu"})
function UNet:init(cfg, opts)
  opts = options.check("UNet", opts, {"dtype", "device"}, nn.Module.user_level(3))
  local o = {dtype = opts.dtype, device = opts.device}
  for _, t in ipairs(cfg.down_block_types) do
    if not SUPPORTED_DOWN[t] then error("UNet2DConditionModel: unsupported down block type " .. t, 3) end
  end
  for _, t in ipairs(cfg.up_block_types) do
    if not SUPPORTED_UP[t] then error("UNet2DConditionModel: unsupported up block type " .. t, 3) end
  end
  if type(cfg.transformer_layers_per_block or 1) ~= "number" then
    error("UNet2DConditionModel: per-level transformer_layers_per_block is not supported", 3)
  end
  self.config = cfg
  local ch = cfg.block_out_channels
  local L, C0, E = #ch, ch[1], ch[1] * 4
  local heads = heads_list(cfg)
  self.conv_in = nn.Conv2d(cfg.in_channels, C0, 3, {padding = 1, dtype = o.dtype, device = o.device})
  self.time_embedding = TimestepEmbedding(C0, E, o)
  local down = {}
  local cout = C0
  for i = 1, L do
    local cin = cout
    cout = ch[i]
    local attn = cfg.down_block_types[i]:find("CrossAttn") and heads[i] or nil
    down[i] = DownBlock(cin, cout, attn, i < L, cfg, o)
  end
  self.down_blocks = List0(down)
  self.mid_block = MidBlock(ch[L], heads[L], cfg, o)
  local up = {}
  cout = ch[L]
  for i = 1, L do
    local cprev = cout
    cout = ch[L - i + 1]
    local cin = ch[math.max(L - i, 1)]
    local attn = cfg.up_block_types[i]:find("CrossAttn") and heads[L - i + 1] or nil
    up[i] = UpBlock(cprev, cout, cin, attn, i < L, cfg, o)
  end
  self.up_blocks = List0(up)
  self.conv_norm_out = nn.GroupNorm(cfg.norm_num_groups, C0, {eps = cfg.norm_eps, dtype = o.dtype, device = o.device})
  self.conv_out = nn.Conv2d(C0, cfg.out_channels, 3, {padding = 1, dtype = o.dtype, device = o.device})
end

-- forward(x, t, context): x [B, Cin, H, W] noisy latents, t a number or [B] / [1] timesteps,
-- context [B, S, X] -> predicted noise [B, Cout, H, W]
function UNet:forward(x, t, context)
  local cfg = self.config
  local levels = #cfg.block_out_channels
  local mult = 1 << (levels - 1)
  if not keng.is_tensor(x) or x.ndim ~= 4 or x.shape[2] ~= cfg.in_channels
     or x.shape[3] % mult ~= 0 or x.shape[4] % mult ~= 0 then
    error(string.format("UNet2DConditionModel: latents %s must be [B, %d, H, W] with H and W multiples of %d",
      keng.is_tensor(x) and shape_str(x) or type(x), cfg.in_channels, mult), 2)
  end
  local B = x.shape[1]
  if not keng.is_tensor(context) or context.ndim ~= 3 or context.shape[1] ~= B
     or context.shape[3] ~= cfg.cross_attention_dim then
    error(string.format("UNet2DConditionModel: context %s must be [%d, S, %d]",
      keng.is_tensor(context) and shape_str(context) or type(context), B, cfg.cross_attention_dim), 2)
  end
  if not keng.is_tensor(t) then t = keng.full({B}, t) end
  if t.ndim == 0 then t = t:view{1} end
  if t.shape[1] ~= B then t = t:expand{B} end
  local temb = M.timestep_features(t, cfg.block_out_channels[1], cfg.flip_sin_to_cos ~= false,
    cfg.freq_shift or 0, x.device)                              -- [B, C0]
  temb = self.time_embedding(temb:to(x.dtype))                  -- [B, E]
  local h = self.conv_in(x)                                     -- [B, C0, H, W]
  local skips = {h}
  for i = 0, levels - 1 do h = self.down_blocks[i](h, temb, context, skips) end
  h = self.mid_block(h, temb, context)                          -- [B, C_last, H/mult, W/mult]
  for i = 0, levels - 1 do h = self.up_blocks[i](h, temb, context, skips) end
  return self.conv_out(self.conv_norm_out(h):silu())            -- [B, Cout, H, W]
end

---------------------------------------------------------------------------------------------
-- construction and loading

local function copy(t)
  local out = {}
  for k, v in pairs(t) do out[k] = type(v) == "table" and copy(v) or v end
  return out
end
M.copy = copy

function M.config(name, level)
  return copy(common.preset("unet.from_preset", M.presets, name, (level or 1) + 1))
end

-- from_preset(name, {dtype =, device =}) -> UNet with random weights (shapes only on "meta")
function M.from_preset(name, opts)
  local m = UNet(M.config(name, 2), options.check("unet.from_preset", opts, {"dtype", "device"}))
  return m
end

-- reads dir/config.json (or dir/name) -> table, nulls read as absent (errors name the file)
function M.read_config(dir, who, level, name)
  local path = common.inside(dir, dir .. "/" .. (name or "config.json"), who, level + 1)
  return common.read_json(path, who, level + 1) or error(string.format("%s: missing %s", who, path), level + 1)
end

-- weights(dir, who, level) -> the tensors of dir/diffusion_pytorch_model.safetensors (or its
-- sharded index), and the path read
function M.weights(dir, who, level)
  local path = dir .. "/diffusion_pytorch_model.safetensors"
  local f = io.open(path, "rb")
  if f then f:close() else
    local idx = io.open(dir .. "/diffusion_pytorch_model.safetensors.index.json", "rb")
    if not idx then error(string.format("%s: missing weight file %s", who, path), level + 1) end
    idx:close()
    path = dir .. "/diffusion_pytorch_model.safetensors.index.json"  -- the shards it names
  end
  common.inside(dir, path, who, level + 1)
  local ok, sd = pcall(require("keng.progress").loading, path, function() return keng.load(path) end)
  if not ok then error(string.format("%s: %s: %s", who, path, tostring(sd)), level + 1) end
  return sd, path
end

-- loads dir's weights (M.weights) into m strictly; sd, when given, is what M.weights returned
function M.load_weights(m, dir, who, level, sd, path)
  if not sd then sd, path = M.weights(dir, who, level + 1) end
  local ok2, err = pcall(m.load_state_dict, m, sd, {strict = true})
  if not ok2 then error(string.format("%s: %s: %s", who, path, tostring(err)), level + 1) end
  return m
end

-- from_pretrained(dir, {dtype =, device =}) -> UNet with dir/config.json and its weights
-- UNet2DConditionModel config keys that change the numbers, at the values keng implements
M.CONFIG_RULES = {act_fn = "silu", center_input_sample = false, class_embed_type = options.ABSENT, addition_embed_type = options.ABSENT,
  time_embedding_type = "positional", resnet_time_scale_shift = "default", only_cross_attention = false,
  dual_cross_attention = false, num_class_embeds = options.ABSENT, time_cond_proj_dim = options.ABSENT, conv_in_kernel = 3, conv_out_kernel = 3,
  mid_block_type = "UNetMidBlock2DCrossAttn", encoder_hid_dim = options.ABSENT, attention_type = "default",
  resnet_skip_time_act = false, resnet_out_scale_factor = 1, timestep_post_act = options.ABSENT, cross_attention_norm = options.ABSENT,
  time_embedding_dim = options.ABSENT, time_embedding_act_fn = options.ABSENT, mid_block_scale_factor = 1, class_embeddings_concat = false,
  reverse_transformer_layers_per_block = options.ABSENT, addition_time_embed_dim = options.ABSENT, projection_class_embeddings_input_dim = options.ABSENT,
  mid_block_only_cross_attention = false}

-- build_loaded(class, cfg, dir, opts, who, level) -> class(cfg) in opts.dtype ("auto", the
-- default: the weights' dtype, as transformers' dtype = "auto"; diffusers' own default is f32)
-- on opts.device, with dir's weights (UNet, VAE)
function M.build_loaded(class, cfg, dir, opts, who, level)
  opts = options.check(who, opts, {"dtype", "device"}, level + 1)
  local sd, path = M.weights(dir, who, level + 1)
  local dtype = common.model_dtype(opts, nil, sd, who, level + 1)
  return M.load_weights(class(cfg, {dtype = dtype, device = opts.device}), dir, who, level + 1, sd, path)
end

function M.from_pretrained(dir, opts)
  local cfg = M.read_config(dir, "unet.from_pretrained", 2)
  options.config("unet.from_pretrained: " .. dir .. "/config.json", cfg, M.CONFIG_RULES, 2)
  if type(cfg.transformer_layers_per_block) == "table" then
    error("unet.from_pretrained: per-level transformer_layers_per_block is not supported", 2)
  end
  cfg.norm_eps = cfg.norm_eps or 1e-5
  cfg.norm_num_groups = cfg.norm_num_groups or 32
  cfg.downsample_padding = cfg.downsample_padding or 1
  return M.build_loaded(UNet, cfg, dir, opts, "unet.from_pretrained", 2)
end

return M
