-- sd_spec.lua — Stable Diffusion (scripts/models/unet.lua, vae.lua, stable_diffusion.lua) against
-- diffusers golden files (tests/fixtures/sd, written by tests/fixtures/gen/gen_sd.py): the UNet's
-- noise prediction, the VAE encoder moments and decoder output, the DDIM schedule and 3 guided
-- DDIM steps, and the whole StableDiffusionPipeline (with tests/fixtures/clip's text encoder and
-- tokenizer); exact parameter counts of the SD v1 parts on the meta device; sd_tiny end to end;
-- bad input. Shape letters: B batch, L latent channels, h/w latent size, H/W image size.
-- Tolerances: 1e-4 with H.close's |a-b|/(1+|b|), all f32 (the worst observed is about 2e-6; DDIM
-- latents after 3 guided steps reach |x| ~ 24, still under 1e-5 relative). Images: within 0.5
-- of diffusers' unrounded x255 values, i.e. the same rounding.
local keng = require "keng"
local H = require "helper"
local sd = require "models.stable_diffusion"
local unet_m = require "models.unet"
local vae_m = require "models.vae"

local FIX = "tests/fixtures/sd"
local gold = keng.load(FIX .. "/golden.safetensors")

local exists = H.exists

describe("UNet2DConditionModel", function()
  it("predicts diffusers' noise (f32, 1e-4)", function()
    local m = unet_m.from_pretrained(FIX .. "/unet")
    local y = keng.no_grad(function() return m(gold.unet_latents, gold.unet_t, gold.unet_context) end)
    assert.are.same({2, 4, 8, 8}, y.shape)
    H.close(y, gold.unet_eps, 1e-4, "unet eps")
    -- a plain number timestep equals a tensor of that timestep
    local one = keng.no_grad(function()
      return m(gold.unet_latents:narrow(1, 2, 1), 37, gold.unet_context:narrow(1, 2, 1))
    end)
    H.close(one, gold.unet_eps:narrow(1, 2, 1), 1e-4, "unet eps, number t")
  end)

  it("has SD v1's 859,520,964 parameters and diffusers' names (meta)", function()
    local m = unet_m.from_preset("sd_v1", {device = "meta"})
    assert.are.equal(859520964, m:num_params())
    local names = m:named_parameters()
    for _, n in ipairs{"conv_in.weight", "time_embedding.linear_1.weight", "down_blocks.0.resnets.0.norm1.weight",
                       "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.weight",
                       "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight",
                       "down_blocks.0.attentions.0.transformer_blocks.0.ff.net.0.proj.weight",
                       "down_blocks.0.attentions.0.transformer_blocks.0.ff.net.2.weight",
                       "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_out.0.bias",
                       "down_blocks.0.downsamplers.0.conv.weight", "mid_block.attentions.0.proj_in.weight",
                       "up_blocks.0.resnets.2.conv_shortcut.weight", "up_blocks.2.upsamplers.0.conv.weight",
                       "conv_norm_out.weight", "conv_out.bias"} do
      assert.is_not_nil(names[n], n)
    end
    assert.are.same({1280, 768}, names["down_blocks.2.attentions.1.transformer_blocks.0.attn2.to_k.weight"].shape)
    assert.are.same({640, 768}, names["down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight"].shape)
    assert.are.same({5120, 640}, names["down_blocks.1.attentions.0.transformer_blocks.0.ff.net.0.proj.weight"].shape)
    assert.are.equal(5801540, unet_m.from_preset("sd_tiny", {device = "meta"}):num_params())
  end)

  it("names the expected latent shape on bad input", function()
    local m = unet_m.from_pretrained(FIX .. "/unet")
    H.raises(function() m(keng.zeros({1, 3, 8, 8}), 1, gold.unet_context:narrow(1, 1, 1)) end,
      "latents [1,3,8,8] must be [B, 4, H, W] with H and W multiples of 8")
    H.raises(function() m(keng.zeros({1, 4, 12, 8}), 1, gold.unet_context:narrow(1, 1, 1)) end, "multiples of 8")
    H.raises(function() m(keng.zeros({1, 4, 8, 8}), 1, keng.zeros({1, 5, 7})) end, "context [1,5,7] must be [1, S, 32]")
  end)

  it("names a missing weight file and config", function()
    local d = os.tmpname()
    os.remove(d)
    assert(os.execute("mkdir -p " .. d .. " && cp " .. FIX .. "/unet/config.json " .. d .. "/"))
    local err = H.raises(function() unet_m.from_pretrained(d) end, "missing weight file")
    assert.truthy(err:find(d .. "/diffusion_pytorch_model.safetensors", 1, true))
    H.raises(function() unet_m.from_pretrained(d .. "/nowhere") end, d .. "/nowhere/config.json")
    os.execute("rm -rf " .. d)
  end)
end)

describe("AutoencoderKL", function()
  it("encodes and decodes as diffusers (f32, 1e-4)", function()
    local m = vae_m.from_pretrained(FIX .. "/vae")
    keng.no_grad(function()
      H.close(m.encoder(gold.vae_image), gold.vae_enc, 1e-4, "encoder")
      H.close(m:encode(gold.vae_image), gold.vae_moments, 1e-4, "moments")
      H.close(m:decode(gold.vae_latents), gold.vae_decoded, 1e-4, "decoder")
    end)
  end)

  it("has SD v1's encoder count (34,163,592 to the 8-channel output) on meta", function()
    local m = vae_m.from_preset("sd_v1", {device = "meta"})
    assert.are.equal(34163592, m.encoder:num_params())
    assert.are.equal(49490179, m.decoder:num_params())
    assert.are.equal(83653863, m:num_params())
    assert.are.equal(2148072, vae_m.from_preset("sd_tiny", {device = "meta"}).encoder:num_params())
  end)

  it("names the expected image shape on bad input", function()
    local m = vae_m.from_pretrained(FIX .. "/vae")
    H.raises(function() m.encoder(keng.zeros({1, 4, 16, 16})) end, "image [1,4,16,16] must be [B, 3, H, W]")
    H.raises(function() m:decode(keng.zeros({1, 3, 4, 4})) end, "latents [1,3,4,4] must be [B, 4, h, w]")
  end)
end)

describe("DDIM", function()
  it("has diffusers' alphas_cumprod and timesteps", function()
    local s = sd.DDIM.new()
    H.close(s.alphas_cumprod, gold.ddim_alphas_cumprod, 1e-6, "alphas_cumprod")   -- f64 here, f32 there
    assert.are.same(gold.ddim_timesteps_50:tolist(), s:set_timesteps(50))
    assert.are.same(gold.ddim_timesteps_3:tolist(), s:set_timesteps(3))
    assert.are.equal(981, s:set_timesteps(50)[1])
    H.raises(function() s:set_timesteps(0) end, "num_steps must be an integer in [1, 1000]")
  end)

  it("takes 3 guided steps as diffusers (f32, 1e-4)", function()
    local pipe = sd.Pipeline({unet = unet_m.from_pretrained(FIX .. "/unet"), vae = vae_m.from_pretrained(FIX .. "/vae")})
    local lat = pipe:denoise(gold.ddim_latents0, gold.ddim_cond, gold.ddim_uncond, {num_steps = 3, guidance_scale = 7.5})
    H.close(lat, gold.ddim_latents3, 1e-4, "3 DDIM steps")
  end)
end)

describe("StableDiffusionPipeline", function()
  local clip_fix = "tests/fixtures/clip"
  local function pipeline_dir()
    local d = os.tmpname()
    os.remove(d)
    local root = io.popen("pwd"):read("l")
    local links = {}
    for _, p in ipairs{FIX .. "/unet", FIX .. "/vae", FIX .. "/scheduler", clip_fix .. "/text_encoder", clip_fix .. "/tokenizer"} do
      links[#links + 1] = root .. "/" .. p
    end
    assert(os.execute("mkdir -p " .. d .. " && ln -s " .. table.concat(links, " ") .. " " .. d .. "/"))
    return d
  end

  it("loads the diffusers layout and matches diffusers' images", function()
    if not exists(clip_fix .. "/text_encoder/config.json") then pending("tests/fixtures/clip is absent") return end
    local d = pipeline_dir()
    local pipe = sd.from_pretrained(d)
    local P = {"a photograph of an astronaut riding a horse", "hello world"}
    H.close(pipe:encode_prompt(P), gold.pipe_embeds, 1e-4, "prompt embeddings")
    H.close(pipe:encode_prompt(""), gold.pipe_uncond, 1e-4, "empty prompt")
    local img = pipe:text_to_image(P, {num_steps = 3, guidance_scale = 7.5, latents = gold.pipe_latents,
      height = 32, width = 32})
    assert.are.equal("u8", img.dtype)
    assert.are.same({2, 32, 32, 3}, img.shape)
    local worst = (img:float() - gold.pipe_image):abs():max():item()
    assert(worst <= 0.5 + 1e-3, "image differs from diffusers' by " .. worst .. " of 255")
    H.raises(function() pipe:text_to_image(P, {num_steps = 1, latents = keng.zeros({2, 4, 4, 4}), height = 32, width = 32}) end,
      "latents [2,4,4,4] must be [2,4,8,8]")
    os.execute("rm -rf " .. d)
  end)

  it("names a missing part of the layout", function()
    local d = os.tmpname()
    os.remove(d)
    assert(os.execute("mkdir -p " .. d))
    H.raises(function() sd.from_pretrained(d) end, d .. "/unet/config.json")
    os.execute("rm -rf " .. d)
  end)

  it("counts SD v1 on meta and keeps image_encoder the VAE encoder", function()
    local pipe = sd.from_preset("stable_diffusion_v1", {device = "meta"})
    assert.are.equal(859520964, pipe.unet:num_params())
    assert.are.equal(123060480, pipe.text_encoder:num_params())
    assert.are.equal(34163592, pipe.image_encoder:num_params())
    assert.are.equal(pipe.vae.encoder, pipe.image_encoder)
    assert.are.equal(859520964 + 123060480 + 83653863, pipe:num_params())
  end)

  it("sd_tiny makes seeded u8 images and its image encoder trains", function()
    local pipe = sd.from_preset("sd_tiny", {seed = 0})
    local a = pipe:text_to_image("a photograph of an astronaut riding a horse", {num_steps = 2, seed = 3, height = 64, width = 64})
    assert.are.same({1, 64, 64, 3}, a.shape)
    assert.are.equal("u8", a.dtype)
    local b = pipe:text_to_image({"a photograph of an astronaut riding a horse"}, {num_steps = 2, seed = 3,
      height = 64, width = 64, batch_size = 2})
    assert.are.same({2, 64, 64, 3}, b.shape)
    -- a batch of 2 folds into bigger GEMMs whose blocking sums in another order, so a pixel may
    -- round to the neighbouring u8 level; more than one level would mean a different image
    local diff = (a[1]:float() - b[1]:float()):abs():max():item()
    assert.is_true(diff <= 1, "same seed, same first image: pixels differ by " .. diff)
    H.raises(function() pipe:text_to_image({"a", "b"}, {batch_size = 3}) end, "batch_size 3 is not a positive multiple of the 2 prompts")
    H.raises(function() pipe:text_to_image("a", {height = 60, width = 64}) end, "must be multiples of 64")
    -- the fit row's model: image [B, 3, H, W] -> [B, 8, H/8, W/8], gradients reach every weight
    local enc = pipe.image_encoder
    enc:train()
    local x = keng.rand({1, 3, 32, 32})
    local y = enc(x)
    assert.are.same({1, 8, 4, 4}, y.shape)
    keng.mse_loss(y, keng.rand({1, 8, 4, 4})):backward()
    for name, p in pairs(enc:named_parameters()) do assert.is_not_nil(p.grad, name) end
  end)
end)
