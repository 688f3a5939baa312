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

describe("model input errors", function()
  local bert = require "models.bert"
  local m = bert.from_preset("bert_tiny", {device = "cpu"})
  local cls = bert.from_preset("bert_tiny", {num_classes = 2})
  local ids = keng.zeros({1, 3}, {dtype = "i64"})

  it("BERT names an empty sequence (T = 0) instead of an internal select error", function()
    blames_here(function() m(keng.zeros({1, 0}, {dtype = "i64"})) end, "bert: token_ids [1,0] hold no tokens (T = 0)")
    blames_here(function() cls(keng.zeros({2, 0}, {dtype = "i64"})) end, "bert: token_ids [2,0] hold no tokens")
  end)

  it("BERT's input errors point at the user's line, through the classifier too", function()
    blames_here(function() m("hello") end, "bert: inputs must be {token_ids=")
    blames_here(function() m(keng.zeros({3}, {dtype = "i64"})) end, "bert: token_ids must be [B, T], got [3]")
    blames_here(function() m(keng.full({1, 3}, 99999, {dtype = "i64"})) end, "bert: token id 99999 is outside the vocabulary")
    blames_here(function() m{token_ids = ids, segment_ids = keng.zeros({1, 2}, {dtype = "i64"})} end,
      "bert: segment_ids [1,2] does not match token_ids [1,3]")
    blames_here(function() cls(keng.zeros({1, 600}, {dtype = "i64"})) end, "bert: 600 tokens exceed the 512 positions")
  end)
end)

describe("CLIP input errors", function()
  it("point at the user's line", function()
    local clip = require "models.clip"
    local m = clip.from_preset("sd_tiny_text")
    blames_here(function() m("x") end, "clip: token ids must be an integer tensor [B, T], got string")
    blames_here(function() m(keng.full({1, 3}, 1e6, {dtype = "i64"})) end, "clip: token id 1000000 is outside the vocabulary")
  end)
end)
