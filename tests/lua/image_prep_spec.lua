-- image_prep_spec.lua — keng.image.resize / normalize / pad (SAM's and SD's preprocessing) on
-- u8 [H, W, C] and float [C, H, W] images, against torch (tests/fixtures/gen/gen_image.py).
local keng = require "keng"
local image = require "keng.image"
local H = require "helper"

local G = keng.load("tests/fixtures/image/decoded.safetensors")
local MEAN, STD = {123.675, 116.28, 103.53}, {58.395, 57.12, 57.375}

describe("image preprocessing", function()
  it("resizes u8 to the longest side exactly as torch's uint8 antialias resize", function()
    local r = image.resize(G.source, {longest_side = 10})
    assert.are.equal("u8", r.dtype)
    assert.are.same({7, 10, 3}, r.shape)
    assert.are.equal(0, (r:int() - G.resized:int()):abs():max():item())
    assert.are.same({7, 10, 3}, image.resize(G.source, {size = {7, 10}}).shape)
  end)

  it("resizes u8 exactly as torch's uint8 interpolate in bilinear and bicubic, antialias on and off", function()
    local U = keng.load("tests/fixtures/image/resize_u8.safetensors")
    local src = {source = G.source, small = U.small}
    local n = 0
    for name, want in pairs(U) do
      local img, mode, aa, ac, h, w = name:match("^(%a+)_(%a+)_aa(%d)_ac(%d)_(%d+)x(%d+)$")
      if img then
        local got = image.resize(src[img], {size = {tonumber(h), tonumber(w)}, mode = mode, antialias = aa == "1",
                                            align_corners = ac == "1"})
        assert.are.same(want.shape, got.shape, name)
        assert.are.equal(0, (got:int() - want:int()):abs():max():item(), name)
        n = n + 1
      end
    end
    assert.are.equal(40, n)
    H.raises(function() image.resize(G.source, {size = 3, antialias = "no"}) end,
      "image.resize: antialias must be true or false, got string")
  end)

  it("resizes float [C, H, W] exactly as interpolate, in every mode", function()
    local x = G.source:double():permute({3, 1, 2}):contiguous()
    for _, m in ipairs{"bilinear", "bicubic"} do
      local want = keng.interpolate(x:unsqueeze(1), {size = {5, 9}, mode = m, antialias = true}):squeeze(1)
      H.close(image.resize(x, {size = {5, 9}, mode = m}), want, 0, m)
      want = keng.interpolate(x:unsqueeze(1), {size = {5, 9}, mode = m}):squeeze(1)
      H.close(image.resize(x, {size = {5, 9}, mode = m, antialias = false}), want, 0, m)
    end
    H.close(image.resize(x, {size = 4, mode = "nearest"}), keng.interpolate(x:unsqueeze(1), {size = 4}):squeeze(1), 0)
  end)

  it("normalizes and pads as SAM's preprocessing", function()
    local n = image.normalize(G.resized, MEAN, STD)
    assert.are.same({3, 7, 10}, n.shape)
    local p = image.pad(n, {size = {10, 10}})
    H.close(p, G.sam_input, 1e-6)
    -- the float [C, H, W] path and a scalar mean/std (SD's [-1, 1])
    local f = G.resized:float():permute({3, 1, 2}) / 255
    H.close(image.normalize(f, 0.5, 0.5), f * 2 - 1, 1e-6)
    local u = image.pad(G.resized, {top = 1, left = 2, right = 1, value = 9})
    assert.are.same({8, 13, 3}, u.shape)
    assert.are.equal(9, u[1][1][1]:item())
    H.close(u:narrow(1, 2, 7):narrow(2, 3, 10), G.resized, 0)
  end)

  it("reports bad input and unknown options", function()
    H.raises(function() image.resize(G.source, {longest = 10}) end,
      "image.resize: unknown option 'longest' (valid: align_corners, antialias, longest_side, mode, size)")
    H.raises(function() image.resize(G.source, {}) end, "image.resize: give size= or longest_side=")
    H.raises(function() image.resize(G.source, {size = 3, longest_side = 4}) end, "image.resize: give size= or longest_side=, not both")
    H.raises(function() image.resize(G.source, {size = 3, mode = "area"}) end, "image.resize: unknown mode 'area'")
    H.raises(function() image.resize(G.source, {size = 3, mode = "nearest", antialias = true}) end,
      "image.resize: antialias applies to the bilinear and bicubic modes, not nearest")
    H.raises(function() image.resize(keng.zeros({2, 2}), {size = 3}) end,
      "image.resize: expected u8 [H, W, C] or float [C, H, W], got [2,2]")
    H.raises(function() image.normalize(G.resized, {1, 2}, STD) end, "image.normalize: mean must be a number or a list of 3 numbers")
    H.raises(function() image.normalize(G.resized, MEAN, {1, 0, 1}) end, "image.normalize: std[2] is 0")
    H.raises(function() image.pad(G.resized, {size = {5, 10}}) end, "image.pad: size {5, 10} is smaller than the image's 7x10")
    H.raises(function() image.pad(G.resized, {size = {10, 10}, top = 1}) end, "image.pad: give size= or top/bottom/left/right=, not both")
    H.raises(function() image.pad(G.resized, {top = -1}) end, "image.pad: top must be >= 0, got -1")
    H.raises(function() image.pad(G.resized, {rigth = 1}) end, "image.pad: unknown option 'rigth'")
  end)
end)
