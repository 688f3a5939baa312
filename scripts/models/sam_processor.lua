-- models.sam_processor — what Hugging Face's SamProcessor / SamImageProcessor do around SamModel:
-- a photo of any size is resized so its longest side is the model's input side S (bilinear,
-- antialiased, on the u8 pixels), rescaled by 1/255, normalised with the ImageNet mean/std and
-- padded with zeros at the bottom and right to S x S; prompts given in the photo's pixels are
-- scaled to the resized frame; the model's low-resolution masks go back to the photo's size.
--
--   local sam_processor = require "models.sam_processor"
--   local proc = sam_processor.new{size = m.cfg.image_size}        -- or sam_processor.for_model(m)
--   local inputs = proc:preprocess(image.read("cat.jpg"))          -- u8 [H, W, 3], or a list of them
--   local out = m:predict{pixel_values = inputs.pixel_values,
--                         points = proc:scale_points({{{500, 375}}}, inputs.original_sizes)}
--   local masks = proc:post_process_masks(out.masks, inputs.original_sizes, inputs.reshaped_sizes)
--   masks[1]   -- bool [P, 4, H, W] (or [4, H, W]): the first photo's masks at its own size
--
-- Sizes are {h, w} pairs, one per image. Point coordinates are (x, y) pixels.
local keng = require "keng"
local image = require "keng.image"
local options = require "keng.options"
local shape_str = require("keng.util").shape_str

local M = {}

local Processor = {}
Processor.__index = Processor

local MEAN, STD = {0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}

-- new{size = 1024, pad_size = size, mean = ImageNet, std = ImageNet}: size is the longest side
-- after resizing (HF's size.longest_edge), pad_size the square side after padding
function M.new(opts)
  opts = options.check("sam_processor.new", opts, {"size", "pad_size", "mean", "std"})
  local p = setmetatable({}, Processor)
  p.size = options.integer("sam_processor.new", "size", opts.size or 1024, 1, 2)
  p.pad_size = options.integer("sam_processor.new", "pad_size", opts.pad_size or p.size, p.size, 2)
  p.mean, p.std = opts.mean or MEAN, opts.std or STD
  return p
end

-- for_model(m): a processor for a models.sam model's input side
function M.for_model(m, opts)
  opts = options.check("sam_processor.for_model", opts, {"mean", "std"})
  return M.new{size = m.cfg.image_size, mean = opts.mean, std = opts.std}
end

-- the resized {h, w} of an h x w image: the longest side to `size`, the other rounded half up
-- (HF's _get_preprocess_shape, segment_anything's ResizeLongestSide)
function Processor:resized_size(h, w)
  local s = self.size / math.max(h, w)
  return math.floor(h * s + 0.5), math.floor(w * s + 0.5)
end

local function image_list(images, who)
  if keng.is_tensor(images) then images = {images} end
  if type(images) ~= "table" or #images == 0 then error(who .. ": images must be a u8 [H, W, 3] tensor or a list of them", 3) end
  for i, t in ipairs(images) do
    if not keng.is_tensor(t) or t.dtype ~= "u8" or t.ndim ~= 3 or t.shape[3] ~= 3 then
      error(string.format("%s: image %d must be u8 [H, W, 3] (as image.read gives), got %s", who, i,
        keng.is_tensor(t) and (t.dtype .. " " .. shape_str(t)) or type(t)), 3)
    end
  end
  return images
end

-- preprocess(images) -> {pixel_values = f32 [B, 3, S, S], original_sizes = {{h, w}, ...},
-- reshaped_sizes = {{h, w}, ...}}. images: one u8 [H, W, 3] or a list (sizes may differ).
-- pixel_values are normalised already: pass them as predict{pixel_values =}.
function Processor:preprocess(images)
  images = image_list(images, "sam_processor:preprocess")
  local rows, orig, resh = {}, {}, {}
  local m255, s255 = {}, {}
  for c = 1, 3 do m255[c], s255[c] = self.mean[c] * 255, self.std[c] * 255 end
  for i, t in ipairs(images) do
    local h, w = t.shape[1], t.shape[2]
    local nh, nw = self:resized_size(h, w)
    local r = (nh == h and nw == w) and t or image.resize(t, {size = {nh, nw}})    -- u8, as torchvision's
    local x = image.normalize(r, m255, s255)                        -- f32 [3, nh, nw]
    rows[i] = image.pad(x, {size = {self.pad_size, self.pad_size}})
    orig[i], resh[i] = {h, w}, {nh, nw}
  end
  return {pixel_values = keng.stack(rows, 1), original_sizes = orig, reshaped_sizes = resh}
end

local function sizes_of(who, sizes, n, name)
  if type(sizes) ~= "table" or (n and #sizes ~= n) then
    error(string.format("%s: %s must be a list of %s{h, w} pairs", who, name, n and (n .. " ") or ""), 3)
  end
  for i, s in ipairs(sizes) do
    if type(s) ~= "table" or math.type(s[1]) ~= "integer" or math.type(s[2]) ~= "integer" or s[1] < 1 or s[2] < 1 then
      error(string.format("%s: %s[%d] must be an {h, w} pair of positive integers", who, name, i), 3)
    end
  end
  return sizes
end

-- scale_points(points, original_sizes) -> f32 tensor of the same shape [B, ..., 2]: (x, y) in
-- each photo's pixels scaled to the resized frame the model sees (x·nw/w, y·nh/h). points: a
-- tensor or nested lists, image first ([B, P, K, 2] for predict's prompt sets); one size serves
-- every image. scale_boxes does the same for [B, ..., 4] (x1, y1, x2, y2).
function Processor:scale_points(points, original_sizes, width)
  local who = width == 4 and "sam_processor:scale_boxes" or "sam_processor:scale_points"
  width = width or 2
  local t = keng.is_tensor(points) and points:float() or keng.tensor(points)
  if t.ndim < 2 or t.shape[t.ndim] ~= width then
    error(string.format("%s: expected [B, ..., %d], got %s", who, width, shape_str(t)), 2)
  end
  local B = t.shape[1]
  sizes_of(who, original_sizes, nil, "original_sizes")
  if #original_sizes ~= 1 and #original_sizes ~= B then
    error(string.format("%s: %d original sizes for %d images", who, #original_sizes, B), 2)
  end
  local f = {}
  for b = 1, B do
    local s = original_sizes[#original_sizes == 1 and 1 or b]
    local nh, nw = self:resized_size(s[1], s[2])
    for c = 1, width do f[#f + 1] = (c % 2 == 1) and nw / s[2] or nh / s[1] end
  end
  local shape = {B}
  for _ = 2, t.ndim - 1 do shape[#shape + 1] = 1 end
  shape[#shape + 1] = width
  return t * keng.tensor(f):view(shape)
end

function Processor:scale_boxes(boxes, original_sizes) return self:scale_points(boxes, original_sizes, 4) end

-- post_process_masks(masks, original_sizes, reshaped_sizes, {mask_threshold = 0, binarize = true})
-- -> a list with one tensor per image: masks [B, ..., h, w] (the model's logits, e.g. predict's
-- [B, 4, S/4, S/4] or [B, P, 4, S/4, S/4]) upscaled to the padded S x S (bilinear), cropped to
-- the resized image, resized to the original h x w (bilinear) and, with binarize, compared with
-- mask_threshold (bool); otherwise f32 logits. As HF's post_process_masks.
function Processor:post_process_masks(masks, original_sizes, reshaped_sizes, opts)
  local who = "sam_processor:post_process_masks"
  opts = options.check(who, opts, {"mask_threshold", "binarize"})
  if not keng.is_tensor(masks) or masks.ndim < 3 then error(who .. ": masks must be a tensor [B, ..., h, w]", 2) end
  local B = masks.shape[1]
  sizes_of(who, original_sizes, B, "original_sizes")
  sizes_of(who, reshaped_sizes, B, "reshaped_sizes")
  local thr = opts.mask_threshold or 0
  local out = {}
  for b = 1, B do
    local m = masks[b]                                             -- [..., h, w]
    local lead = {table.unpack(m.shape, 1, m.ndim - 2)}
    local h, w = m.shape[m.ndim - 1], m.shape[m.ndim]
    local x = m:float():reshape{1, -1, h, w}
    x = keng.interpolate(x, {size = {self.pad_size, self.pad_size}, mode = "bilinear"})
    local r = reshaped_sizes[b]
    x = x:narrow(3, 1, r[1]):narrow(4, 1, r[2])
    local o = original_sizes[b]
    x = keng.interpolate(x, {size = {o[1], o[2]}, mode = "bilinear"})
    lead[#lead + 1], lead[#lead + 2] = o[1], o[2]
    x = x:reshape(lead)
    out[b] = opts.binarize == false and x or x:gt(thr)
  end
  return out
end

M.Processor = Processor
return M
