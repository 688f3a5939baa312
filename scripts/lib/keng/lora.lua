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
local options = require "keng.options"

local lora = {}

local function shape_str(t) return require("keng.util").shape_str(t, ",") end

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
-- opts.per_head = false gives plain [in, r] / [r, out] adapters even on a per-head projection
-- (PEFT's layout; lora.load_adapters of a PEFT directory uses it).
function lora.enable(model, opts)
  opts = options.check("lora.enable", opts, {"rank", "targets", "alpha", "per_head"})
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
    if n and n > 1 and fout % n == 0 and opts.per_head ~= false then -- Keras's per-head kernel: fans as Keras computes them
      m:param("lora_a", {fin, n, rank}, "he_uniform",
        {dtype = o.dtype, device = o.device, fan_in = fin * n})
      m:param("lora_b", {rank, fout // n}, "zeros", o)
    else
      m:param("lora_a", {fin, rank}, "he_uniform", {dtype = o.dtype, device = o.device, fan_in = fin})
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

-- copies adapters from tbl (keng names) into the model's, every one present with its shape
local function load_table(model, tbl)
  local mine = lora.adapters(model)
  if next(mine) == nil then error("lora.load_adapters: the model has no adapters (call lora.enable first)", 3) end
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
  if #problems > 0 then error("lora.load_adapters: " .. table.concat(problems, "; "), 3) end
  keng.no_grad(function()
    for k, t in pairs(mine) do t:copy_(tbl[k]) end
  end)
  return model
end

-- ---- PEFT adapters (adapter_config.json + adapter_model.safetensors) ---------------------------
-- PEFT keeps lora_A.weight [r, in] and lora_B.weight [out, r] and adds (x·Aᵀ·Bᵀ)·lora_alpha/r;
-- keng keeps A [in, r], B [r, out] and adds (x·A·B)·scale. So keng's A, B are PEFT's transposed
-- and lora_alpha = scale·r (Keras's scale 1 is lora_alpha = r). Tensor names are
-- "base_model.model." .. <Hugging Face module name> .. ".lora_A.weight"; a model maps its names
-- to Hugging Face's with model:hf_name / model:keng_name when they differ (models.causal_lm).
local PEFT_PREFIX = "base_model.model."

local function to_hf(model, name)
  if type(model.hf_name) ~= "function" then return name end
  return (model:hf_name(name .. ".weight"):gsub("%.weight$", ""))
end
local function to_keng(model, name)
  if type(model.keng_name) ~= "function" then return name end
  local k = model:keng_name(name .. ".weight")
  return k and (k:gsub("%.weight$", ""))
end

-- adapter_config.json keys keng reads, and the ones that do not change the adapted model's math
-- (lora_dropout acts in PEFT's training only: keng trains its adapters without dropout)
local PEFT_USED = {r = true, lora_alpha = true, target_modules = true, peft_type = true, rank_pattern = true,
  alpha_pattern = true}
local PEFT_HARMLESS = {base_model_name_or_path = true, revision = true, task_type = true, inference_mode = true,
  peft_version = true, init_lora_weights = true, auto_mapping = true, megatron_core = true, megatron_config = true,
  qalora_group_size = true, lora_dropout = true, loftq_config = true, eva_config = true, corda_config = true,
  lora_ga_config = true, ensure_weight_tying = true, layers_pattern = true}

-- a value that leaves a LoRA plain: nil/null, false, "none", {} or []
local function unset(v)
  if v == nil or v == false or v == "none" then return true end
  return type(v) == "table" and next(v) == nil
end

-- the value of rank_pattern / alpha_pattern for module hf: PEFT matches each key as the end of
-- the module name at a dot ("q_proj", "layers.0.self_attn.q_proj"); keys that are regular
-- expressions are refused
local function pattern_value(pat, hf, what, where)
  if pat == nil then return nil end
  if type(pat) ~= "table" then error(string.format("%s: %s must be an object", where, what), 4) end
  local keys = {}
  for k in pairs(pat) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, key in ipairs(keys) do
    if key:find("[%^%$%(%)%[%]%*%+%?\\|{}]") then
      error(string.format("%s: %s key '%s' is a regular expression; keng matches plain module names only", where,
        what, key), 4)
    end
    if hf == key or hf:sub(-#key - 1) == "." .. key then return pat[key] end
  end
end

local read_file = require("keng.util").read_file

local function load_peft(model, dir)
  local json = require "keng.json"
  local who = "lora.load_adapters"
  local text = read_file(dir .. "/adapter_config.json")
  local ok, cfg = pcall(json.decode, text, {null_as_nil = true})
  if not ok or type(cfg) ~= "table" then error(who .. ": " .. dir .. "/adapter_config.json: " .. tostring(cfg), 3) end
  if cfg.peft_type ~= "LORA" then
    error(string.format("%s: %s: peft_type is %s; only LORA adapters are implemented", who, dir, tostring(cfg.peft_type)), 3)
  end
  local keys = {}
  for k in pairs(cfg) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    if not PEFT_USED[k] and not PEFT_HARMLESS[k] and not unset(cfg[k]) then
      error(string.format("%s: %s: adapter_config.json sets %s = %s, which keng's LoRA does not implement "
        .. "(it implements r, lora_alpha, rank_pattern, alpha_pattern and target_modules)", who, dir, k,
        json.encode(cfg[k])), 3)
    end
  end
  local r, alpha = cfg.r, cfg.lora_alpha or cfg.r
  if math.type(r) ~= "integer" or r < 1 then error(who .. ": " .. dir .. ": r must be a positive integer, got " .. tostring(r), 3) end
  if type(alpha) ~= "number" then error(who .. ": " .. dir .. ": lora_alpha must be a number, got " .. tostring(alpha), 3) end
  local tensors = keng.load(dir .. "/adapter_model.safetensors")
  -- module (keng name) -> {A =, B =}
  local mods, order, names = {}, {}, {}
  for k in pairs(tensors) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do
    local hf, ab = k:match("^" .. PEFT_PREFIX:gsub("%.", "%%.") .. "(.+)%.lora_([AB])%.weight$")
    local name = hf and to_keng(model, hf)
    if not name then
      error(string.format("%s: %s: tensor '%s' is not a LoRA A/B weight (expected %s<module>.lora_A.weight or .lora_B.weight)",
        who, dir, k, PEFT_PREFIX), 3)
    end
    if not mods[name] then mods[name] = {hf = hf}; order[#order + 1] = name end
    mods[name][ab] = tensors[k]
  end
  local by_name = {}
  for _, e in ipairs(model:named_modules()) do by_name[e[1]] = e[2] end
  for _, name in ipairs(order) do
    local e, m = mods[name], by_name[name]
    if not m or not is_linear(m) then
      error(string.format("%s: %s: the adapters are for %s (keng %s), which is not a Linear layer of this model",
        who, dir, e.hf, name), 3)
    end
    if not e.A or not e.B then
      error(string.format("%s: %s: %s has lora_%s but not lora_%s", who, dir, e.hf, e.A and "A" or "B", e.A and "B" or "A"), 3)
    end
  end
  if #order == 0 then error(who .. ": " .. dir .. "/adapter_model.safetensors holds no adapters", 3) end
  -- each module's rank (its tensors') and alpha, checked against the config
  local groups, gorder = {}, {}
  for _, name in ipairs(order) do
    local e = mods[name]
    local want = pattern_value(cfg.rank_pattern, e.hf, "rank_pattern", who .. ": " .. dir) or r
    local rm = e.A.shape[1]
    if e.A.ndim ~= 2 or e.B.ndim ~= 2 or rm ~= want or e.B.shape[2] ~= want then
      error(string.format("%s: %s: %s has lora_A %s and lora_B %s but adapter_config.json gives rank %d", who, dir,
        e.hf, shape_str(e.A), shape_str(e.B), want), 3)
    end
    e.alpha = pattern_value(cfg.alpha_pattern, e.hf, "alpha_pattern", who .. ": " .. dir) or alpha
    e.rank = rm
    local g = rm .. "/" .. e.alpha
    if not groups[g] then groups[g] = {}; gorder[#gorder + 1] = g end
    table.insert(groups[g], name)
  end
  if #adapted(model) == 0 then
    for _, g in ipairs(gorder) do
      local e = mods[groups[g][1]]
      lora.enable(model, {rank = e.rank, alpha = e.alpha, targets = groups[g], per_head = false})
    end
  end
  local tbl = {}
  for _, name in ipairs(order) do
    local m = by_name[name]
    local scale = mods[name].alpha / mods[name].rank
    if rawget(m, "lora_scale") ~= scale then
      error(string.format("%s: %s: %s has scale %s in the model but lora_alpha / r = %s in %s", who, dir, name,
        tostring(rawget(m, "lora_scale")), tostring(scale), dir), 3)
    end
    tbl[name .. ".lora_a"] = mods[name].A:transpose(1, 2)               -- [r, in] -> [in, r]
    tbl[name .. ".lora_b"] = mods[name].B:transpose(1, 2)               -- [out, r] -> [r, out]
  end
  return load_table(model, tbl)
end

-- load_adapters(model, src): src is
--   a table of keng names -> tensors (lora.adapters of a model with the same lora.enable setup),
--   a .safetensors file of such a table (keng.save(path, lora.adapters(m))), or
--   a directory: PEFT's adapter_config.json + adapter_model.safetensors (the model gets adapters
--   on the named layers when it has none), or keng's adapter_model.safetensors alone.
-- Every adapter must be present with its shape; other keys are an error.
function lora.load_adapters(model, src)
  if type(model) ~= "table" or type(model.named_modules) ~= "function" then
    error("lora.load_adapters: model must be a keng.nn module", 2)
  end
  if type(src) == "string" then
    if read_file(src .. "/adapter_config.json") then return load_peft(model, src) end
    local file = src
    if read_file(src .. "/adapter_model.safetensors") then file = src .. "/adapter_model.safetensors" end
    local ok, tbl = pcall(keng.load, file)
    if not ok then error("lora.load_adapters: " .. tostring(tbl), 2) end
    src = tbl
  end
  if type(src) ~= "table" then error("lora.load_adapters: a table of name -> tensor, a file or a directory expected", 2) end
  return load_table(model, src)
end

-- PEFT's A [r, in] and B [out, r] for an adapted Linear. Keras's per-head adapters (A [in, n, r],
-- B [r, D]) become one adapter of rank n·r with a block-diagonal B: A'[(h, j), c] = A[c, h, j],
-- B'[(h, d), (h, j)] = B[j, d], so B'·A' is exactly the per-head delta.
local function peft_pair(m)
  local a, b = m.lora_a:detach(), m.lora_b:detach()
  if a.ndim == 2 then return a:transpose(1, 2):contiguous(), b:transpose(1, 2):contiguous() end
  local fin, n, r, D = a.shape[1], a.shape[2], a.shape[3], b.shape[2]
  local A = a:reshape{fin, n * r}:transpose(1, 2):contiguous()            -- [n·r, in]
  local B = keng.zeros({n * D, n * r}, {dtype = b.dtype, device = b.device})
  local bt = b:transpose(1, 2)                                            -- [D, r]
  keng.no_grad(function()
    for h = 0, n - 1 do B:narrow(1, h * D + 1, D):narrow(2, h * r + 1, r):copy_(bt) end
  end)
  return A, B
end

-- save_adapters(model, dir, {format = "peft" | "keng", base_model = nil}): writes dir (made when
-- missing) with adapter_model.safetensors: PEFT names plus adapter_config.json ("peft", the
-- default: loads with peft.PeftModel.from_pretrained), or keng's names ("keng"). Each file is
-- written to a temp file and renamed. Layers whose rank or alpha differ from the first one's go
-- to rank_pattern / alpha_pattern; Keras's per-head adapters are written as rank n·r (peft_pair).
function lora.save_adapters(model, dir, opts)
  opts = options.check("lora.save_adapters", opts, {"format", "base_model"})
  local format = opts.format or "peft"
  if format ~= "peft" and format ~= "keng" then
    error("lora.save_adapters: format must be \"peft\" or \"keng\", got " .. tostring(format), 2)
  end
  if type(dir) ~= "string" then error("lora.save_adapters: dir must be a string", 2) end
  local layers = adapted(model)
  if #layers == 0 then error("lora.save_adapters: the model has no LoRA adapters", 2) end
  local function mkdir() os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "'") end
  if format == "keng" then
    mkdir()
    keng.save(dir .. "/adapter_model.safetensors", lora.adapters(model), {format = "pt"})
    return dir
  end
  -- the first layer's rank and alpha are the config's; layers that differ get rank_pattern /
  -- alpha_pattern entries under their full module name
  local function num(x) return x == math.floor(x) and math.tointeger(x) or x end
  local tensors, targets, seen = {}, {}, {}
  local rank, alpha, rank_pattern, alpha_pattern
  rank_pattern, alpha_pattern = {}, {}
  for _, e in ipairs(layers) do
    local name, m = e[1], e[2]
    local hf = to_hf(model, name)
    local A, B = peft_pair(m)
    local r = A.shape[1]
    local a = num(rawget(m, "lora_scale") * r)
    if not rank then rank, alpha = r, a end
    if r ~= rank then rank_pattern[hf] = r end
    if a ~= alpha then alpha_pattern[hf] = a end
    tensors[PEFT_PREFIX .. hf .. ".lora_A.weight"] = A
    tensors[PEFT_PREFIX .. hf .. ".lora_B.weight"] = B
    local field = hf:match("([^.]+)$")
    if not seen[field] then seen[field] = true; targets[#targets + 1] = field end
  end
  table.sort(targets)
  local json = require "keng.json"
  local cfg = {peft_type = "LORA", r = rank, lora_alpha = alpha, target_modules = json.array(targets),
    lora_dropout = 0.0, bias = "none", fan_in_fan_out = false, use_rslora = false, use_dora = false,
    modules_to_save = json.null, rank_pattern = rank_pattern, alpha_pattern = alpha_pattern, init_lora_weights = true,
    inference_mode = true, base_model_name_or_path = opts.base_model or json.null,
    task_type = model.__name == "CausalLM" and "CAUSAL_LM" or json.null}
  mkdir()
  keng.save(dir .. "/adapter_model.safetensors", tensors, {format = "pt"})
  local path = dir .. "/adapter_config.json"
  local f, err = io.open(path .. ".tmp", "w")
  if not f then error("lora.save_adapters: cannot write " .. path .. ": " .. tostring(err), 2) end
  f:write(json.encode(cfg, {indent = "  "}), "\n")
  f:close()
  local ok, rerr = os.rename(path .. ".tmp", path)
  if not ok then error("lora.save_adapters: cannot rename to " .. path .. ": " .. tostring(rerr), 2) end
  return dir
end

return lora
