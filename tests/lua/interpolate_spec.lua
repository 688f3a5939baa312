-- interpolate_spec.lua — keng.interpolate's nearest, bilinear and bicubic modes, align_corners and
-- antialias against torch.nn.functional.interpolate (tests/fixtures/gen/gen_interpolate.py): f64
-- and f32 values, f64 gradients; finite differences; bf16 and non-contiguous input; errors.
local keng = require "keng"
local H = require "helper"

local DIR = "tests/fixtures/interpolate"
local CASES = dofile(DIR .. "/cases.lua")
local G = keng.load(DIR .. "/golden.safetensors")

local function name(k, o)
  local parts = {}
  for _, key in ipairs{"mode", "size", "scale", "align_corners", "antialias"} do
    local v = o[key]
    if type(v) == "table" then v = "{" .. table.concat(v, ", ") .. "}" end
    if v ~= nil then parts[#parts + 1] = key .. "=" .. tostring(v) end
  end
  return "case " .. k .. " (" .. table.concat(parts, " ") .. ")"
end

describe("interpolate vs torch", function()
  for k, o in ipairs(CASES) do
    it(name(k, o) .. ": f64 and f32 values, f64 gradient", function()
      local x = G.x:clone()
      x.requires_grad = true
      local y = keng.interpolate(x, o)
      H.close(y, G["y" .. k], 1e-12, "y")
      local loss = (y * G["g" .. k]):sum()
      loss:backward()
      H.close(x.grad, G["dx" .. k], 1e-12, "dx")
      local yf = keng.interpolate(G.x:float(), o)
      assert.are.equal("f32", yf.dtype)
      H.close(yf, G["yf" .. k], 2e-6, "f32")
    end)
  end
end)

describe("interpolate", function()
  it("gradients match finite differences in every mode", function()
    keng.manual_seed(7)
    for _, o in ipairs{
      {mode = "bilinear", size = {5, 7}},
      {mode = "bilinear", size = {2, 9}, align_corners = true},
      {mode = "bicubic", scale = 1.5},
      {mode = "bicubic", size = {2, 3}, align_corners = true},
      {mode = "bilinear", size = {2, 2}, antialias = true},
      {mode = "bicubic", size = {3, 2}, antialias = true},
    } do
      H.gradcheck(function(x) return keng.interpolate(x, o) end, {H.leaf({2, 1, 4, 5})})
    end
  end)

  it("keeps bf16 and takes non-contiguous input", function()
    local o = {mode = "bicubic", size = {9, 11}, align_corners = false}
    local y = keng.interpolate(H.noncontig(G.x:bf16()), o)
    assert.are.equal("bf16", y.dtype)
    H.close(y:double(), keng.interpolate(G.x:bf16():float(), o), 1e-2)
    local xn = H.noncontig(G.x)
    assert.is_false(xn.is_contiguous)
    H.close(keng.interpolate(xn, {mode = "bilinear", size = {2, 3}, antialias = true}), G.y13, 1e-12)
  end)

  it("is the identity at the same size, and bilinear with align_corners hits the corners", function()
    local x = G.x
    for _, m in ipairs{"nearest", "bilinear", "bicubic"} do
      H.close(keng.interpolate(x, {mode = m, size = {5, 7}}), x, 0, m)
    end
    H.close(keng.interpolate(x, {mode = "bilinear", size = {5, 7}, antialias = true}), x, 1e-15, "aa")
    local t = keng.tensor({{{{0, 3}, {6, 9}}}}, {dtype = "f64"})
    H.close(keng.interpolate(t, {mode = "bilinear", size = {3, 3}, align_corners = true}),
      {0, 1.5, 3, 3, 4.5, 6, 6, 7.5, 9}, 0)
  end)

  it("reports bad input", function()
    local x = keng.randn({1, 1, 4, 4})
    H.raises(function() keng.interpolate(x, {size = 2, mode = "trilinear"}) end,
      "interpolate: unknown mode 'trilinear' (valid: nearest, bilinear, bicubic)")
    H.raises(function() keng.interpolate(x, {size = 2, align_corners = false}) end,
      "interpolate: align_corners applies to the bilinear and bicubic modes, not nearest")
    H.raises(function() keng.interpolate(x, {size = 2, antialias = true}) end,
      "interpolate: antialias applies to the bilinear and bicubic modes, not nearest")
    H.raises(function() keng.interpolate(x, {size = 2, mode = "bilinear", align_corners = 1}) end,
      "interpolate: align_corners must be a boolean, got number")
    H.raises(function() keng.interpolate(x, {size = 2, scale = 2}) end, "interpolate: give scale= or size=, not both")
    H.raises(function() keng.interpolate(x, {size = 2.5}) end, "interpolate: size must be an integer, got 2.5")
    H.raises(function() keng.interpolate(x, {size = {3, -1}, mode = "bicubic"}) end,
      "interpolate: x [1,1,4,4]: output size 3x-1 must be positive")
    H.raises(function() keng.interpolate(x, {scale = -2}) end, "interpolate: scale must be positive and finite, got -2")
    H.raises(function() keng.interpolate(x, {scale = 2, antialas = true}) end,
      "interpolate: unknown option 'antialas' (valid: size, scale, mode, align_corners, antialias)")
    H.raises(function() keng.interpolate(keng.ones({1, 1, 2, 2}, {dtype = "i32"}), {size = 3, mode = "bilinear"}) end,
      "interpolate: mode 'bilinear' needs a floating-point x, got i32")
  end)
end)
