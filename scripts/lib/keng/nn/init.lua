-- keng.nn — modules: the Module base class (keng.nn.module), layers (keng.nn.layers), the
-- MultiHeadAttention and TransformerEncoderLayer blocks, initialisers by name, and `functional` (thin names over engine ops).
--   local nn = require "keng.nn"
--   local m = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
local nn = {}
nn.functional = require "keng.nn.functional"
nn.initializers = require "keng.nn.initializers"
nn.init = nn.initializers
nn.Module = require "keng.nn.module"
for name, cls in pairs(require "keng.nn.layers") do nn[name] = cls end
nn.MultiHeadAttention = require "keng.nn.attention"
nn.TransformerEncoderLayer = require "keng.nn.transformer"
return nn
