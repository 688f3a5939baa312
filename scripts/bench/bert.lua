-- bert.lua — the BERT rows (docs/benchmarks.md): a classifier (backbone -> pooler -> dropout -> Dense 2)
--   fit:     sparse CE from logits, AdamW(lr 1e-3, wd 0.004, b1 .9, b2 .999, eps 1e-7), all weights
--   predict: forward, logits [B,2]
-- Inputs: token_ids [B,T] = [CLS] + words + [SEP], segment_ids [B,T] zeros, padding_mask [B,T]
-- all ones; labels [B] in {0,1}. Shape letters: B batch, T tokens.
local keng = require "keng"
local optim = require "keng.optim"
local common = require "bench.common"
local config = require "bench.config"

local M = {}

function M.run(row, ctx)
  local bert = require "models.bert"
  local size = row[ctx.tier]
  local B, T = row.batch, size.seq
  keng.manual_seed(0)
  local model = bert.from_preset(size.preset, {num_classes = row.num_classes, dtype = ctx.dtype, device = ctx.device})
  local ids = common.bert_tokens(B, T, config.cpu_vocab.bert):to(ctx.device)     -- [B,T]
  local x = {token_ids = ids,
             segment_ids = keng.zeros({B, T}, {dtype = "i64", device = ctx.device}),
             padding_mask = keng.ones({B, T}, {dtype = "i64", device = ctx.device})}
  local total, trainable = model:num_params(), model:num_params{trainable = true}
  local info = {preset = size.preset, params = total, trainable = trainable,
                shapes = {token_ids = {B, T}, segment_ids = {B, T}, padding_mask = {B, T}}}
  local r
  if row.task == "fit" then
    local y = keng.tensor((function()
      local t = {}
      for i = 1, B do t[i] = (i - 1) % 2 end
      return t
    end)(), {dtype = "i64", device = ctx.device})                                 -- [B]
    info.shapes.labels = {B}
    local opt = optim.AdamW(model:parameters(), row.optimizer)
    r = common.time_fit(model, x, y, opt, function(logits, labels)
      return keng.cross_entropy(logits:float(), labels)
    end, ctx, B)
  else
    info.shapes.logits = {B, row.num_classes}
    r = common.time_predict(model, x, ctx, B)
  end
  for k, v in pairs(info) do r[k] = v end
  return r
end

return M
