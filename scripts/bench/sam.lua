-- sam.lua — the Segment Anything rows (docs/benchmarks.md):
--   fit:     the image encoder alone (m.encoder: ViTDet + neck), images [B, 3, S, S] uniform [0, 1),
--            target [B, 256, h, w] uniform, MSE, Adam(lr 1e-3, eps 1e-7) on every encoder weight, f32
--   predict: the full model (encoder, prompt encoder, mask decoder) under no_grad with two points
--            per image ([[500, 375], [250, 375]] at 1024, scaled to the tier's image size),
--            labels {1, 2}, no box, no mask -> masks [B, 4, 4h, 4w] logits, iou_pred [B, 4]
-- Shape letters: B batch, S image side, h = w = S / 16 (the grid).
local keng = require "keng"
local optim = require "keng.optim"
local bench = require "keng.bench"
local common = require "bench.common"

local M = {}

function M.run(row, ctx)
  local sam = require "models.sam"
  local size = row[ctx.tier]
  local B, S = row.batch, size.image
  keng.manual_seed(0)
  local model = sam.from_preset(size.preset, {dtype = ctx.dtype, device = ctx.device})
  local images = keng.rand({B, 3, S, S}):to{dtype = ctx.dtype, device = ctx.device}   -- [B, 3, S, S]
  local info = {preset = size.preset, shapes = {images = {B, 3, S, S}}}
  local r
  if row.task == "fit" then
    local enc = model.encoder
    local t = size.target                                           -- {h, w, 256} as Keras writes it
    local target = keng.rand({B, t[3], t[1], t[2]}):to{dtype = ctx.dtype, device = ctx.device}  -- [B, 256, h, w]
    info.shapes.target = target.shape
    info.params, info.trainable = enc:num_params(), enc:num_params{trainable = true}
    local opt = optim.Adam(enc:parameters(), {lr = 1e-3, eps = 1e-7})
    r = common.time_fit(enc, images, target, opt, function(pred, y)
      return keng.mse_loss(pred, y)
    end, ctx, B)
  else
    local args = {images = images, points = size.points, labels = size.labels}
    info.shapes.points = {B, #size.points, 2}
    info.params, info.trainable = model:num_params(), model:num_params{trainable = true}
    model:eval()
    r = keng.no_grad(function()
      local step, warmup, g = bench.graphed(function()               -- CUDA Graph replays on the GPU tier
        local out = model:forward(args)
        if not info.shapes.masks then info.shapes.masks, info.shapes.iou_pred = out.masks.shape, out.iou_pred.shape end
        return out.masks, out.iou_pred
      end, ctx)
      local res = bench.run(step, {steps = ctx.steps, warmup = warmup, items = B, on_step = ctx.on_step,
                                    profile = ctx.profile})
      res.graph, res.graph_error = g.graph, g.graph_error
      return res
    end)
  end
  for k, v in pairs(info) do r[k] = v end
  return r
end

return M
