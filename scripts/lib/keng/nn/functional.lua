-- keng.nn.functional — PyTorch's torch.nn.functional names for engine ops (docs/lua_api.md). Each
-- F.name is the engine function keng.name itself (no wrapper: same arguments, same errors).
-- Shape letters: B batch, T/S lengths, H heads, D head dim, C channels/classes.
local keng = require "keng"
local F = {}

local NAMES = {
  "softmax", "log_softmax",                 -- over dim (1-based)
  "layer_norm",                             -- (x, w, b, eps) over the last dim
  "rms_norm",                               -- (x, w, eps, {unit_offset =}): (1 + w) when set
  "group_norm",                             -- (x [B, C, ...], groups, w, b, eps)
  "conv2d", "conv_transpose2d",             -- (x [B, C, H, W], w [O, C/g, kh, kw], b, opts)
  "interpolate",                            -- (x, {scale =, size =, mode =, align_corners =, antialias =})
  "embedding",                              -- (ids (0-based), table)
  "dropout",                                -- (x, p, training)
  "scaled_dot_product_attention",           -- (q [B, H, T, D], k / v [B, Hkv, S, D], opts)
  "rope",                                   -- (x [..., T, D], positions, opts)
  "cross_entropy", "mse_loss",
  "linear",                                 -- (x, w [out, in], b): x·wᵀ + b
  "gelu", "silu", "relu", "tanh", "sigmoid", "quick_gelu",
  "softplus",                               -- (x, {beta = 1, threshold = 20})
  "pad",                                    -- (x, pad, value)
}

for _, name in ipairs(NAMES) do
  F[name] = keng[name] or error("keng.nn.functional: the engine has no keng." .. name)
end

return F
