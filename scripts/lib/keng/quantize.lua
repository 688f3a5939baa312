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
-- "int4": blocks of 32 weights with an f16 scale (llama.cpp's Q4_0 layout): `weight` u8
-- [out, in / 2] (two 4-bit codes a byte), `weight_scale` f16 [out, in / 32] (keng.linear_q4);
-- a Linear whose in-features are not a multiple of 32 stays float.
local keng = require "keng"
local options = require "keng.options"

local M = {}

local FORMATS = {"int4", "int8"}
-- the engine ops of each format: quantize (w -> codes, scales)
local QUANTIZE = {int8 = "quantize_q8", int4 = "quantize_q4"}

local function is_linear(m)
  return m.__name == "Linear" and keng.is_tensor(m.weight) and m.weight.ndim == 2
end

-- the dtype the layer computes in once its weight is int8: the one it had
local function remember_dtype(m)
  if not rawget(m, "_compute_dtype") then rawset(m, "_param_dtype", m.weight.dtype) end
end

-- swaps the float parameter for the two buffers (int8: q i8 [O, I], s f32 [O]; int4: q u8
-- [O, I / 2], s f16 [O, I / 32])
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
  if not QUANTIZE[fmt] then
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
    -- int4 needs in-features in whole blocks of 32: other layers stay float (docs/quantization.md)
    if is_linear(m) and not m.weight_scale and (fmt == "int8" or m.weight.shape[2] % 32 == 0) then
      if m.weight.device == "meta" then
        error("quantize: a Linear holds meta tensors (no values to quantize); load the weights first", level)
      end
      todo[#todo + 1] = m
    end
  end
  keng.no_grad(function()
    for _, m in ipairs(todo) do
      local q, s = keng[QUANTIZE[fmt]](m.weight:detach())
      install(m, q, s)
    end
  end)
  -- the float weights are unreferenced now: give their memory back to the system (keng's block
  -- cache would keep it, and the process would stay resident at the float model's size)
  keng.empty_cache()
  return model
end

-- quantize(model, fmt, opts) -> model: every Linear in model (model itself included), in place
function M.quantize(model, fmt, opts) return M.quantize_at(3, model, fmt, opts) end

-- prepare(model, sd): for each "<layer>.weight_scale" in the state dict sd, turns that Linear
-- into a quantized one with empty storage of the right shapes, so that load_state_dict copies the
-- checkpoint's codes instead of converting them to float. The format follows the entries: an f32
-- [out] scale is int8; an f16 [out, in / 32] one is llama.cpp's Q8_0 (int8 with a scale per block
-- of 32, from GGUF files) when sd's codes are i8, else int4. Returns the number of layers.
function M.prepare(model, sd)
  local mods, n = {}, 0
  for _, e in ipairs(model:named_modules()) do mods[e[1]] = e[2] end
  for k in pairs(sd) do
    local prefix = k:match("^(.*)%.weight_scale$") or (k == "weight_scale" and "")
    if prefix and not keng.is_tensor(sd[k]) then prefix = nil end
    local m = prefix and mods[prefix]
    if m and is_linear(m) and not m.weight_scale then
      local w, ws = m.weight, sd[k]
      local codes = sd[prefix == "" and "weight" or prefix .. ".weight"]
      local o, i, dev = w.shape[1], w.shape[2], w.device
      if ws.ndim == 1 then   -- int8: one f32 scale per row
        install(m, keng.empty({o, i}, {dtype = "i8", device = dev}), keng.empty({o}, {dtype = "f32", device = dev}))
      elseif keng.is_tensor(codes) and codes.dtype == "i8" then   -- Q8_0: f16 scales per block of 32
        install(m, keng.empty({o, i}, {dtype = "i8", device = dev}),
          keng.empty({o, i // 32}, {dtype = "f16", device = dev}))
      else                   -- int4: codes [out, in / 2], f16 scales [out, in / 32]
        install(m, keng.empty({o, i // 2}, {dtype = "u8", device = dev}),
          keng.empty({o, i // 32}, {dtype = "f16", device = dev}))
      end
      n = n + 1
    end
  end
  return n
end

return M
