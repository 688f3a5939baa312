-- keng.lora — low-rank adapters (Hu et al. 2021, "LoRA", fig. 1) with Keras semantics.
--
--   lora.enable(model, {rank = 4, targets = {"query", "value"}, alpha = nil})
--
-- Each targeted Linear keeps its frozen weight W [out, in] and gains two parameters in Keras'
-- [in, out] orientation: lora_a [in, r] (he_uniform) and lora_b [r, out] (zeros), so the
-- effective kernel is Wᵀ + A·B and, at the start, the model computes exactly what it did:
--   y = x·Wᵀ + b + (x·A)·B · scale          scale = alpha / r, or 1 when alpha is nil (Keras)
-- The module stays a Linear, so state_dict names keep their Hugging Face form and the adapters
-- show up as "<layer>.lora_a" / "<layer>.lora_b". Every other parameter is frozen.
-- A projection that Keras keeps per head (an EinsumDense kernel [in, n, D]; the model marks the
-- Linear with `einsum_heads = n`) gets Keras's per-head adapters instead: lora_a [in, n, r] and
-- lora_b [r, D], delta kernel[c, h, d] = Σ_r A[c, h, r]·B[r, d] — which is why Gemma 7B has
-- 11,067,392 trainable LoRA parameters, not rank·(in + out) per layer.
-- Shape letters: r rank, n heads, D head dim, in/out the Linear's features.
local keng = require "keng"

local lora = {}

local function shape_str(t) return "[" .. table.concat(t.shape, ",") .. "]" end

local function is_linear(m)
  return m.__name == "Linear" and keng.is_tensor(m.weight) and m.weight.ndim == 2
end

-- the forward every adapted Linear gets (an instance field, so the class stays untouched)
-- delta kernel in Keras's orientation: [in, out]
local function delta_kernel(m)
  local a, b = m.lora_a:float(), m.lora_b:float()
  if a.ndim == 2 then return a:matmul(b) end                        -- [in, r] @ [r, out]
  local fin, n, r = a.shape[1], a.shape[2], a.shape[3]
  return a:reshape{fin * n, r}:matmul(b):reshape{fin, n * b.shape[2]}  -- [in, n, D] -> [in, out]
end

local function adapted_forward(self, x)
  local y = getmetatable(self).forward(self, x)                    -- [..., out], frozen path
  local a, b = self.lora_a, self.lora_b
  local d
  if a.ndim == 2 then                                              -- [in, r], [r, out]
    d = x:to(a.dtype):matmul(a):matmul(b)                          -- [..., out]
  else                                                             -- [in, n, r], [r, D]
    local fin, n, r = a.shape[1], a.shape[2], a.shape[3]
    local lead = x.shape
    lead[#lead] = nil
    local xr = x:to(a.dtype):matmul(a:reshape{fin, n * r})         -- [..., n*r]
    local shape = {table.unpack(lead)}
    shape[#shape + 1], shape[#shape + 2] = n, r
    d = xr:reshape(shape):matmul(b)                                -- [..., n, D]
    lead[#lead + 1] = -1
    d = d:reshape(lead)                                            -- [..., out]
  end
  local scale = rawget(self, "lora_scale")
  if scale ~= 1 then d = d * scale end
  return y + d:to(y.dtype)
end

-- list of {dotted name, Linear} whose field name (or full dotted name) is in targets
local function targeted(model, targets)
  local want = {}
  for _, t in ipairs(targets) do want[t] = true end
  local out, linears = {}, {}
  for _, e in ipairs(model:named_modules()) do
    local name, m = e[1], e[2]
    if is_linear(m) then
      linears[#linears + 1] = name
      local field = name:match("([^.]+)$") or name
      if want[field] or want[name] then out[#out + 1] = {name, m} end
    end
  end
  return out, linears
end

-- enable(model, {rank = 4, targets = {"query", "value"}, alpha = nil}) -> model. Freezes every
-- parameter, then adds trainable adapters to each targeted Linear.
function lora.enable(model, opts)
  opts = opts or {}
  local rank = opts.rank or 4
  local targets = opts.targets or {"query", "value"}
  if type(model) ~= "table" or type(model.named_modules) ~= "function" then
    error("lora.enable: model must be a keng.nn module", 2)
  end
  if math.type(rank) ~= "integer" or rank < 1 then
    error("lora.enable: rank must be a positive integer, got " .. tostring(rank), 2)
  end
  local hits, linears = targeted(model, targets)
  if #hits == 0 then
    error(string.format("lora.enable: no Linear layer is named %s (Linear layers: %s)",
      table.concat(targets, " or "), #linears > 0 and table.concat(linears, ", ") or "none"), 2)
  end
  local keep = {}  -- adapters from an earlier enable stay trainable
  for _, e in ipairs(model:named_modules()) do
    if rawget(e[2], "lora_scale") then keep[e[2].lora_a], keep[e[2].lora_b] = true, true end
  end
  local frozen = {}
  for _, p in ipairs(model:parameters()) do
    if not keep[p] then
      frozen[#frozen + 1] = {p, p.requires_grad}
      p.requires_grad = false
    end
  end
  local prev = rawget(model, "_lora_frozen")
  if prev then for _, f in ipairs(frozen) do if not keep[f[1]] then prev[#prev + 1] = f end end
  else rawset(model, "_lora_frozen", frozen) end
  for _, h in ipairs(hits) do
    local name, m = h[1], h[2]
    if rawget(m, "lora_scale") then
      error("lora.enable: " .. name .. " already has adapters (lora.merge first)", 2)
    end
    local fin, fout = m.in_features or m.weight.shape[2], m.out_features or m.weight.shape[1]
    -- an int8 base (keng.quantize) gets adapters in the dtype the layer computes in
    local o = {dtype = m.weight_scale and m:compute_dtype() or m.weight.dtype, device = m.weight.device}
    local n = rawget(m, "einsum_heads") or m.einsum_heads
    if n and n > 1 and fout % n == 0 then -- Keras's per-head kernel: fans as Keras computes them
      m:param("lora_a", {fin, n, rank}, "he_uniform",
        {dtype = o.dtype, device = o.device, fan_in = fin * n, fan_out = rank * fin})
      m:param("lora_b", {rank, fout // n}, "zeros", o)
    else
      m:param("lora_a", {fin, rank}, "he_uniform", {dtype = o.dtype, device = o.device, fan_in = fin, fan_out = rank})
      m:param("lora_b", {rank, fout}, "zeros", o)
    end
    rawset(m, "lora_rank", rank)
    rawset(m, "lora_scale", opts.alpha and opts.alpha / rank or 1)
    rawset(m, "forward", adapted_forward)
  end
  return model
end

-- list of {dotted name, Linear} that carry adapters
local function adapted(model)
  local out = {}
  for _, e in ipairs(model:named_modules()) do
    if rawget(e[2], "lora_scale") then out[#out + 1] = e end
  end
  return out
end
lora.adapted_layers = adapted

-- merge(model) -> model: W += (A·B)ᵀ · scale, computed in f32, then the adapters are removed,
-- the Linear's own forward comes back and the requires_grad flags from before enable return.
function lora.merge(model)
  local layers = adapted(model)
  if #layers == 0 then error("lora.merge: the model has no LoRA adapters", 2) end
  for _, e in ipairs(layers) do
    if e[2].weight_scale then
      error("lora.merge: " .. e[1] .. " has a quantized (" .. e[2].weight.dtype .. ") weight; merging would re-quantize it: keep the "
        .. "adapters separate (lora.adapters) or merge into the float model", 2)
    end
  end
  keng.no_grad(function()
    for _, e in ipairs(layers) do
      local m = e[2]
      local w = m.weight                                                   -- [out, in]
      local delta = delta_kernel(m):transpose(1, 2)                        -- [out, in]
      local scale = rawget(m, "lora_scale")
      if scale ~= 1 then delta = delta * scale end
      w:copy_(w:float() + delta)
      m.lora_a, m.lora_b = nil, nil
      rawset(m, "forward", nil)
      rawset(m, "lora_scale", nil)
      rawset(m, "lora_rank", nil)
    end
  end)
  local frozen = rawget(model, "_lora_frozen")
  if frozen then
    for _, f in ipairs(frozen) do f[1].requires_grad = f[2] end
    rawset(model, "_lora_frozen", nil)
  end
  return model
end

-- adapters(model) -> {"<layer>.lora_a" = tensor, "<layer>.lora_b" = tensor, ...} (detached,
-- storage shared): save them on their own with keng.save(path, lora.adapters(m))
function lora.adapters(model)
  local out = {}
  for _, e in ipairs(adapted(model)) do
    local p = e[1] == "" and "" or e[1] .. "."
    out[p .. "lora_a"], out[p .. "lora_b"] = e[2].lora_a:detach(), e[2].lora_b:detach()
  end
  return out
end

-- load_adapters(model, tbl): copies saved adapters into a model with the same lora.enable
-- setup. Every adapter must be present with its shape; other keys are an error.
function lora.load_adapters(model, tbl)
  if type(tbl) ~= "table" then error("lora.load_adapters: a table of name -> tensor expected", 2) end
  local mine = lora.adapters(model)
  if next(mine) == nil then error("lora.load_adapters: the model has no adapters (call lora.enable first)", 2) end
  local problems = {}
  local names = {}
  for k in pairs(mine) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do
    local src = tbl[k]
    if src == nil then
      problems[#problems + 1] = "missing " .. k
    elseif shape_str(src) ~= shape_str(mine[k]) then
      problems[#problems + 1] = string.format("%s: checkpoint %s, model %s", k, shape_str(src), shape_str(mine[k]))
    end
  end
  local extra = {}
  for k in pairs(tbl) do if mine[k] == nil then extra[#extra + 1] = k end end
  table.sort(extra)
  for _, k in ipairs(extra) do problems[#problems + 1] = "unexpected " .. k end
  if #problems > 0 then error("lora.load_adapters: " .. table.concat(problems, "; "), 2) end
  keng.no_grad(function()
    for k, t in pairs(mine) do t:copy_(tbl[k]) end
  end)
  return model
end

return lora
