-- models.sam_amg — SAM's automatic mask generator: every object in a photo without prompts, as
-- Hugging Face's pipeline("mask-generation") (SamAutomaticMaskGenerator in segment_anything).
--
--   local amg = require "models.sam_amg"
--   local r = amg.generate(m, image.read("street.jpg"), {points_per_crop = 32})
--   r.masks   -- bool [N, H, W] at the photo's size, best predicted IoU first
--   r.scores  -- f32 [N] predicted IoU       r.boxes -- i64 [N, 4] x1, y1, x2, y2 (0-based, inclusive)
--
-- The work, per crop of the photo (the whole photo, plus 4^i crops in layer i when crops_n_layers
-- > 0): the processor resizes / normalises / pads it, the image encoder runs once; a grid of
-- points_per_crop² points goes through the prompt encoder and mask decoder points_per_batch at a
-- time (one prompt set per point: predict's point batches) for the three multimask outputs; those
-- whose predicted IoU is at most pred_iou_thresh are dropped at once, the others go back to the
-- crop's size (post_process_masks) a chunk at a time (M.upsample_elements: 64 MB of f32, where the
-- whole batch was 800 MB at 1024² for 64 points), and those whose stability score (the IoU of the
-- mask thresholded at mask_threshold ± stability_score_offset) is at most stability_score_thresh
-- are dropped, as are masks touching an inner crop edge (20 pixels). Their boxes then go through greedy non-maximum suppression (box
-- IoU > crops_nms_thresh suppresses the lower score), run in Lua over the kept boxes.
local keng = require "keng"
local image = require "keng.image"
local options = require "keng.options"
local sam_processor = require "models.sam_processor"

local M = {}

M.defaults = {points_per_crop = 32, points_per_batch = 64, pred_iou_thresh = 0.88, stability_score_thresh = 0.95,
  stability_score_offset = 1, mask_threshold = 0, crops_nms_thresh = 0.7, crops_n_layers = 0,
  crop_overlap_ratio = 512 / 1500, crop_n_points_downscale_factor = 1}
-- the most mask values upsampled at once (f32: 64 MB): a batch's masks that pass the IoU
-- threshold go to the crop's size in chunks of this many pixels, whatever points_per_batch is
M.upsample_elements = 2^24
local KEYS = {"processor", "progress"}
for k in pairs(M.defaults) do KEYS[#KEYS + 1] = k end
table.sort(KEYS)

-- crop boxes {x0, y0, x1, y1} (pixels, x1/y1 exclusive) and their layers: the whole image, then
-- 2^i x 2^i overlapping crops in layer i (HF's _generate_per_layer_crops)
function M.crop_boxes(h, w, layers, overlap_ratio)
  local boxes, layer = {{0, 0, w, h}}, {0}
  local short = math.min(h, w)
  for i = 1, layers do
    local n = 2 ^ i
    local overlap = math.floor(overlap_ratio * short * (2 / n))
    local cw = math.ceil((overlap * (n - 1) + w) / n)
    local ch = math.ceil((overlap * (n - 1) + h) / n)
    for a = 0, n - 1 do                                             -- x outer, y inner (product order)
      for b = 0, n - 1 do
        local x0, y0 = math.floor((cw - overlap) * a), math.floor((ch - overlap) * b)
        boxes[#boxes + 1] = {x0, y0, math.min(x0 + cw, w), math.min(y0 + ch, h)}
        layer[#layer + 1] = i
      end
    end
  end
  return boxes, layer
end

-- f32 [n·n, 2] point centres of an n x n grid over [0, 1]², x fastest (HF's _build_point_grid)
function M.point_grid(n)
  local lo, hi = 1 / (2 * n), 1 - 1 / (2 * n)
  local v, step = {}, n > 1 and (hi - lo) / (n - 1) or 0
  for i = 0, n - 1 do v[i + 1] = i < n / 2 and lo + step * i or hi - step * (n - 1 - i) end   -- as torch.linspace
  local ax = keng.tensor(v)
  local xs = ax:view{1, n, 1}:expand{n, n, 1}
  local ys = ax:view{n, 1, 1}:expand{n, n, 1}
  return keng.cat({xs, ys}, 3):reshape{n * n, 2}
end

-- i64 [N, 4] x1, y1, x2, y2 of bool masks [N, H, W] (inclusive pixel ids; 0s for an empty mask)
function M.mask_boxes(masks)
  local N, H, W = masks.shape[1], masks.shape[2], masks.shape[3]
  if N == 0 then return keng.zeros({0, 4}, {dtype = "i64"}) end
  local function edges(any, n)                                      -- any f32 [N, n] of 0/1
    local idx = keng.arange(n, {device = masks.device}):view{1, n}
    local hi = (any * idx):max(2)
    local lo = (any * idx + (1 - any) * n):min(2)
    return lo, hi
  end
  local top, bottom = edges(masks:sum(3):gt(0):float(), H)
  local left, right = edges(masks:sum(2):gt(0):float(), W)
  local empty = right:lt(left) + bottom:lt(top)                    -- bool + bool: or
  local b = keng.stack({left, top, right, bottom}, 2)
  return keng.where(empty:unsqueeze(2), 0, b):to("i64")
end

-- stability scores f32 [N] of mask logits [N, H, W]: #(x > t + o) / #(x > t - o)
function M.stability_scores(masks, threshold, offset)
  local inter = masks:gt(threshold + offset):sum({2, 3})
  local union = masks:gt(threshold - offset):sum({2, 3})
  return inter / union
end

local function f32(x) return (string.unpack("f", string.pack("f", x))) end

-- greedy NMS: ids (1-based) of boxes (Lua lists {x1, y1, x2, y2}) kept, best score first; a box
-- whose IoU with a kept one is > thresh goes (torchvision's nms: areas (x2-x1)(y2-y1), the IoU
-- rounded to f32, ties in score in their given order)
function M.nms(boxes, scores, thresh)
  local order = {}
  for i = 1, #boxes do order[i] = i end
  table.sort(order, function(a, b)
    if scores[a] ~= scores[b] then return scores[a] > scores[b] end
    return a < b
  end)
  local keep, gone = {}, {}
  for _, i in ipairs(order) do
    if not gone[i] then
      keep[#keep + 1] = i
      local a = boxes[i]
      local area_a = (a[3] - a[1]) * (a[4] - a[2])
      for _, j in ipairs(order) do
        if not gone[j] and j ~= i then
          local b = boxes[j]
          local iw = math.max(0, math.min(a[3], b[3]) - math.max(a[1], b[1]))
          local ih = math.max(0, math.min(a[4], b[4]) - math.max(a[2], b[2]))
          local inter = iw * ih
          local area_b = (b[3] - b[1]) * (b[4] - b[2])
          if f32(inter / (area_a + area_b - inter + 0.0)) > thresh then gone[j] = true end
        end
      end
      gone[i] = true
    end
  end
  return keep
end

local function near_crop_edge(box, crop, W, H)                       -- box: offset to the image
  local img = {0, 0, W, H}
  for k = 1, 4 do
    if math.abs(box[k] - crop[k]) <= 20 and math.abs(box[k] - img[k]) > 20 then return true end
  end
  return false
end

local function check(opts)
  opts = options.check("sam_amg.generate", opts, KEYS, 3)
  local o = {}
  for k, v in pairs(M.defaults) do o[k] = opts[k] == nil and v or opts[k] end
  local who = "sam_amg.generate"
  options.integer(who, "points_per_crop", o.points_per_crop, 1, 3)
  options.integer(who, "points_per_batch", o.points_per_batch, 1, 3)
  options.integer(who, "crops_n_layers", o.crops_n_layers, 0, 3)
  options.integer(who, "crop_n_points_downscale_factor", o.crop_n_points_downscale_factor, 1, 3)
  for _, k in ipairs{"pred_iou_thresh", "stability_score_thresh", "stability_score_offset", "mask_threshold",
                     "crops_nms_thresh", "crop_overlap_ratio"} do
    options.number(who, k, o[k], nil, nil, 3)
  end
  o.processor = opts.processor
  o.progress = require("keng.progress").check_option(who, opts.progress, 3)
  return o
end

-- generate(m, image, opts) -> {masks = bool [N, H, W], scores = f32 [N], boxes = i64 [N, 4]}
-- image: u8 [H, W, 3] or a file path. opts (HF pipeline names and defaults): points_per_crop 32,
-- points_per_batch 64, pred_iou_thresh 0.88, stability_score_thresh 0.95 (a threshold ≤ 0 is
-- off), stability_score_offset 1, mask_threshold 0, crops_nms_thresh 0.7, crops_n_layers 0,
-- crop_overlap_ratio 512/1500, crop_n_points_downscale_factor 1, processor (default
-- sam_processor.for_model(m)), progress (a bar of decode batches on stderr: nil on a terminal,
-- true / false).
function M.generate(m, img, opts)
  local o = check(opts)
  if type(img) == "string" then img = image.read(img) end
  if not keng.is_tensor(img) or img.dtype ~= "u8" or img.ndim ~= 3 or img.shape[3] ~= 3 then
    error("sam_amg.generate: image must be u8 [H, W, 3] or a file path", 2)
  end
  local proc = o.processor or sam_processor.for_model(m)
  local H, W = img.shape[1], img.shape[2]
  local crops, layers = M.crop_boxes(H, W, o.crops_n_layers, o.crop_overlap_ratio)
  local was = m.training
  m:eval()
  local all_masks, all_scores, all_boxes = {}, {}, {}
  local side, batches = {}, 0                                        -- grid side per crop; decode batches
  for c = 1, #crops do
    side[c] = math.floor(o.points_per_crop / o.crop_n_points_downscale_factor ^ layers[c])
    batches = batches + math.ceil(side[c] ^ 2 / o.points_per_batch)
  end
  local bar = require("keng.progress").task("masks", batches, {enabled = o.progress, unit = "batch"})
  local done = 0
  local ok, err = pcall(keng.no_grad, function()
    for c, crop in ipairs(crops) do
      local x0, y0, x1, y1 = crop[1], crop[2], crop[3], crop[4]
      local ch, cw = y1 - y0, x1 - x0
      local piece = img:narrow(1, y0 + 1, ch):narrow(2, x0 + 1, cw):contiguous()
      local inputs = proc:preprocess(piece)
      local px = inputs.pixel_values:to{device = m:param_device(), dtype = m:param_dtype()}
      local emb = m.vision_encoder(px, true)                       -- [1, E, h, w]
      local grid = M.point_grid(side[c]) * keng.tensor({cw, ch}):view{1, 2}   -- crop pixels
      local nh, nw = proc:resized_size(ch, cw)
      local pts = grid * keng.tensor({nw / cw, nh / ch}):view{1, 2}  -- [n², 2] model pixels
      local total = pts.shape[1]
      for s = 1, total, o.points_per_batch do
        local P = math.min(o.points_per_batch, total - s + 1)
        local p = pts:narrow(1, s, P):view{1, P, 1, 2}
        local out = m:predict{image_embeddings = emb, points = p, labels = keng.ones({1, P, 1})}
        local low = out.masks:narrow(3, 2, 3)                       -- [1, P, 3, h, w] the multimask outputs
        local hl, wl = low.shape[4], low.shape[5]
        local iou = out.iou_pred:narrow(3, 2, 3):reshape{P * 3}:float()
        -- the IoU threshold needs no upsampling: only its survivors are upsampled, in chunks of
        -- M.upsample_elements values (64 MB of f32), not the whole batch (3·P masks at the crop's size)
        local cand = {}
        if o.pred_iou_thresh > 0 then
          for i, v in ipairs(iou:gt(o.pred_iou_thresh):tolist()) do if v then cand[#cand + 1] = i - 1 end end
        else
          for i = 1, P * 3 do cand[i] = i - 1 end
        end
        local flat = low:reshape{P * 3, hl, wl}
        local chunk = math.max(1, M.upsample_elements // (ch * cw))
        local kept_masks, kept_ids = {}, {}
        for c0 = 1, #cand, chunk do
          local ids = table.move(cand, c0, math.min(c0 + chunk - 1, #cand), 1, {})
          local idx = keng.tensor(ids, {dtype = "i64", device = flat.device})
          -- on the model's device (f32): the upsampling and the scores; the kept masks come to the CPU
          local up = proc:post_process_masks(flat:index_select(1, idx):view{1, #ids, hl, wl}, inputs.original_sizes,
            inputs.reshaped_sizes, {binarize = false})[1]            -- [k, ch, cw]
          local sel = ids
          if o.stability_score_thresh > 0 then
            local st = M.stability_scores(up, o.mask_threshold, o.stability_score_offset)
            local rows = {}
            sel = {}
            for i, v in ipairs(st:gt(o.stability_score_thresh):tolist()) do
              if v then rows[#rows + 1], sel[#sel + 1] = i - 1, ids[i] end
            end
            up = #rows > 0 and up:index_select(1, keng.tensor(rows, {dtype = "i64", device = up.device})) or nil
          end
          if up and #sel > 0 then
            kept_masks[#kept_masks + 1] = up:gt(o.mask_threshold):to{device = "cpu"}   -- bool [k', ch, cw]
            table.move(sel, 1, #sel, #kept_ids + 1, kept_ids)
          end
        end
        if #kept_ids > 0 then
          local masks = #kept_masks == 1 and kept_masks[1] or keng.cat(kept_masks, 1)
          local scores = iou:index_select(1, keng.tensor(kept_ids, {dtype = "i64", device = iou.device})):tolist()
          local boxes = M.mask_boxes(masks):tolist()
          for i, b in ipairs(boxes) do
            local bb = {b[1] + x0, b[2] + y0, b[3] + x0, b[4] + y0}
            if not near_crop_edge(bb, crop, W, H) then
              local mk = masks[i]
              if cw ~= W or ch ~= H then
                local full = keng.zeros({H, W}, {dtype = "bool"})
                full:narrow(1, y0 + 1, ch):narrow(2, x0 + 1, cw):copy_(mk)
                mk = full
              end
              all_masks[#all_masks + 1], all_scores[#all_scores + 1], all_boxes[#all_boxes + 1] = mk, scores[i], bb
            end
          end
        end
        done = done + 1
        bar:update(done, #all_masks .. " kept")
      end
    end
  end)
  if was then m:train() end
  if not ok then error(tostring(err):gsub("^[^:]*:%d+: ", ""), 2) end
  bar:finish(#all_masks .. " kept")
  local keep = M.nms(all_boxes, all_scores, o.crops_nms_thresh)
  local masks, scores, boxes = {}, {}, {}
  for i, k in ipairs(keep) do masks[i], scores[i], boxes[i] = all_masks[k], all_scores[k], all_boxes[k] end
  if #keep == 0 then
    return {masks = keng.zeros({0, H, W}, {dtype = "bool"}), scores = keng.zeros({0}),
            boxes = keng.zeros({0, 4}, {dtype = "i64"})}
  end
  return {masks = keng.stack(masks, 1), scores = keng.tensor(scores), boxes = keng.tensor(boxes, {dtype = "i64"})}
end

return M
