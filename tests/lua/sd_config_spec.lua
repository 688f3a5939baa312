-- sd_config_spec.lua — scheduler and model config keys that change the numbers are implemented
-- or refused by name. DDIM against diffusers' DDIMScheduler (tests/fixtures/gen/gen_ddim.py):
-- trailing / linspace spacing with numpy's round-half-to-even, rescale_betas_zero_snr,
-- clip_sample, trained_betas, the cosine schedule; unknown scheduler keys and thresholding raise.
local keng = require "keng"
local H = require "helper"
local json = require "keng.json"
local sd = require "models.stable_diffusion"

local read = H.read

describe("DDIM against diffusers", function()
  local cases = json.decode(read("tests/fixtures/sd/ddim_configs.json"))

  it("timesteps, alphas_cumprod and one step match for every config", function()
    for i, case in ipairs(cases) do
      local cfg = {}
      for k, v in pairs(case.config) do if v ~= json.null then cfg[k] = v end end
      local s = sd.DDIM.new(cfg)
      local ts = s:set_timesteps(case.steps)
      local name = string.format("case %d (%s)", i, json.encode(case.config))
      assert.are.same(case.timesteps, ts, name .. ": timesteps")
      local ac = {}
      for j, t in ipairs(ts) do ac[j] = s:alpha_bar(t) end
      -- diffusers makes betas and their cumprod in f32, keng in double: 1e-6 covers it
      H.close(ac, case.alphas_cumprod, 1e-6, name .. ": alphas_cumprod")
      H.close(s.final_alpha_cumprod, case.final_alpha_cumprod, 1e-6, name .. ": final alpha")
      local x = keng.tensor({1, 2, 3, 4}, {dtype = "f64"}):reshape{1, 1, 2, 2}
      local eps = keng.tensor({0.5, -1, 0.25, 2}, {dtype = "f64"}):reshape{1, 1, 2, 2}
      H.close(s:step(eps, ts[1], x):reshape{-1}, case.step, 1e-6, name .. ": step")
    end
  end)

  it("rounds ties to even as numpy", function()
    assert.are.same({0, 2, 2, 4, -2, -2}, {sd.round_half_even(0.5), sd.round_half_even(1.5), sd.round_half_even(2.5),
      sd.round_half_even(3.5), sd.round_half_even(-1.5), sd.round_half_even(-2.5)})
    assert.equal(3, sd.round_half_even(2.6))
  end)

  it("refuses unknown keys and thresholding", function()
    H.raises(function() sd.DDIM.new({variance_type = "learned"}) end,
      "DDIM: unknown scheduler config key 'variance_type' (known: beta_end")
    H.raises(function() sd.DDIM.new({thresholding = true}) end, "DDIM: thresholding (dynamic thresholding) is not supported")
    H.raises(function() sd.DDIM.new({beta_schedule = "sigmoid"}) end, "DDIM: unsupported beta_schedule sigmoid")
    H.raises(function() sd.DDIM.new({trained_betas = {0.1, 0.2}}) end, "trained_betas must be a list of num_train_timesteps")
    H.raises(function() sd.DDIM.new({prediction_type = "sample"}) end, "unsupported prediction_type sample")
  end)
end)
