-- examples/sd_edit.lua — image-to-image and inpainting with the `sd_tiny` Stable Diffusion preset:
-- a synthetic 128x128 picture (a gradient and a disk), the img2img result (strength 0.6, Euler)
-- and the inpainted one (the disk repainted, DPM-Solver++ 2M Karras), side by side in a PNG. The
-- weights are random, so the new pixels are coloured noise: this shows the path (VAE encode ->
-- noise to the strength's timestep -> guided UNet steps -> VAE decode; for inpainting the known
-- region blended back each step), not a trained model. With real weights use
-- sd.from_pretrained("path/to/stable-diffusion-v1-5") and a photo (keng.image.read).
--
--   keng examples/sd_edit.lua [out.png] [steps]
local keng = require "keng"
local sd = require "models.stable_diffusion"

local out = arg and arg[1] or "sd_edit.png"
local steps = tonumber(arg and arg[2]) or 10

local n = 128                                                               -- a multiple of 64 (SD v1)
local xs = keng.arange(n):float():view{1, n}:expand{n, n}
local ys = keng.arange(n):float():view{n, 1}:expand{n, n}
local disk = ((xs - 80) ^ 2 + (ys - 56) ^ 2):lt(28 ^ 2)                      -- bool [n, n]
local r = xs / n * 0.6 + 0.2
local g = ys / n * 0.5 + 0.3
local b = keng.where(disk, 0.9, 0.25)
local picture = (keng.stack({r, g, b}, 3) * 255 + 0.5):to("u8")           -- u8 [n, n, 3]
local mask = (disk:to("u8") * 255)                                           -- u8 [n, n], 255 = repaint

local pipe = sd.from_preset("sd_tiny", {seed = 0})
local t0 = os.time()
local a = pipe:img2img("a watercolour of a moon over hills", picture,
  {strength = 0.6, num_steps = steps, scheduler = "euler", seed = 42})      -- u8 [1, n, n, 3]
local c = pipe:inpaint("a red moon", picture, mask,
  {num_steps = steps, scheduler = "dpmpp_2m_karras", seed = 42})
keng.image.write_png(out, keng.cat({picture, a[1], c[1]}, 2))              -- [n, 3n, 3]
print(string.format("wrote %s: input | img2img | inpaint, %d steps, %ds", out, steps, os.time() - t0))
