-- image_spec.lua — keng.image.grid: tiling a batch of u8 images into one picture
local keng = require "keng"
local image = require "keng.image"
local H = require "helper"

describe("image.grid", function()
  it("places image b at row (b-1)//cols, column (b-1)%cols with padding between", function()
    local imgs = keng.arange(5 * 4 * 3 * 3):to("u8"):reshape{5, 4, 3, 3} -- values 0..179
    local g = image.grid(imgs, {cols = 2, pad = 1, background = 255})
    assert.are.same({3 * 5 - 1, 2 * 4 - 1, 3}, g.shape)
    for b = 1, 5 do
      local r, c = (b - 1) // 2, (b - 1) % 2
      H.close(g:narrow(1, r * 5 + 1, 4):narrow(2, c * 4 + 1, 3), imgs[b], 0, "tile " .. b)
    end
    H.close(g:select(1, 5), keng.full({7, 3}, 255, {dtype = "u8"}), 0, "padding row")
    H.close(g:narrow(1, 11, 4):narrow(2, 5, 3), keng.full({4, 3, 3}, 255, {dtype = "u8"}), 0, "empty cell")
  end)

  it("defaults to a square-ish layout and rejects bad input", function()
    local g = image.grid(keng.zeros({4, 2, 2, 1}, {dtype = "u8"}), {pad = 0})
    assert.are.same({4, 4, 1}, g.shape)
    H.raises(function() image.grid(keng.zeros({2, 2, 3}, {dtype = "u8"})) end, "image.grid: images must be a tensor [B, H, W, C]")
    H.raises(function() image.grid(keng.zeros({1, 2, 2, 3}, {dtype = "u8"}), {cols = 0}) end, "cols must be a positive integer")
  end)
end)
