-- models.sam — Segment Anything (Kirillov et al. 2023): a ViTDet image encoder, a prompt encoder
-- and a two-way-transformer mask decoder. References: Hugging Face modeling_sam.py (module names,
-- checkpoint layout, the numbers the golden spec checks), keras-hub SAM (presets, benchmark rows).
--
--   local sam = require "models.sam"
--   local m = sam.from_preset("sam_tiny")                      -- random weights (CPU tier)
--   local m = sam.from_pretrained("path/to/hf_sam")            -- config.json + model.safetensors
--   local out = m:predict{images = x, points = {{500, 375}, {250, 375}}, labels = {1, 2}}
--   out.masks     -- f32 [B, 4, 4h, 4w] mask logits (all four mask tokens; the single-mask one first)
--   out.iou_pred  -- f32 [B, 4]
--   m.encoder(x)  -- the image encoder alone, [B, 256, h, w] (the benchmark's fit row)
--   m:predict{pixel_values =, points = [B, P, K, 2]}  -- P prompt sets: masks [B, P, 4, 4h, 4w]
-- Real photos: models.sam_processor (resize/normalise/pad, post_process_masks); every object
-- without prompts: models.sam_amg.
--
-- Shape letters: B batch, S image side, h = w = S / patch (the grid), C encoder width, E prompt /
-- decoder width (256), H heads, D head dim, N windows x batch, T tokens, K prompt tokens.
--
-- Pixels: images are NCHW with values in [0, 1] (u8 images are divided by 255 first); the model
-- normalises them with the ImageNet mean/std, which in Hugging Face is the processor's job
-- (SamProcessor: rescale 1/255, normalise). Resizing/padding to S x S stays with the caller. Pass
-- {normalize = false} to the constructor (or set m.vision_encoder.normalize = false) to feed HF's
-- pixel_values directly. Points and boxes are in pixels of the S x S input, (x, y) order.
--
-- Point labels follow the reference: 1 foreground, 0 background, -1 not-a-point (its position is
-- ignored and not_a_point_embed is used), -10 padding (a zero token); any other label (e.g. 2)
-- gets the position encoding alone, as in Hugging Face and segment_anything.
--
-- Module tree = the Hugging Face SamModel state_dict names (0-based list indices), except that
-- the tied shared_image_embedding.positional_embedding is not kept twice: the image-wide encoding
-- uses prompt_encoder.shared_embedding (the loader accepts either name).
local keng = require "keng"
local nn = require "keng.nn"
local common = require "models.common"
local options = require "keng.options"

local M = {}

local MEAN = {0.485, 0.456, 0.406}
local STD = {0.229, 0.224, 0.225}

local shape_str = require("keng.util").shape_str

-- children named "0", "1", ... as the checkpoints' (nn.ModuleList's one rule for 0-based names)
local function List(mods) return nn.ModuleList(mods, {first = 0}) end

-- LayerNorm over the channels of an NCHW tensor (HF SamLayerNorm, channels_first)
local function layer_norm2d(ln, x)                                  -- x [B, C, H, W]
  return ln(x:permute{1, 3, 4, 2}):permute{1, 4, 2, 3}
end

---------------------------------------------------------------------------------------------
-- image encoder (ViTDet)

-- relative position bias of the decomposed form (Li et al. 2022, MViTv2): for query (y, x) and
-- key (ky, kx), bias = q·Rh[y - ky] + q·Rw[x - kx]. q [N, H, S·S, D] unscaled -> its two terms
-- rel_h [N, H, T, ky] and rel_w [N, H, T, kx], which scaled_dot_product_attention adds to the
-- scores itself (the [N, H, T, T] bias is never built). The products read q where it lies (a
-- strided view of the qkv projection) with Rh / Rw broadcast over N and H: rel_h comes out in
-- its final order, rel_w needs one transpose (a quarter of the time of copying q twice first)
local function rel_pos_terms(q, rel_h, rel_w, S, idx)
  local N, H, D = q.shape[1], q.shape[2], q.shape[4]
  local Rh = rel_h:index_select(1, idx):view{1, 1, S, S, D}:transpose(4, 5)  -- [1, 1, y, D, ky]: table[y - ky + S - 1]
  local Rw = rel_w:index_select(1, idx):view{1, 1, S, S, D}:transpose(4, 5)  -- [1, 1, x, D, kx]
  local q5 = q:view{N, H, S, S, D}                                   -- [N, H, y, x, D]
  local bh = q5:matmul(Rh):view{N, H, S * S, S}                      -- [N, H, y, x, ky]
  local bw = q5:transpose(3, 4):matmul(Rw):transpose(3, 4)           -- [N, H, y, x, kx] (of [N, H, x, y, kx])
  return bh, bw:reshape{N, H, S * S, S}
end

local VisionAttention = nn.Module:extend("SamVisionAttention")
M.VisionAttention = VisionAttention

-- window: the window side, or 0 for global attention over the whole grid; size: the side of the
-- square token grid it attends over (the window, or the whole grid)
function VisionAttention:init(cfg, window, o)
  local C, H = cfg.width, cfg.heads
  local size = window > 0 and window or cfg.image_size // cfg.patch
  self.heads, self.head_dim, self.size, self.window = H, C // H, size, window
  self.qkv = nn.Linear(C, 3 * C, {bias = cfg.qkv_bias ~= false, dtype = o.dtype, device = o.device})
  self.proj = nn.Linear(C, C, {dtype = o.dtype, device = o.device})
  if cfg.rel_pos ~= false then
    self:param("rel_pos_h", {2 * size - 1, C // H}, "zeros", {dtype = o.dtype, device = o.device})
    self:param("rel_pos_w", {2 * size - 1, C // H}, "zeros", {dtype = o.dtype, device = o.device})
  end
end

-- i64 [S·S]: row-major (i, j) -> i - j + S - 1, the table row of each query/key pair
function VisionAttention:rel_index(S, device)
  local c = rawget(self, "_rel_idx")
  if c and c.S == S and c.t.device == device then return c.t end
  local v = {}
  for i = 0, S - 1 do for j = 0, S - 1 do v[#v + 1] = i - j + S - 1 end end
  local t = keng.tensor(v, {dtype = "i64", device = device})
  rawset(self, "_rel_idx", {S = S, t = t})
  return t
end

-- attention inside each S x S grid of x [N, S, S, C]
function VisionAttention:attend(x)                                  -- x [N, S, S, C]
  local N, S, C = x.shape[1], x.shape[2], x.shape[4]
  local H, D, T = self.heads, self.head_dim, S * S
  local qkv = self.qkv(x:reshape{N, T, C}):view{N, T, 3, H, D}:permute{3, 1, 4, 2, 5}  -- [3, N, H, T, D]
  local q, k, v = qkv[1], qkv[2], qkv[3]                            -- [N, H, T, D]
  local a
  if self.rel_pos_h then
    if self.rel_pos_h.shape[1] ~= 2 * S - 1 then
      error(string.format("SamVisionAttention: rel_pos tables have %d rows, a %dx%d grid needs %d",
        self.rel_pos_h.shape[1], S, S, 2 * S - 1), 2)
    end
    local rh, rw = rel_pos_terms(q, self.rel_pos_h, self.rel_pos_w, S, self:rel_index(S, x.device))
    a = keng.scaled_dot_product_attention(q, k, v, {rel_h = rh, rel_w = rw, layout = "bthd"})  -- [N, T, H, D]
  else
    a = keng.scaled_dot_product_attention(q, k, v, {layout = "bthd"})
  end
  a = a:reshape{N, S, S, C}                                         -- no copy: the heads are side by side
  return self.proj(a)                                               -- [N, S, S, C]
end

local MLPBlock = nn.Module:extend("SamMLPBlock")
M.MLPBlock = MLPBlock

-- lin2(act(lin1(x))): the mask decoder's ReLU MLP (the encoder's is nn.TransformerEncoderLayer's)
function MLPBlock:init(dim, hidden, act, o)
  self.lin1 = nn.Linear(dim, hidden, {dtype = o.dtype, device = o.device})
  self.lin2 = nn.Linear(hidden, dim, {dtype = o.dtype, device = o.device})
  self.act = act
end

function MLPBlock:forward(x)
  local h = self.lin1(x)
  h = self.act == "relu" and h:relu() or h:gelu()
  return self.lin2(h)
end

-- x [B, h, w, C] after the layer's first norm: windows of self.window (or the whole grid)
function VisionAttention:forward(x)
  local win = self.window
  if win == 0 then return self:attend(x) end
  -- pad the grid to a multiple of the window (zeros after normalisation, as the reference),
  -- cut it into [B·nh·nw, win, win, C], attend inside each window, and put it back
  local B, h, w, C = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
  local ph, pw = (win - h % win) % win, (win - w % win) % win
  local y = x
  if ph > 0 or pw > 0 then y = keng.pad(y, {0, 0, 0, pw, 0, ph}) end
  local Hp, Wp = h + ph, w + pw
  local nh, nw = Hp // win, Wp // win
  y = y:view{B, nh, win, nw, win, C}:permute{1, 2, 4, 3, 5, 6}:reshape{B * nh * nw, win, win, C}
  y = self:attend(y)
  y = y:view{B, nh, nw, win, win, C}:permute{1, 2, 4, 3, 5, 6}:reshape{B, Hp, Wp, C}
  if ph > 0 or pw > 0 then y = y:narrow(2, 1, h):narrow(3, 1, w) end
  return y
end

-- a ViT layer: nn.TransformerEncoderLayer, pre-LN, with the windowed attention above and an
-- exact-GELU MLP, under the checkpoint's names (layer_norm1, attn, layer_norm2, mlp.lin1/lin2)
local VIT_NAMES = {attn = "attn", attn_norm = "layer_norm1", mlp = "mlp", fc1 = "lin1", fc2 = "lin2",
                   mlp_norm = "layer_norm2"}

-- window: the window side, or 0 for global attention over the whole grid
local function VisionLayer(cfg, window, o)
  return nn.TransformerEncoderLayer(cfg.width, cfg.heads, cfg.mlp, {norm_first = true, eps = cfg.eps,
    dtype = o.dtype, device = o.device, attention = VisionAttention(cfg, window, o), names = VIT_NAMES})
end
M.VisionLayer = VisionLayer

local PatchEmbeddings = nn.Module:extend("SamPatchEmbeddings")
function PatchEmbeddings:init(cfg, o)
  self.projection = nn.Conv2d(3, cfg.width, cfg.patch, {stride = cfg.patch, dtype = o.dtype, device = o.device})
end
function PatchEmbeddings:forward(x)                                 -- [B, 3, S, S] -> [B, h, w, C]
  return self.projection(x):permute{1, 3, 4, 2}
end

local Neck = nn.Module:extend("SamVisionNeck")
function Neck:init(cfg, o)
  local E = cfg.out_chans
  self.conv1 = nn.Conv2d(cfg.width, E, 1, {bias = false, dtype = o.dtype, device = o.device})
  self.layer_norm1 = nn.LayerNorm(E, {eps = 1e-6, dtype = o.dtype, device = o.device})
  self.conv2 = nn.Conv2d(E, E, 3, {padding = 1, bias = false, dtype = o.dtype, device = o.device})
  self.layer_norm2 = nn.LayerNorm(E, {eps = 1e-6, dtype = o.dtype, device = o.device})
end
function Neck:forward(x)                                            -- [B, h, w, C] -> [B, E, h, w]
  -- the 1x1 conv is a linear map of the channels-last grid, and the first norm then needs no permute
  local w1 = self.conv1.weight
  local y = keng.linear(x, w1:view{w1.shape[1], w1.shape[2]})        -- [B, h, w, E]
  y = self.layer_norm1(y):permute{1, 4, 2, 3}                        -- [B, E, h, w]
  return layer_norm2d(self.layer_norm2, self.conv2(y))
end

local VisionEncoder = nn.Module:extend("SamVisionEncoder")
M.VisionEncoder = VisionEncoder

function VisionEncoder:init(cfg, o)
  self.cfg = cfg
  self.normalize = o.normalize ~= false
  local g = cfg.image_size // cfg.patch
  self.patch_embed = PatchEmbeddings(cfg, o)
  if cfg.abs_pos ~= false then self:param("pos_embed", {1, g, g, cfg.width}, "zeros", {dtype = o.dtype, device = o.device}) end
  local global = {}
  for _, i in ipairs(cfg.global) do global[i] = true end
  local layers = {}
  for i = 0, cfg.depth - 1 do layers[i + 1] = VisionLayer(cfg, global[i] and 0 or cfg.window, o) end
  self.layers = List(layers)
  self.neck = Neck(cfg, o)
end

-- images [B, 3, S, S] in [0, 1] (f32) or 0..255 (u8) -> image embeddings [B, E, h, w];
-- normalized: the images are HF pixel_values already (models.sam_processor's)
function VisionEncoder:forward(images, normalized)
  local S = self.cfg.image_size
  if not keng.is_tensor(images) then error("SamVisionEncoder: images must be a tensor [B, 3, S, S]", 2) end
  local s = images.shape
  if images.ndim ~= 4 or s[2] ~= 3 or s[3] ~= S or s[4] ~= S then
    error(string.format("SamVisionEncoder: images must be [B, 3, %d, %d] (NCHW), got %s", S, S, shape_str(images)), 2)
  end
  local dtype = self.patch_embed.projection.weight.dtype
  local x = images
  if x.dtype == "u8" then x = x:to(dtype) / 255 elseif x.dtype ~= dtype then x = x:to(dtype) end
  if self.normalize and not normalized then
    local o = {dtype = dtype, device = x.device}
    x = (x - keng.tensor(MEAN, o):view{1, 3, 1, 1}) / keng.tensor(STD, o):view{1, 3, 1, 1}
  end
  x = self.patch_embed(x)                                           -- [B, h, w, C]
  if self.pos_embed then x = x + self.pos_embed end
  for i = 0, #self.layers - 1 do x = self.layers[i](x) end
  return self.neck(x)                                               -- [B, E, h, w]
end

function VisionEncoder:extra_repr()
  local c = self.cfg
  return string.format("image=%d, patch=%d, width=%d, depth=%d, heads=%d, mlp=%d, window=%d, global={%s}",
    c.image_size, c.patch, c.width, c.depth, c.heads, c.mlp, c.window, table.concat(c.global, ","))
end

---------------------------------------------------------------------------------------------
-- prompt encoder

local PositionalEmbedding = nn.Module:extend("SamPositionalEmbedding")
M.PositionalEmbedding = PositionalEmbedding

-- random Fourier features (Tancik et al. 2020): a fixed Gaussian [2, F] maps (x, y) in [0, 1]
function PositionalEmbedding:init(feats, o)
  self:param("positional_embedding", {2, feats}, "normal", {dtype = o.dtype, device = o.device, std = 1.0})
end

function PositionalEmbedding:forward(coords)                        -- [..., 2] in [0, 1] -> [..., 2F]
  local c = (coords * 2 - 1):matmul(self.positional_embedding) * (2 * math.pi)
  return keng.cat({c:sin(), c:cos()}, -1)
end

local MaskEmbedding = nn.Module:extend("SamMaskEmbedding")
function MaskEmbedding:init(cfg, o)
  local mc, E = cfg.mask_in_chans, cfg.prompt_dim
  local co = {stride = 2, dtype = o.dtype, device = o.device}
  self.conv1 = nn.Conv2d(1, mc // 4, 2, co)
  self.conv2 = nn.Conv2d(mc // 4, mc, 2, co)
  self.conv3 = nn.Conv2d(mc, E, 1, {dtype = o.dtype, device = o.device})
  self.layer_norm1 = nn.LayerNorm(mc // 4, {eps = 1e-6, dtype = o.dtype, device = o.device})
  self.layer_norm2 = nn.LayerNorm(mc, {eps = 1e-6, dtype = o.dtype, device = o.device})
end
function MaskEmbedding:forward(m)                                   -- [B, 1, 4h, 4w] -> [B, E, h, w]
  local y = layer_norm2d(self.layer_norm1, self.conv1(m)):gelu()
  y = layer_norm2d(self.layer_norm2, self.conv2(y)):gelu()
  return self.conv3(y)
end

local PromptEncoder = nn.Module:extend("SamPromptEncoder")
M.PromptEncoder = PromptEncoder

local function embedding(n, dim, o)
  return nn.Embedding(n, dim, {dtype = o.dtype, device = o.device,
    init = function(shape, io) return keng.randn(shape, io) end})
end

function PromptEncoder:init(cfg, o)
  local E = cfg.prompt_dim
  self.input_size, self.grid = cfg.image_size, cfg.image_size // cfg.patch
  self.shared_embedding = PositionalEmbedding(E // 2, o)
  self.mask_embed = MaskEmbedding(cfg, o)
  self.no_mask_embed = embedding(1, E, o)
  self.point_embed = List{embedding(1, E, o), embedding(1, E, o), embedding(1, E, o), embedding(1, E, o)}
  self.not_a_point_embed = embedding(1, E, o)
end

-- points f32 [B, K, 2] (pixels), labels [B, K] (float or integer), pad: append a not-a-point
-- (the reference does so when no box follows) -> [B, K(+1), E]
function PromptEncoder:embed_points(points, labels, pad)
  local B, K = points.shape[1], points.shape[2]
  points = points + 0.5                                             -- the centre of the pixel
  labels = labels:to(points.dtype)
  if pad then
    points = keng.cat({points, keng.zeros({B, 1, 2}, {dtype = points.dtype, device = points.device})}, 2)
    labels = keng.cat({labels, keng.full({B, 1}, -1, {dtype = points.dtype, device = points.device})}, 2)
  end
  local e = self.shared_embedding(points / self.input_size)         -- [B, K', E]
  local lab = labels:unsqueeze(3)                                   -- [B, K', 1]
  e = keng.where(lab:eq(-1), self.not_a_point_embed.weight, e)
  e = keng.where(lab:eq(-10), 0, e)
  e = keng.where(lab:eq(0), e + self.point_embed[0].weight, e)
  e = keng.where(lab:eq(1), e + self.point_embed[1].weight, e)
  return e
end

-- boxes [B, 4] (x1, y1, x2, y2 pixels) -> corner tokens [B, 2, E]
function PromptEncoder:embed_boxes(boxes)
  local B = boxes.shape[1]
  local corners = (boxes + 0.5):view{B, 2, 2}
  local e = self.shared_embedding(corners / self.input_size)        -- [B, 2, E]
  local tag = keng.cat({self.point_embed[2].weight, self.point_embed[3].weight}, 1)  -- [2, E]
  return e + tag
end

-- -> sparse [B, K, E] (or nil when there is no prompt token), dense [B, E, h, w]
function PromptEncoder:forward(B, points, labels, boxes, masks)
  local sparse
  if points then sparse = self:embed_points(points, labels, boxes == nil) end
  if boxes then
    local b = self:embed_boxes(boxes)
    sparse = sparse and keng.cat({sparse, b}, 2) or b
  end
  local dense
  if masks then
    dense = self.mask_embed(masks)
  else
    local E = self.no_mask_embed.weight.shape[2]
    dense = self.no_mask_embed.weight:view{1, E, 1, 1}:expand{B, E, self.grid, self.grid}
  end
  return sparse, dense
end

-- the position encoding of every cell centre of the h x w embedding grid -> [1, E, h, w]
function PromptEncoder:image_pe()
  local g, w = self.grid, self.shared_embedding.positional_embedding
  local o = {dtype = w.dtype, device = w.device}
  local ax = (keng.arange(g, o) + 0.5) / g                          -- [g]
  local xs = ax:view{1, g, 1}:expand{g, g, 1}
  local ys = ax:view{g, 1, 1}:expand{g, g, 1}
  local pe = self.shared_embedding(keng.cat({xs, ys}, 3))           -- [g, g, E]
  return pe:permute{3, 1, 2}:unsqueeze(1)
end

---------------------------------------------------------------------------------------------
-- mask decoder

local Attention = nn.MultiHeadAttention:extend("SamAttention")
M.Attention = Attention

-- nn.MultiHeadAttention whose projections shrink the width by downsample (2 in the cross
-- attentions), with the checkpoint's names q_proj, k_proj, v_proj, out_proj
function Attention:init(dim, heads, downsample, o)
  nn.MultiHeadAttention.init(self, dim, heads, {head_dim = dim // downsample // heads, dtype = o.dtype,
    device = o.device, names = {query = "q_proj", key = "k_proj", value = "v_proj", out = "out_proj"}})
end

function Attention:forward(q, k, v)                                 -- q [B, T, E], k/v [B, S, E]
  return nn.MultiHeadAttention.forward(self, q, {context = k, value = v})  -- [B, T, E]
end

local TwoWayBlock = nn.Module:extend("SamTwoWayAttentionBlock")

-- tokens attend to themselves, then to the image, an MLP, then the image attends to the tokens
function TwoWayBlock:init(cfg, skip_first_pe, o)
  local E, H, r = cfg.prompt_dim, cfg.dec_heads, cfg.dec_downsample
  local no = {eps = 1e-6, dtype = o.dtype, device = o.device}
  self.skip_first_pe = skip_first_pe
  self.self_attn = Attention(E, H, 1, o)
  self.layer_norm1 = nn.LayerNorm(E, no)
  self.cross_attn_token_to_image = Attention(E, H, r, o)
  self.layer_norm2 = nn.LayerNorm(E, no)
  self.mlp = MLPBlock(E, cfg.dec_mlp, "relu", o)
  self.layer_norm3 = nn.LayerNorm(E, no)
  self.layer_norm4 = nn.LayerNorm(E, no)
  self.cross_attn_image_to_token = Attention(E, H, r, o)
end

-- queries [B, K, E], keys [B, hw, E]; qpe, kpe their position encodings
function TwoWayBlock:forward(queries, keys, qpe, kpe)
  if self.skip_first_pe then
    queries = self.self_attn(queries, queries, queries)
  else
    local q = queries + qpe
    queries = queries + self.self_attn(q, q, queries)
  end
  queries = self.layer_norm1(queries)
  local q, k = queries + qpe, keys + kpe
  queries = self.layer_norm2(queries + self.cross_attn_token_to_image(q, k, keys))
  queries = self.layer_norm3(queries + self.mlp(queries))
  q = queries + qpe
  keys = self.layer_norm4(keys + self.cross_attn_image_to_token(k, q, queries))
  return queries, keys
end

local TwoWayTransformer = nn.Module:extend("SamTwoWayTransformer")
function TwoWayTransformer:init(cfg, o)
  local layers = {}
  for i = 1, cfg.dec_depth do layers[i] = TwoWayBlock(cfg, i == 1, o) end
  self.layers = List(layers)
  self.final_attn_token_to_image = Attention(cfg.prompt_dim, cfg.dec_heads, cfg.dec_downsample, o)
  self.layer_norm_final_attn = nn.LayerNorm(cfg.prompt_dim, {dtype = o.dtype, device = o.device})  -- eps 1e-5
end

-- tokens [B, K, E], image [B, E, h, w], image_pe [B, E, h, w] -> tokens, image [B, hw, E]
function TwoWayTransformer:forward(tokens, image, image_pe)
  local B, E = image.shape[1], image.shape[2]
  local keys = image:reshape{B, E, -1}:transpose(2, 3)              -- [B, hw, E]
  local kpe = image_pe:reshape{B, E, -1}:transpose(2, 3)
  local queries = tokens
  for i = 0, #self.layers - 1 do queries, keys = self.layers[i](queries, keys, tokens, kpe) end
  local a = self.final_attn_token_to_image(queries + tokens, keys + kpe, keys)
  return self.layer_norm_final_attn(queries + a), keys
end

local FeedForward = nn.Module:extend("SamFeedForward")

-- proj_in -> ReLU -> (layers -> ReLU) x (depth - 2) -> proj_out
function FeedForward:init(din, hidden, dout, depth, o)
  local lo = {dtype = o.dtype, device = o.device}
  self.proj_in = nn.Linear(din, hidden, lo)
  self.proj_out = nn.Linear(hidden, dout, lo)
  local layers = {}
  for i = 1, depth - 2 do layers[i] = nn.Linear(hidden, hidden, lo) end
  self.layers = List(layers)
end
function FeedForward:forward(x)
  x = self.proj_in(x):relu()
  for i = 0, #self.layers - 1 do x = self.layers[i](x):relu() end
  return self.proj_out(x)
end

local MaskDecoder = nn.Module:extend("SamMaskDecoder")
M.MaskDecoder = MaskDecoder

function MaskDecoder:init(cfg, o)
  local E, n = cfg.prompt_dim, cfg.multimask + 1
  self.num_mask_tokens = n
  self.iou_token = embedding(1, E, o)
  self.mask_tokens = embedding(n, E, o)
  self.transformer = TwoWayTransformer(cfg, o)
  local co = {stride = 2, dtype = o.dtype, device = o.device}
  self.upscale_conv1 = nn.ConvTranspose2d(E, E // 4, 2, co)
  self.upscale_conv2 = nn.ConvTranspose2d(E // 4, E // 8, 2, co)
  self.upscale_layer_norm = nn.LayerNorm(E // 4, {eps = 1e-6, dtype = o.dtype, device = o.device})
  local mlps = {}
  for i = 1, n do mlps[i] = FeedForward(E, E, E // 8, 3, o) end
  self.output_hypernetworks_mlps = List(mlps)
  self.iou_prediction_head = FeedForward(E, cfg.iou_hidden, n, cfg.iou_depth, o)
end

-- image [B, E, h, w], image_pe [1, E, h, w], sparse [B, K, E] or nil, dense [B, E, h, w]
-- -> masks [B, n, 4h, 4w] (every mask token), iou [B, n]
function MaskDecoder:forward(image, image_pe, sparse, dense)
  local B, E, h, w = image.shape[1], image.shape[2], image.shape[3], image.shape[4]
  local n = self.num_mask_tokens
  local out_tokens = keng.cat({self.iou_token.weight, self.mask_tokens.weight}, 1)   -- [1 + n, E]
  local tokens = out_tokens:unsqueeze(1):expand{B, 1 + n, E}
  if sparse then tokens = keng.cat({tokens, sparse:to(tokens.dtype)}, 2) end        -- [B, 1 + n + K, E]
  local src = image + dense
  local pe = image_pe:expand{B, E, h, w}
  local hs, keys = self.transformer(tokens, src, pe)
  local iou_out = hs:select(2, 1)                                   -- [B, E]
  local up = keys:transpose(2, 3):reshape{B, E, h, w}
  up = layer_norm2d(self.upscale_layer_norm, self.upscale_conv1(up)):gelu()
  up = self.upscale_conv2(up):gelu()                                -- [B, E/8, 4h, 4w]
  local hyper = {}
  for i = 1, n do hyper[i] = self.output_hypernetworks_mlps[i - 1](hs:select(2, 1 + i)) end  -- [B, E/8]
  local hin = keng.stack(hyper, 2)                                  -- [B, n, E/8]
  local c, H4, W4 = up.shape[2], up.shape[3], up.shape[4]
  local masks = hin:matmul(up:reshape{B, c, H4 * W4}):view{B, n, H4, W4}
  return masks, self.iou_prediction_head(iou_out)                   -- [B, n, 4h, 4w], [B, n]
end

---------------------------------------------------------------------------------------------
-- the whole model

local Sam = nn.Module:extend("SamModel")
M.Sam = Sam

-- m:save_pretrained(dir, {max_shard_size = "5GB"}): a transformers SamModel directory
-- (config.json + safetensors, models.hf_save)
function Sam:save_pretrained(dir, opts) return require("models.hf_save").sam(self, dir, opts, 2) end

-- Sam(cfg, {dtype = "f32", device = "cpu", normalize = true})
function Sam:init(cfg, opts)
  opts = options.check("SamModel", opts, {"dtype", "device", "normalize"}, nn.Module.user_level(3))
  local o = {dtype = opts.dtype or "f32", device = opts.device or "cpu", normalize = opts.normalize}
  self.cfg = cfg
  self.vision_encoder = VisionEncoder(cfg, o)
  self.prompt_encoder = PromptEncoder(cfg, o)
  self.mask_decoder = MaskDecoder(cfg, o)
  rawset(self, "encoder", self.vision_encoder)                      -- an alias, not a second child
end

local function as_tensor(v, dtype, device)
  if v == nil then return nil end
  if keng.is_tensor(v) then return v:to{dtype = dtype, device = device} end
  return keng.tensor(v, {dtype = dtype, device = device})
end

-- checks and shapes the prompts for a batch of B: points [B, K, 2], labels [B, K], boxes [B, 4],
-- masks [B, 1, 4h, 4w]; a prompt given once ([K, 2], [K], [4], [1, 4h, 4w]) serves every image
function Sam:prompts(B, args, level)
  local dtype, device = self:param_dtype(), self:param_device()
  local points, labels = as_tensor(args.points, dtype, device), as_tensor(args.labels, dtype, device)
  local boxes, masks = as_tensor(args.boxes, dtype, device), as_tensor(args.masks, dtype, device)
  if points then
    if points.ndim == 2 then points = points:unsqueeze(1):expand{B, points.shape[1], 2} end
    if points.ndim ~= 3 or points.shape[1] ~= B or points.shape[3] ~= 2 then
      error(string.format("sam: points must be [%d, K, 2] or [K, 2] (x, y pixels), got %s", B, shape_str(points)), level)
    end
    local K = points.shape[2]
    if labels == nil then labels = keng.ones({B, K}, {dtype = dtype, device = device}) end
    if labels.ndim == 1 then labels = labels:unsqueeze(1):expand{B, labels.shape[1]} end
    if labels.ndim ~= 2 or labels.shape[1] ~= B or labels.shape[2] ~= K then
      error(string.format("sam: labels must be [%d, %d] or [%d] to match points %s, got %s", B, K, K,
        shape_str(points), shape_str(labels)), level)
    end
  elseif labels then
    error("sam: labels given without points", level)
  end
  if boxes then
    if boxes.ndim == 1 then boxes = boxes:unsqueeze(1):expand{B, 4} end
    if boxes.ndim ~= 2 or boxes.shape[1] ~= B or boxes.shape[2] ~= 4 then
      error(string.format("sam: boxes must be [%d, 4] (x1, y1, x2, y2 pixels), got %s", B, shape_str(boxes)), level)
    end
  end
  if masks then
    local m = 4 * self.prompt_encoder.grid
    if masks.ndim == 3 and masks.shape[1] == 1 then masks = masks:unsqueeze(1):expand{B, 1, m, m} end
    if masks.ndim == 3 and masks.shape[1] == B then masks = masks:unsqueeze(2) end
    if masks.ndim ~= 4 or masks.shape[1] ~= B or masks.shape[2] ~= 1 or masks.shape[3] ~= m or masks.shape[4] ~= m then
      error(string.format("sam: masks must be [%d, 1, %d, %d] (mask logits), got %s", B, m, m, shape_str(masks)), level)
    end
  end
  return points, labels, boxes, masks
end

function Sam:param_dtype() return self.mask_decoder.iou_token.weight.dtype end
function Sam:param_device() return self.mask_decoder.iou_token.weight.device end

-- forward{images = [B, 3, S, S] | pixel_values = [B, 3, S, S] (normalised, models.sam_processor)
-- | image_embeddings = [B, E, h, w], points =, labels =, boxes =, masks =} -> {masks = [B, 4, 4h,
-- 4w] logits, iou_pred = [B, 4], image_embeddings = [B, E, h, w]}; with P prompt sets per image
-- (points [B, P, K, 2], boxes [B, P, 4]) masks [B, P, 4, 4h, 4w] and iou_pred [B, P, 4]
function Sam:forward(args, level)
  level = level or 2
  if type(args) ~= "table" or keng.is_tensor(args) then
    error("sam: forward/predict take a table {images =, points =, labels =, boxes =, masks =}", level)
  end
  options.check("sam", args, {"images", "pixel_values", "image_embeddings", "points", "labels", "boxes", "masks"},
    level, "input")
  local emb = args.image_embeddings
  if emb == nil then
    local px = args.pixel_values
    if args.images == nil and px == nil then error("sam: images (or pixel_values, image_embeddings) missing", level) end
    if args.images ~= nil and px ~= nil then error("sam: give images or pixel_values, not both", level) end
    local ok, e = pcall(self.vision_encoder.forward, self.vision_encoder, px or args.images, px ~= nil)
    if not ok then error(tostring(e):gsub("^[^:]*:%d+: ", ""), level) end
    emb = e
  end
  local B = emb.shape[1]
  local P, folded = self:fold_point_batch(B, args, emb, level + 1)
  if P then                                                         -- decode B·P prompt sets
    local out = self:forward(folded, level + 1)
    local M, H4, W4 = out.masks.shape[2], out.masks.shape[3], out.masks.shape[4]
    return {masks = out.masks:view{B, P, M, H4, W4}, iou_pred = out.iou_pred:view{B, P, M}, image_embeddings = emb}
  end
  local points, labels, boxes, masks = self:prompts(B, args, level + 1)
  local sparse, dense = self.prompt_encoder(B, points, labels, boxes, masks)
  local out_masks, iou = self.mask_decoder(emb, self.prompt_encoder:image_pe(), sparse, dense)
  return {masks = out_masks, iou_pred = iou, image_embeddings = emb}
end

-- Several prompt sets per image (HF's point_batch_size P): points [B, P, K, 2], labels [B, P, K],
-- boxes [B, P, 4]. Each set is decoded on its own (HF folds P into the decoder's batch), so they
-- become a batch of B·P prompts over the image embeddings repeated P times (a mask input [B, 1,
-- 4h, 4w] too). -> P and the folded forward arguments, or nil when the prompts have no P dim.
function Sam:fold_point_batch(B, args, emb, level)
  local dtype, device = self:param_dtype(), self:param_device()
  local points, boxes = as_tensor(args.points, dtype, device), as_tensor(args.boxes, dtype, device)
  local P = points and points.ndim == 4 and points.shape[2] or boxes and boxes.ndim == 3 and boxes.shape[2]
  if not P then return nil end
  local K = points and points.shape[3] or "K"
  local function fold(t, name, want)                                -- want: sizes; "K" any
    if t == nil then return nil end
    local ok = t.ndim == #want
    for i = 1, #want do ok = ok and (want[i] == "K" or t.shape[i] == want[i]) end
    if not ok then
      error(string.format("sam: %s must be [%s] (%d images x %d prompt sets), got %s", name,
        table.concat(want, ", "), B, P, shape_str(t)), level + 1)
    end
    local s = {B * P}
    for i = 3, t.ndim do s[#s + 1] = t.shape[i] end
    return t:reshape(s)
  end
  local f = {points = fold(points, "points", {B, P, "K", 2}), boxes = fold(boxes, "boxes", {B, P, 4})}
  f.labels = fold(as_tensor(args.labels, dtype, device), "labels", {B, P, K})
  if f.labels and not f.points then error("sam: labels given without points", level + 1) end
  local function rep(t)                                             -- [B, ...] -> [B·P, ...]
    local s = {table.unpack(t.shape, 2)}
    return t:unsqueeze(2):expand{B, P, table.unpack(s)}:reshape{B * P, table.unpack(s)}
  end
  f.image_embeddings = rep(emb)
  if args.masks ~= nil then
    local _, _, _, masks = self:prompts(B, {masks = args.masks}, level + 1)
    f.masks = rep(masks)
  end
  return P, f
end

-- predict{...}: forward in eval mode without a tape. Anything else (e.g. a dataset for
-- keng.train) goes to the generic Module:predict.
function Sam:predict(args, opts)
  if type(args) ~= "table" or keng.is_tensor(args) or (args.images == nil and args.pixel_values == nil and args.image_embeddings == nil) then
    return nn.Module.predict(self, args, opts)
  end
  options.check("sam:predict", opts, {}, 2)   -- a prompt table takes no options
  local was = self.training
  self:eval()
  local ok, out = pcall(keng.no_grad, function() return self:forward(args, 4) end)
  if was then self:train() end
  if not ok then error(tostring(out):gsub("^[^:]*:%d+: ", ""), 2) end
  return out
end

function Sam:extra_repr() return self.vision_encoder:extra_repr() end

---------------------------------------------------------------------------------------------
-- presets and loading

-- shared by every preset: the prompt encoder and mask decoder at their real sizes
local DEFAULTS = {patch = 16, window = 14, eps = 1e-6, out_chans = 256, prompt_dim = 256, mask_in_chans = 16,
  dec_depth = 2, dec_heads = 8, dec_mlp = 2048, dec_downsample = 2, multimask = 3, iou_hidden = 256, iou_depth = 3}

M.presets = {
  sam_tiny = {image_size = 256, width = 192, depth = 4, heads = 3, mlp = 768, window = 7, global = {1, 3}},
  sam_base_sa1b = {image_size = 1024, width = 768, depth = 12, heads = 12, mlp = 3072, global = {2, 5, 8, 11}},
  sam_large_sa1b = {image_size = 1024, width = 1024, depth = 24, heads = 16, mlp = 4096, global = {5, 11, 17, 23}},
  sam_huge_sa1b = {image_size = 1024, width = 1280, depth = 32, heads = 16, mlp = 5120, global = {7, 15, 23, 31}},
}

-- config(name) -> a full cfg (a copy); global block indices are 0-based, as in HF
function M.config(name, level)
  return common.overlay(DEFAULTS, common.preset("sam.from_preset", M.presets, name, (level or 1) + 1))
end

function M.build(cfg, opts) return Sam(cfg, opts) end

-- load_hf(m, tensors): a Hugging Face SamModel state dict into m (strict; the tied position
-- Gaussian may come under either of its two names)
function M.load_hf(m, tensors, level)
  local sd = {}
  for k, v in pairs(tensors) do sd[k] = v end
  local pe = "prompt_encoder.shared_embedding.positional_embedding"
  sd[pe] = sd[pe] or sd["shared_image_embedding.positional_embedding"]
  sd["shared_image_embedding.positional_embedding"] = nil
  local ok, e = pcall(m.load_state_dict, m, sd)
  if not ok then error("sam: " .. tostring(e):gsub("^[^:]*:%d+: ", ""), level) end
  return m
end

-- from_preset(name, {dtype = "f32", device = "cpu", weights = path, normalize = true}) -> Sam
function M.from_preset(name, opts)
  opts = options.check("sam.from_preset", opts, {"dtype", "device", "weights", "normalize"})
  local sd = opts.weights and common.load_tensors(opts.weights, "sam.from_preset", 2)
  local dtype = opts.dtype                                          -- with weights: "auto" by default
  if sd or dtype == "auto" then dtype = sd and common.model_dtype(opts, nil, sd, "sam.from_preset", 2) or nil end
  local m = M.build(M.config(name, 2), {dtype = dtype, device = opts.device, normalize = opts.normalize})
  if sd then M.load_hf(m, sd, 3) end
  return m
end

-- cfg from a Hugging Face SamConfig (config.json)
function M.config_from_hf(j)
  local v, p, d = j.vision_config or {}, j.prompt_encoder_config or {}, j.mask_decoder_config or {}
  local cfg = common.overlay(DEFAULTS)
  cfg.image_size, cfg.patch = v.image_size or 1024, v.patch_size or 16
  cfg.width, cfg.depth, cfg.heads = v.hidden_size or 768, v.num_hidden_layers or 12, v.num_attention_heads or 12
  cfg.mlp = v.mlp_dim or math.floor(cfg.width * (v.mlp_ratio or 4))
  cfg.window, cfg.global = v.window_size or 14, v.global_attn_indexes or {2, 5, 8, 11}
  cfg.eps, cfg.out_chans = v.layer_norm_eps or 1e-6, v.output_channels or 256
  cfg.qkv_bias, cfg.abs_pos, cfg.rel_pos = v.qkv_bias, v.use_abs_pos, v.use_rel_pos
  cfg.prompt_dim, cfg.mask_in_chans = p.hidden_size or 256, p.mask_input_channels or 16
  cfg.dec_depth, cfg.dec_heads = d.num_hidden_layers or 2, d.num_attention_heads or 8
  cfg.dec_mlp, cfg.dec_downsample = d.mlp_dim or 2048, d.attention_downsample_rate or 2
  cfg.multimask, cfg.iou_hidden, cfg.iou_depth = d.num_multimask_outputs or 3, d.iou_head_hidden_dim or 256,
    d.iou_head_depth or 3
  if (v.num_pos_feats or cfg.prompt_dim // 2) * 2 ~= cfg.prompt_dim then
    error("sam: vision num_pos_feats x 2 must equal the prompt encoder width", 3)
  end
  return cfg
end

-- from_pretrained(dir, {dtype = "auto", device =, normalize =}) -> Sam with dir's config.json and
-- model.safetensors (or a sharded index); "auto" keeps the checkpoint's dtype (common.model_dtype)
function M.from_pretrained(dir, opts)
  opts = options.check("sam.from_pretrained", opts, {"dtype", "device", "normalize"})
  local j = common.read_json(common.inside(dir, dir .. "/config.json", "sam.from_pretrained", 2),
    "sam.from_pretrained", 2)                                        -- nulls read as absent
  if not j then error("sam.from_pretrained: cannot read " .. dir .. "/config.json", 2) end
  -- activations keng implements: exact GELU in the image and prompt encoders, ReLU in the decoder
  options.config("sam.from_pretrained: vision_config", j.vision_config or {}, {hidden_act = "gelu"}, 2)
  options.config("sam.from_pretrained: prompt_encoder_config", j.prompt_encoder_config or {}, {hidden_act = "gelu"}, 2)
  options.config("sam.from_pretrained: mask_decoder_config", j.mask_decoder_config or {}, {hidden_act = "relu"}, 2)
  local tensors = common.load_tensors(dir, "sam.from_pretrained", 2)
  local m = M.build(M.config_from_hf(j), {dtype = common.model_dtype(opts, j, tensors, "sam.from_pretrained", 2),
    device = opts.device, normalize = opts.normalize})
  rawset(m, "hf_config", j)                                        -- save_pretrained writes it back
  return M.load_hf(m, tensors, 3)
end

return M
