-- sam_spec.lua — Segment Anything (scripts/models/sam.lua): vision embeddings, masks and IoU
-- against a tiny random-weight Hugging Face SamModel (tests/fixtures/sam, written by
-- tests/fixtures/gen/gen_sam.py), exact parameter counts of the presets on the meta device,
-- point-label handling, the trainable relative-position path against the fused one, bad input.
-- Shape letters: B batch, K prompt points, E embedding width, h the embedding grid side.
local keng = require "keng"
local H = require "helper"
local sam = require "models.sam"

local FIX = "tests/fixtures/sam"

local function loaded() return sam.from_pretrained(FIX), keng.load(FIX .. "/golden.safetensors") end

describe("sam against Hugging Face", function()
  -- all in f32 with the same op order up to summation; observed errors are about 1e-6
  it("gives the vision embeddings (1e-4 relative)", function()
    local m, g = loaded()
    local emb = keng.no_grad(function() return m.encoder(g.images) end)
    H.close(emb, g.embeddings, 1e-4, "embeddings")
  end)

  it("gives the masks and IoU of two points per image (labels 1/0 and 1/-1)", function()
    local m, g = loaded()
    local out = m:predict{images = g.images, points = g.points, labels = g.labels}
    assert.are.same({2, 4, 24, 24}, out.masks.shape)
    assert.are.same({2, 4}, out.iou_pred.shape)
    H.close(out.masks, g.masks, 1e-4, "masks")
    H.close(out.iou_pred, g.iou, 1e-4, "iou")
  end)

  it("gives the masks and IoU of a point, a box and a mask input", function()
    local m, g = loaded()
    local out = m:predict{images = g.images, points = g.box_points, labels = g.box_labels, boxes = g.boxes,
                          masks = g.mask_input}
    H.close(out.masks, g.box_masks, 1e-4, "masks")
    H.close(out.iou_pred, g.box_iou, 1e-4, "iou")
  end)

  it("takes precomputed image embeddings and u8 images", function()
    local m, g = loaded()
    local a = m:predict{image_embeddings = g.embeddings, points = g.points, labels = g.labels}
    H.close(a.masks, g.masks, 1e-4, "from embeddings")
    local u8 = (g.images * 255):to("u8")
    local e1 = keng.no_grad(function() return m.encoder(u8) end)
    local e2 = keng.no_grad(function() return m.encoder(u8:float() / 255) end)
    H.close(e1, e2, 1e-6, "u8 images")
  end)
end)

describe("sam prompts", function()
  it("ignores the position of a -1 (not-a-point) label", function()
    local m, g = loaded()
    local emb = g.embeddings:narrow(1, 1, 1)
    local function run(pts, labels) return m:predict{image_embeddings = emb, points = pts, labels = labels} end
    local a = run({{40, 30}, {70, 60}}, {1, -1})
    local b = run({{40, 30}, {5, 90}}, {1, -1})
    H.close(a.masks, b.masks, 1e-6, "moved -1 point")
    H.close(a.iou_pred, b.iou_pred, 1e-6, "moved -1 point iou")
    local c = run({{40, 30}, {5, 90}}, {1, 1})
    assert.is_true((c.masks - b.masks):abs():max():item() > 1e-3, "a foreground point must change the masks")
    -- label 2 (the benchmark's second point) is neither -1 nor background: its position counts
    local d = run({{40, 30}, {5, 90}}, {1, 2})
    local e = run({{40, 30}, {70, 60}}, {1, 2})
    assert.is_true((d.masks - e.masks):abs():max():item() > 1e-3, "a label-2 point's position must count")
  end)

  it("serves one prompt to every image of the batch", function()
    local m, g = loaded()
    local out = m:predict{image_embeddings = g.embeddings, points = {{40, 30}, {70, 60}}, labels = {1, 0}}
    local one = m:predict{image_embeddings = g.embeddings:narrow(1, 1, 1), points = g.points:narrow(1, 1, 1),
                          labels = g.labels:narrow(1, 1, 1)}
    H.close(out.masks:narrow(1, 1, 1), one.masks, 1e-5, "row 1")
    H.close(out.masks:narrow(1, 1, 1), g.masks:narrow(1, 1, 1), 1e-4, "golden row 1")
  end)

  it("names the expected shapes of bad input", function()
    local m, g = loaded()
    H.raises(function() m:predict{images = keng.rand({1, 3, 64, 64}), points = {{1, 2}}} end,
      "images must be [B, 3, 96, 96] (NCHW), got [1,3,64,64]")
    H.raises(function() m:predict{images = keng.rand({1, 4, 96, 96}), points = {{1, 2}}} end,
      "images must be [B, 3, 96, 96] (NCHW), got [1,4,96,96]")
    H.raises(function() m.encoder(keng.rand({1, 96, 96, 3})) end, "images must be [B, 3, 96, 96]")
    H.raises(function() m:predict{image_embeddings = g.embeddings, points = keng.rand({3, 2, 2})} end,
      "points must be [2, K, 2]")
    H.raises(function() m:predict{image_embeddings = g.embeddings, points = g.points, labels = {1, 0, 1}} end,
      "labels must be [2, 2] or [2]")
    H.raises(function() m:predict{image_embeddings = g.embeddings, boxes = {{1, 2, 3}}} end, "boxes must be [2, 4]")
    H.raises(function() m:predict{image_embeddings = g.embeddings, masks = keng.zeros({2, 1, 8, 8})} end,
      "masks must be [2, 1, 24, 24]")
  end)
end)

describe("sam presets", function()
  it("counts sam_huge_sa1b exactly on the meta device", function()
    local m = sam.from_preset("sam_huge_sa1b", {device = "meta"})
    assert.are.equal(641090864, m:num_params())
    assert.are.equal(637026048, m.encoder:num_params())
    assert.is_truthy(m:summary{quiet = true}:find("Total params: 641,090,864", 1, true))
  end)

  it("counts the base and large presets as Hugging Face does", function()
    assert.are.equal(93735728, sam.from_preset("sam_base_sa1b", {device = "meta"}):num_params())
    assert.are.equal(312343088, sam.from_preset("sam_large_sa1b", {device = "meta"}):num_params())
  end)

  it("runs sam_tiny at the CPU-tier sizes", function()
    keng.manual_seed(0)
    local m = sam.from_preset("sam_tiny")
    local out = m:predict{images = keng.rand({2, 3, 256, 256}), points = {{125, 93.75}, {62.5, 93.75}},
                          labels = {1, 2}}
    assert.are.same({2, 4, 64, 64}, out.masks.shape)
    assert.are.same({2, 4}, out.iou_pred.shape)
    assert.are.same({2, 256, 16, 16}, out.image_embeddings.shape)
  end)

  it("rejects an unknown preset and a missing checkpoint by name", function()
    H.raises(function() sam.from_preset("sam_giant") end, "unknown preset 'sam_giant'")
    H.raises(function() sam.from_pretrained("tests/fixtures/no_such_sam") end, "tests/fixtures/no_such_sam/config.json")
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir .. " && cp " .. FIX .. "/config.json " .. dir .. "/"))
    local err = H.raises(function() sam.from_pretrained(dir) end, "sam.from_pretrained")
    os.execute("rm -rf " .. dir)
    assert.is_truthy(err:find("model.safetensors", 1, true), err)
  end)
end)

describe("sam config.json with nulls", function()
  -- a null in a nested config reads as absent: the default applies (these equal the fixture's)
  it("loads like one without the keys", function()
    local json = require "keng.json"
    local function embeddings(value)                                -- value: json.null or nil
      local m = H.with_model_dir(FIX, function(j)
        for _, k in ipairs{"layer_norm_eps", "patch_size", "num_pos_feats"} do j.vision_config[k] = value end
        for _, k in ipairs{"iou_head_depth", "attention_downsample_rate", "num_multimask_outputs"} do
          j.mask_decoder_config[k] = value
        end
      end, sam.from_pretrained)
      return m.cfg, keng.no_grad(function() return m.encoder(keng.load(FIX .. "/golden.safetensors").images) end)
    end
    local cfg_null, emb_null = embeddings(json.null)
    local cfg_absent, emb_absent = embeddings(nil)
    assert.are.same(cfg_absent, cfg_null)
    assert.are.equal(1e-6, cfg_null.eps)
    H.close(emb_null, emb_absent, 0, "embeddings")
  end)
end)

describe("sam training path", function()
  it("gives the same embeddings with a tape (explicit attention) as without (fused)", function()
    local m, g = loaded()
    local a = m.encoder(g.images)                                   -- rel tables require grad
    local b = keng.no_grad(function() return m.encoder(g.images) end)
    H.close(a, b, 1e-5, "explicit vs fused")
    local y = keng.rand(a.shape)
    keng.mse_loss(a, y):backward()
    local att = m.encoder.layers[0].attn
    assert.is_truthy(att.rel_pos_h.grad, "rel_pos_h has a gradient")
    assert.is_true(att.rel_pos_w.grad:abs():sum():item() > 0)
    assert.is_true(m.encoder.pos_embed.grad:abs():sum():item() > 0)
  end)

  it("differentiates the relative-position attention (f64 gradcheck)", function()
    keng.manual_seed(3)
    local cfg = {width = 8, heads = 2}
    local att = sam.VisionAttention(cfg, 3, {dtype = "f64"})
    local x = keng.randn({2, 3, 3, 8}, {dtype = "f64", requires_grad = true})
    local rh = keng.randn({5, 4}, {dtype = "f64", requires_grad = true})
    local rw = keng.randn({5, 4}, {dtype = "f64", requires_grad = true})
    H.gradcheck(function(xx, h, w)
      att.rel_pos_h, att.rel_pos_w = h, w
      return att(xx)
    end, {x, rh, rw}, {tol = 1e-5})
  end)
end)
