-- rope_spec.lua — keng.rope with given inverse frequencies and a cos/sin scale (the scaled RoPE
-- of scripts/models/rope.lua): values against a Lua rotate_half reference, f64 finite-difference
-- gradients, a non-contiguous input, bf16, the device, and the error messages.
-- Shapes: x [..., T, D], positions [T] or [B, T], inv_freq [D/2].
local keng = require "keng"
local H = require "helper"

local ref_rope = H.ref_rope

describe("rope with inv_freq and scale", function()
  keng.manual_seed(5)
  local f = {1.0, 0.3, 0.05, 0.001}                                  -- D = 8
  local function freq(dtype) return H.t(f, {dtype = dtype or "f64"}) end

  it("rotates by pos · inv_freq[i] and scales, positions [T] and [B, T]", function()
    local x = keng.randn({2, 3, 5, 8}):to(H.device)
    local pos = H.t({0, 1, 2, 7, 100}, {dtype = "i64"})
    H.close(keng.rope(x, pos, {inv_freq = freq()}), ref_rope(x, pos, f, 1), 1e-5, "positions [T]")
    H.close(keng.rope(x, pos, {inv_freq = freq("f32"), scale = 1.25}), ref_rope(x, pos, f, 1.25), 1e-5,
      "f32 frequencies, scale 1.25")
    local pb = H.t({{3, 4, 5, 6, 7}, {0, 0, 1, 1, 9}}, {dtype = "i32"})
    H.close(keng.rope(x, pb, {inv_freq = freq(), scale = 0.5}), ref_rope(x, pb, f, 0.5), 1e-5, "positions [B, T]")
    -- the given frequencies win over base; base's are 10000^(-2i/D)
    local fb = {}
    for i = 0, 3 do fb[i + 1] = 10000 ^ (-2 * i / 8) end
    H.close(keng.rope(x, pos, {inv_freq = H.t(fb, {dtype = "f64"}), base = 3}), keng.rope(x, pos), 1e-6, "as base")
    H.close(keng.rope(x, pos, {scale = 2}), keng.rope(x, pos) * 2, 1e-6, "scale without inv_freq")
  end)

  it("accepts non-contiguous x and inv_freq, bf16 and f64", function()
    local x = keng.randn({2, 4, 8}):to(H.device)
    local pos = H.t({5, 1, 2, 3}, {dtype = "i64"})
    local nx = H.noncontig(x)
    assert.is_false(nx.is_contiguous)
    local ff = H.t({1.0, 9, 0.3, 9, 0.05, 9, 0.001, 9}, {dtype = "f64"}):view{4, 2}:select(2, 1)   -- stride 2
    assert.is_false(ff.is_contiguous)
    H.close(keng.rope(nx, pos, {inv_freq = ff, scale = 1.5}), ref_rope(x, pos, f, 1.5), 1e-5, "noncontig")
    local yb = keng.rope(x:bf16(), pos, {inv_freq = freq(), scale = 1.5})
    assert.are.equal("bf16", yb.dtype)
    H.close(yb, ref_rope(x, pos, f, 1.5), 3e-2, "bf16")
    H.close(keng.rope(x:to("f64"), pos, {inv_freq = freq(), scale = 1.5}), ref_rope(x, pos, f, 1.5), 1e-12, "f64")
  end)

  it("has gradients matching finite differences (scale · the inverse rotation)", function()
    local x = H.leaf({2, 3, 8})
    H.gradcheck(function(a) return keng.rope(a, keng.tensor({0, 3, 17}, {dtype = "i64"}),
      {inv_freq = keng.tensor(f, {dtype = "f64"}), scale = 1.3}) end, {x})
    H.gradcheck(function(a) return keng.rope(a, keng.tensor({{1, 2, 3}, {9, 8, 7}}, {dtype = "i64"}),
      {inv_freq = keng.tensor(f, {dtype = "f32"}), scale = 0.7}) end, {x})
  end)

  it("raises on a mis-shaped, integer or grad-requiring inv_freq, a bad scale and unknown options", function()
    local x, pos = keng.randn({2, 3, 8}), keng.tensor({0, 1, 2}, {dtype = "i64"})
    H.raises(function() keng.rope(x, pos, {inv_freq = keng.ones({3})}) end, "rope: inv_freq [3] must be [D/2] = [4]")
    H.raises(function() keng.rope(x, pos, {inv_freq = keng.ones({4}, {dtype = "i64"})}) end,
      "rope: inv_freq must be floating point")
    local g = keng.ones({4}):detach()
    g.requires_grad = true
    H.raises(function() keng.rope(x, pos, {inv_freq = g}) end, "must not require grad")
    H.raises(function() keng.rope(x, pos, {scale = 0 / 0}) end, "rope: scale")
    H.raises(function() keng.rope(x, pos, {scale = math.huge}) end, "must be finite")
    H.raises(function() keng.rope(x, pos, {bse = 10}) end, "rope: unknown option 'bse' (valid: base, inv_freq, scale)")
    H.raises(function() keng.rope(x, pos, {base = -1}) end, "base -1 must be positive")
  end)
end)
