-- image_jpeg_spec.lua — JPEG read/write (engine/io/jpeg.c, libjpeg-turbo) and keng.image's
-- format-sniffing read / extension-picking write, against PIL's files and decodes
-- (tests/fixtures/gen/gen_image.py): pixels equal, corrupt files raise, options checked.
local keng = require "keng"
local image = require "keng.image"
local H = require "helper"

local DIR = "tests/fixtures/image/"
local G = keng.load(DIR .. "decoded.safetensors")

local slurp, spit = H.read, H.write

local function same(a, b, msg)
  assert.are.same(b.shape, a.shape)
  assert.are.equal(0, (a:int() - b:int()):abs():max():item(), msg)
end

describe("JPEG", function()
  local tmp = os.tmpname()
  teardown(function() os.remove(tmp); os.remove(tmp .. ".jpg"); os.remove(tmp .. ".png") end)

  it("decodes PIL's baseline, progressive and greyscale files to PIL's pixels", function()
    for _, name in ipairs{"photo", "progressive", "gray"} do
      local t = image.read(DIR .. name .. ".jpg")
      assert.are.equal("u8", t.dtype)
      same(t, G[name], name)
      same(image.read_jpeg(DIR .. name .. ".jpg"), G[name], name)
    end
  end)

  it("writes what libjpeg writes: quality 90 decodes to PIL's quality-90 pixels; round trips", function()
    image.write(tmp .. ".jpg", G.source, {quality = 90})
    same(image.read(tmp .. ".jpg"), G.photo)
    image.write(tmp .. ".jpg", H.noncontig(G.source:transpose(1, 2)):transpose(1, 2), {quality = 90})
    same(image.read(tmp .. ".jpg"), G.photo, "strided input")
    image.write(tmp .. ".jpg", G.source)                            -- default quality 90
    same(image.read(tmp .. ".jpg"), G.photo, "default quality")
    image.write(tmp .. ".jpg", G.source, {quality = 100})
    local err = (image.read(tmp .. ".jpg"):int() - G.source:int()):abs():max():item()
    assert.is_true(err <= 40, "quality 100 error " .. err)            -- 4:2:0 chroma of noisy pixels
    image.write(tmp .. ".jpg", G.source:narrow(3, 1, 1), {quality = 95})  -- greyscale file
    local g = image.read(tmp .. ".jpg")
    same(g:narrow(3, 1, 1), g:narrow(3, 2, 1))
    assert.is_true((g:narrow(3, 1, 1):int() - G.source:narrow(3, 1, 1):int()):abs():max():item() <= 8)
  end)

  it("picks the reader by content and the writer by extension", function()
    image.write(tmp .. ".png", G.source)
    spit(tmp, slurp(tmp .. ".png"))                                   -- no extension: still PNG
    same(image.read(tmp), G.source)
    spit(tmp, slurp(DIR .. "photo.jpg"))
    same(image.read(tmp), G.photo)
    local rgba = keng.cat({G.source, keng.full({16, 24, 1}, 7, {dtype = "u8"})}, 3)
    image.write(tmp .. ".png", rgba)
    same(image.read(tmp .. ".png"), G.source, "alpha dropped")
    image.write(tmp .. ".png", G.source:narrow(3, 2, 1))
    same(image.read(tmp .. ".png"), G.source:narrow(3, 2, 1):expand({16, 24, 3}), "grey replicated")
  end)

  it("refuses CMYK, corrupt and truncated files by name, never exits", function()
    H.raises(function() image.read(DIR .. "cmyk.jpg") end, "jpeg_read: " .. DIR .. "cmyk.jpg: CMYK JPEGs are not supported")
    local d = slurp(DIR .. "photo.jpg")
    spit(tmp, d:sub(1, 400))
    H.raises(function() image.read(tmp) end, "jpeg_read: " .. tmp .. ": Premature end of JPEG file")
    spit(tmp, d:sub(1, 200) .. string.rep("\255\1", 50) .. d:sub(301))
    H.raises(function() image.read(tmp) end, "jpeg_read: " .. tmp .. ": Corrupt JPEG data")
    local sof = d:find("\255\192", 1, true) + 5                     -- SOF0's height, width
    spit(tmp, d:sub(1, sof - 1) .. string.pack(">I2I2", 65000, 65000) .. d:sub(sof + 4))
    H.raises(function() image.read(tmp) end,
      "jpeg_read: " .. tmp .. ": header claims 65000x65000 pixels, more than the " .. #d .. "-byte file can hold")
    spit(tmp, d:sub(1, 3))
    H.raises(function() image.read(tmp) end, "jpeg_read: " .. tmp .. ":")
    spit(tmp, "GIF89a....")
    H.raises(function() image.read(tmp) end, "image.read: " .. tmp .. ": not a PNG or JPEG file")
    H.raises(function() image.read(tmp .. ".missing") end, "image.read: " .. tmp .. ".missing")
  end)

  it("checks what it writes and its options", function()
    H.raises(function() image.write(tmp .. ".jpg", G.source, {quality = 0}) end, "image.write: quality must be >= 1, got 0")
    H.raises(function() image.write(tmp .. ".jpg", G.source, {quality = 101}) end, "jpeg_write: quality 101 must be in 1..100")
    H.raises(function() image.write(tmp .. ".jpg", G.source, {qualty = 80}) end, "image.write: unknown option 'qualty' (valid: quality)")
    H.raises(function() image.write(tmp .. ".png", G.source, {quality = 80}) end, "image.write: quality applies to JPEG files")
    H.raises(function() image.write(tmp .. ".gif", G.source) end, "image.write: " .. tmp .. ".gif: unknown extension (valid: .png, .jpg, .jpeg)")
    H.raises(function() image.write(tmp .. ".jpg", G.source:float()) end, "jpeg_write: image [16,24,3] has dtype f32, expected u8")
    H.raises(function() image.write(tmp .. ".jpg", keng.zeros({4, 4, 2}, {dtype = "u8"})) end,
      "jpeg_write: image [4,4,2]: expected [H, W] or [H, W, C] with C 1 or 3")
  end)
end)
