-- models.lora_files — LoRA files people share for Stable Diffusion, merged into a pipeline's UNet
-- and text encoder weights (what diffusers' load_lora_weights + fuse_lora compute).
--
--   local pipe = require("models.stable_diffusion").from_pretrained(dir)
--   pipe:load_lora("style.safetensors", {scale = 0.8})   -- = lora_files.load(pipe, path, opts)
--   pipe:unload_lora()                                    -- the weights as they were
--
-- Layouts read (by their keys):
--   diffusers / PEFT  unet.<module>.lora_A.weight [r, in(, kh, kw)], .lora_B.weight [out, r(, 1, 1)],
--                     text_encoder.<module>...; alpha from the header's lora_adapter_metadata
--                     ("unet.lora_alpha", "text_encoder.lora_alpha"; use_rslora) or a
--                     <module>.alpha tensor, else alpha = r. Older diffusers names (lora.down /
--                     lora.up, attn processors' to_q_lora ...) too.
--   kohya             lora_unet_<module with _ for .>.lora_down.weight, .lora_up.weight, .alpha
--                     (0-d), lora_te_<text encoder module>...
-- Each adapted Linear / Conv2d weight W becomes W + scale · (alpha / r) · B·A (a Conv2d's A is
-- [r, in, kh, kw] and B [out, r, 1, 1]). The text encoder's modules match with or without the
-- "text_model." prefix (transformers 5 writes CLIPTextModel without it). A key of no known layout,
-- a module the model lacks, or a shape that does not fit raises, naming it.
local keng = require "keng"
local json = require "keng.json"
local options = require "keng.options"

local M = {}

local shape_str = require("keng.util").shape_str

-- name -> module for a model, under its dotted names, with "_" for "." (kohya) and, for a text
-- encoder, without its "text_model." prefix
local function module_index(model)
  local idx = {}
  for _, e in ipairs(model:named_modules()) do
    local name, mod = e[1], e[2]
    if name ~= "" and keng.is_tensor(rawget(mod, "weight") or mod.weight) then
      local names = {name}
      local short = name:match("^text_model%.(.+)$")
      if short then names[2] = short end
      for _, n in ipairs(names) do
        idx[n] = {name, mod}
        idx[(n:gsub("%.", "_"))] = idx[(n:gsub("%.", "_"))] or {name, mod}
      end
    end
  end
  return idx
end

-- one key -> part ("unet" | "text_encoder"), module path, what ("A" | "B" | "alpha"), layout
local function parse_key(k)
  local part, rest
  if k:match("^lora_unet_") then part, rest = "unet", k:sub(11)
  elseif k:match("^lora_te_") then part, rest = "text_encoder", k:sub(9) end
  if part then                                                      -- kohya
    local mod = rest:match("^(.-)%.lora_down%.weight$")
    if mod then return part, mod, "A", "kohya" end
    mod = rest:match("^(.-)%.lora_up%.weight$")
    if mod then return part, mod, "B", "kohya" end
    mod = rest:match("^(.-)%.alpha$")
    if mod then return part, mod, "alpha", "kohya" end
    return nil
  end
  part, rest = k:match("^(unet)%.(.+)$")
  if not part then part, rest = k:match("^(text_encoder)%.(.+)$") end
  if not part then return nil end
  for _, p in ipairs{{"%.lora_A%.weight$", "A"}, {"%.lora_B%.weight$", "B"}, {"%.down%.weight$", "A"},
                     {"%.up%.weight$", "B"}, {"%.alpha$", "alpha"}} do
    local s = rest:find(p[1])
    if s then
      -- the names diffusers wrote before PEFT: <module>.lora.down, <module>.lora_linear_layer.down
      -- (text encoder), attn1.processor.to_q_lora.down (attention processors) -> <module>
      local mod = rest:sub(1, s - 1):gsub("%.lora$", ""):gsub("%.lora_linear_layer$", "")
      mod = mod:gsub("%.processor%.to_out_lora$", ".to_out.0"):gsub("%.processor%.(to_[qkv])_lora$", ".%1")
      return part, mod, p[2], "diffusers"
    end
  end
  return nil
end

-- alpha / rank settings from diffusers' header metadata, per part
local function metadata_config(meta, path)
  local s = meta and meta.lora_adapter_metadata
  if not s then return {} end
  local ok, j = pcall(json.decode, s)
  if ok and type(j) ~= "table" then ok, j = false, "not a JSON object" end
  if not ok then error("lora_files.load: " .. path .. ": unreadable lora_adapter_metadata: " .. tostring(j), 3) end
  local cfg = {}
  for k, v in pairs(j) do
    local part, field = k:match("^(%w[%w_]-)%.(.+)$")
    if part then
      cfg[part] = cfg[part] or {}
      cfg[part][field] = v
    end
  end
  for part, c in pairs(cfg) do
    for _, f in ipairs{"alpha_pattern", "rank_pattern"} do
      if type(c[f]) == "table" and next(c[f]) ~= nil then
        error(string.format("lora_files.load: %s: %s.%s (per-module alpha/rank) is not supported", path, part, f), 3)
      end
    end
    if c.use_dora then error(string.format("lora_files.load: %s: %s.use_dora (DoRA) is not supported", path, part), 3) end
  end
  return cfg
end

-- groups the file's tensors per module: {part, module path, A, B, alpha}
local function collect(tensors, path)
  local groups, order, bad = {}, {}, {}
  local keys = {}
  for k in pairs(tensors) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local part, mod, what = parse_key(k)
    if not part then
      bad[#bad + 1] = k
    else
      local id = part .. ":" .. mod
      local g = groups[id]
      if not g then
        g = {part = part, module = mod}
        groups[id] = g
        order[#order + 1] = g
      end
      g[what] = tensors[k]
    end
  end
  if #bad > 0 then
    error(string.format("lora_files.load: %s: %d keys of no LoRA layout known (diffusers/PEFT, kohya), e.g. '%s'",
      path, #bad, bad[1]), 3)
  end
  for _, g in ipairs(order) do
    if not g.A or not g.B then
      error(string.format("lora_files.load: %s: %s module '%s' has lora_%s but not lora_%s", path, g.part, g.module,
        g.A and "A (down)" or "B (up)", g.A and "B (up)" or "A (down)"), 3)
    end
  end
  return order
end

local function restore_point(target, mod)
  local saved = rawget(target, "_lora_saved")
  if not saved then
    saved = {list = {}, seen = {}}
    rawset(target, "_lora_saved", saved)
  end
  if not saved.seen[mod] then
    saved.seen[mod] = true
    saved.list[#saved.list + 1] = {mod, mod.weight:clone()}
  end
end

-- load(target, path, {scale = 1}) -> target: target is a Stable Diffusion pipeline (or any
-- table with unet = / text_encoder =); merges every adapter of the file into its weights.
function M.load(target, path, opts)
  opts = options.check("lora_files.load", opts, {"scale"}, 2)
  local scale = options.number("lora_files.load", "scale", opts.scale or 1, nil, nil, 2)
  if type(path) ~= "string" then error("lora_files.load: path must be a string (a .safetensors file)", 2) end
  local ok, tensors, meta = pcall(keng.load, path)
  if not ok then error("lora_files.load: " .. tostring(tensors):gsub("^[^:]*:%d+: ", ""), 2) end
  local cfg = metadata_config(meta, path)
  local groups = collect(tensors, path)
  local index = {}
  for _, part in ipairs{"unet", "text_encoder"} do
    if target[part] then index[part] = module_index(target[part]) end
  end
  -- check everything before changing a weight: a bad file leaves the model as it was
  local plan = {}
  for _, g in ipairs(groups) do
    if not index[g.part] then error(string.format("lora_files.load: %s has %s adapters, the target has no %s", path,
      g.part, g.part), 2) end
    local hit = index[g.part][g.module]
    if not hit then
      error(string.format("lora_files.load: %s: the %s has no module '%s'", path, g.part, g.module), 2)
    end
    local mod, A, B = hit[2], g.A, g.B
    local W = mod.weight
    local r = A.shape[1]
    local out = W.shape[1]
    local fits = B.shape[1] == out and B:numel() == out * r and A:numel() * out == W:numel() * r
    if not fits then
      error(string.format("lora_files.load: %s: %s.%s: lora_A %s and lora_B %s do not fit the weight %s", path,
        g.part, hit[1], shape_str(A), shape_str(B), shape_str(W)), 2)
    end
    local c = cfg[g.part] or {}
    local alpha = g.alpha and g.alpha:float():item() or c.lora_alpha or r
    local s = c.use_rslora and alpha / math.sqrt(r) or alpha / r
    plan[#plan + 1] = {mod = mod, A = A, B = B, r = r, factor = scale * s}
  end
  keng.no_grad(function()
    for _, p in ipairs(plan) do
      local W = p.mod.weight
      restore_point(target, p.mod)
      local a = p.A:to{dtype = "f32", device = W.device}:reshape{p.r, -1}
      local b = p.B:to{dtype = "f32", device = W.device}:reshape{W.shape[1], p.r}
      local delta = (b:matmul(a) * p.factor):reshape(W.shape)
      W:copy_((W:float() + delta):to(W.dtype))
    end
  end)
  return target
end

-- unload(target): every weight a load changed, back as it was before the first load
function M.unload(target)
  local saved = rawget(target, "_lora_saved")
  if not saved then return target end
  keng.no_grad(function()
    for _, e in ipairs(saved.list) do e[1].weight:copy_(e[2]) end
  end)
  rawset(target, "_lora_saved", nil)
  return target
end

return M
