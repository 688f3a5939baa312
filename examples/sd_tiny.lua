-- examples/sd_tiny.lua — text to image with the `sd_tiny` Stable Diffusion preset (docs/benchmarks.md's
-- CPU tier), written to a PNG. The weights are random, so the picture is coloured noise: this
-- shows the whole path (prompt -> CLIP text encoder -> 10 guided DDIM steps of the UNet -> VAE
-- decoder -> u8 pixels -> PNG), not a trained model. With real weights use
-- sd.from_pretrained("path/to/stable-diffusion-v1-4") (the diffusers layout) instead.
--
--   keng examples/sd_tiny.lua [out.png] [steps]
local keng = require "keng"
local sd = require "models.stable_diffusion"

local out = arg and arg[1] or "sd_tiny.png"
local steps = tonumber(arg and arg[2]) or 10

local pipe = sd.from_preset("sd_tiny", {seed = 0})
local t0 = os.time()
local imgs = pipe:text_to_image("a photograph of an astronaut riding a horse",
  {batch_size = 2, num_steps = steps, guidance_scale = 7.5, seed = 42})   -- u8 [2, 128, 128, 3]
local row = {}
for i = 1, imgs.shape[1] do row[i] = imgs[i] end                          -- [128, 128, 3] each
keng.image.write_png(out, keng.cat(row, 2))                                -- side by side: [128, 256, 3]
print(string.format("wrote %s: %d images %dx%d, %d DDIM steps, %ds", out, imgs.shape[1], imgs.shape[2],
  imgs.shape[3], steps, os.time() - t0))
