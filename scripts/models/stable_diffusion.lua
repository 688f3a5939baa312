-- models.stable_diffusion — text-to-image, image-to-image and inpainting with latent diffusion
-- (Rombach et al. 2022): the CLIP text encoder (models.clip), the UNet denoiser (models.unet),
-- the VAE (models.vae), a scheduler (DDIM here, Song et al. 2020, eta 0; the others in
-- models.schedulers) and classifier-free guidance (Ho & Salimans 2022).
-- Reference: diffusers StableDiffusionPipeline and DDIMScheduler (SD v1 scheduler config:
-- scaled-linear betas 0.00085 .. 0.012 over 1000 steps, "leading" spacing, steps_offset 1,
-- set_alpha_to_one false, epsilon prediction).
--
--   local sd = require "models.stable_diffusion"
--   local pipe = sd.from_preset("sd_tiny")                     -- random weights (noise pictures)
--   local pipe = sd.from_pretrained("path/to/stable-diffusion-v1-4")  -- the diffusers layout
--   local img = pipe:text_to_image("an astronaut riding a horse", {num_steps = 50, seed = 0})
--   local img2 = pipe:img2img("a watercolour", img, {strength = 0.6, scheduler = "euler"})
--   local img3 = pipe:inpaint("a red hat", img, mask, {scheduler = "dpmpp_2m_karras"})
--   require("keng.image").write_png("out.png", img[1])        -- img: u8 [B, H, W, 3]
--
-- Shape letters: B batch, L latent channels (4), h/w latent size (H/f, W/f with f the VAE's
-- downscale, 8 for SD v1), H/W image size, S = 77 prompt tokens, X text width (768 for v1).
-- pipe.image_encoder is the VAE encoder up to its 8-channel conv output (docs/benchmarks.md's SD fit row).
local keng = require "keng"
local nn = require "keng.nn"
local common = require "models.common"
local U = require "models.unet"
local V = require "models.vae"
local options = require "keng.options"
local progress = require "keng.progress"

local M = {}
local function shape_str(t) return require("keng.util").shape_str(t, ",") end

-- a pipeline preset names the presets of its parts
M.presets = {
  stable_diffusion_v1 = {unet = "sd_v1", vae = "sd_v1", text_encoder = "clip_vit_l14_text"},
  sd_tiny = {unet = "sd_tiny", vae = "sd_tiny", text_encoder = "sd_tiny_text"},
}
M.presets.sd_v1 = M.presets.stable_diffusion_v1

---------------------------------------------------------------------------------------------
-- DDIM scheduler (deterministic, eta 0)

local DDIM = {}
DDIM.__index = DDIM
M.DDIM = DDIM

M.DDIM_V1 = {num_train_timesteps = 1000, beta_start = 0.00085, beta_end = 0.012, beta_schedule = "scaled_linear",
             steps_offset = 1, set_alpha_to_one = false, timestep_spacing = "leading", prediction_type = "epsilon"}

-- DDIMScheduler's config keys: what each does here. Any other key is refused by name (a key
-- keng does not know may change the numbers); thresholding is refused when on.
local DDIM_KEYS = {num_train_timesteps = true, beta_start = true, beta_end = true, beta_schedule = true,
  trained_betas = true, steps_offset = true, set_alpha_to_one = true, timestep_spacing = true, prediction_type = true,
  clip_sample = true, clip_sample_range = true, rescale_betas_zero_snr = true, thresholding = true,
  dynamic_thresholding_ratio = true, sample_max_value = true,  -- used only with thresholding (refused)
  _class_name = true, _diffusers_version = true}
M.DDIM_KEYS = DDIM_KEYS

-- numpy's round (half to even), as diffusers rounds timesteps
local function round_half_even(x)
  local f = math.floor(x)
  local d = x - f
  if d > 0.5 or (d == 0.5 and f % 2 == 1) then return f + 1 end
  return f
end
M.round_half_even = round_half_even

-- the betas of cfg: trained_betas as given, or beta_schedule over N steps
local function ddim_betas(c, N)
  if c.trained_betas ~= nil then
    if type(c.trained_betas) ~= "table" or #c.trained_betas ~= N then
      error(string.format("DDIM: trained_betas must be a list of num_train_timesteps = %d numbers", N), 3)
    end
    return c.trained_betas
  end
  local betas = {}
  for i = 0, N - 1 do
    if c.beta_schedule == "scaled_linear" then
      local s, e = math.sqrt(c.beta_start), math.sqrt(c.beta_end)
      betas[i + 1] = (s + (e - s) * i / (N - 1)) ^ 2
    elseif c.beta_schedule == "linear" then
      betas[i + 1] = c.beta_start + (c.beta_end - c.beta_start) * i / (N - 1)
    elseif c.beta_schedule == "squaredcos_cap_v2" then                -- Nichol & Dhariwal's cosine
      local function abar(t) return math.cos((t + 0.008) / 1.008 * math.pi / 2) ^ 2 end
      betas[i + 1] = math.min(1 - abar((i + 1) / N) / abar(i / N), 0.999)
    else
      error("DDIM: unsupported beta_schedule " .. tostring(c.beta_schedule) ..
        " (scaled_linear, linear, squaredcos_cap_v2 or trained_betas)", 3)
    end
  end
  return betas
end

-- DDIM.new(cfg) with diffusers' scheduler_config.json keys (defaults: SD v1's)
function DDIM.new(cfg)
  for k in pairs(cfg or {}) do
    if not DDIM_KEYS[k] then
      local names = {}
      for n in pairs(DDIM_KEYS) do if n:sub(1, 1) ~= "_" then names[#names + 1] = n end end
      table.sort(names)
      error(string.format("DDIM: unknown scheduler config key '%s' (known: %s)", tostring(k), table.concat(names, ", ")), 2)
    end
  end
  local c = common.overlay(M.DDIM_V1, cfg)
  if c.thresholding then error("DDIM: thresholding (dynamic thresholding) is not supported", 2) end
  if c.prediction_type ~= "epsilon" and c.prediction_type ~= "v_prediction" then
    error("DDIM: unsupported prediction_type " .. tostring(c.prediction_type), 2)
  end
  local N = c.num_train_timesteps
  local ac, prod = {}, 1.0
  for i, beta in ipairs(ddim_betas(c, N)) do                      -- alphas_cumprod[t + 1] for t = 0..N-1
    prod = prod * (1 - beta)
    ac[i] = prod
  end
  if c.rescale_betas_zero_snr then
    -- Lin et al. 2023: shift and scale sqrt(alphas_cumprod) so the last step has zero SNR
    local a0, aT = math.sqrt(ac[1]), math.sqrt(ac[N])
    for i = 1, N do ac[i] = ((math.sqrt(ac[i]) - aT) * a0 / (a0 - aT)) ^ 2 end
  end
  local s = setmetatable({config = c, num_train_timesteps = N, alphas_cumprod = ac,
    final_alpha_cumprod = c.set_alpha_to_one and 1.0 or ac[1], init_noise_sigma = 1.0}, DDIM)
  return s
end

-- alpha_bar(t) for a 0-based training timestep; t < 0 is the final (clean) value
function DDIM:alpha_bar(t)
  if t < 0 then return self.final_alpha_cumprod end
  return self.alphas_cumprod[t + 1]
end

-- set_timesteps(n) -> the n timesteps, descending (also self.timesteps)
function DDIM:set_timesteps(n)
  local N, c = self.num_train_timesteps, self.config
  if math.type(n) ~= "integer" or n < 1 or n > N then
    error(string.format("DDIM: num_steps must be an integer in [1, %d], got %s", N, tostring(n)), 2)
  end
  local ts = {}
  if c.timestep_spacing == "leading" then
    local ratio = N // n
    for i = n - 1, 0, -1 do ts[#ts + 1] = i * ratio + c.steps_offset end
  elseif c.timestep_spacing == "trailing" then                   -- as numpy: round(arange(N, 0, -N/n)) - 1
    local ratio = N / n
    for i = 0, n - 1 do ts[#ts + 1] = round_half_even(N - i * ratio) - 1 end
  elseif c.timestep_spacing == "linspace" then                   -- round(linspace(0, N-1, n)), reversed
    local step = n > 1 and (N - 1) / (n - 1) or 0
    for i = n - 1, 0, -1 do ts[#ts + 1] = round_half_even(i * step) end
  else
    error("DDIM: unsupported timestep_spacing " .. tostring(c.timestep_spacing), 2)
  end
  self.timesteps, self.num_inference_steps = ts, n
  return ts
end

-- the scheduler interface of models.schedulers: DDIM feeds the UNet x as is
function DDIM:scale_model_input(x) return x end
function DDIM:set_begin_index() end
-- add_noise(x0, noise, t): sqrt(abar_t)·x0 + sqrt(1 - abar_t)·noise (img2img's start)
function DDIM:add_noise(x0, noise, t)
  local a = self:alpha_bar(math.tointeger(t))
  return x0 * math.sqrt(a) + noise * math.sqrt(1 - a)
end

-- step(eps, t, x) -> x at the previous timestep (eta 0): x0 = (x - sqrt(1-ab_t)·eps)/sqrt(ab_t),
-- x_prev = sqrt(ab_prev)·x0 + sqrt(1-ab_prev)·eps. eps, x [B, L, h, w].
function DDIM:step(eps, t, x)
  if not self.num_inference_steps then error("DDIM: call set_timesteps before step", 2) end
  local prev = t - self.num_train_timesteps // self.num_inference_steps
  local a, ap = self:alpha_bar(t), self:alpha_bar(prev)
  local x0
  if self.config.prediction_type == "v_prediction" then               -- v = sqrt(a)·eps - sqrt(1-a)·x0
    x0 = x * math.sqrt(a) - eps * math.sqrt(1 - a)
    eps = x * math.sqrt(1 - a) + eps * math.sqrt(a)
  else
    x0 = (x - eps * math.sqrt(1 - a)) / math.sqrt(a)
  end
  if self.config.clip_sample then                                     -- x0 clipped, eps kept (diffusers)
    local r = self.config.clip_sample_range or 1.0
    x0 = x0:clamp(-r, r)
  end
  return x0 * math.sqrt(ap) + eps * math.sqrt(1 - ap)
end

---------------------------------------------------------------------------------------------
-- a stand-in tokenizer for random-weight presets (no vocabulary files): BOS, one id per byte,
-- EOS, EOS padding; ids 0..255 are CLIP's byte symbols, so the rows are well-formed ids

local ByteTokenizer = {}
ByteTokenizer.__index = ByteTokenizer
M.ByteTokenizer = ByteTokenizer

function ByteTokenizer.new(vocab)
  return setmetatable({bos_id = vocab - 2, eos_id = vocab - 1, pad_id = vocab - 1, max_length = 77}, ByteTokenizer)
end

function ByteTokenizer:encode_batch(texts)
  local T, rows = self.max_length, {}
  for b, text in ipairs(texts) do
    local row = {self.bos_id}
    for i = 1, math.min(#text, T - 2) do row[#row + 1] = text:byte(i) end
    if #text > T - 2 then
      io.stderr:write(string.format("stable_diffusion: warning: prompt %d is over %d tokens; truncated\n", b, T - 2))
    end
    row[#row + 1] = self.eos_id
    while #row < T do row[#row + 1] = self.pad_id end
    rows[b] = row
  end
  return keng.tensor(rows, {dtype = "i64"})
end

---------------------------------------------------------------------------------------------
-- the pipeline

local Pipeline = nn.Module:extend("StableDiffusionPipeline")
M.Pipeline = Pipeline

-- Pipeline{text_encoder=, tokenizer=, unet=, vae=, scheduler=}: the modules are children
-- (num_params / to / state_dict cover them); image_encoder is the VAE encoder, not a new child
function Pipeline:init(parts)
  self.text_encoder, self.unet, self.vae = parts.text_encoder, parts.unet, parts.vae
  rawset(self, "tokenizer", parts.tokenizer)
  rawset(self, "scheduler", parts.scheduler or DDIM.new())
  rawset(self, "image_encoder", parts.vae.encoder)
  local vc, uc = parts.vae.config, parts.unet.config
  rawset(self, "vae_scale", 1 << (#vc.block_out_channels - 1))
  rawset(self, "latent_channels", vc.latent_channels)
  rawset(self, "scaling_factor", parts.vae.scaling_factor)
  -- an inpainting UNet reads latents + mask + masked-image latents (9 channels for SD v1)
  rawset(self, "inpainting", uc.in_channels == 2 * vc.latent_channels + 1)
  if uc.in_channels ~= vc.latent_channels and not self.inpainting then
    error(string.format("stable_diffusion: the UNet reads %d channels, the VAE has %d latent channels",
      uc.in_channels, vc.latent_channels), 3)
  end
  local tw = parts.text_encoder and parts.text_encoder.config.width
  if tw and tw ~= uc.cross_attention_dim then
    error(string.format("stable_diffusion: the text encoder is %d wide, the UNet cross-attends to %d",
      tw, uc.cross_attention_dim), 3)
  end
  self:eval()
end

local function as_list(prompt, who)
  if type(prompt) == "string" then return {prompt} end
  if type(prompt) ~= "table" or #prompt == 0 then
    error(who .. ": prompt must be a string or a non-empty list of strings", 3)
  end
  for i, p in ipairs(prompt) do
    if type(p) ~= "string" then error(string.format("%s: prompt[%d] is a %s, not a string", who, i, type(p)), 3) end
  end
  return prompt
end

-- encode_prompt(prompt or list) -> text embeddings [B, 77, X] (the last hidden state)
function Pipeline:encode_prompt(prompt)
  local prompts = as_list(prompt, "encode_prompt")
  if not self.text_encoder or not self.tokenizer then
    error("encode_prompt: this pipeline has no text encoder or tokenizer", 2)
  end
  local ids = self.tokenizer:encode_batch(prompts)             -- i64 [B, 77]
  return keng.no_grad(function() return self.text_encoder(ids) end)
end

-- denoise(latents, cond, uncond, {num_steps = 50, guidance_scale = 7.5, callback =, scheduler =,
-- timesteps =, condition =, after_step =}) -> latents: latents [B, L, h, w] (already times
-- init_noise_sigma), cond [B, S, X], uncond [B, S, X] or nil (no guidance). Each step scales
-- the input as the scheduler says, runs the UNet on uncond and on cond at batch B (with
-- `condition` [B, C, h, w] appended to its input channels: the inpainting UNet's mask and
-- masked-image latents), guides eps = eps_u + g·(eps_c - eps_u) and takes the scheduler's step;
-- after_step(i, latents) -> latents may then edit them. `timesteps` (a tail of the scheduler's,
-- set_timesteps already called) replaces set_timesteps(num_steps): img2img's later start.
function Pipeline:denoise(latents, cond, uncond, opts)
  opts = options.check("denoise", opts, {"guidance_scale", "scheduler", "timesteps", "num_steps", "progress",
    "condition", "after_step", "callback"})
  local g = opts.guidance_scale or 7.5
  local sched = opts.scheduler or self.scheduler
  local ts = opts.timesteps or sched:set_timesteps(opts.num_steps or 50)
  -- progress = nil: a sampling bar on stderr when it is a terminal; true / false: on / off
  local bar = progress.task("sampling", #ts, {enabled = progress.check_option("denoise", opts.progress, 3)})
  return keng.no_grad(function()
    for i, t in ipairs(ts) do
      local xin = sched:scale_model_input(latents, t)
      if opts.condition then
        local cnd = opts.condition
        if cnd.dtype ~= xin.dtype then cnd = cnd:to(xin.dtype) end           -- a bf16 VAE's latents
        xin = keng.cat({xin, cnd}, 2)
      end
      local eps
      if uncond and g ~= 1 then
        local eu = self.unet(xin, t, uncond)                    -- [B, L, h, w]
        local ec = self.unet(xin, t, cond)
        eps = eu + (ec - eu) * g
      else
        eps = self.unet(xin, t, cond)
      end
      if eps.dtype ~= latents.dtype then eps = eps:to(latents.dtype) end   -- a bf16 UNet, f32 latents
      latents = sched:step(eps, t, latents)
      if opts.after_step then latents = opts.after_step(i, latents) end
      if opts.callback then opts.callback(i, t, latents) end
      bar:update(i)
    end
    bar:finish()
    return latents
  end)
end

-- decode_latents(latents [B, L, h, w]) -> u8 images [B, H, W, 3]: VAE decode of latents / scale,
-- [-1, 1] -> [0, 255], rounded
function Pipeline:decode_latents(latents)
  return keng.no_grad(function()
    local img = self.vae:decode(latents / self.scaling_factor):float()  -- [B, 3, H, W]
    img = ((img / 2 + 0.5):clamp(0, 1) * 255 + 0.5):clamp(0, 255)
    return img:permute{1, 3, 4, 2}:contiguous():to("u8")        -- [B, H, W, 3]
  end)
end

-- the scheduler of one call: nil -> the pipeline's; a name (models.schedulers.names) -> that
-- class made from the pipeline's scheduler config (diffusers' Class.from_config); an object as is
function Pipeline:_scheduler(spec, who)
  if spec == nil then return self.scheduler end
  if type(spec) == "string" then
    local s = require("models.schedulers").from_config(spec, self.scheduler.config, 4)   -- blames the user's line
    return s
  end
  if type(spec) ~= "table" or type(spec.step) ~= "function" or type(spec.set_timesteps) ~= "function" then
    error(who .. ": scheduler must be a name or a scheduler object (set_timesteps, step)", 3)
  end
  return spec
end

-- the noise source of one call: opts.randn(shape) -> tensor (tests inject diffusers' draws) or
-- keng.randn on the UNet's device (after seeding with opts.seed)
function Pipeline:_randn(opts)
  if opts.randn then return opts.randn end
  if opts.seed then keng.manual_seed(opts.seed) end
  local device = self.unet.conv_in.weight.device
  return function(shape) return keng.randn(shape, {device = device ~= "meta" and device or nil}) end
end

-- the prompts of one call: B, cond [B, S, X], uncond [B, S, X] or nil, guidance scale
function Pipeline:_text(prompt, opts, who)
  local prompts = as_list(prompt, who)
  local B = opts.batch_size or #prompts
  if math.type(B) ~= "integer" or B < 1 or B % #prompts ~= 0 then
    error(string.format("%s: batch_size %s is not a positive multiple of the %d prompts",
      who, tostring(opts.batch_size), #prompts), 3)
  end
  local per = B // #prompts
  local list = {}
  for _, p in ipairs(prompts) do for _ = 1, per do list[#list + 1] = p end end
  local g = opts.guidance_scale or 7.5
  local cond = self:encode_prompt(list)                         -- [B, S, X]
  local uncond
  if g ~= 1 then
    local neg = opts.negative_prompt or ""
    if type(neg) == "string" then
      local u = self:encode_prompt({neg})                       -- [1, S, X]
      uncond = u:expand{B, u.shape[2], u.shape[3]}:contiguous()
    else
      uncond = self:encode_prompt(neg)
    end
  end
  return B, cond, uncond, g
end

-- text_to_image(prompt or list, {batch_size=, num_steps=50, guidance_scale=7.5, seed=, height=,
-- width=, negative_prompt="", latents=, scheduler=, randn=, progress=}) -> u8 [B, H, W, 3]; progress: a
-- sampling bar on stderr (nil: only when stderr is a terminal, true: always, false: never). A list of P
-- prompts with batch_size B (a multiple of P) makes B/P images per prompt; latents [B, L, h, w]
-- replace the seeded noise; scheduler a name ("euler", "dpmpp_2m_karras", ...) or an object.
local T2I_OPTS = {"batch_size", "num_steps", "num_inference_steps", "guidance_scale", "seed", "height", "width",
  "negative_prompt", "latents", "callback", "scheduler", "randn", "progress"}

function Pipeline:text_to_image(prompt, opts)
  -- image-to-image is img2img, inpainting inpaint: image =, strength =, mask = are refused here
  opts = options.check("text_to_image", opts, T2I_OPTS, nn.Module.user_level(2))
  progress.check_option("text_to_image", opts.progress, 2)
  if self.inpainting then
    error("text_to_image: this UNet reads latents + mask + masked image (an inpainting UNet): use inpaint", 2)
  end
  local f = self.vae_scale
  local sample = self.unet.config.sample_size or 64
  local Hh, Ww = opts.height or sample * f, opts.width or sample * f
  local mult = f * (1 << (#self.unet.config.block_out_channels - 1))
  if Hh % mult ~= 0 or Ww % mult ~= 0 then
    error(string.format("text_to_image: height %d and width %d must be multiples of %d", Hh, Ww, mult), 2)
  end
  local sched = self:_scheduler(opts.scheduler, "text_to_image")
  local B, cond, uncond, g = self:_text(prompt, opts, "text_to_image")
  local latents = opts.latents
  local shape = {B, self.latent_channels, Hh // f, Ww // f}
  local randn = self:_randn(opts)
  if latents then
    if not keng.is_tensor(latents) or latents.ndim ~= 4 or latents.shape[1] ~= B or latents.shape[2] ~= shape[2]
       or latents.shape[3] ~= shape[3] or latents.shape[4] ~= shape[4] then
      error(string.format("text_to_image: latents %s must be %s",
        keng.is_tensor(latents) and shape_str(latents) or type(latents), require("keng.util").shape_str(shape)), 2)
    end
  else
    latents = randn(shape)
  end
  if opts.randn and sched.noise then sched.noise = opts.randn end   -- Euler a's draws too
  local n = opts.num_steps or opts.num_inference_steps or 50
  sched:set_timesteps(n)                                        -- init_noise_sigma may depend on it
  latents = latents * sched.init_noise_sigma
  latents = self:denoise(latents, cond, uncond, {num_steps = n, guidance_scale = g, callback = opts.callback,
    scheduler = sched, progress = opts.progress})
  return self:decode_latents(latents)
end

-- image [H, W, 3] / [B, H, W, 3] u8 (0..255, as keng.image reads) or f32 [B, 3, H, W] in [-1, 1]
-- -> f32 [B', 3, H, W] in [-1, 1] on the UNet's device, B' = 1 or B
function Pipeline:_image(image, B, who, what)
  what = what or "image"
  if not keng.is_tensor(image) then error(string.format("%s: %s must be a tensor, got %s", who, what, type(image)), 3) end
  local x = image
  if x.dtype == "u8" then
    if x.ndim == 3 then x = x:view{1, x.shape[1], x.shape[2], x.shape[3]} end
    if x.ndim ~= 4 or x.shape[4] ~= 3 then
      error(string.format("%s: u8 %s %s must be [H, W, 3] or [B, H, W, 3]", who, what, shape_str(image)), 3)
    end
    x = (x:float() / 255 * 2 - 1):permute{1, 4, 2, 3}:contiguous()   -- diffusers: x/255, then 2x - 1
  elseif x.ndim ~= 4 or x.shape[2] ~= 3 then
    error(string.format("%s: %s %s must be u8 [H, W, 3] / [B, H, W, 3] or float [B, 3, H, W]", who, what,
      shape_str(image)), 3)
  else
    x = x:float()
  end
  if x.shape[1] ~= 1 and x.shape[1] ~= B then
    error(string.format("%s: %s has %d images for a batch of %d", who, what, x.shape[1], B), 3)
  end
  local mult = self.vae_scale * (1 << (#self.unet.config.block_out_channels - 1))
  if x.shape[3] % mult ~= 0 or x.shape[4] % mult ~= 0 then
    error(string.format("%s: %s height %d and width %d must be multiples of %d (keng does not resize)", who, what,
      x.shape[3], x.shape[4], mult), 3)
  end
  local device = self.unet.conv_in.weight.device
  if device ~= "cpu" and device ~= "meta" then x = x:to(device) end
  return x
end

-- encode_image(x [B, 3, H, W] in [-1, 1], randn) -> latents [B, L, h, w]: a sample of the VAE's
-- posterior (mean + std·noise, logvar clamped to [-30, 20] as diffusers) times scaling_factor
function Pipeline:encode_image(x, randn)
  return keng.no_grad(function()
    local m = self.vae:encode(x)                                 -- [B, 2L, h, w]
    local L = self.latent_channels
    local mean, logvar = m:narrow(2, 1, L), m:narrow(2, L + 1, L):clamp(-30, 20)
    local z = mean + (logvar * 0.5):exp() * randn(mean.shape)
    return z * self.scaling_factor
  end)
end

-- the start of image-to-image: the scheduler's timesteps from strength (diffusers' get_timesteps:
-- the last int(n·strength) of them), its begin index set
local function start_timesteps(sched, n, strength, who)
  local ts = sched:set_timesteps(n)
  local N = #ts                                                  -- PNDM has n + 1
  local init = math.min(math.floor(N * strength), N)
  local t_start = math.max(N - init, 0)
  if N - t_start < 1 then
    error(string.format("%s: strength %g with %d steps runs no step", who, strength, n), 3)
  end
  sched:set_begin_index(t_start)
  return table.move(ts, t_start + 1, N, 1, {})
end

-- img2img(prompt or list, image, {strength = 0.8, num_steps = 50, guidance_scale = 7.5, seed=,
-- negative_prompt=, batch_size=, scheduler=, callback=, randn=}) -> u8 [B, H, W, 3]:
-- diffusers' StableDiffusionImg2ImgPipeline: the image's latents noised to the timestep
-- `strength` of the way up, then the last int(num_steps·strength) steps. image: see _image.
local I2I_OPTS = {"strength", "batch_size", "num_steps", "num_inference_steps", "guidance_scale", "seed",
  "negative_prompt", "callback", "scheduler", "randn", "progress"}

function Pipeline:img2img(prompt, image, opts)
  opts = options.check("img2img", opts, I2I_OPTS, nn.Module.user_level(2))
  progress.check_option("img2img", opts.progress, 2)
  if self.inpainting then error("img2img: this is an inpainting UNet: use inpaint", 2) end
  local strength = options.number("img2img", "strength", opts.strength or 0.8, 0, 1)
  local sched = self:_scheduler(opts.scheduler, "img2img")
  local B, cond, uncond, g = self:_text(prompt, opts, "img2img")
  local img = self:_image(image, B, "img2img")
  local randn = self:_randn(opts)
  if opts.randn and sched.noise then sched.noise = opts.randn end
  local run = start_timesteps(sched, opts.num_steps or opts.num_inference_steps or 50, strength, "img2img")
  local x0 = self:encode_image(img, randn)
  if x0.shape[1] ~= B then x0 = x0:expand{B, x0.shape[2], x0.shape[3], x0.shape[4]}:contiguous() end
  local latents = sched:add_noise(x0, randn(x0.shape), run[1])
  latents = self:denoise(latents, cond, uncond, {guidance_scale = g, callback = opts.callback, scheduler = sched,
    timesteps = run, progress = opts.progress})
  return self:decode_latents(latents)
end

-- mask [H, W] / [B, H, W] u8 (255 = repaint) or float [B, 1, H, W] in [0, 1] -> f32 [B', 1, H, W]
-- of 0 and 1 (diffusers binarises at one half)
local function mask_tensor(mask, img, who)
  if not keng.is_tensor(mask) then error(string.format("%s: mask must be a tensor, got %s", who, type(mask)), 3) end
  local m = mask
  if m.dtype == "u8" then
    if m.ndim == 2 then m = m:view{1, m.shape[1], m.shape[2]} end
    if m.ndim ~= 3 then error(string.format("%s: u8 mask %s must be [H, W] or [B, H, W]", who, shape_str(mask)), 3) end
    m = m:float():view{m.shape[1], 1, m.shape[2], m.shape[3]} / 255
  elseif m.ndim ~= 4 or m.shape[2] ~= 1 then
    error(string.format("%s: mask %s must be u8 [H, W] / [B, H, W] or float [B, 1, H, W]", who, shape_str(mask)), 3)
  end
  if m.shape[3] ~= img.shape[3] or m.shape[4] ~= img.shape[4] then
    error(string.format("%s: mask %s is not the image's size %dx%d", who, shape_str(mask), img.shape[3], img.shape[4]), 3)
  end
  if m.shape[1] ~= 1 and m.shape[1] ~= img.shape[1] and img.shape[1] ~= 1 then
    error(string.format("%s: mask has %d images, the image %d", who, m.shape[1], img.shape[1]), 3)
  end
  m = m:float():ge(0.5):float()
  if img.device ~= "cpu" then m = m:to(img.device) end
  return m
end

local function batch(x, B)
  if x.shape[1] == B then return x end
  local s = {B}
  for i = 2, x.ndim do s[i] = x.shape[i] end
  return x:expand(s):contiguous()
end

-- inpaint(prompt or list, image, mask, {strength = 1, num_steps = 50, ...img2img's}) -> u8
-- [B, H, W, 3]: diffusers' StableDiffusionInpaintPipeline. With an inpainting UNet (latents +
-- mask + masked-image latents, 9 channels for SD v1) the mask and the masked image's latents
-- condition every step; with a plain UNet the known region is re-noised to each step's level
-- and blended in (latents = (1 - m)·known + m·latents, m the mask at latent size).
local INP_OPTS = I2I_OPTS

function Pipeline:inpaint(prompt, image, mask, opts)
  opts = options.check("inpaint", opts, INP_OPTS, nn.Module.user_level(2))
  progress.check_option("inpaint", opts.progress, 2)
  local strength = options.number("inpaint", "strength", opts.strength or 1.0, 0, 1)
  local sched = self:_scheduler(opts.scheduler, "inpaint")
  local B, cond, uncond, g = self:_text(prompt, opts, "inpaint")
  local img = self:_image(image, B, "inpaint")
  local m = mask_tensor(mask, img, "inpaint")                     -- [B', 1, H, W] of 0/1
  local randn = self:_randn(opts)
  if opts.randn and sched.noise then sched.noise = opts.randn end
  local run = start_timesteps(sched, opts.num_steps or opts.num_inference_steps or 50, strength, "inpaint")
  -- diffusers' draw order: the image's latents (when needed), the start noise, the masked image's
  local x0
  if not self.inpainting or strength < 1 then x0 = batch(self:encode_image(img, randn), B) end
  local f, L = self.vae_scale, self.latent_channels
  local h, w = img.shape[3] // f, img.shape[4] // f
  local noise = randn({B, L, h, w})
  local latents
  if strength == 1 then latents = noise * sched.init_noise_sigma
  else latents = sched:add_noise(x0, noise, run[1]) end
  local masked = self:encode_image(img * (1 - m), randn)       -- diffusers: image · (mask < 0.5)
  -- the mask at latent size: nearest (F.interpolate's default) with an integer factor f = every f-th pixel
  local ml = m:view{m.shape[1], 1, h, f, w, f}:narrow(4, 1, 1):narrow(6, 1, 1):contiguous():view{m.shape[1], 1, h, w}
  ml, masked = batch(ml, B), batch(masked, B)
  local dopts = {guidance_scale = g, callback = opts.callback, scheduler = sched, timesteps = run,
    progress = opts.progress}
  if self.inpainting then
    dopts.condition = keng.cat({ml, masked}, 2)                  -- [B, 1 + L, h, w]
  else
    dopts.after_step = function(i, lat)
      local known = x0
      if i < #run then known = sched:add_noise(x0, noise, run[i + 1]) end
      return known * (1 - ml) + lat * ml
    end
  end
  latents = self:denoise(latents, cond, uncond, dopts)
  return self:decode_latents(latents)
end

-- forward(prompt, opts) = text_to_image
function Pipeline:forward(prompt, opts) return self:text_to_image(prompt, opts) end

-- LoRA files (diffusers/PEFT or kohya layout) merged into the UNet and text encoder weights:
-- pipe:load_lora(path, {scale = 1}), pipe:unload_lora() (models/lora_files.lua)
function Pipeline:load_lora(path, opts)
  local ok, e = pcall(require("models.lora_files").load, self, path, opts)
  if not ok then error(tostring(e):gsub("^[^:]*:%d+: ", ""), 2) end
  return self
end
function Pipeline:unload_lora() return require("models.lora_files").unload(self) end

-- save_pretrained(dir, {max_shard_size = "5GB"}): the diffusers layout (model_index.json, unet/,
-- vae/, text_encoder/, tokenizer/, scheduler/) that from_pretrained here and diffusers'
-- StableDiffusionPipeline.from_pretrained read (models.hf_save)
function Pipeline:save_pretrained(dir, opts) return require("models.hf_save").pipeline(self, dir, opts, 2) end

---------------------------------------------------------------------------------------------
-- construction and loading

local function load_tokenizer(spec, vocab)
  if type(spec) == "table" then return spec end
  if type(spec) == "string" then return require("models.clip").tokenizer(spec) end
  return ByteTokenizer.new(vocab)
end

-- from_preset("sd_tiny" | "stable_diffusion_v1", {dtype=, device=, tokenizer= dir or object,
-- seed=}) -> Pipeline with random weights; on device="meta" shapes only (for counting).
-- Without a tokenizer the prompt is tokenized byte by byte (the weights are random anyway).
function M.from_preset(name, opts)
  opts = options.check("stable_diffusion.from_preset", opts, {"dtype", "device", "tokenizer", "seed"})
  local p = common.preset("stable_diffusion.from_preset", M.presets, name, 2)
  if opts.seed then keng.manual_seed(opts.seed) end
  local o = {dtype = opts.dtype, device = opts.device}
  local clip = require "models.clip"
  local te = clip.from_preset(p.text_encoder, o)
  local unet = U.from_preset(p.unet, o)
  local vae = V.from_preset(p.vae, o)
  return Pipeline({text_encoder = te, unet = unet, vae = vae, scheduler = DDIM.new(),
    tokenizer = load_tokenizer(opts.tokenizer, te.config.vocab)})
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

-- from_pretrained(dir, {dtype=, device=}) -> Pipeline from the diffusers layout: unet/, vae/,
-- text_encoder/, tokenizer/ (each with its files), scheduler/scheduler_config.json (optional:
-- SD v1's DDIM otherwise; its _class_name picks the class: models.schedulers.by_class)
function M.from_pretrained(dir, opts)
  opts = options.check("stable_diffusion.from_pretrained", opts, {"dtype", "device"})
  local o = {dtype = opts.dtype, device = opts.device}
  for _, part in ipairs{"unet", "vae", "text_encoder", "tokenizer"} do
    local probe = part == "tokenizer" and (exists(dir .. "/tokenizer/tokenizer.json") and "/tokenizer.json" or "/vocab.json") or "/config.json"
    if not exists(dir .. "/" .. part .. probe) then
      error(string.format("stable_diffusion.from_pretrained: missing %s/%s%s", dir, part, probe), 2)
    end
  end
  local function load(fn, ...)
    local ok, r = pcall(fn, ...)
    if not ok then error("stable_diffusion.from_pretrained: " .. tostring(r), 3) end
    return r
  end
  local clip = require "models.clip"
  local te = load(clip.from_pretrained, dir .. "/text_encoder", o)
  local tok = load(clip.tokenizer, dir .. "/tokenizer")
  local unet = load(U.from_pretrained, dir .. "/unet", o)
  local vae = load(V.from_pretrained, dir .. "/vae", o)
  -- the scheduler its config names (PNDM for SD v1.x, ...; DDIM when there is none)
  local sched = DDIM.new()
  if exists(dir .. "/scheduler/scheduler_config.json") then
    local j = U.read_config(dir .. "/scheduler", "stable_diffusion.from_pretrained", 2,
      "scheduler_config.json")  -- errors name the file
    local ok, s = pcall(require("models.schedulers").from_diffusers_config, j)
    if not ok then error("stable_diffusion.from_pretrained: scheduler/scheduler_config.json: " .. tostring(s), 2) end
    sched = s
  end
  local ok, pipe = pcall(Pipeline, {text_encoder = te, tokenizer = tok, unet = unet, vae = vae, scheduler = sched})
  if not ok then error(tostring(pipe), 2) end
  return pipe
end

return M
