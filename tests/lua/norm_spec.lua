-- norm_spec.lua — layer_norm, rms_norm, group_norm: values against plain Lua references,
-- gradients against finite differences (f64), non-contiguous and bf16 inputs, the parallel
-- path against a composite of engine ops, and error messages.
-- Shapes: x [N, C] (layer/rms, over the last dim), x [B, C, S] (group norm), w, b [C].
local keng = require "keng"
local H = require "helper"

-- rows of a 2-D list -> normalised rows; opts: w, b (lists), eps, rms, unit_offset
local function ref_rows(rows, o)
  local out = {}
  for r, row in ipairs(rows) do
    local C, mean, ss = #row, 0, 0
    if not o.rms then
      for _, v in ipairs(row) do mean = mean + v end
      mean = mean / C
    end
    for _, v in ipairs(row) do ss = ss + (v - mean) ^ 2 end
    local rstd = 1 / math.sqrt(ss / C + o.eps)
    out[r] = {}
    for c, v in ipairs(row) do
      local w = o.w and o.w[c] or 1
      if o.unit_offset then w = 1 + (o.w and o.w[c] or 0) end
      out[r][c] = (v - mean) * rstd * w + (o.b and o.b[c] or 0)
    end
  end
  return out
end

-- x [B, C, S] list, G groups -> list of the same shape
local function ref_group(x, G, w, b, eps)
  local out = {}
  for bi, xb in ipairs(x) do
    local C, S = #xb, #xb[1]
    local cpg = C // G
    out[bi] = {}
    for g = 0, G - 1 do
      local vals = {}
      for c = g * cpg + 1, (g + 1) * cpg do for s = 1, S do vals[#vals + 1] = xb[c][s] end end
      local mean, ss = 0, 0
      for _, v in ipairs(vals) do mean = mean + v end
      mean = mean / #vals
      for _, v in ipairs(vals) do ss = ss + (v - mean) ^ 2 end
      local rstd = 1 / math.sqrt(ss / #vals + eps)
      for c = g * cpg + 1, (g + 1) * cpg do
        out[bi][c] = {}
        for s = 1, S do out[bi][c][s] = (xb[c][s] - mean) * rstd * (w and w[c] or 1) + (b and b[c] or 0) end
      end
    end
  end
  return out
end

local function tolist(t) return t:float():tolist() end

describe("layer_norm", function()
  it("matches the reference with and without weight and bias", function()
    keng.manual_seed(1)
    local x, w, b = keng.randn({4, 6}) * 3 + 1, keng.randn({6}), keng.randn({6})
    H.close(keng.layer_norm(x, w, b), ref_rows(x:tolist(), {w = w:tolist(), b = b:tolist(), eps = 1e-5}), 1e-5, "w, b")
    H.close(keng.layer_norm(x), ref_rows(x:tolist(), {eps = 1e-5}), 1e-5, "no w, b")
    H.close(keng.layer_norm(x, nil, b, 0.5), ref_rows(x:tolist(), {b = b:tolist(), eps = 0.5}), 1e-5, "b only, eps")
  end)

  it("normalises over the last dim of a 3-d input", function()
    keng.manual_seed(2)
    local x = keng.randn({2, 3, 5})
    local y = keng.layer_norm(x)
    H.close(y:reshape{6, 5}, ref_rows(x:reshape{6, 5}:tolist(), {eps = 1e-5}), 1e-5)
    assert.are.same({2, 3, 5}, y.shape)
  end)

  it("has gradients that match finite differences", function()
    keng.manual_seed(3)
    local x, w, b = H.leaf({3, 5}), H.leaf({5}), H.leaf({5})
    H.gradcheck(function(x, w, b) return keng.layer_norm(x, w, b) end, {x, w, b})
    local x2 = H.leaf({2, 2, 4})
    H.gradcheck(function(x) return keng.layer_norm(x, nil, nil, 1e-3) end, {x2})
  end)

  it("accepts a non-contiguous input", function()
    keng.manual_seed(4)
    local x, w = keng.randn({5, 4}), keng.randn({4})
    H.close(keng.layer_norm(H.noncontig(x), w), keng.layer_norm(x, w), 1e-6)
    local xl = H.leaf({4, 3})
    H.gradcheck(function(x) return keng.layer_norm(x:transpose(1, 2)) end, {xl})
  end)

  it("runs in bf16 and f16, computing in f32", function()
    keng.manual_seed(5)
    local x, w, b = keng.randn({8, 16}), keng.randn({16}), keng.randn({16})
    local ref = keng.layer_norm(x, w, b)
    local yb = keng.layer_norm(x:bf16(), w:bf16(), b:bf16())
    assert.are.equal("bf16", yb.dtype)
    H.close(yb, ref, 3e-2, "bf16")
    H.close(keng.layer_norm(x:to("f16"), w, b), ref, 3e-3, "f16 x, f32 w")
  end)

  it("agrees with a composite of engine ops on a large input (parallel path)", function()
    keng.manual_seed(6)
    local function composite(x, w, b)
      local mu = x:mean(-1, true)
      local d = x - mu
      return d * (d:var(-1, true, {correction = 0}) + 1e-5):rsqrt() * w + b
    end
    local x, w, b = H.leaf({128, 300}), H.leaf({300}), H.leaf({300})
    local gy = keng.randn({128, 300}, {dtype = "f64"})
    local y1 = keng.layer_norm(x, w, b)
    y1:mul(gy):sum():backward()
    local g1 = {x.grad, w.grad, b.grad}
    x.grad, w.grad, b.grad = nil, nil, nil
    local y2 = composite(x, w, b)
    y2:mul(gy):sum():backward()
    H.close(y1, y2, 1e-10, "y")
    H.close(g1[1], x.grad, 1e-9, "dx")
    H.close(g1[2], w.grad, 1e-9, "dw")
    H.close(g1[3], b.grad, 1e-9, "db")
  end)

  it("reports bad shapes and dtypes", function()
    local x = keng.randn({2, 4})
    H.raises(function() keng.layer_norm(x, keng.ones({3})) end, "layer_norm")
    H.raises(function() keng.layer_norm(x, nil, keng.ones({2, 2})) end, "bias")
    H.raises(function() keng.layer_norm(keng.ones({2, 4}, {dtype = "i64"})) end, "layer_norm")
  end)
end)

describe("rms_norm", function()
  it("matches the reference, with and without unit offset", function()
    keng.manual_seed(11)
    local x, w = keng.randn({3, 7}) * 2 + 0.5, keng.randn({7})
    H.close(keng.rms_norm(x, w), ref_rows(x:tolist(), {rms = true, w = w:tolist(), eps = 1e-6}), 1e-5, "plain")
    H.close(keng.rms_norm(x, w, 1e-2, {unit_offset = true}),
      ref_rows(x:tolist(), {rms = true, w = w:tolist(), eps = 1e-2, unit_offset = true}), 1e-5, "unit offset")
    H.close(keng.rms_norm(x), ref_rows(x:tolist(), {rms = true, eps = 1e-6}), 1e-5, "no weight")
  end)

  it("has gradients that match finite differences", function()
    keng.manual_seed(12)
    local x, w = H.leaf({3, 5}), H.leaf({5})
    H.gradcheck(function(x, w) return keng.rms_norm(x, w) end, {x, w})
    H.gradcheck(function(x, w) return keng.rms_norm(x, w, 1e-3, {unit_offset = true}) end, {x, w})
    H.gradcheck(function(x) return keng.rms_norm(x:transpose(1, 2)) end, {H.leaf({5, 3})})
  end)

  it("accepts non-contiguous and bf16 inputs", function()
    keng.manual_seed(13)
    local x, w = keng.randn({6, 8}), keng.randn({8})
    local ref = keng.rms_norm(x, w)
    H.close(keng.rms_norm(H.noncontig(x), w), ref, 1e-6, "noncontig")
    H.close(keng.rms_norm(x:bf16(), w:bf16()), ref, 3e-2, "bf16")
    assert.are.equal("bf16", keng.rms_norm(x:bf16(), w).dtype)
  end)

  it("reports a bad weight", function()
    H.raises(function() keng.rms_norm(keng.ones({2, 4}), keng.ones({5})) end, "rms_norm")
  end)
end)

describe("group_norm", function()
  it("matches the reference", function()
    keng.manual_seed(21)
    local x, w, b = keng.randn({2, 6, 5}) * 2 - 1, keng.randn({6}), keng.randn({6})
    H.close(keng.group_norm(x, 3, w, b), ref_group(x:tolist(), 3, w:tolist(), b:tolist(), 1e-5), 1e-5, "3 groups")
    H.close(keng.group_norm(x, 1), ref_group(x:tolist(), 1, nil, nil, 1e-5), 1e-5, "1 group")
    H.close(keng.group_norm(x, 6, nil, nil, 0.1), ref_group(x:tolist(), 6, nil, nil, 0.1), 1e-5, "6 groups")
  end)

  it("handles 4-d NCHW input", function()
    keng.manual_seed(22)
    local x, w = keng.randn({2, 4, 3, 2}), keng.randn({4})
    local y = keng.group_norm(x, 2, w)
    assert.are.same({2, 4, 3, 2}, y.shape)
    H.close(y:reshape{2, 4, 6}, ref_group(x:reshape{2, 4, 6}:tolist(), 2, w:tolist(), nil, 1e-5), 1e-5)
  end)

  it("has gradients that match finite differences", function()
    keng.manual_seed(23)
    local x, w, b = H.leaf({2, 4, 3}), H.leaf({4}), H.leaf({4})
    H.gradcheck(function(x, w, b) return keng.group_norm(x, 2, w, b) end, {x, w, b})
    H.gradcheck(function(x) return keng.group_norm(x, 1) end, {H.leaf({3, 2, 2, 2})})
  end)

  it("accepts non-contiguous and bf16 inputs", function()
    keng.manual_seed(24)
    local x, w, b = keng.randn({3, 4, 5}), keng.randn({4}), keng.randn({4})
    local ref = keng.group_norm(x, 2, w, b)
    local xt = x:transpose(2, 3):contiguous():transpose(2, 3)
    assert.is_false(xt.is_contiguous)
    H.close(keng.group_norm(xt, 2, w, b), ref, 1e-6, "noncontig")
    H.close(keng.group_norm(x:bf16(), 2, w, b), ref, 3e-2, "bf16")
  end)

  it("agrees with a composite of engine ops on a large input", function()
    keng.manual_seed(25)
    local x, w, b = H.leaf({4, 8, 32, 32}), H.leaf({8}), H.leaf({8})
    local gy = keng.randn({4, 8, 32, 32}, {dtype = "f64"})
    local y1 = keng.group_norm(x, 4, w, b)
    y1:mul(gy):sum():backward()
    local g1 = {x.grad, w.grad, b.grad}
    x.grad, w.grad, b.grad = nil, nil, nil
    local xg = x:reshape{4, 4, 2 * 32 * 32}
    local d = xg - xg:mean(-1, true)
    local y2 = (d * (d:var(-1, true, {correction = 0}) + 1e-5):rsqrt()):reshape{4, 8, 32, 32}
      * w:reshape{1, 8, 1, 1} + b:reshape{1, 8, 1, 1}
    y2:mul(gy):sum():backward()
    H.close(y1, y2, 1e-10, "y")
    H.close(g1[1], x.grad, 1e-9, "dx")
    H.close(g1[2], w.grad, 1e-9, "dw")
    H.close(g1[3], b.grad, 1e-9, "db")
  end)

  -- f32 rows sum over 8 float lanes per block of 128 elements: rows longer than a block, with a
  -- tail that is not a multiple of 8 and a mean far from 0, against the f64 kernel on the same values
  it("f32 matches f64 on long rows with a large mean, forward and backward", function()
    keng.manual_seed(26)
    local x32 = (keng.randn({2, 6, 15, 13}) * 0.5 + 100):detach()
    local w32, b32 = keng.randn({6}):detach(), keng.randn({6}):detach()
    local gy = keng.randn({2, 6, 15, 13})
    local function run(x, w, b, g)
      x.requires_grad, w.requires_grad, b.requires_grad = true, true, true
      local y = keng.group_norm(x, 2, w, b)
      y:mul(g):sum():backward()
      return y, x.grad, w.grad, b.grad
    end
    local a = {run(x32, w32, b32, gy)}
    local r = {run(x32:double():detach(), w32:double():detach(), b32:double():detach(), gy:double())}
    for i, name in ipairs({"y", "dx", "dw", "db"}) do H.close(a[i]:double(), r[i], 2e-4, name) end
    -- layer_norm over rows of 300 (3 blocks, a tail of 44) with the same check
    local l = (keng.randn({4, 300}) * 0.1 - 50):detach()
    H.close(keng.layer_norm(l):double(), keng.layer_norm(l:double()), 2e-4, "layer_norm")
  end)

  it("reports groups that do not divide the channels", function()
    local x = keng.randn({2, 6, 3})
    H.raises(function() keng.group_norm(x, 4) end, "group_norm")
    H.raises(function() keng.group_norm(x, 3, keng.ones({5})) end, "weight")
    H.raises(function() keng.group_norm(keng.randn({6}), 3) end, "group_norm")
  end)
end)

-- f32 input runs the direct kernels (rows read and written in place, AVX2 sums, float lanes
-- per 256-element block, two-pass variance): against f64 at odd row lengths, a large mean, bf16
-- and a non-contiguous input (made contiguous by the op, the same kernel), gradients included
describe("norm kernels on f32 rows", function()
  local function both(fn, x, ws, g)
    local function run(xx, wws, gg)
      xx.requires_grad = true
      for _, w in ipairs(wws) do w.requires_grad = true end
      local y = fn(xx, table.unpack(wws))
      y:mul(gg):sum():backward()
      local out = {y, xx.grad}
      for _, w in ipairs(wws) do out[#out + 1] = w.grad end
      return out
    end
    local w32, w64 = {}, {} -- fresh leaves: no gradient carried over from another call
    for k, w in ipairs(ws) do w32[k], w64[k] = w:detach(), w:double():detach() end
    return run(x:detach(), w32, g), run(x:double():detach(), w64, g:double())
  end

  it("layer_norm, rms_norm match f64 at row lengths 1, 7, 33, 1000", function()
    keng.manual_seed(41)
    for _, n in ipairs({1, 7, 33, 1000}) do
      for _, shift in ipairs({0, 30}) do
        local x = (keng.randn({5, n}) + shift):detach()
        local w, b, g = keng.randn({n}):detach(), keng.randn({n}):detach(), keng.randn({5, n})
        local a, r = both(function(t, ww, bb) return keng.layer_norm(t, ww, bb) end, x, {w, b}, g)
        for i, name in ipairs({"y", "dx", "dw", "db"}) do
          H.close(a[i]:double(), r[i], 2e-4, "layer_norm " .. name .. " n " .. n .. " shift " .. shift)
        end
        local a2, r2 = both(function(t, ww) return keng.rms_norm(t, ww, 1e-6, {unit_offset = true}) end, x, {w}, g)
        for i, name in ipairs({"y", "dx", "dw"}) do
          H.close(a2[i]:double(), r2[i], 2e-4, "rms_norm " .. name .. " n " .. n .. " shift " .. shift)
        end
        if n > 1 then H.close(keng.layer_norm(H.noncontig(x), w, b), a[1], 1e-6, "non-contiguous n " .. n) end
        if shift == 0 then -- (bf16 rounds 30 + x to 1/8: the normalised values would differ)
          H.close(keng.layer_norm(x:bf16(), w, b):float(), a[1], 5e-2, "bf16 n " .. n)
        end
      end
    end
    H.gradcheck(function(t, w, b) return keng.layer_norm(t, w, b) end, {H.leaf({3, 33}), H.leaf({33}), H.leaf({33})})
  end)

  it("group_norm matches f64 with spatial sizes 1, 7, 33, 1000", function()
    keng.manual_seed(42)
    for _, s in ipairs({1, 7, 33, 1000}) do
      local x = (keng.randn({2, 6, s}) * 2 + 5):detach()
      local w, b, g = keng.randn({6}):detach(), keng.randn({6}):detach(), keng.randn({2, 6, s})
      local a, r = both(function(t, ww, bb) return keng.group_norm(t, 3, ww, bb) end, x, {w, b}, g)
      for i, name in ipairs({"y", "dx", "dw", "db"}) do H.close(a[i]:double(), r[i], 2e-4, "group_norm " .. name .. " S " .. s) end
    end
  end)
end)
