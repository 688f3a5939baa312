-- keng.precision — Keras precision policies.
--   "float32"         parameters and compute in f32 (the default)
--   "bfloat16"        parameters, compute and optimizer state in bf16
--   "mixed_bfloat16"  f32 master parameters; layers cast inputs and weights to bf16 for compute
-- Norms, softmax and losses reduce in f32 whatever the policy (the engine accumulates in f32).
-- Layers read the policy when they are built, as in Keras; a layer given {dtype=} uses that.
local precision = {}

local policies = {
  float32 = {variable = "f32", compute = "f32"},
  bfloat16 = {variable = "bf16", compute = "bf16"},
  mixed_bfloat16 = {variable = "f32", compute = "bf16"},
  float16 = {variable = "f16", compute = "f16"},
  mixed_float16 = {variable = "f32", compute = "f16"},
}

local current = "float32"

-- set_policy(name) -> the previous policy's name
function precision.set_policy(name)
  if not policies[name] then
    local names = {}
    for k in pairs(policies) do names[#names + 1] = k end
    table.sort(names)
    error(string.format("set_policy: unknown policy '%s' (expected %s)", tostring(name),
      table.concat(names, ", ")), 2)
  end
  local old = current
  current = name
  return old
end

function precision.policy() return current end
-- the dtype new parameters get
function precision.variable_dtype() return policies[current].variable end
-- the dtype layers compute in
function precision.compute_dtype() return policies[current].compute end

-- with_policy(name, fn, ...) runs fn under a policy and restores the old one (also on error)
function precision.with_policy(name, fn, ...)
  local old = precision.set_policy(name)
  local res = table.pack(pcall(fn, ...))
  current = old
  if not res[1] then error(res[2], 0) end
  return table.unpack(res, 2, res.n)
end

return precision
