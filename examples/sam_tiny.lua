-- examples/sam_tiny.lua — Segment Anything on a synthetic image: one foreground point, the mask
-- with the best predicted IoU drawn in red over the image, written as a PNG.
--   keng examples/sam_tiny.lua [out.png] [hf_checkpoint_dir]
-- Without a checkpoint the sam_tiny preset runs with random weights (the mask is then arbitrary;
-- the point of the example is the pipeline). With a Hugging Face SamModel directory (config.json
-- + model.safetensors, e.g. facebook/sam-vit-base) the image is drawn at that model's size.
local keng = require "keng"
local sam = require "models.sam"
local image = require "keng.image"

local out_path, ckpt = arg[1] or "sam_tiny.png", arg[2]
keng.manual_seed(0)
local m = ckpt and sam.from_pretrained(ckpt) or sam.from_preset("sam_tiny")
local S = m.cfg.image_size

-- a grey gradient with a bright disk of radius S/5 centred at (0.4 S, 0.45 S), NCHW in [0, 1]
local ax = keng.arange(S):float()
local xs, ys = ax:view{1, S}:expand{S, S}, ax:view{S, 1}:expand{S, S}
local cx, cy, r = 0.4 * S, 0.45 * S, S / 5
local disk = ((xs - cx) ^ 2 + (ys - cy) ^ 2):lt(r * r):float()     -- [S, S]
local bg = xs / (2 * S) + 0.2
local img = keng.stack({bg + 0.6 * disk, bg + 0.3 * disk, bg * 0.8}, 1):clamp(0, 1)   -- [3, S, S]

local out = m:predict{images = img:unsqueeze(1), points = {{cx, cy}}, labels = {1}}
local iou = out.iou_pred[1]                                         -- [4]
local best = iou:argmax():item() + 1                                -- argmax is 0-based
local parts = {}
for i, v in ipairs(iou:tolist()) do parts[i] = string.format("%.3f", v) end
print(string.format("predicted IoU per mask: %s (drawing mask %d)", table.concat(parts, ", "), best))

-- mask logits [4h, 4w] -> upsampled to S x S -> overlay
local logits = out.masks[1][best]:view{1, 1, S // 4, S // 4}
local mask = keng.interpolate(logits, {scale = 4, mode = "nearest"}):view{1, S, S}:gt(0):float()
local red = keng.tensor({1, 0, 0}):view{3, 1, 1}
local blend = img * (1 - 0.5 * mask) + red * (0.5 * mask)           -- [3, S, S]
local u8 = (blend:permute{2, 3, 1} * 255):clamp(0, 255):to("u8"):contiguous()  -- [S, S, 3]
image.fill_rect(u8, math.floor(cx) - 1, math.floor(cy) - 1, 4, 4, {0, 255, 0})   -- the prompt point
image.write_png(out_path, u8)
print(string.format("wrote %s (%dx%d, mask covers %.1f%% of the image)", out_path, S, S,
  100 * mask:mean():item()))
