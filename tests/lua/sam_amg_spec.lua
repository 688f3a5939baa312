-- sam_amg_spec.lua — SAM around the model: several prompt sets per image (point batches), the
-- processor (resize longest side, normalise, pad; points to the resized frame), mask
-- post-processing to the photo's size, and the automatic mask generator, against transformers'
-- SamModel / SamProcessor / pipeline("mask-generation") on the tiny model of tests/fixtures/sam
-- (tests/fixtures/gen/gen_sam_amg.py wrote amg.safetensors).
local keng = require "keng"
local H = require "helper"
local sam = require "models.sam"
local sam_processor = require "models.sam_processor"
local amg = require "models.sam_amg"

local FIX = "tests/fixtures/sam"

local function loaded()
  return sam.from_pretrained(FIX), keng.load(FIX .. "/golden.safetensors"), keng.load(FIX .. "/amg.safetensors")
end

describe("sam point batches (several prompt sets per image)", function()
  it("gives HF's masks and IoU for points [B, P, K, 2] with padding labels", function()
    local m, g, a = loaded()
    local out = m:predict{image_embeddings = g.embeddings, points = a.pb_points, labels = a.pb_labels}
    assert.are.same({2, 3, 4, 24, 24}, out.masks.shape)
    H.close(out.masks, a.pb_masks, 1e-4, "masks")
    H.close(out.iou_pred, a.pb_iou, 1e-4, "iou")
  end)

  it("gives HF's masks and IoU for boxes [B, P, 4]", function()
    local m, g, a = loaded()
    local out = m:predict{image_embeddings = g.embeddings, boxes = a.pbb_boxes}
    assert.are.same({2, 3, 4}, out.iou_pred.shape)
    H.close(out.masks, a.pbb_masks, 1e-4, "masks")
    H.close(out.iou_pred, a.pbb_iou, 1e-4, "iou")
  end)

  it("decodes each prompt set as it would alone (from images, with a mask input)", function()
    local m, g, a = loaded()
    local mask_in = g.mask_input
    local out = m:predict{images = g.images, points = a.pb_points, labels = a.pb_labels, masks = mask_in}
    for p = 1, 3 do
      local one = m:predict{image_embeddings = g.embeddings, points = a.pb_points:select(2, p),
                            labels = a.pb_labels:select(2, p), masks = mask_in}
      H.close(out.masks:select(2, p), one.masks, 1e-4, "set " .. p)
    end
  end)

  it("names the expected shapes of mismatched prompt sets", function()
    local m, g, a = loaded()
    H.raises(function() m:predict{image_embeddings = g.embeddings, points = a.pb_points, labels = a.pb_labels:narrow(2, 1, 2)} end,
      "labels must be [2, 3, 2] (2 images x 3 prompt sets), got [2,2,2]")
    H.raises(function() m:predict{image_embeddings = g.embeddings, points = a.pb_points, boxes = keng.zeros({2, 2, 4})} end,
      "boxes must be [2, 3, 4] (2 images x 3 prompt sets), got [2,2,4]")
    H.raises(function() m:predict{image_embeddings = g.embeddings, points = keng.zeros({1, 3, 2, 2})} end,
      "points must be [2, 3, K, 2]")
    H.raises(function() m:predict{images = g.images, pixel_values = g.images, points = {{1, 2}}} end,
      "give images or pixel_values, not both")
    H.raises(function() m:predict{image_embeddings = g.embeddings, labels = a.pb_labels, boxes = a.pbb_boxes} end,
      "labels given without points")
    H.raises(function() m:forward{points = {{1, 2}}} end, "images (or pixel_values, image_embeddings) missing")
  end)
end)

describe("sam processor", function()
  it("resizes, normalises and pads a photo as SamProcessor", function()
    local m, _, a = loaded()
    local proc = sam_processor.for_model(m)
    local inputs = proc:preprocess(a.photo)
    assert.are.same({{40, 60}}, inputs.original_sizes)
    assert.are.same({{64, 96}}, inputs.reshaped_sizes)
    assert.are.same({1, 3, 96, 96}, inputs.pixel_values.shape)
    -- the u8 resize is torch's integer arithmetic; normalising differs in f32 rounding only
    H.close(inputs.pixel_values, a.pixel_values, 1e-5, "pixel_values")
    local pad = inputs.pixel_values:narrow(3, 65, 32)
    assert.are.equal(0, pad:abs():max():item())
  end)

  it("takes a list of photos of different sizes", function()
    local m, _, a = loaded()
    local proc = sam_processor.for_model(m)
    local crop = a.photo:narrow(1, 1, 30):narrow(2, 1, 20):contiguous()
    local inputs = proc:preprocess({a.photo, crop})
    assert.are.same({2, 3, 96, 96}, inputs.pixel_values.shape)
    assert.are.same({{40, 60}, {30, 20}}, inputs.original_sizes)
    assert.are.same({{64, 96}, {96, 64}}, inputs.reshaped_sizes)
    H.close(inputs.pixel_values:narrow(1, 1, 1), proc:preprocess(a.photo).pixel_values, 0, "row 1")
    local pts = proc:scale_points({{{10, 5}}, {{10, 5}}}, inputs.original_sizes)
    H.close(pts, keng.tensor({{{16, 8}}, {{32, 16}}}), 1e-6, "per-image scale")
  end)

  it("gives HF's model input from HF's pixel_values and its scaled points", function()
    local m, g, a = loaded()
    local proc = sam_processor.for_model(m)
    local pts = proc:scale_points({{{10, 5}, {45, 30}}}, {{40, 60}})
    H.close(pts, a.proc_points, 0, "points")
    local boxes = proc:scale_boxes({{10, 5, 45, 30}}, {{40, 60}})
    H.close(boxes, keng.tensor({{16, 8, 72, 48}}), 1e-6, "boxes")
    -- pixel_values skip the model's own normalisation
    local e1 = keng.no_grad(function() return m.encoder(g.images) end)
    local mean = keng.tensor({0.485, 0.456, 0.406}):view{1, 3, 1, 1}
    local std = keng.tensor({0.229, 0.224, 0.225}):view{1, 3, 1, 1}
    local out = m:predict{pixel_values = (g.images - mean) / std, points = g.points, labels = g.labels}
    H.close(out.image_embeddings, e1, 1e-5, "pixel_values")
  end)

  it("post-processes masks to the photo's size as post_process_masks", function()
    local m, _, a = loaded()
    local proc = sam_processor.for_model(m)
    local out = m:predict{pixel_values = a.pixel_values, points = a.proc_points:unsqueeze(2)}
    local low = out.masks:narrow(3, 2, 3)                           -- [1, 1, 3, 24, 24] multimask
    local up = proc:post_process_masks(low, {{40, 60}}, {{64, 96}}, {binarize = false})
    assert.are.same({1, 3, 40, 60}, up[1].shape)
    H.close(up[1], a.up_masks, 1e-4, "logits")
    local bin = proc:post_process_masks(low, {{40, 60}}, {{64, 96}})[1]
    assert.are.equal("bool", bin.dtype)
    assert.are.equal(0, bin:ne(a.up_masks:gt(0)):sum():item())
    local thr = proc:post_process_masks(low, {{40, 60}}, {{64, 96}}, {mask_threshold = 1e9})[1]
    assert.are.equal(0, thr:sum():item())
  end)

  it("reports bad input", function()
    local proc = sam_processor.new{size = 96}
    H.raises(function() proc:preprocess(keng.rand({3, 40, 60})) end, "image 1 must be u8 [H, W, 3]")
    H.raises(function() proc:scale_points({1, 2}, {{40, 60}}) end, "expected [B, ..., 2], got [2]")
    H.raises(function() proc:scale_points({{{1, 2}}, {{3, 4}}, {{5, 6}}}, {{4, 6}, {5, 5}}) end,
      "2 original sizes for 3 images")
    H.raises(function() proc:post_process_masks(keng.zeros({2, 3, 24, 24}), {{4, 6}}, {{4, 6}}) end,
      "original_sizes must be a list of 2 {h, w} pairs")
    H.raises(function() proc:post_process_masks(keng.zeros({1, 3, 24, 24}), {{4, 6}}, {{4, 6}}, {threshold = 1}) end,
      "unknown option 'threshold'")
    H.raises(function() sam_processor.new{size = 96, pad_size = 64} end, "pad_size")
    H.raises(function() proc:post_process_masks({}, {{4, 6}}, {{4, 6}}) end, "masks must be a tensor [B, ..., h, w]")
    H.raises(function() proc:post_process_masks(keng.zeros({1, 3, 24, 24}), {{4, 6.5}}, {{4, 6}}) end,
      "original_sizes[1] must be an {h, w} pair of positive integers")
    H.raises(function() proc:scale_boxes({{1, 2, 3}}, {{4, 6}}) end, "scale_boxes: expected [B, ..., 4], got [1,3]")
  end)
end)

-- the generator fixture's model: blocky, confident masks (see gen_sam_amg.py)
local function amg_model()
  local m, _, a = loaded()
  keng.no_grad(function()
    for _, name in ipairs{"upscale_conv1", "upscale_conv2"} do
      local w = m.mask_decoder[name].weight
      w:copy_(w:mean({3, 4}, true):expand(w.shape))
    end
    for i = 0, 3 do
      local po = m.mask_decoder.output_hypernetworks_mlps[i].proj_out
      po.weight:mul_(10)
      po.bias:mul_(10)
    end
  end)
  return m, a
end

local BASE = {points_per_crop = 8, points_per_batch = 20, stability_score_thresh = 0.8, stability_score_offset = 0.05}
local function with(extra)
  local o = {}
  for k, v in pairs(BASE) do o[k] = v end
  for k, v in pairs(extra) do o[k] = v end
  return o
end

describe("sam automatic mask generator", function()
  -- masks, boxes and count exactly; scores as the model's IoU head (1e-4)
  local function same(r, a, name)
    assert.are.same(a[name .. "_masks"].shape, r.masks.shape)
    assert.are.equal(0, r.masks:to("u8"):ne(a[name .. "_masks"]):sum():item(), "masks")
    assert.are.same(a[name .. "_boxes"]:tolist(), r.boxes:tolist())
    H.close(r.scores, a[name .. "_scores"], 1e-4, "scores")
  end

  it("finds HF's masks, boxes and scores (IoU and stability thresholds, NMS)", function()
    local m, a = amg_model()
    same(amg.generate(m, a.photo, with{pred_iou_thresh = 0.001}), a, "amg")
  end)

  it("upsamples only the masks that pass the IoU threshold, in bounded chunks, with the same results", function()
    local m, a = amg_model()
    local proc = require("models.sam_processor").for_model(m)
    local calls, masks, biggest = 0, 0, 0
    local inner = proc.post_process_masks
    proc.post_process_masks = function(self, x, ...)
      calls, masks = calls + 1, masks + x.shape[2]
      biggest = math.max(biggest, x.shape[2])
      return inner(self, x, ...)
    end
    local saved = amg.upsample_elements
    amg.upsample_elements = 3 * 40 * 60                               -- 3 masks of the 40 x 60 photo at a time
    local ok, r = pcall(amg.generate, m, a.photo, with{pred_iou_thresh = 0.001, processor = proc})
    amg.upsample_elements = saved
    assert(ok, r)
    same(r, a, "amg")
    assert.are.equal(3, biggest)
    -- 64 points x 3 outputs; the threshold drops some before any upsampling
    assert.truthy(masks < 64 * 3 and masks >= r.masks.shape[1], masks .. " upsampled")
    -- per decode batch (4 of 20 points) its survivors in chunks of 3
    assert.truthy(calls >= math.ceil(masks / 3) and calls <= math.ceil(masks / 3) + 4, calls .. " calls, " .. masks .. " masks")
  end)

  it("finds HF's masks over a layer of crops", function()
    local m, a = amg_model()
    same(amg.generate(m, a.photo, with{pred_iou_thresh = 0, crops_n_layers = 1}), a, "crop")
  end)

  it("reads the photo from a file", function()
    local m, a = amg_model()
    local path = os.tmpname() .. ".png"
    require("keng.image").write(path, a.photo)
    local r = amg.generate(m, path, with{pred_iou_thresh = 0.001})
    os.remove(path)
    same(r, a, "amg")
  end)

  it("keeps nothing when the thresholds are out of reach", function()
    local m, a = amg_model()
    local r = amg.generate(m, a.photo, with{pred_iou_thresh = 10})
    assert.are.same({0, 40, 60}, r.masks.shape)
    assert.are.same({0}, r.scores.shape)
  end)

  it("suppresses overlapping boxes greedily by score (torchvision's rule)", function()
    local boxes = {{0, 0, 10, 10}, {1, 1, 10, 10}, {20, 20, 30, 30}, {0, 0, 10, 10}}
    assert.are.same({3, 1}, amg.nms(boxes, {0.5, 0.4, 0.9, 0.5}, 0.7))           -- the tie: first given first
    assert.are.same({3, 1, 2}, amg.nms(boxes, {0.5, 0.4, 0.9, 0.5}, 0.9))         -- IoU 0.81 stays
    assert.are.same({}, amg.nms({}, {}, 0.7))
  end)

  it("boxes masks with inclusive pixel ids, zeros when empty", function()
    local m = keng.zeros({2, 5, 7}, {dtype = "bool"})
    m[1]:narrow(1, 2, 3):narrow(2, 3, 2):fill_(true)                -- rows 1..3, columns 2..3 (0-based)
    assert.are.same({{2, 1, 3, 3}, {0, 0, 0, 0}}, amg.mask_boxes(m):tolist())
  end)

  it("refuses unknown options and bad values by name", function()
    local m, a = amg_model()
    H.raises(function() amg.generate(m, a.photo, {points_per_side = 8}) end, "unknown option 'points_per_side'")
    H.raises(function() amg.generate(m, a.photo, {points_per_batch = 0}) end, "points_per_batch")
    H.raises(function() amg.generate(m, keng.rand({3, 40, 60})) end, "image must be u8 [H, W, 3]")
    H.raises(function() amg.generate(m, a.photo, {progress = "on"}) end, "progress must be true, false or nil")
  end)
end)
