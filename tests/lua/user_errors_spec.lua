-- user_errors_spec.lua — a wrong input is named as the user's mistake at the user's line: a
-- layer's input check blames the line that called the layer (not keng's module.lua), a string
-- where a tensor belongs is named as such (not "attempt to index a nil value").
local keng = require "keng"
local H = require "helper"
local nn = require "keng.nn"

local function blames_here(fn, pattern)
  local err = H.raises(fn, pattern)
  assert(err:find("user_errors_spec.lua:", 1, true), "error not blamed on the caller's line: " .. err)
  assert(not err:find("attempt to", 1, true), "an internal error leaked: " .. err)
  return err
end

describe("layer input errors", function()
  it("name a non-tensor input", function()
    blames_here(function() nn.Linear(4, 3)("x") end, "Linear: input must be a tensor, got the string \"x\"")
    blames_here(function() nn.LayerNorm(4)({1, 2}) end, "LayerNorm: input must be a tensor, got table")
    blames_here(function() nn.Embedding(4, 3)(nil) end, "Embedding: ids must be a tensor, got nil")
    blames_here(function() nn.Conv2d(1, 1, 3)(5) end, "Conv2d: input must be a tensor, got number")
    blames_here(function() nn.ReLU()("x") end, "ReLU: input must be a tensor")
    blames_here(function() nn.MultiHeadAttention(4, 2)(true) end, "MultiHeadAttention: input must be a tensor")
  end)

  it("point a shape error at the user's line, through Sequential too", function()
    blames_here(function() nn.Linear(4, 3)(keng.zeros({2, 5})) end, "Linear(4 -> 3): input [2,5] has 5 features")
    blames_here(function() nn.Sequential(nn.Linear(4, 3), nn.ReLU())(keng.zeros({2, 5})) end, "Linear(4 -> 3)")
    blames_here(function() nn.GroupNorm(3, 4) end, "GroupNorm: 4 channels do not split into 3 groups")
    blames_here(function() nn.MultiHeadAttention(5, 2) end, "MultiHeadAttention: dim 5 does not split into 2 heads")
    blames_here(function() nn.Dropout(2) end, "Dropout: p must be in [0, 1]")
  end)
end)
