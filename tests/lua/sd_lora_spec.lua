-- sd_lora_spec.lua — LoRA files merged into Stable Diffusion's UNet and text encoder
-- (scripts/models/lora_files.lua), against diffusers' load_lora_weights + set_adapters on the tiny
-- pipeline: a PEFT adapter file saved by diffusers (alpha in its header metadata) and the same
-- matrices in kohya's layout (alpha tensors), at scales 1 and 0.5 (tests/fixtures/sd_lora,
-- written by tests/fixtures/gen/gen_sd_lora.py).
local keng = require "keng"
local H = require "helper"
local sd = require "models.stable_diffusion"
local unet_m = require "models.unet"
local vae_m = require "models.vae"
local clip = require "models.clip"
local lora_files = require "models.lora_files"

local FIX = "tests/fixtures/sd_lora"

local function parts()
  return {unet = unet_m.from_pretrained("tests/fixtures/sd/unet"),
          text_encoder = clip.from_pretrained("tests/fixtures/clip/text_encoder")}
end

local function hidden(te, ids)
  local out = keng.no_grad(function() return te(ids) end)
  return keng.is_tensor(out) and out or out.last_hidden_state
end

-- kohya's layout of the fixture's adapters, as gen_sd_lora.py wrote it for diffusers (alpha 6;
-- the text encoder under transformers 4's text_model names) -> a temporary file's path
local function kohya_file()
  local out = {}
  for k, v in pairs(keng.load(FIX .. "/diffusers.safetensors")) do
    local part, mod, which = k:match("^(%a+_?%a*)%.(.-)%.lora_([AB])%.weight$")   -- unet | text_encoder
    local prefix = part == "unet" and "lora_unet_" or "lora_te_text_model_"
    local name = prefix .. mod:gsub("%.", "_")
    out[name .. (which == "A" and ".lora_down.weight" or ".lora_up.weight")] = v
    out[name .. ".alpha"] = keng.tensor(6.0)
  end
  local path = os.tmpname() .. ".safetensors"
  keng.save(path, out)
  return path
end

-- loads the named layout into p, the kohya file removed after
local function load_layout(p, name, opts)
  if name ~= "kohya" then return lora_files.load(p, FIX .. "/diffusers.safetensors", opts) end
  local path = kohya_file()
  local ok, e = pcall(lora_files.load, p, path, opts)
  os.remove(path)
  assert(ok, e)
end

local function outputs(p)
  local g = keng.load("tests/fixtures/sd/golden.safetensors")
  local L = keng.load(FIX .. "/golden.safetensors")
  local eps = keng.no_grad(function() return p.unet(g.unet_latents, g.unet_t, g.unet_context) end)
  return eps, hidden(p.text_encoder, L.ids), L
end

describe("LoRA files against diffusers", function()
  -- merged (W + s·α/r·BA) vs diffusers' unmerged adapters: f32 rounding only, which these strong
  -- random adapters amplify through the UNet (diffusers' own fuse_lora moves its eps by 1.4e-4;
  -- an f64 run is 5e-5 from the f32 golden); a wrong alpha or scale moves it by ~1
  for _, name in ipairs{"diffusers", "kohya"} do
    for _, s in ipairs{1, 0.5} do
      it(string.format("merges the %s layout at scale %g (UNet and text encoder)", name, s), function()
        local p = parts()
        load_layout(p, name, {scale = s})
        local eps, te, L = outputs(p)
        H.close(eps, L[string.format("%s_unet_eps_%g", name, s)], 3e-4, "unet eps")
        H.close(te, L[string.format("%s_te_%g", name, s)], 1e-5, "text encoder")
      end)
    end
  end

  it("reads the older diffusers names (lora.down / lora.up, attention processors, .alpha tensors)", function()
    -- the PEFT file's matrices renamed to the layouts diffusers wrote before PEFT: same result
    local t = keng.load(FIX .. "/diffusers.safetensors")
    local old = {}
    for k, v in pairs(t) do
      local mod, which = k:match("^(.-)%.lora_([AB])%.weight$")
      local down = which == "A" and "down" or "up"
      local m2 = mod:gsub("%.(to_[qkv])$", ".processor.%1_lora"):gsub("%.to_out%.0$", ".processor.to_out_lora")
      if m2 ~= mod then
        old[m2 .. "." .. down .. ".weight"] = v
        old[m2 .. ".alpha"] = keng.tensor(8.0)
      elseif mod:match("^text_encoder") then
        old[mod .. ".lora_linear_layer." .. down .. ".weight"] = v
        old[mod .. ".alpha"] = keng.tensor(8.0)
      else
        old[mod .. ".lora." .. down .. ".weight"] = v
        old[mod .. ".alpha"] = keng.tensor(8.0)
      end
    end
    local path = os.tmpname() .. ".safetensors"
    keng.save(path, old)
    local p = parts()
    lora_files.load(p, path)
    os.remove(path)
    local eps, te, L = outputs(p)
    H.close(eps, L.diffusers_unet_eps_1, 3e-4, "unet eps")
    H.close(te, L.diffusers_te_1, 1e-5, "text encoder")
  end)

  it("loads through the pipeline and unloads to the very weights it had", function()
    local p = parts()
    local pipe = sd.Pipeline({unet = p.unet, text_encoder = p.text_encoder, vae = vae_m.from_pretrained("tests/fixtures/sd/vae")})
    local before = p.unet.down_blocks[0].resnets[0].conv1.weight:clone()
    local q_before = p.text_encoder.text_model.encoder.layers[0].self_attn.q_proj.weight:clone()
    local path = kohya_file()
    assert.are.equal(pipe, pipe:load_lora(path))
    os.remove(path)
    pipe:load_lora(FIX .. "/diffusers.safetensors", {scale = 0.5})  -- stacks on the first
    assert.is_true((p.unet.down_blocks[0].resnets[0].conv1.weight - before):abs():max():item() > 1e-3)
    pipe:unload_lora()
    assert.are.equal(0, (p.unet.down_blocks[0].resnets[0].conv1.weight - before):abs():max():item())
    assert.are.equal(0, (p.text_encoder.text_model.encoder.layers[0].self_attn.q_proj.weight - q_before):abs():max():item())
    local _, te, L = outputs(p)
    H.close(te, L.base_te, 1e-5, "base text encoder")
  end)
end)

describe("LoRA file errors", function()
  local function file(tensors, meta)
    local path = os.tmpname() .. ".safetensors"
    keng.save(path, tensors, meta)
    return path
  end
  local A, B = keng.randn({4, 8}), keng.randn({8, 4})
  local Q = "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"

  it("names keys of no known layout, missing modules, a missing half and bad shapes", function()
    local p = parts()
    local f = file({["model.diffusion_model.foo.weight"] = A})
    H.raises(function() lora_files.load(p, f) end, "keys of no LoRA layout known (diffusers/PEFT, kohya), e.g. 'model.diffusion_model.foo.weight'")
    f = file({["unet.nowhere.lora_A.weight"] = A, ["unet.nowhere.lora_B.weight"] = B})
    H.raises(function() lora_files.load(p, f) end, "the unet has no module 'nowhere'")
    f = file({[Q .. ".lora_A.weight"] = A})
    H.raises(function() lora_files.load(p, f) end, "has lora_A (down) but not lora_B (up)")
    f = file({[Q .. ".lora_A.weight"] = keng.randn({4, 9}), [Q .. ".lora_B.weight"] = B})
    H.raises(function() lora_files.load(p, f) end, "lora_A [4,9] and lora_B [8,4] do not fit the weight [8,8]")
    f = file({["lora_te_text_model_encoder_layers_0_mlp_fc1.lora_down.weight"] = A,
              ["lora_te_text_model_encoder_layers_0_mlp_fc1.lora_up.weight"] = B})
    H.raises(function() lora_files.load({unet = p.unet}, f) end, "has text_encoder adapters, the target has no text_encoder")
    f = file({[Q .. ".lora_A.weight"] = A, [Q .. ".lora_B.weight"] = B},
             {lora_adapter_metadata = '{"unet.use_dora": true, "unet.r": 4}'})
    H.raises(function() lora_files.load(p, f) end, "unet.use_dora (DoRA) is not supported")
    f = file({[Q .. ".lora_A.weight"] = A, [Q .. ".lora_B.weight"] = B},
             {lora_adapter_metadata = '{"unet.alpha_pattern": {"to_q": 2}, "unet.r": 4}'})
    H.raises(function() lora_files.load(p, f) end, "unet.alpha_pattern (per-module alpha/rank) is not supported")
    f = file({[Q .. ".lora_A.weight"] = A, [Q .. ".lora_B.weight"] = B}, {lora_adapter_metadata = "{oops"})
    H.raises(function() lora_files.load(p, f) end, "unreadable lora_adapter_metadata")
    H.raises(function() lora_files.load(p, 42) end, "path must be a string")
  end)

  it("changes nothing when a file is refused, and checks its options", function()
    local p = parts()
    local before = p.unet.down_blocks[0].attentions[0].transformer_blocks[0].attn1.to_q.weight:clone()
    local f = file({[Q .. ".lora_A.weight"] = A, [Q .. ".lora_B.weight"] = B, ["unet.nowhere.lora_A.weight"] = A,
                    ["unet.nowhere.lora_B.weight"] = B})
    H.raises(function() lora_files.load(p, f) end, "no module 'nowhere'")
    assert.are.equal(0, (p.unet.down_blocks[0].attentions[0].transformer_blocks[0].attn1.to_q.weight - before):abs():max():item())
    H.raises(function() lora_files.load(p, FIX .. "/diffusers.safetensors", {weight = 1}) end, "unknown option 'weight'")
    H.raises(function() lora_files.load(p, "tests/fixtures/sd_lora/none.safetensors") end, "none.safetensors")
  end)
end)
