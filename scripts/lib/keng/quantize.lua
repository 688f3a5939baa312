-- keng.quantize — weight-only quantization of a model's Linear layers (docs/quantization.md).
--
--   keng.quantize(model, "int8") -> model        (also model:quantize("int8"))
--
-- "int8", as Keras 3's int8 quantization of Dense: every nn.Linear's weight W [out, in] becomes
-- `weight` (i8 [out, in]) and `weight_scale` (f32 [out]) with W ≈ weight · weight_scale[:, None],
-- one absmax scale per output row (engine op quantize_q8). The float weight is released; the
-- layer then runs keng.linear_q8 (the weight dequantized inside the kernel) and computes in the
-- dtype it computed in before. Both are persistent buffers, so state_dict() holds the int8 bytes
-- and their scales, keng.save writes them as safetensors I8/F32, and a checkpoint with
-- `<layer>.weight_scale` entries loads back into a quantized layer (prepare, used by the model
-- loaders). Embeddings (and a head tied to them) keep their dtype; biases stay float. LoRA
-- adapters added after quantizing train on top of the frozen int8 base (the x gradient flows).
local keng = require "keng"
local options = require "keng.options"

local M = {}

local FORMATS = {"int8"}
local NOT_YET = {int4 = true}

local function is_linear(m)
  return m.__name == "Linear" and keng.is_tensor(m.weight) and m.weight.ndim == 2
end

-- the dtype the layer computes in once its weight is int8: the one it had
local function remember_dtype(m)
  if not rawget(m, "_compute_dtype") then rawset(m, "_param_dtype", m.weight.dtype) end
end

-- swaps the float parameter for the two buffers (q i8 [O, I], s f32 [O])
local function install(m, q, s)
  remember_dtype(m)
  m.weight = nil
  m:buffer("weight", q)
  m:buffer("weight_scale", s)
  -- Module:to(dtype) converts float tensors; the scale stays f32 (a bf16 scale would add error)
  local keep = rawget(m, "_keep_dtype") or {}
  keep.weight_scale = true
  rawset(m, "_keep_dtype", keep)
end

local function check_format(fmt, who, level)
  if NOT_YET[fmt] then
    error(string.format("%s: format '%s' is not implemented yet (implemented: %s)", who, tostring(fmt),
      table.concat(FORMATS, ", ")), level + 1)
  end
  if fmt ~= "int8" then
    error(string.format("%s: unknown format '%s' (valid: %s)", who, tostring(fmt), table.concat(FORMATS, ", ")),
      level + 1)
  end
end

-- quantize_at(level, model, fmt, opts): quantize, raising at `level` (as error()'s, counted from
-- here) so that keng.quantize (a C shim) and model:quantize both blame the user's line
function M.quantize_at(level, model, fmt, opts)
  options.check("quantize", opts, {}, level)
  if type(model) ~= "table" or type(model.modules) ~= "function" then
    error("quantize: a keng.nn module expected, got " .. type(model), level)
  end
  check_format(fmt, "quantize", level)
  local todo = {}
  for _, m in ipairs(model:modules()) do
    if is_linear(m) and m.weight.dtype ~= "i8" then
      if m.weight.device == "meta" then
        error("quantize: a Linear holds meta tensors (no values to quantize); load the weights first", level)
      end
      todo[#todo + 1] = m
    end
  end
  keng.no_grad(function()
    for _, m in ipairs(todo) do
      local q, s = keng.quantize_q8(m.weight:detach())
      install(m, q, s)
    end
  end)
  collectgarbage()  -- the float weights are unreferenced now: give their memory back
  return model
end

-- quantize(model, fmt, opts) -> model: every Linear in model (model itself included), in place
function M.quantize(model, fmt, opts) return M.quantize_at(3, model, fmt, opts) end

-- prepare(model, sd): for each "<layer>.weight_scale" in the state dict sd, turns that Linear
-- into an int8 one with empty storage of the right shapes, so that load_state_dict copies the
-- checkpoint's int8 bytes instead of converting them to float. Returns the number of layers.
function M.prepare(model, sd)
  local mods, n = {}, 0
  for _, e in ipairs(model:named_modules()) do mods[e[1]] = e[2] end
  for k in pairs(sd) do
    local prefix = k:match("^(.*)%.weight_scale$") or (k == "weight_scale" and "")
    local m = prefix and mods[prefix]
    if m and is_linear(m) and m.weight.dtype ~= "i8" then
      local w = m.weight
      install(m, keng.empty(w.shape, {dtype = "i8", device = w.device}),
        keng.empty({w.shape[1]}, {dtype = "f32", device = w.device}))
      n = n + 1
    end
  end
  return n
end

return M
