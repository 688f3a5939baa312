-- stable_diffusion.lua — the Stable Diffusion rows (docs/benchmarks.md):
--   fit:     the VAE image encoder up to its 8-channel conv output (pipe.image_encoder), images
--            [B, 3, S, S] uniform [0, 1), target [B, 8, h, w] uniform, MSE, Adam(lr 1e-3,
--            eps 1e-7) on every encoder weight, f32
--   predict: ms per diffusion step of text_to_image(prompt, {batch_size = B, guidance 7.5, DDIM
--            eta 0}); one step = UNet(uncond) + UNet(cond), each at batch B, + the DDIM update.
--            Difference rule: (t(2 + N steps) - t(2 steps)) / N, so text encoding, noise
--            sampling and VAE decoding cancel; N = --steps (100 on the GPU tier: 102 - 2, as Keras).
-- Shape letters: B batch, S image side, h = w = S / 8 (the latent side).
local keng = require "keng"
local optim = require "keng.optim"
local bench = require "keng.bench"
local common = require "bench.common"

local M = {}

local SHORT = 2                                                     -- the short run's diffusion steps

function M.run(row, ctx)
  local sd = require "models.stable_diffusion"
  local size = row[ctx.tier]
  local B, S = row.batch, size.image
  keng.manual_seed(0)
  local pipe = sd.from_preset(size.preset, {dtype = ctx.dtype, device = ctx.device})
  local info = {preset = size.preset, shapes = {}}
  local r
  if row.task == "fit" then
    local enc = pipe.image_encoder
    local t = size.target                                           -- {h, w, 8} as Keras writes it
    local images = keng.rand({B, 3, S, S}):to{dtype = ctx.dtype, device = ctx.device}   -- [B, 3, S, S]
    local target = keng.rand({B, t[3], t[1], t[2]}):to{dtype = ctx.dtype, device = ctx.device}  -- [B, 8, h, w]
    info.shapes = {images = images.shape, target = target.shape}
    info.params, info.trainable = enc:num_params(), enc:num_params{trainable = true}
    local opt = optim.Adam(enc:parameters(), {lr = 1e-3, eps = 1e-7})
    r = common.time_fit(enc, images, target, opt, function(pred, y)
      return keng.mse_loss(pred, y)
    end, ctx, B)
  else
    local gen = {batch_size = B, guidance_scale = size.guidance, height = S, width = S, seed = 0,
                 progress = false}                 -- the runner draws the row's own progress
    local img
    r = keng.no_grad(function()
      return bench.run_diff(function(k)
        gen.num_steps = k
        img = pipe:text_to_image(row.prompt, gen)                  -- u8 [B, S, S, 3]
      end, {short = SHORT, steps = ctx.steps, repeats = ctx.repeats, items = B, on_step = ctx.on_step,
                  profile = ctx.profile})
    end)
    local f = pipe.vae_scale
    info.shapes = {images = img.shape, latents = {B, pipe.latent_channels, S // f, S // f}}
    info.prompt, info.guidance_scale = row.prompt, size.guidance
    info.params, info.trainable = pipe:num_params(), pipe:num_params{trainable = true}
    info.rule = string.format("(t(%d steps) - t(%d steps)) / %d", SHORT + ctx.steps, SHORT, ctx.steps)
  end
  for k, v in pairs(info) do r[k] = v end
  return r
end

return M
