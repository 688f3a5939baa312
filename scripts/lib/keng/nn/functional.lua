-- keng.nn.functional — thin names over engine ops (docs/lua_api.md). Each entry is one engine
-- call; nothing here loops over elements. Shape letters: B batch, T/S lengths, H heads,
-- D head dim, C channels/classes.
local keng = require "keng"
local F = {}

F.softmax = function(x, dim) return keng.softmax(x, dim) end              -- over dim (1-based)
F.log_softmax = function(x, dim) return keng.log_softmax(x, dim) end
F.layer_norm = function(x, w, b, eps) return keng.layer_norm(x, w, b, eps) end    -- over the last dim
F.rms_norm = function(x, w, eps, opts) return keng.rms_norm(x, w, eps, opts) end  -- opts.unit_offset: (1+w)
F.group_norm = function(x, groups, w, b, eps) return keng.group_norm(x, groups, w, b, eps) end -- x [B,C,...]
F.conv2d = function(x, w, b, opts) return keng.conv2d(x, w, b, opts) end  -- x [B,C,H,W], w [O,C/g,kh,kw]
F.conv_transpose2d = function(x, w, b, opts) return keng.conv_transpose2d(x, w, b, opts) end
F.interpolate = function(x, opts) return keng.interpolate(x, opts) end    -- {scale=, size=, mode=, align_corners=, antialias=}
F.embedding = function(ids, table) return keng.embedding(ids, table) end   -- ids 0-based
F.dropout = function(x, p, training) return keng.dropout(x, p, training) end
F.scaled_dot_product_attention = function(q, k, v, opts)                    -- q [B,H,T,D], k/v [B,Hkv,S,D]
  return keng.scaled_dot_product_attention(q, k, v, opts)
end
F.rope = function(x, positions, opts) return keng.rope(x, positions, opts) end -- x [..., T, D]
F.cross_entropy = function(logits, targets, opts) return keng.cross_entropy(logits, targets, opts) end
F.mse_loss = function(a, b, opts) return keng.mse_loss(a, b, opts) end
F.linear = function(x, w, b) return keng.linear(x, w, b) end               -- x·wᵀ + b, w [out, in]
F.gelu = function(x, opts) return keng.gelu(x, opts) end
F.silu = function(x) return keng.silu(x) end
F.relu = function(x) return keng.relu(x) end
F.tanh = function(x) return keng.tanh(x) end
F.sigmoid = function(x) return keng.sigmoid(x) end
F.quick_gelu = function(x) return keng.quick_gelu(x) end
F.pad = function(x, pad, value) return keng.pad(x, pad, value) end

return F
