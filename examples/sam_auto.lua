-- examples/sam_auto.lua — SAM's automatic mask generator (models.sam_amg) on a photo: every mask
-- it keeps drawn in its own colour over the photo, written as a PNG.
--   keng examples/sam_auto.lua [out.png] [photo.jpg|png] [hf_checkpoint_dir]
-- Without a checkpoint the sam_tiny preset runs with random weights and loose thresholds (its
-- masks are then arbitrary; the point is the pipeline). With a Hugging Face SamModel directory
-- (e.g. facebook/sam-vit-base) the generator's defaults apply.
local keng = require "keng"
local sam = require "models.sam"
local amg = require "models.sam_amg"
local image = require "keng.image"

local out_path, photo_path, ckpt = arg[1] or "sam_auto.png", arg[2], arg[3]
keng.manual_seed(0)
local m = ckpt and sam.from_pretrained(ckpt) or sam.from_preset("sam_tiny")

local photo
if photo_path then
  photo = image.read(photo_path)
else                                                                -- 120 x 160: a gradient and two disks
  local h, w = 120, 160
  local xs = keng.arange(w):float():view{1, w}:expand{h, w}
  local ys = keng.arange(h):float():view{h, 1}:expand{h, w}
  local d1 = ((xs - 50) ^ 2 + (ys - 60) ^ 2):lt(900):float()
  local d2 = ((xs - 115) ^ 2 + (ys - 45) ^ 2):lt(400):float()
  local r = xs / w * 0.4 + 0.5 * d1
  local g = ys / h * 0.4 + 0.5 * d2
  photo = (keng.stack({r, g, (r + g) * 0.5}, 3) * 255):clamp(0, 255):to("u8"):contiguous()
end

local opts = ckpt and {} or {points_per_crop = 16, pred_iou_thresh = 0, stability_score_thresh = 0}
local t0 = os.clock()
local r = amg.generate(m, photo, opts)
local N = r.masks.shape[1]
print(string.format("%d masks in %.1f s (CPU time)", N, os.clock() - t0))

local out = photo:float()                                           -- [H, W, 3]
local colors = {{230, 25, 75}, {60, 180, 75}, {255, 225, 25}, {0, 130, 200}, {245, 130, 48}, {145, 30, 180},
                {70, 240, 240}, {240, 50, 230}}
for i = N, 1, -1 do                                                 -- the best mask drawn last (on top)
  local mk = r.masks[i]:float():unsqueeze(3)                        -- [H, W, 1]
  local c = keng.tensor(colors[(i - 1) % #colors + 1]):view{1, 1, 3}
  out = out * (1 - 0.5 * mk) + c * (0.5 * mk)
end
local u8 = out:clamp(0, 255):to("u8"):contiguous()
for i = 1, N do                                                     -- box outlines
  local b = r.boxes[i]:tolist()
  local c = colors[(i - 1) % #colors + 1]
  image.fill_rect(u8, b[1] + 1, b[2] + 1, b[3] - b[1] + 1, 1, c)
  image.fill_rect(u8, b[1] + 1, b[4] + 1, b[3] - b[1] + 1, 1, c)
  image.fill_rect(u8, b[1] + 1, b[2] + 1, 1, b[4] - b[2] + 1, c)
  image.fill_rect(u8, b[3] + 1, b[2] + 1, 1, b[4] - b[2] + 1, c)
end
image.write_png(out_path, u8)
print(string.format("wrote %s (%dx%d, %d masks; scores %s)", out_path, u8.shape[2], u8.shape[1], N,
  N > 0 and string.format("%.3f..%.3f", r.scores:min():item(), r.scores:max():item()) or "-"))
