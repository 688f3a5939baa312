-- models.vae — Stable Diffusion's autoencoder, diffusers' AutoencoderKL: an encoder from RGB to
-- 2·L channels (mean and log-variance of the latent), a decoder from L latent channels to RGB.
-- Reference: diffusers models/autoencoders/autoencoder_kl.py and vae.py (Encoder, Decoder),
-- unet_2d_blocks.py (DownEncoderBlock2D, UpDecoderBlock2D, UNetMidBlock2D).
--
-- Shape letters: B batch, C channels, H/W image height/width, h/w latent height/width
-- (H / 2^(levels-1)), L latent channels (4), T = h·w spatial tokens.
--
-- Module tree = diffusers' names (vae/diffusion_pytorch_model.safetensors loads as is):
--   encoder.conv_in, encoder.down_blocks.i.resnets.j, encoder.down_blocks.i.downsamplers.0.conv,
--   encoder.mid_block.{resnets.0, attentions.0.{group_norm, to_q, to_k, to_v, to_out.0}, resnets.1},
--   encoder.conv_norm_out, encoder.conv_out (-> 2·L), quant_conv (1x1, 2·L -> 2·L),
--   post_quant_conv (1x1, L -> L), decoder.conv_in, decoder.mid_block, decoder.up_blocks.i.resnets.j,
--   decoder.up_blocks.i.upsamplers.0.conv, decoder.conv_norm_out, decoder.conv_out (-> 3)
-- Every norm is GroupNorm with eps 1e-6. The latent that the UNet sees is mean · scaling_factor
-- (0.18215 for SD v1); decode() takes the unscaled latent.
local keng = require "keng"
local nn = require "keng.nn"
local common = require "models.common"
local U = require "models.unet"
local options = require "keng.options"

local M = {}
local function List0(list) return nn.ModuleList(list, {first = 0}) end  -- diffusers' 0-based names
local function shape_str(t) return require("keng.util").shape_str(t, ",") end
local EPS = 1e-6

M.presets = {
  -- SD v1 (CompVis/stable-diffusion-v1-4 vae/config.json); encoder 34,163,592 parameters
  sd_v1 = {in_channels = 3, out_channels = 3, latent_channels = 4, block_out_channels = {128, 256, 512, 512},
           layers_per_block = 2, norm_num_groups = 32, scaling_factor = 0.18215, sample_size = 512},
  -- docs/benchmarks.md CPU tier: encoder 32/64/128/128, decoder mirrored (128/128/64/32), 8 groups
  sd_tiny = {in_channels = 3, out_channels = 3, latent_channels = 4, block_out_channels = {32, 64, 128, 128},
             layers_per_block = 2, norm_num_groups = 8, scaling_factor = 0.18215, sample_size = 128},
}
M.presets.stable_diffusion_v1 = M.presets.sd_v1

---------------------------------------------------------------------------------------------
-- single-head self-attention over the spatial positions, with its own GroupNorm and residual:
-- nn.MultiHeadAttention with one head of width C and diffusers' names (to_q, to_k, to_v, to_out.0)

local SpatialAttention = nn.MultiHeadAttention:extend("VAEAttention")
M.SpatialAttention = SpatialAttention

function SpatialAttention:init(c, groups, o)
  self.group_norm = nn.GroupNorm(groups, c, {eps = EPS, dtype = o.dtype, device = o.device})
  nn.MultiHeadAttention.init(self, c, 1, {names = {query = "to_q", key = "to_k", value = "to_v", out = "to_out.0"},
    dtype = o.dtype, device = o.device})
end

function SpatialAttention:forward(x)                           -- x [B, C, h, w]
  local B, C, h, w = table.unpack(x.shape)
  local t = self.group_norm(x):view{B, C, h * w}:transpose(2, 3)  -- [B, T, C]
  local a = nn.MultiHeadAttention.forward(self, t)              -- [B, T, C]
  return a:transpose(2, 3):reshape{B, C, h, w} + x              -- [B, C, h, w]
end

local MidBlock = nn.Module:extend("UNetMidBlock2D")

function MidBlock:init(c, cfg, o)
  local g = cfg.norm_num_groups
  if cfg.mid_block_add_attention ~= false then self.attentions = List0({SpatialAttention(c, g, o)}) end
  self.resnets = List0({U.ResnetBlock2D(c, c, nil, g, EPS, o), U.ResnetBlock2D(c, c, nil, g, EPS, o)})
end

function MidBlock:forward(x)
  x = self.resnets[0](x)
  if self.attentions then x = self.attentions[0](x) end
  return self.resnets[1](x)
end

-- a level of resnets with an optional down- or upsampler
local Level = nn.Module:extend("VAEBlock2D")

-- Level(Cin, Cout, n resnets, "down" | "up" | nil, cfg, o)
function Level:init(cin, cout, n, sampler, cfg, o)
  local res = {}
  for j = 1, n do res[j] = U.ResnetBlock2D(j == 1 and cin or cout, cout, nil, cfg.norm_num_groups, EPS, o) end
  self.resnets = List0(res)
  if sampler == "down" then self.downsamplers = List0({U.Downsample2D(cout, 0, o)}) end
  if sampler == "up" then self.upsamplers = List0({U.Upsample2D(cout, o)}) end
end

function Level:forward(x)
  for j = 0, #self.resnets - 1 do x = self.resnets[j](x) end
  if self.downsamplers then x = self.downsamplers[0](x) end
  if self.upsamplers then x = self.upsamplers[0](x) end
  return x
end

---------------------------------------------------------------------------------------------
-- encoder: image [B, 3, H, W] in [-1, 1] -> [B, 2·L, h, w] (the "8-channel output")

local Encoder = nn.Module:extend("VAEEncoder")
M.Encoder = Encoder

function Encoder:init(cfg, o)
  local ch, L = cfg.block_out_channels, #cfg.block_out_channels
  self.in_channels, self.levels = cfg.in_channels, L
  self.conv_in = nn.Conv2d(cfg.in_channels, ch[1], 3, {padding = 1, dtype = o.dtype, device = o.device})
  local down, cout = {}, ch[1]
  for i = 1, L do
    local cin = cout
    cout = ch[i]
    down[i] = Level(cin, cout, cfg.layers_per_block, i < L and "down" or nil, cfg, o)
  end
  self.down_blocks = List0(down)
  self.mid_block = MidBlock(ch[L], cfg, o)
  self.conv_norm_out = nn.GroupNorm(cfg.norm_num_groups, ch[L], {eps = EPS, dtype = o.dtype, device = o.device})
  self.conv_out = nn.Conv2d(ch[L], 2 * cfg.latent_channels, 3, {padding = 1, dtype = o.dtype, device = o.device})
end

function Encoder:forward(x)                                    -- x [B, 3, H, W]
  local mult = 1 << (self.levels - 1)
  if not keng.is_tensor(x) or x.ndim ~= 4 or x.shape[2] ~= self.in_channels
     or x.shape[3] % mult ~= 0 or x.shape[4] % mult ~= 0 then
    error(string.format("VAE encoder: image %s must be [B, %d, H, W] with H and W multiples of %d",
      keng.is_tensor(x) and shape_str(x) or type(x), self.in_channels, mult), 2)
  end
  local h = self.conv_in(x)                                     -- [B, C0, H, W]
  for i = 0, self.levels - 1 do h = self.down_blocks[i](h) end  -- [B, C_last, h, w]
  h = self.mid_block(h)
  return self.conv_out(self.conv_norm_out(h):silu())            -- [B, 2·L, h, w]
end

---------------------------------------------------------------------------------------------
-- decoder: latent [B, L, h, w] -> image [B, 3, H, W] (about [-1, 1])

local Decoder = nn.Module:extend("VAEDecoder")
M.Decoder = Decoder

function Decoder:init(cfg, o)
  local ch, L = cfg.block_out_channels, #cfg.block_out_channels
  self.latent_channels, self.levels = cfg.latent_channels, L
  self.conv_in = nn.Conv2d(cfg.latent_channels, ch[L], 3, {padding = 1, dtype = o.dtype, device = o.device})
  self.mid_block = MidBlock(ch[L], cfg, o)
  local up, cout = {}, ch[L]
  for i = 1, L do
    local cin = cout
    cout = ch[L - i + 1]
    up[i] = Level(cin, cout, cfg.layers_per_block + 1, i < L and "up" or nil, cfg, o)
  end
  self.up_blocks = List0(up)
  self.conv_norm_out = nn.GroupNorm(cfg.norm_num_groups, ch[1], {eps = EPS, dtype = o.dtype, device = o.device})
  self.conv_out = nn.Conv2d(ch[1], cfg.out_channels, 3, {padding = 1, dtype = o.dtype, device = o.device})
end

function Decoder:forward(z)                                    -- z [B, L, h, w]
  local h = self.mid_block(self.conv_in(z))                     -- [B, C_last, h, w]
  for i = 0, self.levels - 1 do h = self.up_blocks[i](h) end    -- [B, C0, H, W]
  return self.conv_out(self.conv_norm_out(h):silu())            -- [B, 3, H, W]
end

---------------------------------------------------------------------------------------------
-- AutoencoderKL

local VAE = nn.Module:extend("AutoencoderKL")
-- m:save_pretrained(dir, {max_shard_size = "5GB"}): a diffusers directory (config.json +
-- diffusion_pytorch_model.safetensors, or shards + index; scripts/models/hf_save.lua)
function VAE:save_pretrained(dir, opts) return require("models.hf_save").diffusers(self, dir, opts, "AutoencoderKL", 2) end
M.AutoencoderKL = VAE

-- VAE(cfg, {dtype =, device =})
function VAE:init(cfg, opts)
  opts = options.check("AutoencoderKL", opts, {"dtype", "device"}, nn.Module.user_level(3))
  local o = {dtype = opts.dtype, device = opts.device}
  self.config = cfg
  self.scaling_factor = cfg.scaling_factor or 0.18215
  local Lc = cfg.latent_channels
  self.encoder = Encoder(cfg, o)
  self.decoder = Decoder(cfg, o)
  if cfg.use_quant_conv ~= false then self.quant_conv = nn.Conv2d(2 * Lc, 2 * Lc, 1, o) end
  if cfg.use_post_quant_conv ~= false then self.post_quant_conv = nn.Conv2d(Lc, Lc, 1, o) end
end

-- encode(x) -> moments [B, 2·L, h, w]: mean = the first L channels, log-variance the rest
function VAE:encode(x)
  local m = self.encoder(x)
  return self.quant_conv and self.quant_conv(m) or m
end

-- latent_mean(x) -> [B, L, h, w], the mode of the latent distribution (unscaled)
function VAE:latent_mean(x)
  return self:encode(x):narrow(2, 1, self.config.latent_channels)
end

-- decode(z) -> image [B, 3, H, W]; z unscaled (divide the UNet's latents by scaling_factor first)
function VAE:decode(z)
  local Lc = self.config.latent_channels
  if not keng.is_tensor(z) or z.ndim ~= 4 or z.shape[2] ~= Lc then
    error(string.format("AutoencoderKL.decode: latents %s must be [B, %d, h, w]",
      keng.is_tensor(z) and shape_str(z) or type(z), Lc), 2)
  end
  if self.post_quant_conv then z = self.post_quant_conv(z) end
  return self.decoder(z)
end

-- forward(x) = decode(mean of encode(x)): a reconstruction
function VAE:forward(x) return self:decode(self:latent_mean(x)) end

---------------------------------------------------------------------------------------------
-- construction and loading

function M.config(name, level)
  return U.copy(common.preset("vae.from_preset", M.presets, name, (level or 1) + 1))
end

function M.from_preset(name, opts)
  local m = VAE(M.config(name, 2), options.check("vae.from_preset", opts, {"dtype", "device"}))
  return m
end

-- AutoencoderKL config keys that change the numbers, at the values keng implements
M.CONFIG_RULES = {act_fn = "silu", shift_factor = options.ABSENT, latents_mean = options.ABSENT,
  latents_std = options.ABSENT}

-- from_pretrained(dir, {dtype =, device =}) -> AutoencoderKL with dir/config.json and weights
function M.from_pretrained(dir, opts)
  local cfg = U.read_config(dir, "vae.from_pretrained", 2)
  options.config("vae.from_pretrained: " .. dir .. "/config.json", cfg, M.CONFIG_RULES, 2)
  for _, t in ipairs(cfg.down_block_types or {}) do
    if t ~= "DownEncoderBlock2D" then error("vae.from_pretrained: unsupported down block type " .. t, 2) end
  end
  for _, t in ipairs(cfg.up_block_types or {}) do
    if t ~= "UpDecoderBlock2D" then error("vae.from_pretrained: unsupported up block type " .. t, 2) end
  end
  cfg.norm_num_groups = cfg.norm_num_groups or 32
  cfg.layers_per_block = cfg.layers_per_block or 1
  cfg.latent_channels = cfg.latent_channels or 4
  cfg.in_channels, cfg.out_channels = cfg.in_channels or 3, cfg.out_channels or 3
  return U.build_loaded(VAE, cfg, dir, opts, "vae.from_pretrained", 2)
end

return M
