-- sd_img2img_spec.lua — Stable Diffusion image-to-image and inpainting against diffusers
-- (tests/fixtures/sd_sched/pipes.safetensors, written by tests/fixtures/gen/gen_sd_img2img.py):
-- StableDiffusionImg2ImgPipeline with Euler (strength 0.6), StableDiffusionInpaintPipeline with
-- the 9-channel inpainting UNet and DPM++ 2M Karras (strength 1) and with the plain UNet's mask
-- blending and DDIM (strength 0.75), StableDiffusionPipeline with Euler ancestral and PNDM, on tests/fixtures/sd's tiny UNet/VAE and tests/fixtures/clip's
-- text encoder; diffusers' random draws (VAE posterior samples, start noise) are injected in order
-- through opts.randn. Images: within 0.5 of diffusers' unrounded x255 values, i.e. the same u8
-- rounding (as sd_spec: the UNet/VAE agree to ~2e-6, the schedulers to ~2e-6, far under one
-- level); bad input named.
local keng = require "keng"
local H = require "helper"
local sd = require "models.stable_diffusion"
local unet_m = require "models.unet"

local FIX, SCHED, CLIP = "tests/fixtures/sd", "tests/fixtures/sd_sched", "tests/fixtures/clip"
local gold = keng.load(SCHED .. "/pipes.safetensors")
local PROMPT = "a photograph of an astronaut riding a horse"

local exists = H.exists

-- the tiny pipeline of sd_spec, with `unet_dir`'s UNet and the DDIM scheduler config
local function pipeline(unet_dir)
  local clip = require "models.clip"
  return sd.Pipeline({text_encoder = clip.from_pretrained(CLIP .. "/text_encoder"),
    tokenizer = clip.tokenizer(CLIP .. "/tokenizer"), unet = unet_m.from_pretrained(unet_dir),
    vae = require("models.vae").from_pretrained(FIX .. "/vae"), scheduler = sd.DDIM.new()})
end

-- opts.randn replaying diffusers' draws P_noise1, P_noise2, ... and checking their shapes
local function draws(name)
  local k = 0
  return function(shape)
    k = k + 1
    local x = gold[name .. "_noise" .. k]
    assert(x, name .. ": more draws than diffusers made (" .. k .. ")")
    assert.are.same(x.shape, shape)
    return x
  end, function() return k end
end

local function same_image(img, ref, what)
  assert.are.equal("u8", img.dtype)
  assert.are.same(ref.shape, img.shape)
  local worst = (img:float() - ref):abs():max():item()
  assert(worst <= 0.5 + 1e-3, what .. ": image differs from diffusers' by " .. worst .. " of 255")
end

describe("Stable Diffusion img2img and inpaint", function()
  if not exists(CLIP .. "/text_encoder/config.json") then
    it("needs tests/fixtures/clip", function() pending("tests/fixtures/clip is absent") end)
    return
  end

  it("img2img with Euler matches StableDiffusionImg2ImgPipeline (strength 0.6)", function()
    local pipe = pipeline(FIX .. "/unet")
    local randn, count = draws("img2img")
    local steps = 0
    local img = pipe:img2img(PROMPT, gold.image, {strength = 0.6, num_steps = 5, guidance_scale = 7.5,
      scheduler = "euler", randn = randn, callback = function() steps = steps + 1 end})
    same_image(img, gold.img2img_image, "img2img")
    assert.are.equal(2, count())
    assert.are.equal(3, steps)                                  -- int(5 · 0.6) steps run
  end)

  it("inpaint with the 9-channel inpainting UNet and DPM++ 2M Karras", function()
    local pipe = pipeline(SCHED .. "/unet_inpaint")
    assert.is_true(pipe.inpainting)
    local randn, count = draws("inpaint9")
    local img = pipe:inpaint(PROMPT, gold.image, gold.mask, {num_steps = 4, guidance_scale = 7.5,
      scheduler = "dpmpp_2m_karras", randn = randn})
    same_image(img, gold.inpaint9_image, "inpaint 9ch")
    assert.are.equal(2, count())
    H.raises(function() pipe:text_to_image(PROMPT, {num_steps = 1}) end, "an inpainting UNet): use inpaint")
    H.raises(function() pipe:img2img(PROMPT, gold.image) end, "img2img: this is an inpainting UNet: use inpaint")
  end)

  it("inpaint with the plain UNet blends the known region (DDIM, strength 0.75)", function()
    local pipe = pipeline(FIX .. "/unet")
    local randn, count = draws("inpaint4")
    local img = pipe:inpaint(PROMPT, gold.image, gold.mask, {strength = 0.75, num_steps = 4, guidance_scale = 7.5,
      randn = randn})
    same_image(img, gold.inpaint4_image, "inpaint 4ch")
    assert.are.equal(3, count())
  end)

  it("text_to_image with Euler ancestral (its noise through randn) and PNDM matches diffusers", function()
    local pipe = pipeline(FIX .. "/unet")
    for _, case in ipairs{{"t2i_euler_a", "euler_a", 4}, {"t2i_pndm", "pndm", 1}} do
      local randn, count = draws(case[1])
      local img = pipe:text_to_image(PROMPT, {num_steps = 3, guidance_scale = 7.5, height = 32, width = 32,
        scheduler = case[2], randn = randn})
      same_image(img, gold[case[1] .. "_image"], case[1])
      assert.are.equal(case[3], count())
    end
  end)

  it("names bad input", function()
    local pipe = pipeline(FIX .. "/unet")
    H.raises(function() pipe:img2img(PROMPT, gold.image, {strenght = 0.5}) end, "img2img: unknown option 'strenght'")
    H.raises(function() pipe:img2img(PROMPT, gold.image, {strength = 1.5}) end, "img2img: strength must be in [0, 1], got 1.5")
    H.raises(function() pipe:img2img(PROMPT, gold.image, {strength = 0.1, num_steps = 5}) end,
      "img2img: strength 0.1 with 5 steps runs no step")
    H.raises(function() pipe:img2img(PROMPT, keng.zeros({1, 30, 32, 3}, {dtype = "u8"})) end,
      "image height 30 and width 32 must be multiples of 32")
    H.raises(function() pipe:img2img(PROMPT, keng.zeros({32, 32})) end, "must be u8 [H, W, 3] / [B, H, W, 3] or float")
    H.raises(function() pipe:img2img({"a", "b", "c"}, keng.zeros({2, 3, 64, 64})) end, "image has 2 images for a batch of 3")
    H.raises(function() pipe:inpaint(PROMPT, gold.image, keng.zeros({16, 16}, {dtype = "u8"})) end,
      "mask [16,16] is not the image's size 32x32")
    H.raises(function() pipe:text_to_image(PROMPT, {image = gold.image}) end, "text_to_image: unknown option 'image'")
    H.raises(function() pipe:text_to_image(PROMPT, {scheduler = "heun"}) end, "sd_img2img_spec.lua:")
    H.raises(function() pipe:img2img(PROMPT, gold.image, {scheduler = "heun"}) end, "unknown scheduler 'heun'")
    H.raises(function() pipe:inpaint(PROMPT, gold.image, gold.mask, {scheduler = {}}) end,
      "inpaint: scheduler must be a name or a scheduler object (set_timesteps, step)")
  end)
end)

describe("examples/sd_edit.lua", function()
  it("writes input | img2img | inpaint side by side", function()
    local out = H.tmpname(".png")
    local log, code = H.run("cd " .. H.sh_quote(H.root) .. " && " .. H.sh_quote(H.keng_bin()) ..
      " examples/sd_edit.lua " .. H.sh_quote(out) .. " 2 2>&1")
    assert.are.equal(0, code, log)
    local img = require("keng.image").read(out)
    os.remove(out)
    assert.are.same({128, 384, 3}, img.shape)
    -- the input third is the synthetic picture: the disk's centre is blue-heavy (b = 0.9 * 255)
    assert.are.equal(230, img[56 + 1][80 + 1][3]:item())
  end)
end)
