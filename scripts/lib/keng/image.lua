-- keng.image — PNG and JPEG files, resizing helpers and simple drawing on u8 image tensors [H, W, C] (HWC, as in the file).
--
--   local image = require "keng.image"
--   local img = image.new(240, 320, {255, 255, 255})          -- white RGB canvas
--   image.fill_rect(img, 10, 20, 50, 30, {200, 0, 0})         -- x, y (1-based), w, h, colour
--   image.text(img, 12, 60, "BERT FIT 12.3", {0, 0, 0}, 2)      -- 5x7 font, scale 2
--   image.write_png("out.png", img)   local back = image.read_png("out.png")
--   local photo = image.read("cat.jpg")      -- u8 [H, W, 3], PNG or JPEG by content
--   image.write("small.jpg", photo, {quality = 85})
--
-- write_png / read_png are the engine's (engine/io/png.c, libpng); drawing is narrow + fill_ on
-- views, so nothing loops over tensor elements except the glyph pixels of text.
local keng = require "keng"

local options = require "keng.options"

local image = {read_png = keng.image.read_png, write_png = keng.image.write_png,
               read_jpeg = keng.image.read_jpeg, write_jpeg = keng.image.write_jpeg}

-- the file's format from its first bytes (PNG's signature, JPEG's SOI marker), or nil
local function sniff(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local head = f:read(8) or ""
  f:close()
  if head == "\137PNG\r\n\26\n" then return "png" end
  if head:sub(1, 3) == "\255\216\255" then return "jpeg" end
  return nil, "not a PNG or JPEG file"
end

-- image.read(path) -> u8 [H, W, 3] RGB, PNG or JPEG by content (not by name): grey is
-- replicated, alpha dropped (as PIL's convert("RGB"))
function image.read(path)
  local kind, err = sniff(path)
  if not kind then error(string.format("image.read: %s: %s", tostring(path), err), 2) end
  local ok, t = pcall(kind == "png" and image.read_png or image.read_jpeg, path)
  if not ok then error(t, 2) end
  local c = t.shape[3]
  if c == 3 then return t end
  if c == 4 then return t:narrow(3, 1, 3):contiguous() end
  return t:narrow(3, 1, 1):expand({t.shape[1], t.shape[2], 3}):contiguous()
end

-- image.write(path, t, {quality = 90}): u8 [H, W, C] as PNG (.png) or JPEG (.jpg, .jpeg) by the
-- extension; quality (1..100, default 90) is JPEG's
function image.write(path, t, opts)
  opts = options.check("image.write", opts, {"quality"})
  local ext = tostring(path):match("%.([^./]+)$")
  ext = ext and ext:lower()
  if ext == "png" then
    if opts.quality ~= nil then error("image.write: quality applies to JPEG files, not " .. path, 2) end
    local ok, e = pcall(image.write_png, path, t)
    if not ok then error(e, 2) end
  elseif ext == "jpg" or ext == "jpeg" then
    local q = options.integer("image.write", "quality", opts.quality or 90, 1, 2)
    local ok, e = pcall(image.write_jpeg, path, t, q)
    if not ok then error(e, 2) end
  else
    error(string.format("image.write: %s: unknown extension (valid: .png, .jpg, .jpeg)", tostring(path)), 2)
  end
end

-- ---- preprocessing: resize / normalize / pad ------------------------------------------------
-- Each takes an image as u8 [H, W, C] (as read from a file) or a float [C, H, W] (as a model
-- takes it) and returns the same layout; what SAM's and Stable Diffusion's preprocessing do.

local function layout(who, t)
  if not keng.is_tensor(t) or t.ndim ~= 3 then
    error(string.format("%s: expected u8 [H, W, C] or float [C, H, W], got %s", who,
      keng.is_tensor(t) and require("keng.util").shape_str(t, ",") or type(t)), 3)
  end
  if t.dtype == "u8" then return "hwc", t.shape[1], t.shape[2], t.shape[3] end
  if t.dtype == "f32" or t.dtype == "f64" or t.dtype == "bf16" or t.dtype == "f16" then
    return "chw", t.shape[2], t.shape[3], t.shape[1]
  end
  error(string.format("%s: expected u8 [H, W, C] or float [C, H, W], got dtype %s", who, t.dtype), 3)
end

-- bicubic convolution (PyTorch's kernels): |x| <= 1 and 1 < |x| < 2, with a = -0.75 (the plain
-- mode, OpenCV's) or -0.5 (the antialias filter, PIL's)
local function cubic1(x, A) return ((A + 2) * x - (A + 3)) * x * x + 1 end
local function cubic2(x, A) return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A end

-- the antialias filter: triangle (bilinear) or Keys' cubic with a = -0.5 (bicubic)
local function aa_filter(bicubic, x)
  x = math.abs(x)
  if not bicubic then return math.max(0.0, 1.0 - x) end
  if x < 1 then return cubic1(x, -0.5) end
  if x < 2 then return cubic2(x, -0.5) end
  return 0.0
end

local function trunc(v) return math.tointeger(math.modf(v)) or 0 end   -- a C cast to int64

-- torch's uint8 resize, one axis (what torchvision's Resize and HF's image processors run on u8
-- pixels; F.interpolate on uint8 in bilinear and bicubic, antialias on or off): each output reads
-- a window of input pixels with f64 weights, then every weight is rounded to int16 at the
-- largest precision p that keeps the biggest weight below 2^15.
--   antialias: PIL's filter over `support` = half-width * max(scale, 1) input pixels about each
--     output centre, normalised to sum 1;
--   plain: the interpolate formulas (source index scale * (i + 0.5) - 0.5, or scale * i with
--     align_corners; bilinear clamps it at 0), two (bilinear) or four (bicubic, a = -0.75)
--     taps, clamped at the border, where the taps on one pixel merge (their weights summed).
-- -> taps: K lists {i64 [n_out] input ids, i32 [n_out] integer weights} (tap k of every output;
-- 0 weights pad the short ones), p
local function u8_axis(n_in, n_out, bicubic, antialias, align_corners)
  local scale
  if align_corners then scale = n_out > 1 and (n_in - 1) / (n_out - 1) or 0.0 else scale = n_in / n_out end
  local rows, wt_max, K = {}, 0, 0
  for i = 0, n_out - 1 do
    local xmin, ws = 0, {}
    if antialias then
      local half = bicubic and 2.0 or 1.0
      local support = scale >= 1 and half * scale or half
      local invscale = scale >= 1 and 1 / scale or 1.0
      local center = scale * (i + 0.5)
      xmin = math.max(trunc(center - support + 0.5), 0)
      local xsize = math.min(trunc(center + support + 0.5), n_in) - xmin
      local total = 0.0
      for j = 0, xsize - 1 do
        local w = aa_filter(bicubic, (j + xmin - center + 0.5) * invscale)
        ws[j + 1], total = w, total + w
      end
      if total ~= 0 then for j = 1, xsize do ws[j] = ws[j] / total end end
    else
      local real = align_corners and scale * i or scale * (i + 0.5) - 0.5
      if not bicubic and real < 0 then real = 0.0 end
      local k = math.min(math.floor(real), n_in - 1)
      local t = math.min(math.max(real - k, 0.0), 1.0)
      local taps
      if bicubic then
        taps = {{k - 1, cubic2(t + 1, -0.75)}, {k, cubic1(t, -0.75)}, {k + 1, cubic1(1 - t, -0.75)},
                {k + 2, cubic2(2 - t, -0.75)}}
      else
        taps = {{k, 1 - t}, {k + 1, t}}
      end
      local lo, hi = math.huge, -1
      for _, tp in ipairs(taps) do
        tp[1] = math.min(math.max(tp[1], 0), n_in - 1)
        lo, hi = math.min(lo, tp[1]), math.max(hi, tp[1])
      end
      xmin = lo
      for j = 1, hi - lo + 1 do ws[j] = 0.0 end
      for _, tp in ipairs(taps) do ws[tp[1] - lo + 1] = ws[tp[1] - lo + 1] + tp[2] end
    end
    for j = 1, #ws do wt_max = math.max(wt_max, ws[j]) end
    rows[i + 1] = {xmin, ws}
    K = math.max(K, #ws)
  end
  local p = 0
  while p < 22 and trunc(0.5 + wt_max * (1 << (p + 1))) < (1 << 15) do p = p + 1 end
  local taps = {}
  for k = 1, K do
    local ids, ws = {}, {}
    for i = 1, n_out do
      local xmin, w = rows[i][1], rows[i][2][k]
      ids[i] = math.min(xmin + k - 1, n_in - 1)
      local v = (w or 0) * (1 << p)
      ws[i] = v < 0 and trunc(-0.5 + v) or trunc(0.5 + v)
    end
    taps[k] = {keng.tensor(ids, {dtype = "i64"}), keng.tensor(ws, {dtype = "i32"})}
  end
  return taps, p
end

-- x i32 [..., n_in] of 0..255 -> i32 [..., n_out]: Σ w·x + 2^(p-1), shifted down by p and
-- clamped to 0..255, in i32 as torch (|Σw| < 2^23, so 255·Σ|w| fits); one gather per tap, so
-- the cost is K (2 or 4, or about 2·scale + 1 antialiased) passes over the output
local function u8_pass(x, n_out, bicubic, antialias, align_corners)
  local d = x.ndim
  local n_in = x.shape[d]
  if n_in == n_out then return x end                                -- torch skips the pass too
  local taps, p = u8_axis(n_in, n_out, bicubic, antialias, align_corners)
  local s = x:index_select(d, taps[1][1]) * taps[1][2]
  for k = 2, #taps do s = s + x:index_select(d, taps[k][1]) * taps[k][2] end
  s = (s + (1 << (p - 1))):to("f64") * (2.0 ^ -p)                   -- exact: a power of two
  return s:to("i32"):clamp(0, 255)             -- truncation is the shift (a negative sum clamps to 0 either way)
end

-- image.resize(t, {size = {h, w} | longest_side = n, mode = "bilinear", antialias = true,
-- align_corners}) through keng.interpolate; longest_side scales the longer side to n and the
-- other to floor(side * n / longest + 0.5) (SAM's ResizeLongestSide). antialias defaults to
-- true (as torchvision's Resize) for bilinear/bicubic. u8 in bilinear and bicubic is torch's
-- integer uint8 resize exactly (u8_axis), antialias on or off, align_corners or not; nearest
-- copies pixels.
function image.resize(t, opts)
  opts = options.check("image.resize", opts, {"size", "longest_side", "mode", "antialias", "align_corners"})
  local kind, h, w = layout("image.resize", t)
  local oh, ow
  if opts.size ~= nil and opts.longest_side ~= nil then error("image.resize: give size= or longest_side=, not both", 2) end
  if type(opts.size) == "table" then
    oh = options.integer("image.resize", "size[1]", opts.size[1], 1, 2)
    ow = options.integer("image.resize", "size[2]", opts.size[2], 1, 2)
  elseif opts.size ~= nil then
    oh = options.integer("image.resize", "size", opts.size, 1, 2); ow = oh
  elseif opts.longest_side ~= nil then
    local n = options.integer("image.resize", "longest_side", opts.longest_side, 1, 2)
    local s = n / math.max(h, w)
    oh, ow = math.floor(h * s + 0.5), math.floor(w * s + 0.5)
  else
    error("image.resize: give size= or longest_side=", 2)
  end
  local mode = opts.mode or "bilinear"
  for _, k in ipairs{"antialias", "align_corners"} do
    if opts[k] ~= nil and type(opts[k]) ~= "boolean" then
      error(string.format("image.resize: %s must be true or false, got %s", k, type(opts[k])), 2)
    end
  end
  if kind == "hwc" and (mode == "bilinear" or mode == "bicubic") then
    -- torch's u8 path exactly: the width pass first, rounded to u8, then the height pass
    local bicubic, aa, ac = mode == "bicubic", opts.antialias ~= false, opts.align_corners and true or false
    local x = t:to("i32"):permute({1, 3, 2}):contiguous()           -- [h, C, w]
    x = u8_pass(x, ow, bicubic, aa, ac):permute({3, 2, 1}):contiguous()  -- [ow, C, h]
    x = u8_pass(x, oh, bicubic, aa, ac)                                  -- [ow, C, oh]
    return x:permute({3, 1, 2}):to("u8"):contiguous()               -- [oh, ow, C]
  end
  local io = {size = {oh, ow}, mode = mode, align_corners = opts.align_corners}
  if mode ~= "nearest" then io.antialias = opts.antialias ~= false end
  if mode == "nearest" and opts.antialias then io.antialias = true end    -- let interpolate refuse it
  local x = kind == "hwc" and t:float():permute({3, 1, 2}) or t
  local ok, y = pcall(keng.interpolate, x:unsqueeze(1), io)
  if not ok then error((tostring(y):gsub("^interpolate:", "image.resize:")), 2) end
  y = y:squeeze(1)
  if kind == "chw" then return y end
  return (y:permute({2, 3, 1}) + 0.5):clamp(0, 255):to("u8"):contiguous()
end

-- image.normalize(t, mean, std) -> f32 [C, H, W]: (t - mean[c]) / std[c] per channel; mean and
-- std are lists of C numbers (or one number for all); u8 [H, W, C] input is taken in its 0..255
-- values (SAM's pixel_mean 123.675, ...), float [C, H, W] as it is (SD's 0.5, 0.5 on 0..1)
function image.normalize(t, mean, std)
  local kind, _, _, c = layout("image.normalize", t)
  local function per_channel(name, v)
    if type(v) == "number" then v = {v} end
    if type(v) ~= "table" or (#v ~= 1 and #v ~= c) then
      error(string.format("image.normalize: %s must be a number or a list of %d numbers", name, c), 3)
    end
    local out = {}
    for i = 1, c do
      out[i] = v[#v == 1 and 1 or i]
      if type(out[i]) ~= "number" then error(string.format("image.normalize: %s[%d] is not a number", name, i), 3) end
      if name == "std" and out[i] == 0 then error(string.format("image.normalize: std[%d] is 0", i), 3) end
    end
    return keng.tensor(out):reshape({c, 1, 1})
  end
  local m, s = per_channel("mean", mean), per_channel("std", std)
  local x = kind == "hwc" and t:float():permute({3, 1, 2}) or t:float()
  return (x - m) / s
end

-- image.pad(t, {size = {h, w}} | {top =, bottom =, left =, right =}, value = 0): adds rows and
-- columns of `value`; size pads at the bottom and right up to {h, w} (SAM's 1024 x 1024)
function image.pad(t, opts)
  opts = options.check("image.pad", opts, {"size", "top", "bottom", "left", "right", "value"})
  local kind, h, w, c = layout("image.pad", t)
  local top, bottom, left, right
  if opts.size ~= nil then
    for _, k in ipairs{"top", "bottom", "left", "right"} do
      if opts[k] ~= nil then error("image.pad: give size= or top/bottom/left/right=, not both", 2) end
    end
    if type(opts.size) ~= "table" then error("image.pad: size must be a {h, w} pair", 2) end
    local sh = options.integer("image.pad", "size[1]", opts.size[1], 1, 2)
    local sw = options.integer("image.pad", "size[2]", opts.size[2], 1, 2)
    if sh < h or sw < w then
      error(string.format("image.pad: size {%d, %d} is smaller than the image's %dx%d", sh, sw, h, w), 2)
    end
    top, left, bottom, right = 0, 0, sh - h, sw - w
  else
    top = options.integer("image.pad", "top", opts.top or 0, 0, 2)
    bottom = options.integer("image.pad", "bottom", opts.bottom or 0, 0, 2)
    left = options.integer("image.pad", "left", opts.left or 0, 0, 2)
    right = options.integer("image.pad", "right", opts.right or 0, 0, 2)
  end
  local value = opts.value or 0
  if type(value) ~= "number" then error("image.pad: value must be a number", 2) end
  local H2, W2 = h + top + bottom, w + left + right
  if kind == "hwc" then
    local out = keng.full({H2, W2, c}, value, {dtype = t.dtype})
    out:narrow(1, top + 1, h):narrow(2, left + 1, w):copy_(t)
    return out
  end
  local out = keng.full({c, H2, W2}, value, {dtype = t.dtype, device = t.device})
  out:narrow(2, top + 1, h):narrow(3, left + 1, w):copy_(t)
  return out
end

-- a new u8 [H, W, C] image filled with colour (a number or a list of C numbers; default black)
function image.new(h, w, color, channels)
  channels = channels or (type(color) == "table" and #color or 3)
  local img = keng.zeros({h, w, channels}, {dtype = "u8"})
  if color then image.fill_rect(img, 1, 1, w, h, color) end
  return img
end

-- fills the rectangle at column x, row y (1-based, top-left), w wide, h high; clipped to img
function image.fill_rect(img, x, y, w, h, color)
  local H, W, C = img.shape[1], img.shape[2], img.shape[3] or 1
  x, y, w, h = math.floor(x), math.floor(y), math.floor(w), math.floor(h)
  if x < 1 then w, x = w + x - 1, 1 end
  if y < 1 then h, y = h + y - 1, 1 end
  w, h = math.min(w, W - x + 1), math.min(h, H - y + 1)
  if w <= 0 or h <= 0 then return img end
  local view = img:narrow(1, y, h):narrow(2, x, w)                  -- [h, w, C]
  if type(color) == "number" then view:fill_(color); return img end
  if #color ~= C then error(string.format("image.fill_rect: colour has %d values, image has %d channels", #color, C), 2) end
  for c = 1, C do view:narrow(3, c, 1):fill_(color[c]) end
  return img
end

-- 5x7 glyphs, one number per row, bit 4 (0x10) the leftmost column; lower case draws as upper
local glyphs = {
  ["0"] = {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}, ["1"] = {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E},
  ["2"] = {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}, ["3"] = {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E},
  ["4"] = {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}, ["5"] = {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E},
  ["6"] = {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}, ["7"] = {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08},
  ["8"] = {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}, ["9"] = {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C},
  A = {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}, B = {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E},
  C = {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}, D = {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C},
  E = {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}, F = {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10},
  G = {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}, H = {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11},
  I = {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}, J = {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C},
  K = {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}, L = {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F},
  M = {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}, N = {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11},
  O = {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}, P = {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10},
  Q = {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}, R = {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11},
  S = {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}, T = {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04},
  U = {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}, V = {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04},
  W = {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}, X = {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11},
  Y = {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}, Z = {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F},
  [" "] = {0, 0, 0, 0, 0, 0, 0}, ["."] = {0, 0, 0, 0, 0, 0x0C, 0x0C}, [","] = {0, 0, 0, 0, 0x0C, 0x04, 0x08},
  ["-"] = {0, 0, 0, 0x1F, 0, 0, 0}, ["_"] = {0, 0, 0, 0, 0, 0, 0x1F}, ["="] = {0, 0, 0x1F, 0, 0x1F, 0, 0},
  ["/"] = {0, 0x01, 0x02, 0x04, 0x08, 0x10, 0}, [":"] = {0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0},
  ["%"] = {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}, ["("] = {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02},
  [")"] = {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}, ["+"] = {0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0},
}
local unknown = {0x1F, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1F}
image.glyph_width, image.glyph_height = 6, 8                      -- advance per character, line

-- width in pixels of str drawn at scale
function image.text_width(str, scale) return #str * image.glyph_width * (scale or 1) end

-- draws str with its top-left corner at column x, row y; each glyph row is drawn as runs
function image.text(img, x, y, str, color, scale)
  scale = scale or 1
  for i = 1, #str do
    local g = glyphs[str:sub(i, i):upper()] or unknown
    local gx = x + (i - 1) * image.glyph_width * scale
    for r = 1, 7 do
      local bits, c = g[r], 0
      while c < 5 do
        if bits & (0x10 >> c) ~= 0 then
          local run = c
          while run < 5 and bits & (0x10 >> run) ~= 0 do run = run + 1 end
          image.fill_rect(img, gx + c * scale, y + (r - 1) * scale, (run - c) * scale, scale, color)
          c = run
        else
          c = c + 1
        end
      end
    end
  end
  return img
end

-- grid(images, {cols =, pad = 2, background = 0}) -> one u8 image [rows*(H+pad)-pad, cols*(W+pad)-pad, C]
-- tiling a batch [B, H, W, C] (e.g. text_to_image's output) row by row; cols defaults to
-- ceil(sqrt(B)). Each tile is one narrow + copy_, so nothing loops over pixels.
function image.grid(images, opts)
  opts = require("keng.options").check("image.grid", opts, {"cols", "pad", "background"})
  if not keng.is_tensor(images) or images.ndim ~= 4 then
    error("image.grid: images must be a tensor [B, H, W, C]", 2)
  end
  local B, H, W, C = table.unpack(images.shape)
  local cols = opts.cols or math.ceil(math.sqrt(B))
  if math.type(cols) ~= "integer" or cols < 1 then error("image.grid: cols must be a positive integer", 2) end
  local rows, pad = math.ceil(B / cols), opts.pad or 2
  local canvas = keng.full({rows * (H + pad) - pad, cols * (W + pad) - pad, C}, opts.background or 0,
    {dtype = images.dtype})
  for b = 1, B do
    local r, c = (b - 1) // cols, (b - 1) % cols
    canvas:narrow(1, r * (H + pad) + 1, H):narrow(2, c * (W + pad) + 1, W):copy_(images[b])
  end
  return canvas
end

return image
