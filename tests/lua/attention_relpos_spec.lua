-- attention_relpos_spec.lua — scaled_dot_product_attention with SAM's decomposed
-- relative-position bias (rel_h [B,H,T,kh], rel_w [B,H,T,kw], kh*kw = S): key j = ky*kw + kx
-- gets rel_h[..., ky] + rel_w[..., kx]. References: the same call with the bias materialised as
-- an additive mask (values in f64; gradients through the math route's composed ops) and central
-- differences (H.gradcheck, f64) for q, k, v, rel_h, rel_w.
local keng = require "keng"
local H = require "helper"

local function sdpa(q, k, v, opts) return keng.scaled_dot_product_attention(q, k, v, opts) end

-- the [B, H, T, kh*kw] bias itself
local function full_bias(rh, rw)
  local B, Hq, T, kh = table.unpack(rh.shape)
  local kw = rw.shape[4]
  return (rh:reshape{B, Hq, T, kh, 1} + rw:reshape{B, Hq, T, 1, kw}):reshape{B, Hq, T, kh * kw}
end

local function inputs(B, Hq, Hkv, T, kh, kw, D, dtype)
  local o = {dtype = dtype}
  return keng.randn({B, Hq, T, D}, o), keng.randn({B, Hkv, kh * kw, D}, o), keng.randn({B, Hkv, kh * kw, D}, o),
    keng.randn({B, Hq, T, kh}, o), keng.randn({B, Hq, T, kw}, o)
end

describe("scaled_dot_product_attention with rel_h/rel_w", function()
  keng.manual_seed(11)

  it("matches the materialised bias (f64 and f32, several key tiles, tiles that start mid-row)", function()
    -- S = 9*15 = 135: a 128-key forward tile ends inside a grid row; T = 70 > one 64-query tile
    -- kw 20 > 16 (terms gathered, not permuted); S = 4100 past the kernel's index table (4096)
    for _, c in ipairs({{1, 2, 2, 70, 9, 15, 16}, {2, 3, 1, 49, 7, 7, 64}, {1, 2, 1, 3, 4, 4, 8}, {1, 2, 1, 30, 3, 20, 16},
      {1, 1, 1, 2, 2, 2050, 8}}) do
      local q, k, v, rh, rw = inputs(c[1], c[2], c[3], c[4], c[5], c[6], c[7], "f64")
      local ref = sdpa(q, k, v, {mask = full_bias(rh, rw)})
      H.close(sdpa(q, k, v, {rel_h = rh, rel_w = rw}), ref, 1e-12, "f64")
      local f = function(t) return t:to("f32") end
      local o32 = sdpa(f(q), f(k), f(v), {rel_h = f(rh), rel_w = f(rw)})
      assert.are.equal("f32", o32.dtype)
      H.close(o32, ref, 2e-5, "f32")
      local oc = sdpa(q, k, v, {rel_h = rh, rel_w = rw, causal = true, scale = 0.3})
      H.close(oc, sdpa(q, k, v, {mask = full_bias(rh, rw), causal = true, scale = 0.3}), 1e-12, "f64 causal")
    end
  end)

  it("has gradients for q, k, v, rel_h, rel_w matching finite differences (f64)", function()
    local q, k, v = H.leaf({1, 2, 5, 3}), H.leaf({1, 1, 6, 3}), H.leaf({1, 1, 6, 3})
    local rh, rw = H.leaf({1, 2, 5, 2}), H.leaf({1, 2, 5, 3})
    H.gradcheck(function(a, b, c, d, e) return sdpa(a, b, c, {rel_h = d, rel_w = e}) end, {q, k, v, rh, rw})
    H.gradcheck(function(a, b, c, d, e) return sdpa(a, b, c, {rel_h = d, rel_w = e, causal = true}) end,
      {q, k, v, rh, rw})
  end)

  it("has f32 gradients matching the materialised bias's across tiles and key runs", function()
    for _, c in ipairs({{1, 2, 1, 70, 9, 15, 16}, {2, 2, 2, 49, 7, 7, 64}, {1, 1, 1, 256, 16, 16, 32}}) do
      local x = {inputs(c[1], c[2], c[3], c[4], c[5], c[6], c[7], "f32")}
      local function grads(fused)
        local l = {}
        for i, t in ipairs(x) do
          l[i] = t:detach()
          l[i].requires_grad = true
        end
        local opts = fused and {rel_h = l[4], rel_w = l[5]} or {mask = full_bias(l[4], l[5])}
        local out = sdpa(l[1], l[2], l[3], opts)
        keng.manual_seed(3)
        out:mul(keng.randn(out.shape)):sum():backward()
        return out, l
      end
      local o1, g1 = grads(true)
      local o2, g2 = grads(false) -- the mask needs a gradient: the math route's composed ops
      H.close(o1, o2, 1e-5, "out")
      for i, name in ipairs({"q", "k", "v", "rel_h", "rel_w"}) do H.close(g1[i].grad, g2[i].grad, 1e-4, name) end
    end
  end)

  it("reads non-contiguous q and rel_h/rel_w", function()
    local q, k, v, rh, rw = inputs(1, 2, 2, 12, 3, 5, 8, "f64")
    local ref = sdpa(q, k, v, {mask = full_bias(rh, rw)})
    H.close(sdpa(H.noncontig(q), k, v, {rel_h = H.noncontig(rh), rel_w = H.noncontig(rw)}), ref, 1e-12, "f64")
    local f = function(t) return H.noncontig(t:to("f32")) end
    H.close(sdpa(f(q), k:to("f32"), v:to("f32"), {rel_h = f(rh), rel_w = f(rw)}), ref, 2e-5, "f32")
  end)

  it("builds the bias in full on the math route, with the same values and gradients", function()
    local x = {inputs(1, 2, 1, 10, 3, 4, 8, "f64")}
    local function run()
      local l = {}
      for i, t in ipairs(x) do
        l[i] = t:detach()
        l[i].requires_grad = true
      end
      local out = sdpa(l[1], l[2], l[3], {rel_h = l[4], rel_w = l[5]})
      out:sum():backward()
      return out, l
    end
    local o1, g1 = run()
    local before = keng.backends.cudnn_sdpa_stats.routes.math or 0
    keng.backends.sdpa_math = true
    local ok, o2, g2 = pcall(run)
    keng.backends.sdpa_math = false
    assert(ok, o2)
    assert.is_true((keng.backends.cudnn_sdpa_stats.routes.math or 0) > before)
    H.close(o2, o1, 1e-12, "out")
    for i = 1, 5 do H.close(g2[i].grad, g1[i].grad, 1e-10, "grad " .. i) end
  end)

  it("writes [B,T,H,D] for layout = 'bthd' (values, gradients, every route)", function()
    local q, k, v, rh, rw = inputs(2, 3, 1, 10, 3, 4, 8, "f64")
    for _, o in ipairs({{}, {causal = true}, {rel_h = rh, rel_w = rw}}) do
      local ref = sdpa(q, k, v, o):transpose(2, 3)
      o.layout = "bthd"
      local out = sdpa(q, k, v, o)
      assert.are.same({2, 10, 3, 8}, out.shape)
      assert.is_true(out.is_contiguous)
      H.close(out, ref, 0, "f64")
      local f = function(t) return t:to("f32") end
      local o32 = {causal = o.causal, layout = "bthd", rel_h = o.rel_h and f(rh), rel_w = o.rel_w and f(rw)}
      H.close(sdpa(f(q), f(k), f(v), o32), ref, 2e-5, "f32")
      keng.backends.sdpa_math = true
      local ok, m = pcall(sdpa, q, k, v, o)
      keng.backends.sdpa_math = false
      assert(ok, m)
      assert.is_true(m.is_contiguous)
      H.close(m, ref, 1e-12, "math route")
    end
    local a, b, c = H.leaf({1, 2, 5, 3}), H.leaf({1, 1, 6, 3}), H.leaf({1, 1, 6, 3})
    local d, e = H.leaf({1, 2, 5, 2}), H.leaf({1, 2, 5, 3})
    H.gradcheck(function(x, y, z, u, w) return sdpa(x, y, z, {rel_h = u, rel_w = w, layout = "bthd"}) end,
      {a, b, c, d, e})
    H.gradcheck(function(x, y, z) return sdpa(x, y, z, {causal = true, layout = "bthd"}) end, {a, b, c})
    H.raises(function() sdpa(q, k, v, {layout = "bhdt"}) end, "layout 'bhdt' unknown (valid: bhtd, bthd)")
  end)

  it("names the problem with bad arguments", function()
    local q, k, v, rh, rw = inputs(1, 2, 1, 6, 2, 3, 4, "f32")
    H.raises(function() sdpa(q, k, v, {rel_h = rh}) end, "rel_h and rel_w go together (got only rel_h)")
    H.raises(function() sdpa(q, k, v, {rel_w = rw}) end, "got only rel_w")
    local e = H.raises(function() sdpa(q, k, v, {rel_h = rh, rel_w = keng.randn({1, 2, 6, 4})}) end,
      "scaled_dot_product_attention")
    assert.truthy(e:find("rel_h [1,2,6,2], rel_w [1,2,6,4]", 1, true), e)
    assert.truthy(e:find("kh*kw = S = 6", 1, true), e)
    H.raises(function() sdpa(q, k, v, {rel_h = rh:narrow(3, 1, 5), rel_w = rw:narrow(3, 1, 5)}) end,
      "need [B,H,T,kh] and [B,H,T,kw]")
    H.raises(function() sdpa(q, k, v, {rel_h = rh, rel_w = rw, mask = keng.zeros({6, 6})}) end,
      "a mask cannot be combined with rel_h/rel_w")
    H.raises(function() sdpa(q, k, v, {rel_h = rh:to("i32"), rel_w = rw}) end, "rel_h")
    H.raises(function() sdpa(q, k, v, {rel_hh = rh}) end, "rel_hh")
  end)
end)
