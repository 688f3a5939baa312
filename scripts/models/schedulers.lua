-- models.schedulers — the samplers Stable Diffusion users pick, each matching its diffusers class
-- step for step (tests/lua/schedulers_spec.lua replays diffusers' goldens):
--
--   name              diffusers class                     what it is
--   "euler"           EulerDiscreteScheduler               Karras et al. 2022's Euler on sigmas
--   "euler_a"         EulerAncestralDiscreteScheduler      Euler with fresh noise each step
--   "dpmpp_2m"        DPMSolverMultistepScheduler          DPM-Solver++ 2M (Lu et al. 2022)
--   "dpmpp_2m_karras" the same, use_karras_sigmas = true   (the "DPM++ 2M Karras" of UIs)
--   "pndm"            PNDMScheduler (skip_prk_steps)       Liu et al. 2022's PLMS, SD v1's default
--   "lms"             LMSDiscreteScheduler                 linear multistep on sigmas
--   "ddim"            DDIMScheduler                        models.stable_diffusion's DDIM (eta 0)
--
--   local S = require "models.schedulers"
--   local s = S.new("euler", cfg)        -- cfg: the class's scheduler_config.json keys (strict)
--   local s = S.from_config("euler", pipe_cfg)  -- another class's config, as diffusers' from_config:
--                                        -- keys only other classes read are dropped
--   local ts = s:set_timesteps(20)       -- descending timesteps (numbers; Euler/LMS may be fractional)
--   x = x * s.init_noise_sigma
--   for _, t in ipairs(ts) do x = s:step(unet(s:scale_model_input(x, t), t, ctx), t, x) end
--
-- Each scheduler keeps diffusers' step index: the first scale_model_input/step after set_timesteps
-- finds t in the timesteps (the second of two equal ones, as diffusers), or starts at
-- set_begin_index(i) (img2img); each step advances it. Euler ancestral's noise comes from
-- s.noise(shape, x) (keng.randn by default; a test plugs in diffusers' noise).
-- Coefficients are computed in f64 from the config; diffusers computes its sigma tables in f32,
-- so schedules agree to ~1e-6 relative, not bit for bit.
local keng = require "keng"
local options = require "keng.options"
local common = require "models.common"

local M = {}

-- SD v1's training schedule (what every SD v1 scheduler_config.json says)
M.SD_V1 = {num_train_timesteps = 1000, beta_start = 0.00085, beta_end = 0.012, beta_schedule = "scaled_linear",
           steps_offset = 1, prediction_type = "epsilon"}

local SHARED = {"num_train_timesteps", "beta_start", "beta_end", "beta_schedule", "trained_betas", "prediction_type",
                "timestep_spacing", "steps_offset", "rescale_betas_zero_snr"}
local function keys(extra)
  local k = {}
  for _, n in ipairs(SHARED) do k[n] = true end
  for _, n in ipairs(extra) do k[n] = true end
  return k
end

-- each class: its diffusers name, config keys, the defaults of its class, and the keys keng
-- implements at one value only (options.config rules)
local SIGMA_EXTRA = {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas"}
local CLASSES = {
  euler = {class = "EulerDiscreteScheduler",
    keys = keys{"interpolation_type", "sigma_min", "sigma_max", "timestep_type", "final_sigmas_type",
                table.unpack(SIGMA_EXTRA)},
    rules = {interpolation_type = "linear", timestep_type = "discrete", final_sigmas_type = "zero",
             use_exponential_sigmas = false, use_beta_sigmas = false, rescale_betas_zero_snr = false,
             sigma_min = options.ABSENT, sigma_max = options.ABSENT}},
  euler_a = {class = "EulerAncestralDiscreteScheduler", keys = keys{},
    rules = {rescale_betas_zero_snr = false}},
  dpmpp_2m = {class = "DPMSolverMultistepScheduler",
    keys = keys{"solver_order", "thresholding", "dynamic_thresholding_ratio", "sample_max_value", "algorithm_type",
                "solver_type", "lower_order_final", "euler_at_final", "use_lu_lambdas", "use_flow_sigmas",
                "flow_shift", "final_sigmas_type", "lambda_min_clipped", "variance_type", "use_dynamic_shifting",
                "time_shift_type", "sigma_min", "sigma_max", table.unpack(SIGMA_EXTRA)},
    rules = {algorithm_type = "dpmsolver++", thresholding = false, use_lu_lambdas = false, use_flow_sigmas = false,
             final_sigmas_type = "zero", variance_type = options.ABSENT, use_dynamic_shifting = false,
             use_exponential_sigmas = false, use_beta_sigmas = false, rescale_betas_zero_snr = false,
             sigma_min = options.ABSENT, sigma_max = options.ABSENT},
    ignored = {dynamic_thresholding_ratio = true, sample_max_value = true, flow_shift = true,   -- read only by
               time_shift_type = true}},                                                     -- refused modes
  pndm = {class = "PNDMScheduler", keys = keys{"skip_prk_steps", "set_alpha_to_one"},
    rules = {skip_prk_steps = true, rescale_betas_zero_snr = false}},
  lms = {class = "LMSDiscreteScheduler", keys = keys{table.unpack(SIGMA_EXTRA)},
    rules = {use_exponential_sigmas = false, use_beta_sigmas = false, rescale_betas_zero_snr = false}},
}
CLASSES.dpmpp_2m_karras = CLASSES.dpmpp_2m
M.classes = CLASSES

-- the class defaults of diffusers (from_config fills what a config lacks with these)
local DEFAULTS = {
  euler = {timestep_spacing = "linspace", steps_offset = 0, use_karras_sigmas = false},
  euler_a = {timestep_spacing = "linspace", steps_offset = 0},
  dpmpp_2m = {timestep_spacing = "linspace", steps_offset = 0, use_karras_sigmas = false, solver_order = 2,
              solver_type = "midpoint", lower_order_final = true, euler_at_final = false,
              lambda_min_clipped = -math.huge},
  pndm = {timestep_spacing = "leading", steps_offset = 0, set_alpha_to_one = false},
  lms = {timestep_spacing = "linspace", steps_offset = 0, use_karras_sigmas = false},
}
DEFAULTS.dpmpp_2m_karras = common.overlay(DEFAULTS.dpmpp_2m, {use_karras_sigmas = true})

-- diffusers' _class_name -> keng's name
M.by_class = {EulerDiscreteScheduler = "euler", EulerAncestralDiscreteScheduler = "euler_a",
  DPMSolverMultistepScheduler = "dpmpp_2m", PNDMScheduler = "pndm", LMSDiscreteScheduler = "lms",
  DDIMScheduler = "ddim"}

local function sorted_names(t)
  local n = {}
  for k in pairs(t) do n[#n + 1] = k end
  table.sort(n)
  return n
end
M.names = sorted_names(common.overlay(CLASSES, {ddim = true}))

-- numpy's round (half to even)
local function round(x)
  local f = math.floor(x)
  local d = x - f
  if d > 0.5 or (d == 0.5 and f % 2 == 1) then return f + 1 end
  return f
end
-- x rounded to f32 (numpy's float32 timesteps)
local function f32(x) return (string.unpack("f", string.pack("f", x))) end

-- alphas_cumprod[t + 1], t = 0..N-1, of config c (betas as diffusers builds them)
-- (level: error()'s, from this function)
local function alphas_cumprod(c, who, level)
  level = level or 2
  local N = c.num_train_timesteps
  local betas = c.trained_betas
  if betas ~= nil then
    if type(betas) ~= "table" or #betas ~= N then
      error(string.format("%s: trained_betas must be a list of num_train_timesteps = %d numbers", who, N), level)
    end
  else
    betas = {}
    for i = 0, N - 1 do
      if c.beta_schedule == "scaled_linear" then
        local s, e = math.sqrt(c.beta_start), math.sqrt(c.beta_end)
        betas[i + 1] = (s + (e - s) * i / (N - 1)) ^ 2
      elseif c.beta_schedule == "linear" then
        betas[i + 1] = c.beta_start + (c.beta_end - c.beta_start) * i / (N - 1)
      elseif c.beta_schedule == "squaredcos_cap_v2" then
        local function abar(t) return math.cos((t + 0.008) / 1.008 * math.pi / 2) ^ 2 end
        betas[i + 1] = math.min(1 - abar((i + 1) / N) / abar(i / N), 0.999)
      else
        error(string.format("%s: unsupported beta_schedule %s (scaled_linear, linear, squaredcos_cap_v2 or " ..
          "trained_betas)", who, tostring(c.beta_schedule)), level)
      end
    end
  end
  local ac, prod = {}, 1.0
  for i, b in ipairs(betas) do prod = prod * (1 - b); ac[i] = prod end
  return ac
end
M.alphas_cumprod = alphas_cumprod

---------------------------------------------------------------------------------------------
-- the shared part: config, step index, sigma tables

local Base = {}
Base.__index = Base

local function check_config(name, cfg, level)
  local C = CLASSES[name]
  local who = "schedulers." .. name
  options.check(who, cfg, C.keys, level, "config key")
  local c = common.overlay(common.overlay(M.SD_V1, DEFAULTS[name]), cfg)
  options.config(who, c, C.rules, level)
  if c.prediction_type ~= "epsilon" and c.prediction_type ~= "v_prediction" then
    error(string.format("%s: config prediction_type = %s is not supported (epsilon or v_prediction)", who,
      tostring(c.prediction_type)), level)
  end
  for _, sp in ipairs{"linspace", "leading", "trailing"} do if c.timestep_spacing == sp then return c end end
  error(string.format("%s: config timestep_spacing = %s is not supported (linspace, leading or trailing)", who,
    tostring(c.timestep_spacing)), level)
end

local impl = {}   -- name -> metatable

-- new(name, cfg) -> a scheduler; cfg holds the keys of that diffusers class (others refused by
-- name); a missing key takes SD v1's training schedule (betas) or the class's default
function M.new(name, cfg, level)
  level = level or 2
  if name == "ddim" then return require("models.stable_diffusion").DDIM.new(cfg) end
  if not CLASSES[name] then
    error(string.format("schedulers: unknown scheduler '%s' (known: %s)", tostring(name), table.concat(M.names, ", ")),
      level)
  end
  cfg = cfg or {}
  local c = check_config(name, cfg, level + 1)
  if name == "dpmpp_2m_karras" and cfg.use_karras_sigmas == false then
    error("schedulers.dpmpp_2m_karras: config use_karras_sigmas = false contradicts the name (use dpmpp_2m)", level)
  end
  local s = setmetatable({name = name, config = c, who = "schedulers." .. name,
    num_train_timesteps = c.num_train_timesteps}, impl[name])
  s.alphas_cumprod = alphas_cumprod(c, s.who, level + 1)
  s.noise = function(shape, like)
    local d = like.device
    return keng.randn(shape, {device = d ~= "cpu" and d or nil}):to(like.dtype)
  end
  s:init(level + 1)
  return s
end

-- from_config(name, cfg): cfg from another scheduler class (a pipeline's scheduler_config.json),
-- as diffusers' Class.from_config: keys that only the other SD schedulers read are dropped, and
-- the class's defaults fill the rest. Keys no scheduler knows are still refused.
function M.from_config(name, cfg, level)
  level = level or 2
  if name == "ddim" then
    local DDIM_KEYS = require("models.stable_diffusion").DDIM_KEYS
    local c = {}
    for k, v in pairs(cfg or {}) do if DDIM_KEYS[k] and k:sub(1, 1) ~= "_" then c[k] = v end end
    local s = M.new("ddim", c, level + 1)   -- not a tail call: error levels count this frame
    return s
  end
  local C = CLASSES[name]
  if not C then
    local s = M.new(name, cfg, level + 1)
    return s
  end
  local any = {}
  for _, K in pairs(CLASSES) do for k in pairs(K.keys) do any[k] = true end end
  for k in pairs(require("models.stable_diffusion").DDIM_KEYS) do any[k] = true end
  local c = {}
  for k, v in pairs(cfg or {}) do
    if C.keys[k] then c[k] = v
    elseif not any[k] and k:sub(1, 1) ~= "_" then
      local valid = sorted_names(C.keys)
      error(string.format("schedulers.%s: unknown scheduler config key '%s' (valid: %s)", name, tostring(k),
        table.concat(valid, ", ")), level)
    end
  end
  local s = M.new(name, c, level + 1)
  return s
end

-- from_diffusers_config(j) -> the scheduler of a diffusers scheduler_config.json table (its _class_name)
function M.from_diffusers_config(j, level)
  level = level or 2
  local name = M.by_class[j._class_name or "DDIMScheduler"]
  if not name then
    error(string.format("schedulers: unsupported scheduler class %s (supported: %s)", tostring(j._class_name),
      table.concat(sorted_names(M.by_class), ", ")), level)
  end
  if name == "dpmpp_2m" and j.use_karras_sigmas then name = "dpmpp_2m_karras" end
  -- as diffusers loads it: keys of the other SD schedulers (SD v1.x's PNDM config carries
  -- clip_sample, SDXL's Euler config skip_prk_steps, ...) are not read by this class
  local s = M.from_config(name, j, level + 1)
  return s
end

function Base:set_begin_index(i) self.begin_index = i end

-- the 1-based index of timestep t (the second of two equal ones: diffusers' rule, so img2img
-- starting on a repeated timestep does not skip a sigma)
function Base:index_for_timestep(t)
  local found
  for i, v in ipairs(self.timesteps) do
    if v == t then
      if found then return i end
      found = i
    end
  end
  if not found then
    error(string.format("%s: timestep %s is not one of set_timesteps' timesteps", self.who, tostring(t)), 3)
  end
  return found
end

function Base:_index(t)
  if not self.timesteps then error(self.who .. ": call set_timesteps before step", 3) end
  if not self.step_index then
    self.step_index = self.begin_index and self.begin_index + 1 or self:index_for_timestep(t)
  end
  return self.step_index
end

-- sigma schedulers: sqrt((1 - abar) / abar) at every training timestep, ascending t
function Base:sigma_table()
  local t = {}
  for i, a in ipairs(self.alphas_cumprod) do t[i] = math.sqrt((1 - a) / a) end
  return t
end

-- np.interp(t, arange(N), table)
local function interp(t, tab)
  local N = #tab
  if t <= 0 then return tab[1] end
  if t >= N - 1 then return tab[N] end
  local lo = math.floor(t)
  local w = t - lo
  return tab[lo + 1] * (1 - w) + tab[lo + 2] * w
end

-- diffusers' _sigma_to_t: the fractional training timestep whose log-sigma is log(sigma)
local function sigma_to_t(sigma, log_sigmas)
  local ls = math.log(math.max(sigma, 1e-10))
  local N, low = #log_sigmas, 0
  for i = 1, N do if ls - log_sigmas[i] >= 0 then low = i - 1 end end
  low = math.min(low, N - 2)
  local lo, hi = log_sigmas[low + 1], log_sigmas[low + 2]
  local w = math.min(math.max((lo - ls) / (lo - hi), 0), 1)
  return (1 - w) * low + w * (low + 1)
end

-- Karras et al.'s rho = 7 ramp from sigma_max down to sigma_min over n values
local function karras(smax, smin, n)
  local rho = 7.0
  local a, b = smax ^ (1 / rho), smin ^ (1 / rho)
  local out = {}
  for i = 0, n - 1 do
    local r = n > 1 and i / (n - 1) or 0
    out[i + 1] = (a + r * (b - a)) ^ rho
  end
  return out
end

local function check_steps(self, n)
  if math.type(n) ~= "integer" or n < 1 or n > self.num_train_timesteps then
    error(string.format("%s: num_steps must be an integer in [1, %d], got %s", self.who, self.num_train_timesteps,
      tostring(n)), 3)
  end
end

-- the timesteps of Euler / Euler a / LMS (descending, f32 values as numpy's)
local function sigma_spacing(self, n)
  local c, N, ts = self.config, self.num_train_timesteps, {}
  if c.timestep_spacing == "linspace" then
    local step = n > 1 and (N - 1) / (n - 1) or 0               -- numpy: i * step
    for i = n - 1, 0, -1 do ts[#ts + 1] = f32(i * step) end
  elseif c.timestep_spacing == "leading" then
    local ratio = N // n
    for i = n - 1, 0, -1 do ts[#ts + 1] = (i * ratio + c.steps_offset) + 0.0 end
  else
    local ratio = N / n
    for i = 0, n - 1 do ts[#ts + 1] = round(N - i * ratio) - 1.0 end
  end
  return ts
end

-- Euler / Euler a / LMS set_timesteps: sigmas interpolated at the timesteps (or Karras's ramp, the
-- timesteps then read back from it), then a final 0
local function set_sigma_timesteps(self, n)
  check_steps(self, n)
  local tab = self:sigma_table()
  local ts = sigma_spacing(self, n)
  local sig = {}
  for i, t in ipairs(ts) do sig[i] = interp(t, tab) end
  if self.config.use_karras_sigmas then
    sig = karras(sig[1], sig[#sig], n)
    local logs = {}
    for i, v in ipairs(tab) do logs[i] = math.log(v) end
    for i, v in ipairs(sig) do ts[i] = f32(sigma_to_t(v, logs)) end
  end
  sig[#sig + 1] = 0.0
  self.timesteps, self.sigmas, self.num_inference_steps = ts, sig, n
  self.step_index, self.begin_index = nil, nil
  local smax = sig[1]
  for _, v in ipairs(sig) do smax = math.max(smax, v) end
  -- diffusers: max sigma for linspace / trailing spacing, sqrt(max^2 + 1) for leading
  self.init_noise_sigma = self.config.timestep_spacing == "leading" and math.sqrt(smax * smax + 1) or smax
  return ts
end

-- x0 from the model output at sigma (the k-diffusion parametrisation x = x0 + sigma·eps)
local function x0_at_sigma(self, out, x, sigma)
  if self.config.prediction_type == "v_prediction" then
    return out * (-sigma / math.sqrt(sigma * sigma + 1)) + x / (sigma * sigma + 1)
  end
  return x - out * sigma
end

-- scale_model_input for sigma schedulers: x / sqrt(sigma^2 + 1), the UNet's unit-variance input
local function sigma_scale(self, x, t)
  local sigma = self.sigmas[self:_index(t)]
  return x / math.sqrt(sigma * sigma + 1)
end

-- the sigma index add_noise uses, as diffusers: t's own without a begin index, else the current
-- step (inpainting re-noises the known region during the loop), else the begin index
function Base:_noise_index(t)
  if not self.begin_index then return self:index_for_timestep(t) end
  return self.step_index or self.begin_index + 1
end

-- add_noise(x0, noise, t) (img2img's start): x0 + sigma·noise at t
local function sigma_add_noise(self, x0, noise, t)
  return x0 + noise * self.sigmas[self:_noise_index(t)]
end

-- add_noise for alpha schedulers: sqrt(abar_t)·x0 + sqrt(1 - abar_t)·noise
local function alpha_add_noise(self, x0, noise, t)
  local a = self.alphas_cumprod[math.tointeger(t) + 1]
  return x0 * math.sqrt(a) + noise * math.sqrt(1 - a)
end
M.alpha_add_noise = alpha_add_noise

local function class(name, methods)
  local mt = setmetatable(methods, {__index = Base})
  mt.__index = mt
  impl[name] = mt
  return mt
end

---------------------------------------------------------------------------------------------
-- Euler (eps schedulers as an ODE in sigma: x' = (x - x0)/sigma)

local Euler = class("euler", {init = function() end, set_timesteps = set_sigma_timesteps,
  scale_model_input = sigma_scale, add_noise = sigma_add_noise})

function Euler:step(out, t, x)
  local i = self:_index(t)
  local sigma, nxt = self.sigmas[i], self.sigmas[i + 1]
  local x0 = x0_at_sigma(self, out, x, sigma)
  local d = (x - x0) / sigma
  self.step_index = i + 1
  return x + d * (nxt - sigma)
end

---------------------------------------------------------------------------------------------
-- Euler ancestral: an Euler step down to sigma_down, then noise of std sigma_up back up to the
-- next sigma (sigma_down^2 + sigma_up^2 = sigma_next^2)

local EulerA = class("euler_a", {init = function() end, set_timesteps = set_sigma_timesteps,
  scale_model_input = sigma_scale, add_noise = sigma_add_noise})

function EulerA:step(out, t, x)
  local i = self:_index(t)
  local sf, st = self.sigmas[i], self.sigmas[i + 1]
  local x0 = x0_at_sigma(self, out, x, sf)
  local up = math.sqrt(st * st * (sf * sf - st * st) / (sf * sf))
  local down = math.sqrt(st * st - up * up)
  local prev = x + (x - x0) / sf * (down - sf)
  local noise = self.noise(x.shape, x)
  self.step_index = i + 1
  return prev + noise * up
end

---------------------------------------------------------------------------------------------
-- LMS: x_{i+1} = x_i + sum_k c_k · d_{i-k}, c_k the integral over [sigma_i, sigma_{i+1}] of the
-- Lagrange basis polynomial of the last `order` sigmas (diffusers integrates with scipy's quad;
-- the integrand is a polynomial of degree < 4, which 3-point Gauss-Legendre integrates exactly)

local LMS = class("lms", {init = function() end, scale_model_input = sigma_scale, add_noise = sigma_add_noise})

function LMS:set_timesteps(n)
  self.derivatives = {}
  return set_sigma_timesteps(self, n)
end

local GL = {{-math.sqrt(3 / 5), 5 / 9}, {0, 8 / 9}, {math.sqrt(3 / 5), 5 / 9}}

-- the coefficient of derivative `cur` (0 = newest) at step index i (1-based), `order` points
function LMS:coefficient(order, i, cur)
  local s = self.sigmas
  local function basis(tau)
    local p = 1.0
    for k = 0, order - 1 do
      if k ~= cur then p = p * (tau - s[i - k]) / (s[i - cur] - s[i - k]) end
    end
    return p
  end
  local a, b = s[i], s[i + 1]
  local mid, half, sum = (a + b) / 2, (b - a) / 2, 0.0
  for _, q in ipairs(GL) do sum = sum + q[2] * basis(mid + half * q[1]) end
  return sum * half
end

function LMS:step(out, t, x, order)
  order = order or 4
  local i = self:_index(t)
  local sigma = self.sigmas[i]
  local d = (x - x0_at_sigma(self, out, x, sigma)) / sigma
  table.insert(self.derivatives, d)
  if #self.derivatives > order then table.remove(self.derivatives, 1) end
  order = math.min(i, order)                             -- diffusers: min(step_index + 1, order), 0-based
  local prev = x
  local nd = #self.derivatives
  for k = 0, math.min(order, nd) - 1 do                  -- zip(coeffs, reversed(derivatives))
    prev = prev + self.derivatives[nd - k] * self:coefficient(order, i, k)
  end
  self.step_index = i + 1
  return prev
end

---------------------------------------------------------------------------------------------
-- DPM-Solver++ (2M): in lambda = log(alpha/sigma) time, a first-order step from the data
-- prediction, then second-order steps with the previous prediction's difference

local DPM = class("dpmpp_2m", {init = function(self, level)
  local c = self.config
  if c.solver_order ~= 1 and c.solver_order ~= 2 then
    error(string.format("%s: config solver_order = %s is not supported (1 or 2)", self.who, tostring(c.solver_order)),
      level)
  end
  if c.solver_type ~= "midpoint" and c.solver_type ~= "heun" then
    error(string.format("%s: config solver_type = %s is not supported (midpoint or heun)", self.who,
      tostring(c.solver_type)), level)
  end
  if c.lambda_min_clipped ~= -math.huge and c.lambda_min_clipped ~= nil then
    error(string.format("%s: config lambda_min_clipped = %s is not supported (keng implements -inf only)", self.who,
      tostring(c.lambda_min_clipped)), level)
  end
end})
impl.dpmpp_2m_karras = DPM

function DPM:set_timesteps(n)
  check_steps(self, n)
  local c, N = self.config, self.num_train_timesteps
  local ts = {}
  if c.timestep_spacing == "linspace" then
    local step = (N - 1) / n
    for i = n, 1, -1 do ts[#ts + 1] = round(i * step) end
  elseif c.timestep_spacing == "leading" then
    local ratio = N // (n + 1)
    for i = n, 1, -1 do ts[#ts + 1] = i * ratio + c.steps_offset end
  else
    local ratio = N / n
    for i = 0, n - 1 do ts[#ts + 1] = round(N - i * ratio) - 1 end
  end
  local tab = self:sigma_table()
  local sig = {}
  if c.use_karras_sigmas then
    sig = karras(tab[N], tab[1], n)
    local logs = {}
    for i, v in ipairs(tab) do logs[i] = math.log(v) end
    for i, v in ipairs(sig) do ts[i] = round(sigma_to_t(v, logs)) end
  else
    for i, t in ipairs(ts) do sig[i] = interp(t, tab) end
  end
  sig[#sig + 1] = 0.0
  self.timesteps, self.sigmas, self.num_inference_steps = ts, sig, #ts
  self.model_outputs, self.lower_order_nums = {}, 0
  self.step_index, self.begin_index = nil, nil
  self.init_noise_sigma = 1.0
  return ts
end

function DPM:scale_model_input(x) return x end

-- alpha_t, sigma_t and lambda of a k-diffusion sigma
local function als(sigma)
  local a = 1 / math.sqrt(sigma * sigma + 1)
  local s = sigma * a
  return a, s, math.log(a) - math.log(s)
end

function DPM:add_noise(x0, noise, t)
  local a, s = als(self.sigmas[self:_noise_index(t)])
  return x0 * a + noise * s
end

function DPM:step(out, t, x)
  local c = self.config
  local i = self:_index(t)
  local n = #self.timesteps
  local last = i == n and (c.euler_at_final or (c.lower_order_final and n < 15) or c.final_sigmas_type == "zero")
  local a_s, s_s = als(self.sigmas[i])
  local m0
  if c.prediction_type == "v_prediction" then m0 = x * a_s - out * s_s
  else m0 = (x - out * s_s) / a_s end                     -- the data prediction x0
  local prev_m = self.model_outputs[2]
  self.model_outputs = {prev_m, m0}
  local a_t, s_t, l_t = als(self.sigmas[i + 1])
  local _, _, l_s = als(self.sigmas[i])
  local h = l_t - l_s
  local em1 = math.exp(-h) - 1
  local res
  if c.solver_order == 1 or self.lower_order_nums < 1 or last then
    res = x * (s_t / s_s) - m0 * (a_t * em1)
  else
    local _, _, l_s1 = als(self.sigmas[i - 1])
    local r0 = (l_s - l_s1) / h
    local D1 = (m0 - self.model_outputs[1]) * (1 / r0)
    if c.solver_type == "midpoint" then
      res = x * (s_t / s_s) - m0 * (a_t * em1) - D1 * (0.5 * a_t * em1)
    else
      res = x * (s_t / s_s) - m0 * (a_t * em1) + D1 * (a_t * (em1 / h + 1))
    end
  end
  if self.lower_order_nums < c.solver_order then self.lower_order_nums = self.lower_order_nums + 1 end
  self.step_index = i + 1
  return res
end

---------------------------------------------------------------------------------------------
-- PNDM with skip_prk_steps (SD v1's default): PLMS, Adams-Bashforth on eps with DDIM-like
-- transfers; the first step is repeated (a 2nd-order start), so n steps run n + 1 UNet calls

local PNDM = class("pndm", {init = function(self)
  self.final_alpha_cumprod = self.config.set_alpha_to_one and 1.0 or self.alphas_cumprod[1]
  self.init_noise_sigma = 1.0
end, add_noise = alpha_add_noise})

function PNDM:set_timesteps(n)
  check_steps(self, n)
  local c, N = self.config, self.num_train_timesteps
  local asc = {}
  if c.timestep_spacing == "linspace" then
    local step = n > 1 and (N - 1) / (n - 1) or 0
    for i = 0, n - 1 do asc[#asc + 1] = round(i * step) end
  elseif c.timestep_spacing == "leading" then
    for i = 0, n - 1 do asc[#asc + 1] = i * (N // n) + c.steps_offset end
  else
    for i = n - 1, 0, -1 do asc[#asc + 1] = round(N - i * N / n) - 1 end
  end
  -- ascending [t1 .. t_{n-1}, t_{n-1}, t_n] reversed: the largest first, the 2nd largest twice
  local ts = {asc[n]}
  if n > 1 then ts[2] = asc[n - 1] end
  for i = n - 1, 1, -1 do ts[#ts + 1] = asc[i] end
  self.timesteps, self.num_inference_steps = ts, n
  self.ets, self.counter, self.cur_sample = {}, 0, nil
  self.step_index, self.begin_index = nil, nil
  return ts
end

function PNDM:scale_model_input(x) return x end

function PNDM:_prev_sample(x, t, prev, eps)
  local a = self.alphas_cumprod[t + 1]
  local ap = prev >= 0 and self.alphas_cumprod[prev + 1] or self.final_alpha_cumprod
  if self.config.prediction_type == "v_prediction" then eps = eps * math.sqrt(a) + x * math.sqrt(1 - a) end
  local denom = a * math.sqrt(1 - ap) + math.sqrt(a * (1 - a) * ap)
  return x * math.sqrt(ap / a) - eps * ((ap - a) / denom)
end

function PNDM:step(out, t, x)
  if not self.timesteps then error(self.who .. ": call set_timesteps before step", 2) end
  t = math.tointeger(t) or error(self.who .. ": timestep must be an integer, got " .. tostring(t), 2)
  local ratio = self.num_train_timesteps // self.num_inference_steps
  local prev = t - ratio
  local ets = self.ets
  if self.counter ~= 1 then
    while #ets > 3 do table.remove(ets, 1) end
    ets[#ets + 1] = out
  else
    prev, t = t, t + ratio
  end
  local eps
  if #ets == 1 and self.counter == 0 then
    eps, self.cur_sample = out, x
  elseif #ets == 1 and self.counter == 1 then
    eps = (out + ets[1]) / 2
    x, self.cur_sample = self.cur_sample, nil
  elseif #ets == 2 then
    eps = (ets[2] * 3 - ets[1]) / 2
  elseif #ets == 3 then
    eps = (ets[3] * 23 - ets[2] * 16 + ets[1] * 5) / 12
  else
    eps = (ets[4] * 55 - ets[3] * 59 + ets[2] * 37 - ets[1] * 9) / 24
  end
  self.counter = self.counter + 1
  return self:_prev_sample(x, t, prev, eps)
end

return M
