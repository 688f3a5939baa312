-- models.common — the scaffolding model files share: a config over its defaults with the checks
-- every Transformer encoder needs, preset lookup with the valid names in its message, a model
-- directory's config.json and tensors, and the token-id range check. Errors name `who` ("bert",
-- "clip.from_pretrained") and point `level` frames up, as error() does (1 = the function that
-- called the helper).
local json = require "keng.json"

local M = {}

-- overlay(base, over) -> a new table with base's fields, then over's (over may be nil); a shallow
-- copy, so nested tables are shared with base and over
function M.overlay(base, over)
  local c = {}
  for k, v in pairs(base) do c[k] = v end
  for k, v in pairs(over or {}) do c[k] = v end
  return c
end

-- encoder_config(who, defaults, cfg, activations, width_key, level) -> defaults overlaid by cfg,
-- with cfg.activation a key of activations and cfg[width_key] a multiple of cfg.heads
function M.encoder_config(who, defaults, cfg, activations, width_key, level)
  local c = M.overlay(defaults, cfg)
  if not activations[c.activation] then
    error(who .. ": unknown activation '" .. tostring(c.activation) .. "'", level + 1)
  end
  if c[width_key] % c.heads ~= 0 then
    error(string.format("%s: %s %d does not split into %d heads", who, width_key, c[width_key], c.heads), level + 1)
  end
  return c
end

-- preset(who, presets, name, level) -> presets[name], or an error listing the valid names
function M.preset(who, presets, name, level)
  local p = presets[name]
  if p then return p end
  local names = {}
  for k in pairs(presets) do names[#names + 1] = k end
  table.sort(names)
  error(string.format("%s: unknown preset '%s' (valid: %s)", who, tostring(name), table.concat(names, ", ")), level + 1)
end

-- read_json(path, who, level) -> the object (or array) in the JSON file at path, nil when the
-- file cannot be opened, and the set of its top-level keys whose value is null. JSON null reads
-- as absent (a config's "head_dim": null is no key, so defaults apply); the second value tells
-- the few keys whose null differs from absent (Mistral's "sliding_window": null is no window,
-- absent is transformers' default 4096). Malformed JSON, or a value that is not an object,
-- raises "who: path: why".
function M.read_json(path, who, level)
  local f = io.open(path, "rb")
  if not f then return nil end
  local text = f:read(64 * 1024 * 1024 + 1)  -- capped: a config is KBs; /dev/zero must not read forever
  f:close()
  if not text or #text > 64 * 1024 * 1024 then
    error(string.format("%s: %s: %s", who, path, text and "larger than 64 MiB" or "empty or not a readable file"), level + 1)
  end
  local ok, j = pcall(json.decode, text, {null_as_nil = true})
  if ok and type(j) ~= "table" then ok, j = false, "not a JSON object" end
  if not ok then error(string.format("%s: %s: %s", who, path, tostring(j)), level + 1) end
  local nulls = {}
  if text:find("null", 1, true) then                               -- rare: decode once more, nulls kept
    for k, v in pairs(json.decode(text)) do
      if v == json.null then nulls[k] = true end
    end
  end
  return j, nulls
end

-- inside(dir, path, who, level) -> path, refused when it is a symlink resolving outside the
-- model directory dir (in a Hugging Face cache snapshot: outside the repository's folder), the
-- rule of the shards of an index and the tokenizer files (docs/security.md)
function M.inside(dir, path, who, level)
  local real, root = require("keng").path_escapes(dir, path)
  if real then
    error(string.format("%s: %s resolves to '%s', outside the model directory '%s' (a symlink leaving it is refused)",
      who, path, real, root), level + 1)
  end
  return path
end

-- read_config(dir, who, level) -> the object decoded from dir/config.json (read_json)
function M.read_config(dir, who, level)
  local j, nulls = M.read_json(M.inside(dir, dir .. "/config.json", who, level + 1), who, level + 1)
  if not j then error(who .. ": no config.json in " .. dir, level + 1) end
  return j, nulls
end

-- the weight files a model directory may hold, in the order they are looked for: transformers'
-- names, then diffusers' (UNet, VAE), each whole or sharded (an index .json naming the shards)
local WEIGHT_FILES = {"model.safetensors", "model.safetensors.index.json", "diffusion_pytorch_model.safetensors",
                      "diffusion_pytorch_model.safetensors.index.json"}

local function is_dir(path)
  local f = io.open(path, "rb")
  if not f then return false end
  local ok, _, code = f:read(1)
  f:close()
  return ok == nil and code == 21                                   -- EISDIR
end

-- weights_path(path) -> the file to load: path itself, or in a directory the first of
-- WEIGHT_FILES that exists (nil, and path for keng.load's own message, when none does)
function M.weights_path(path)
  if not is_dir(path) then return path end
  for _, name in ipairs(WEIGHT_FILES) do
    local f = io.open(path .. "/" .. name, "rb")
    if f then
      f:close()
      return path .. "/" .. name
    end
  end
  return path
end

-- load_tensors(path, who, level) -> keng.load of a .safetensors file, a sharded index, or a
-- directory (its model[.safetensors|.safetensors.index.json] or
-- diffusion_pytorch_model[...] — WEIGHT_FILES), its error raised as "who: why". (keng is
-- required here, not at the top, so that the config readers above load in a bare Lua state:
-- tests/fuzz/fuzz_config.c.)
function M.load_tensors(path, who, level)
  local file = M.weights_path(path)
  if file ~= path then M.inside(path, file, who, level + 1) end     -- a file found in the directory path
  local ok, t = pcall(require("keng.progress").loading, file, function() return require("keng").load(file) end)
  if not ok then error(who .. ": " .. tostring(t), level + 1) end
  return t
end

-- transformers' dtype names -> keng's
local HF_DTYPES = {float32 = "f32", float = "f32", bfloat16 = "bf16", float16 = "f16", half = "f16", float64 = "f64"}

-- checkpoint_dtype(j, tensors, who, level) -> the dtype that dtype = "auto" keeps, as
-- transformers' dtype = "auto": config.json's dtype (transformers 5) or torch_dtype
-- (transformers 4) when present, else the dtype of the first floating tensor by name (not a
-- quantized layer's weight_scale, whose dtype is the format's: docs/quantization.md)
function M.checkpoint_dtype(j, tensors, who, level)
  local name = j and (j.dtype or j.torch_dtype)
  if name ~= nil then
    local d = HF_DTYPES[name]
    if not d then
      error(string.format("%s: config.json dtype '%s' is not one keng stores (float32, bfloat16, float16, float64)",
        who, tostring(name)), level + 1)
    end
    return d
  end
  local names = {}
  for k, t in pairs(tensors) do
    if (t.dtype == "f32" or t.dtype == "bf16" or t.dtype == "f16" or t.dtype == "f64") and not k:find("weight_scale$") then
      names[#names + 1] = k
    end
  end
  table.sort(names)
  return names[1] and tensors[names[1]].dtype or "f32"
end

-- model_dtype(opts, j, tensors, who, level) -> opts.dtype, or the checkpoint's dtype when it is
-- nil or "auto" (the default of every from_pretrained that calls this)
function M.model_dtype(opts, j, tensors, who, level)
  local d = opts and opts.dtype
  if d == nil or d == "auto" then return M.checkpoint_dtype(j, tensors, who, level + 1) end
  return d
end

-- The one rule for Hugging Face's 0-based layer names. A model whose own names are the
-- checkpoint's keeps its layer lists in nn.ModuleList(list, {first = 0}) (SAM, CLIP, UNet, VAE:
-- "layers.0" is its first layer) and needs no renaming. BERT and the causal LMs name their layers
-- from 1 (nn.ModuleList's default; their users' checkpoints hold those names), so their name maps
-- turn an index with these two and nowhere else: keng_layer("0") == 1, hf_layer("1") == 0.
function M.keng_layer(hf_index) return tonumber(hf_index) + 1 end
function M.hf_layer(keng_index) return tonumber(keng_index) - 1 end

-- check_token_ids(who, ids, vocab, level): every id of the integer tensor ids lies in [0, vocab)
-- (not checked on meta tensors, which hold no values)
function M.check_token_ids(who, ids, vocab, level)
  if ids.device == "meta" or ids:numel() == 0 then return end
  local hi, lo = ids:max():item(), ids:min():item()
  if hi >= vocab or lo < 0 then
    error(string.format("%s: token id %d is outside the vocabulary [0, %d)", who, hi >= vocab and hi or lo, vocab),
      level + 1)
  end
end

return M
