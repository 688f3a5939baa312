-- dtype_auto_spec.lua — from_pretrained's dtype = "auto" (the default) keeps a checkpoint's dtype
-- for BERT, CLIP, UNet, VAE, SAM and a whole Stable Diffusion pipeline, as transformers' dtype =
-- "auto" does: config.json's dtype / torch_dtype when present, else the weights'. The bf16
-- checkpoints are the f32 fixtures rounded to bf16 (what save_pretrained of a bf16 model writes).
local keng = require "keng"
local json = require "keng.json"

local FIX = "tests/fixtures/"
local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- bf16_copy(src, dst, weights, cfg_dtype): dst/config.json = src's with dtype = cfg_dtype (json.null
-- drops the key; nil leaves it as it is), dst/weights = src's tensors rounded to bf16
local function bf16_copy(src, dst, weights, cfg_dtype)
  assert(os.execute("mkdir -p " .. q(dst)))
  local f = assert(io.open(src .. "/config.json", "rb"))
  local j = json.decode(f:read("a"))
  f:close()
  if cfg_dtype == json.null then j.dtype, j.torch_dtype = nil, nil elseif cfg_dtype then j.dtype = cfg_dtype end
  f = assert(io.open(dst .. "/config.json", "wb"))
  f:write(json.encode(j))
  f:close()
  local sd = keng.load(src .. "/" .. weights)
  local out = {}
  for k, t in pairs(sd) do out[k] = (t.dtype == "f32") and t:to("bf16") or t end
  keng.save(dst .. "/" .. weights, out)
  return dst, out
end

local function dtypes(m)
  local seen = {}
  for _, t in pairs(m:state_dict()) do seen[t.dtype] = true end
  local l = {}
  for d in pairs(seen) do l[#l + 1] = d end
  table.sort(l)
  return table.concat(l, ",")
end

local tmp
before_each(function() tmp = os.tmpname() os.remove(tmp) end)
after_each(function() os.execute("rm -rf " .. q(tmp)) end)

local CASES = {
  {"bert", FIX .. "bert", "model.safetensors", "bfloat16"},
  {"clip", FIX .. "clip/text_encoder", "model.safetensors", "bfloat16"},
  {"sam", FIX .. "sam", "model.safetensors", "bfloat16"},
  {"unet", FIX .. "sd/unet", "diffusion_pytorch_model.safetensors"},
  {"vae", FIX .. "sd/vae", "diffusion_pytorch_model.safetensors"},
}

describe("dtype = \"auto\"", function()
  for _, c in ipairs(CASES) do
    local name, src, weights, cfg_dtype = c[1], c[2], c[3], c[4]
    local M = require("models." .. name)
    it(name .. ": a bf16 checkpoint stays bf16 (default and \"auto\"), values unchanged; dtype = \"f32\" converts", function()
      local dir, sd = bf16_copy(src, tmp, weights, cfg_dtype)
      local m = M.from_pretrained(dir)
      assert.are.equal("bf16", dtypes(m))
      assert.are.equal("bf16", dtypes(M.from_pretrained(dir, {dtype = "auto"})))
      assert.are.equal("f32", dtypes(M.from_pretrained(dir, {dtype = "f32"})))
      local back = m:state_dict()
      local n = 0
      for k, orig in pairs(sd) do                                  -- checkpoint names -> keng's
        local kk = name == "bert" and M.hf_name(k) or k
        local t = kk and (back[kk] or back["text_model." .. kk])
        if t then
          assert.are.equal(0, (t:float() - orig:float()):abs():max():item(), k)
          n = n + 1
        end
      end
      assert.is_true(n > 10, name .. ": compared only " .. n .. " tensors")
    end)
    it(name .. ": an f32 checkpoint stays f32", function()
      assert.are.equal("f32", dtypes(M.from_pretrained(src)))
    end)
  end

  it("reads config.json's dtype first (transformers), the weights' when it has none", function()
    local bert = require "models.bert"
    bf16_copy(FIX .. "bert", tmp, "model.safetensors", "float32")   -- bf16 weights, config says float32
    assert.are.equal("f32", dtypes(bert.from_pretrained(tmp)))
    bf16_copy(FIX .. "bert", tmp, "model.safetensors", json.null)   -- no dtype key: the weights'
    assert.are.equal("bf16", dtypes(bert.from_pretrained(tmp)))
    bf16_copy(FIX .. "bert", tmp, "model.safetensors", "float8_e4m3fn")
    local ok, err = pcall(bert.from_pretrained, tmp)
    assert.is_false(ok)
    assert.matches("bert.from_pretrained: config.json dtype 'float8_e4m3fn' is not one keng stores", err, 1, true)
  end)

  it("from_preset with weights keeps their dtype too (bert, clip, sam), as the causal LMs' does", function()
    for _, c in ipairs{{"bert", "bert_tiny"}, {"clip", "sd_tiny_text"}, {"sam", "sam_tiny"}} do
      local M = require("models." .. c[1])
      keng.manual_seed(4)
      local m = M.from_preset(c[2])
      local sd = {}
      for k, t in pairs(m:state_dict()) do sd[k] = t:to("bf16") end
      local path = tmp .. ".safetensors"
      keng.save(path, sd)
      local back = M.from_preset(c[2], {weights = path})
      assert.are.equal("bf16", dtypes(back), c[1])
      assert.are.equal("f32", dtypes(M.from_preset(c[2], {weights = path, dtype = "f32"})), c[1])
      assert.are.equal("f32", dtypes(M.from_preset(c[2], {dtype = "auto"})), c[1])   -- random weights: f32
      for k, t in pairs(back:state_dict()) do assert.are.equal(0, (t:float() - sd[k]:float()):abs():max():item(), k) end
      os.remove(path)
    end
  end)

  it("a Stable Diffusion pipeline keeps each part's dtype", function()
    local sd = require "models.stable_diffusion"
    bf16_copy(FIX .. "sd/unet", tmp .. "/unet", "diffusion_pytorch_model.safetensors")
    bf16_copy(FIX .. "sd/vae", tmp .. "/vae", "diffusion_pytorch_model.safetensors")
    bf16_copy(FIX .. "clip/text_encoder", tmp .. "/text_encoder", "model.safetensors", "bfloat16")
    assert(os.execute("cp -r " .. q(FIX .. "clip/tokenizer") .. " " .. q(tmp .. "/tokenizer")))
    local pipe = sd.from_pretrained(tmp)
    for _, part in ipairs{"unet", "vae", "text_encoder"} do assert.are.equal("bf16", dtypes(pipe[part]), part) end
    pipe = sd.from_pretrained(tmp, {dtype = "f32"})
    for _, part in ipairs{"unet", "vae", "text_encoder"} do assert.are.equal("f32", dtypes(pipe[part]), part) end
  end)
end)
