-- models.common — the scaffolding model files share: a config over its defaults with the checks
-- every Transformer encoder needs, preset lists for messages, a model directory's config.json,
-- and the token-id range check. Errors name `who` ("bert", "clip.from_pretrained") and point
-- `level` frames up, as error() does (1 = the function that called the helper).
local keng = require "keng"

local M = {}

-- encoder_config(who, defaults, cfg, activations, width_key, level) -> defaults overlaid by cfg,
-- with cfg.activation a key of activations and cfg[width_key] a multiple of cfg.heads
function M.encoder_config(who, defaults, cfg, activations, width_key, level)
  local c = {}
  for k, v in pairs(defaults) do c[k] = v end
  for k, v in pairs(cfg) do c[k] = v end
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

-- read_config(dir, who, level) -> the table decoded from dir/config.json
function M.read_config(dir, who, level)
  local f = io.open(dir .. "/config.json", "rb")
  if not f then error(who .. ": no config.json in " .. dir, level + 1) end
  local text = f:read("a")
  f:close()
  local ok, j = pcall(require("keng.json").decode, text)
  if not ok then error(who .. ": " .. dir .. "/config.json: " .. tostring(j), level + 1) end
  return j
end

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
