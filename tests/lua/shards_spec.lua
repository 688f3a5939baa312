-- shards_spec.lua — sharded diffusers and transformers checkpoints (an index .json naming the
-- shard files) for the UNet, VAE and CLIP text encoder: the VAE and text encoder as diffusers /
-- transformers save them with a small max_shard_size (tests/fixtures/sd_sharded, written by
-- tests/fixtures/gen/gen_shards.py), the UNet split here the same way; each must load to the
-- same tensors as the unsharded fixture.
local keng = require "keng"
local json = require "keng.json"
local H = require "helper"
local common = require "models.common"
local U = require "models.unet"
local V = require "models.vae"
local clip = require "models.clip"

local FIX = "tests/fixtures/"

-- every tensor of a equals b's of the same name, bit for bit, and the names agree
local function same_state(a, b, what)
  local sa, sb, n = a:state_dict(), b:state_dict(), 0
  for k, t in pairs(sa) do
    assert.is_truthy(sb[k], what .. ": " .. k .. " missing")
    H.close(t, sb[k], 0, what .. " " .. k)
    n = n + 1
  end
  for k in pairs(sb) do assert.is_truthy(sa[k], what .. ": extra " .. k) end
  assert.is_true(n > 10, what .. ": " .. n .. " tensors")
end

describe("sharded checkpoints", function()
  it("a diffusers VAE (diffusion_pytorch_model.safetensors.index.json) loads as the whole file", function()
    local f = io.open(FIX .. "sd_sharded/vae/diffusion_pytorch_model.safetensors", "rb")
    assert.is_nil(f)                                                -- only the index and its shards
    same_state(V.from_pretrained(FIX .. "sd_sharded/vae"), V.from_pretrained(FIX .. "sd/vae"), "vae")
  end)

  -- split(src, file, prefix, fn): src's weight file split in two shards with an index named as
  -- diffusers / transformers name them, in a temporary copy of src (config.json too); fn(dir, sd)
  local function split(src, file, prefix, fn)
    local sd = keng.load(src .. "/" .. file)
    local names = {}
    for k in pairs(sd) do names[#names + 1] = k end
    table.sort(names)
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p '" .. dir .. "' && cp " .. src .. "/config.json '" .. dir .. "/'"))
    local shards, map = {{}, {}}, {}
    for i, k in ipairs(names) do
      local s = i <= #names // 2 and 1 or 2
      shards[s][k] = sd[k]
      map[k] = string.format("%s-%05d-of-00002.safetensors", prefix, s)
    end
    for s = 1, 2 do keng.save(string.format("%s/%s-%05d-of-00002.safetensors", dir, prefix, s), shards[s]) end
    local f = assert(io.open(dir .. "/" .. prefix .. ".safetensors.index.json", "wb"))
    f:write(json.encode({metadata = {total_size = 0}, weight_map = map}))
    f:close()
    local ok, err = pcall(fn, dir, sd, names)
    os.execute("rm -rf '" .. dir .. "'")
    assert(ok, err)
  end

  it("a transformers text encoder (model.safetensors.index.json) loads as the whole file", function()
    local src = FIX .. "clip/text_encoder"
    split(src, "model.safetensors", "model", function(dir)
      same_state(clip.from_pretrained(dir), clip.from_pretrained(src), "text encoder")
    end)
  end)

  it("a UNet split into two shards with diffusers' index layout loads as the whole file", function()
    local src = FIX .. "sd/unet"
    split(src, "diffusion_pytorch_model.safetensors", "diffusion_pytorch_model", function(dir, sd, names)
      same_state(U.from_pretrained(dir), U.from_pretrained(src), "unet")
      -- common.load_tensors finds the diffusers index in a directory too
      local t = common.load_tensors(dir, "spec", 1)
      H.close(t[names[1]], sd[names[1]], 0, "load_tensors")
    end)
  end)

  it("a directory without weights names what it looked for", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p '" .. dir .. "'"))
    local ok, err = pcall(common.load_tensors, dir, "spec", 1)
    os.execute("rm -rf '" .. dir .. "'")
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("spec: ", 1, true), err)
    assert.is_truthy(tostring(err):find("model.safetensors", 1, true), err)
  end)
end)
