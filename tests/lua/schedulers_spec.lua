-- schedulers_spec.lua — models.schedulers against diffusers (tests/fixtures/sd_sched, written by
-- tests/fixtures/gen/gen_schedulers.py): for each case the timesteps, sigmas and init_noise_sigma,
-- then a replay of diffusers' loop on a fixed sample and fixed fake model outputs
-- (out_i = eps[i] + 0.1·scaled input, so errors feed back): every scale_model_input and every
-- step's output; Euler ancestral with diffusers' noise plugged into s.noise; add_noise at the
-- 4th timestep after set_begin_index (img2img's start); bad configs refused by name.
-- Tolerances (H.close, |a-b|/(1+|b|)): timesteps exact except Karras's read-back ones (1e-4: a
-- float32 log-interpolation in diffusers); sigmas 1e-5 and samples 1e-5: keng computes the sigma
-- table in f64, diffusers in f32 (1 - abar near t = 0 loses ~1e-4 relative in f32, but those
-- sigmas are ~0.03, so |a-b| stays ~3e-6). Worst observed: 2.2e-6 (Karras sigmas, whose ends are
-- diffusers' f32 sigma_min/max), 1.9e-6 on samples (PNDM); below 1e-7 nothing passes.
local keng = require "keng"
local H = require "helper"
local S = require "models.schedulers"
local common = require "models.common"

local FIX = "tests/fixtures/sd_sched"
local gold = keng.load(FIX .. "/golden.safetensors")
local cases = common.read_json(FIX .. "/configs.json", "schedulers_spec", 1)

local NAME = {euler = "euler", euler_leading = "euler", euler_karras = "euler", euler_a = "euler_a",
  dpmpp_2m_karras = "dpmpp_2m_karras", dpmpp_2m = "dpmpp_2m", pndm = "pndm", lms = "lms", lms_leading = "lms"}

local function tolist(t) return H.flat(t) end

describe("schedulers against diffusers", function()
  local order = {}
  for k in pairs(NAME) do order[#order + 1] = k end
  table.sort(order)
  for _, case in ipairs(order) do
    it(case .. ": timesteps, sigmas and every step", function()
      local c = cases[case]
      assert.is_not_nil(c, case)
      local s = S.from_config(NAME[case], c.config)
      local ts = s:set_timesteps(c.num_steps)
      H.close(ts, gold[case .. "_timesteps"], case:find("karras") and 1e-4 or 0, case .. " timesteps")
      if gold[case .. "_sigmas"] then H.close(s.sigmas, gold[case .. "_sigmas"], 1e-5, case .. " sigmas") end
      H.close(s.init_noise_sigma, gold[case .. "_init_sigma"], 1e-6, case .. " init_noise_sigma")
      if case == "euler_a" then
        local k = 0
        s.noise = function(shape)
          k = k + 1
          assert.are.same({1, 4, 4, 4}, shape)
          return gold.euler_a_noise[k]
        end
      end
      local x = gold.sample0 * s.init_noise_sigma
      local scaled, outs = gold[case .. "_scaled"], gold[case .. "_out"]
      for i, t in ipairs(gold[case .. "_timesteps"]:tolist()) do
        local xin = s:scale_model_input(x, t)
        H.close(xin, scaled[i], 1e-5, case .. " scaled input at step " .. i)
        x = s:step(gold.eps[i] + xin * 0.1, t, x)
        H.close(x, outs[i], 1e-5, case .. " step " .. i)
      end
      -- img2img's start: noise added at the 4th timestep
      s:set_timesteps(c.num_steps)
      s:set_begin_index(3)
      H.close(s:add_noise(gold.sample0, gold.eps[1], ts[4]), gold[case .. "_add"], 1e-5, case .. " add_noise")
    end)
  end
end)

describe("scheduler configs", function()
  it("reads a pipeline's PNDM scheduler_config.json and makes any scheduler from it", function()
    local j = {_class_name = "PNDMScheduler", beta_end = 0.012, beta_schedule = "scaled_linear", beta_start = 0.00085,
      num_train_timesteps = 1000, set_alpha_to_one = false, skip_prk_steps = true, steps_offset = 1, clip_sample = false}
    assert.are.equal("pndm", S.from_diffusers_config(j).name)
    for _, n in ipairs(S.names) do assert.is_not_nil(S.from_config(n, j), n) end
    -- SDXL's Euler config carries keys only other classes read (diffusers ignores them)
    local xl = {_class_name = "EulerDiscreteScheduler", beta_end = 0.012, beta_schedule = "scaled_linear",
      beta_start = 0.00085, clip_sample = false, interpolation_type = "linear", num_train_timesteps = 1000,
      prediction_type = "epsilon", sample_max_value = 1.0, set_alpha_to_one = false, skip_prk_steps = true,
      steps_offset = 1, timestep_spacing = "leading", use_karras_sigmas = false}
    local e = S.from_diffusers_config(xl)
    assert.are.equal("euler", e.name)
    assert.are.same({801.0, 601.0, 401.0, 201.0, 1.0}, e:set_timesteps(5))
    assert.are.equal("dpmpp_2m_karras", S.from_diffusers_config({_class_name = "DPMSolverMultistepScheduler",
      use_karras_sigmas = true}).name)
  end)

  it("refuses keys that change the numbers, naming them", function()
    H.raises(function() S.new("euler", {use_exponential_sigmas = true}) end,
      "schedulers.euler: config use_exponential_sigmas = true is not supported")
    H.raises(function() S.new("euler", {clip_sample = false}) end, "schedulers.euler: unknown config key 'clip_sample'")
    H.raises(function() S.new("pndm", {skip_prk_steps = false}) end, "config skip_prk_steps = false is not supported")
    H.raises(function() S.new("dpmpp_2m", {algorithm_type = "sde-dpmsolver++"}) end,
      "config algorithm_type = \"sde-dpmsolver++\" is not supported")
    H.raises(function() S.new("dpmpp_2m", {solver_order = 3}) end, "solver_order = 3 is not supported (1 or 2)")
    H.raises(function() S.new("lms", {prediction_type = "sample"}) end, "prediction_type = sample is not supported")
    H.raises(function() S.from_config("euler", {beta_sart = 0.1}) end, "unknown scheduler config key 'beta_sart'")
    H.raises(function() S.new("heun") end, "unknown scheduler 'heun' (known: ddim, dpmpp_2m, dpmpp_2m_karras, euler")
    -- the errors blame the caller's line, through from_config too
    for _, f in ipairs{function() S.new("dpmpp_2m", {solver_order = 3}) end,
                       function() S.from_config("dpmpp_2m", {solver_order = 3}) end,
                       function() S.from_config("euler", {foo = 1}) end,
                       function() S.new("lms", {beta_schedule = "cosine"}) end} do
      H.raises(f, "schedulers_spec.lua:")
    end
    H.raises(function() S.from_config("euler", {foo = 1}) end, "(valid: beta_end, beta_schedule")
    H.raises(function() S.from_diffusers_config({_class_name = "HeunDiscreteScheduler"}) end,
      "unsupported scheduler class HeunDiscreteScheduler")
  end)

  it("names misuse: steps before set_timesteps, a foreign timestep, a bad step count", function()
    local s = S.new("euler")
    H.raises(function() s:step(gold.eps[1], 999, gold.sample0) end, "schedulers.euler: call set_timesteps before step")
    s:set_timesteps(4)
    H.raises(function() s:scale_model_input(gold.sample0, 5) end, "timestep 5 is not one of set_timesteps' timesteps")
    H.raises(function() s:set_timesteps(0) end, "num_steps must be an integer in [1, 1000], got 0")
  end)

  it("integrates LMS coefficients exactly (the Lagrange basis sums to the interval length)", function()
    local s = S.new("lms")
    s:set_timesteps(10)
    for i = 4, 10 do
      local sum = 0
      for k = 0, 3 do sum = sum + s:coefficient(4, i, k) end
      assert.is_true(math.abs(sum - (s.sigmas[i + 1] - s.sigmas[i])) < 1e-12)
    end
  end)
end)
