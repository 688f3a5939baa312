-- models.rope — the RoPE frequency schemes of Hugging Face's modeling_rope_utils.py, read from a
-- config.json and turned into what keng.rope takes: inverse frequencies [D/2] and a scale for
-- cos/sin (YaRN's and LongRoPE's attention factor).
--
--   local rope = require "models.rope"
--   local r = rope.from_config(j, head_dim, "llama.from_pretrained", level)   -- j: config.json
--   local inv_freq, scale = rope.frequencies(r, D, seq_len)   -- list of D/2 numbers, number
--
-- Types: default, linear (positions / factor), dynamic (NTK-aware base growing with the sequence
-- length), llama3 (Llama 3.1's band-wise factor), yarn (NTK-by-parts ramp + attention factor),
-- longrope (per-frequency factors, long or short by the sequence length + attention factor).
-- Both config formats are read: transformers 4's top-level rope_theta and rope_scaling
-- ({"type" or "rope_type", ...}) and transformers 5's rope_parameters ({"rope_type",
-- "rope_theta", ...}); rope_scaling wins when both are present, as in transformers.
-- seq_len is the largest position + 1 of the call (dynamic and longrope depend on it).
local M = {}

-- keys each type reads (besides rope_type / type / rope_theta / partial_rotary_factor)
local KEYS = {
  default = {},
  linear = {factor = true},
  dynamic = {factor = true},
  llama3 = {factor = true, low_freq_factor = true, high_freq_factor = true, original_max_position_embeddings = true},
  yarn = {factor = true, original_max_position_embeddings = true, attention_factor = true, beta_fast = true,
          beta_slow = true, mscale = true, mscale_all_dim = true, truncate = true},
  longrope = {short_factor = true, long_factor = true, factor = true, attention_factor = true,
              original_max_position_embeddings = true},
}
local REQUIRED = {linear = {"factor"}, dynamic = {"factor"}, llama3 = {"factor", "low_freq_factor", "high_freq_factor"},
                  yarn = {"factor"}, longrope = {"short_factor", "long_factor"}}
M.TYPES = {"default", "linear", "dynamic", "llama3", "yarn", "longrope"}

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks)
  return table.concat(ks, ", ")
end

-- from_config(j, head_dim, who, level, default_theta) -> {type=, base=, max_pos=, <the type's keys>}
-- Unknown types, unknown keys and a partial rotary factor other than 1 raise naming the key.
function M.from_config(j, head_dim, who, level, default_theta)
  level = level + 1
  local src, srcname = j.rope_scaling, "rope_scaling"
  if src == nil then src, srcname = j.rope_parameters, "rope_parameters" end
  if src ~= nil and type(src) ~= "table" then
    error(who .. ": config.json " .. srcname .. " must be an object", level)
  end
  src = src or {}
  local typ = src.rope_type or src.type or "default"
  if not KEYS[typ] then
    error(string.format("%s: config.json %s.rope_type '%s' is not implemented (keng implements %s)", who, srcname,
      tostring(typ), table.concat(M.TYPES, ", ")), level)
  end
  local r = {type = typ, base = src.rope_theta or j.rope_theta or default_theta or 10000,
             max_pos = j.max_position_embeddings}
  local prf = src.partial_rotary_factor or j.partial_rotary_factor
  if prf ~= nil and prf ~= 1 then
    error(string.format("%s: config.json partial_rotary_factor %s is not implemented (RoPE over the whole head dim)",
      who, tostring(prf)), level)
  end
  for k, v in pairs(src) do
    if k ~= "rope_type" and k ~= "type" and k ~= "rope_theta" and k ~= "partial_rotary_factor" then
      if not KEYS[typ][k] then
        error(string.format("%s: config.json %s.%s is not read by rope type '%s' (it reads: %s)", who, srcname,
          tostring(k), typ, sorted_keys(KEYS[typ]) ~= "" and sorted_keys(KEYS[typ]) or "nothing more"), level)
      end
      r[k] = v
    end
  end
  for _, k in ipairs(REQUIRED[typ] or {}) do
    if r[k] == nil then
      error(string.format("%s: config.json %s lacks %s (rope type '%s')", who, srcname, k, typ), level)
    end
  end
  if typ == "llama3" or typ == "yarn" or typ == "longrope" then
    -- Phi-3 style configs keep it at the top level; it then wins, as in transformers
    r.original_max_position_embeddings = j.original_max_position_embeddings or r.original_max_position_embeddings
      or j.max_position_embeddings
    if r.original_max_position_embeddings == nil then
      error(string.format("%s: config.json lacks original_max_position_embeddings (rope type '%s')", who, typ), level)
    end
  end
  if (typ == "dynamic" or (typ == "longrope" and r.factor == nil)) and r.max_pos == nil then
    error(string.format("%s: config.json lacks max_position_embeddings (rope type '%s')", who, typ), level)
  end
  for k, v in pairs(r) do                                           -- numbers where numbers are meant
    if k == "truncate" then
      if type(v) ~= "boolean" then
        error(string.format("%s: config.json %s.truncate must be true or false", who, srcname), level)
      end
    elseif k ~= "type" and k ~= "short_factor" and k ~= "long_factor" and v ~= nil and
        (type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge) then
      error(string.format("%s: config.json %s must be a finite number, got %s", who,
        k == "base" and "rope_theta" or k == "max_pos" and "max_position_embeddings" or srcname .. "." .. k,
        tostring(v)), level)
    end
  end
  for _, k in ipairs{"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} do
    if r[k] ~= nil and not (r[k] > 0) then
      error(string.format("%s: config.json %s.%s must be positive, got %s", who, srcname, k, tostring(r[k])), level)
    end
  end
  if typ == "llama3" and r.low_freq_factor == r.high_freq_factor then
    error(string.format("%s: config.json %s: llama3's low_freq_factor and high_freq_factor must differ", who, srcname),
      level)
  end
  if typ == "longrope" then
    for _, k in ipairs{"short_factor", "long_factor"} do
      local ok = type(r[k]) == "table" and #r[k] == head_dim // 2
      for i = 1, ok and #r[k] or 0 do ok = ok and type(r[k][i]) == "number" and r[k][i] > 0 end
      if not ok then
        error(string.format("%s: config.json %s.%s must be a list of %d positive numbers (head_dim / 2)", who, srcname,
          k, head_dim // 2), level)
      end
    end
  end
  if not (r.base > 0) then
    error(who .. ": config.json rope_theta must be positive, got " .. tostring(r.base), level)
  end
  return r
end

-- default inverse frequencies base^(-2i/D), i = 0 .. D/2 - 1
local function plain(base, D)
  local f = {}
  for i = 0, D // 2 - 1 do f[i + 1] = base ^ (-2 * i / D) end
  return f
end

local function get_mscale(scale, m)
  if scale <= 1 then return 1 end
  return 0.1 * (m or 1) * math.log(scale) + 1
end

-- frequencies(r, D, seq_len) -> inverse frequencies (list of D/2 numbers), cos/sin scale
function M.frequencies(r, D, seq_len)
  local t, base = r.type, r.base
  if t == "default" then return plain(base, D), 1 end
  if t == "linear" then
    local f = plain(base, D)
    for i = 1, #f do f[i] = f[i] / r.factor end
    return f, 1
  end
  if t == "dynamic" then                      -- unchanged up to max_position_embeddings
    local L = math.max(seq_len or 0, r.max_pos)
    base = base * ((r.factor * L / r.max_pos) - (r.factor - 1)) ^ (D / (D - 2))
    return plain(base, D), 1
  end
  if t == "llama3" then
    local f, old = plain(base, D), r.original_max_position_embeddings
    local lo, hi = old / r.low_freq_factor, old / r.high_freq_factor   -- wavelength bounds
    for i = 1, #f do
      local wl = 2 * math.pi / f[i]
      if wl > lo then f[i] = f[i] / r.factor
      elseif wl >= hi then                    -- between: interpolate smoothly
        local s = (old / wl - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor)
        f[i] = (1 - s) * f[i] / r.factor + s * f[i]
      end
    end
    return f, 1
  end
  if t == "yarn" then
    local factor, omax = r.factor, r.original_max_position_embeddings
    local scale = r.attention_factor
    if scale == nil then
      if r.mscale and r.mscale ~= 0 and r.mscale_all_dim and r.mscale_all_dim ~= 0 then
        scale = get_mscale(factor, r.mscale) / get_mscale(factor, r.mscale_all_dim)
      else
        scale = get_mscale(factor)
      end
    end
    local beta_fast, beta_slow = r.beta_fast or 32, r.beta_slow or 1
    if beta_fast == 0 then beta_fast = 32 end -- transformers: `or 32`, so 0 means the default
    if beta_slow == 0 then beta_slow = 1 end
    local function corr_dim(rot) return D * math.log(omax / (rot * 2 * math.pi)) / (2 * math.log(base)) end
    local low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if r.truncate ~= false then low, high = math.floor(low), math.ceil(high) end
    low, high = math.max(low, 0), math.min(high, D - 1)
    if low == high then high = high + 0.001 end
    local f = plain(base, D)
    for i = 1, #f do
      local ramp = math.min(math.max(((i - 1) - low) / (high - low), 0), 1)
      local extra = 1 - ramp                  -- share of the unscaled (extrapolated) frequency
      f[i] = f[i] / factor * (1 - extra) + f[i] * extra
    end
    return f, scale
  end
  if t == "longrope" then
    local omax = r.original_max_position_embeddings
    local factor = r.factor or r.max_pos / omax
    local scale = r.attention_factor
    if scale == nil then
      scale = factor <= 1 and 1 or math.sqrt(1 + math.log(factor) / math.log(omax))
    end
    local ext = (seq_len and seq_len > omax) and r.long_factor or r.short_factor
    local f = plain(base, D)
    for i = 1, #f do f[i] = f[i] / ext[i] end
    return f, scale
  end
  error("rope: unknown type " .. tostring(t))
end

-- depends_on_length(r) -> whether the frequencies change with the call's largest position
function M.depends_on_length(r) return r.type == "dynamic" or r.type == "longrope" end

return M
