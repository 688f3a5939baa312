-- attention_spec.lua — fused scaled-dot-product attention and rotary position embedding.
-- Shapes: q [B,H,T,D], k/v [B,Hkv,S,D], mask broadcast to [B,H,T,S]; rope x [..., T, D].
-- References: plain Lua loops over :tolist() (naive softmax(Q·Kᵀ·scale + mask)·V) for values,
-- central differences (H.gradcheck, f64) and an attention composed of keng ops for gradients.
local keng = require "keng"
local H = require "helper"

local function sdpa(q, k, v, opts) return keng.scaled_dot_product_attention(q, k, v, opts) end

-- naive attention in Lua, in f64; a row that sees no key gives zeros
local function ref_sdpa(q, k, v, opts)
  opts = opts or {}
  local B, Hq, T, D = table.unpack(q.shape)
  local Hkv, S = k.shape[2], k.shape[3]
  local Q, K, V = q:to("f64"):tolist(), k:to("f64"):tolist(), v:to("f64"):tolist()
  local M = opts.mask and opts.mask:expand({B, Hq, T, S}):tolist()
  local scale, off, win = opts.scale or 1 / math.sqrt(D), S - T, opts.window or 0
  local out = {}
  for b = 1, B do
    out[b] = {}
    for h = 1, Hq do
      out[b][h] = {}
      local hk = (h - 1) // (Hq // Hkv) + 1
      for i = 1, T do
        local s, mx = {}, -math.huge
        for j = 1, S do
          local vis = (not opts.causal or j - 1 <= i - 1 + off) and (win <= 0 or j - 1 > i - 1 + off - win)
          local x = 0
          for d = 1, D do x = x + Q[b][h][i][d] * K[b][hk][j][d] end
          x = x * scale
          if M then
            local m = M[b][h][i][j]
            if type(m) == "boolean" then vis = vis and m else x = x + m end
          end
          s[j] = vis and x or -math.huge
          if s[j] > mx then mx = s[j] end
        end
        local row, sum = {}, 0
        for d = 1, D do row[d] = 0 end
        if mx > -math.huge then
          for j = 1, S do
            local e = math.exp(s[j] - mx)
            sum = sum + e
            for d = 1, D do row[d] = row[d] + e * V[b][hk][j][d] end
          end
          for d = 1, D do row[d] = row[d] / sum end
        end
        out[b][h][i] = row
      end
    end
  end
  return keng.tensor(out, {dtype = "f64"})
end

-- attention composed of differentiable keng ops (for gradients on multi-block shapes); hidden
-- scores get a large negative bias, so every row must see at least one key
local function composed_sdpa(q, k, v, bias, scale)
  local s = q:matmul(k:transpose(-1, -2)) * scale + bias
  local m = s:max(-1, true):detach()
  local e = (s - m):exp()
  return (e / e:sum(-1, true)):matmul(v)
end

-- [T, S] additive bias: 0 where the causal/window band lets query i see key j, -1e9 elsewhere
local function band_bias(T, S, causal, window)
  local rows, off = {}, S - T
  for i = 0, T - 1 do
    rows[i + 1] = {}
    for j = 0, S - 1 do
      local vis = (not causal or j <= i + off) and (window == 0 or j > i + off - window)
      rows[i + 1][j + 1] = vis and 0 or -1e9
    end
  end
  return keng.tensor(rows, {dtype = "f64"})
end

describe("scaled_dot_product_attention", function()
  keng.manual_seed(7)

  it("matches naive attention without a mask, with an explicit scale", function()
    local q, k, v = keng.randn({2, 2, 5, 4}), keng.randn({2, 2, 7, 4}), keng.randn({2, 2, 7, 4})
    local out = sdpa(q, k, v)
    assert.are.same({2, 2, 5, 4}, out.shape)
    assert.are.equal("f32", out.dtype)
    H.close(out, ref_sdpa(q, k, v), 1e-5, "plain")
    H.close(sdpa(q, k, v, {scale = 0.3}), ref_sdpa(q, k, v, {scale = 0.3}), 1e-5, "scale")
    -- the scale matters (guards against a reference that ignores it)
    local a, b = H.flat(sdpa(q, k, v, {scale = 0.3})), H.flat(out)
    local differ = false
    for i = 1, #a do if math.abs(a[i] - b[i]) > 1e-3 then differ = true end end
    assert.is_true(differ)
  end)

  it("is causal aligned bottom-right when T < S, T == S and T > S", function()
    for _, ts in ipairs({{3, 7}, {6, 6}, {6, 4}}) do
      local T, S = ts[1], ts[2]
      local q, k, v = keng.randn({1, 2, T, 8}), keng.randn({1, 2, S, 8}), keng.randn({1, 2, S, 8})
      local out = sdpa(q, k, v, {causal = true})
      H.close(out, ref_sdpa(q, k, v, {causal = true}), 1e-5, "causal T=" .. T .. " S=" .. S)
    end
    -- with T > S the first T - S queries see no key: zeros, not NaN
    local q, k, v = keng.randn({1, 1, 6, 4}), keng.randn({1, 1, 4, 4}), keng.randn({1, 1, 4, 4})
    local out = sdpa(q, k, v, {causal = true}):tolist()
    for d = 1, 4 do assert.are.equal(0, out[1][1][1][d]); assert.are.equal(0, out[1][1][2][d]) end
  end)

  it("applies a sliding window, with and without causal", function()
    local q, k, v = keng.randn({1, 2, 5, 4}), keng.randn({1, 2, 9, 4}), keng.randn({1, 2, 9, 4})
    H.close(sdpa(q, k, v, {causal = true, window = 3}), ref_sdpa(q, k, v, {causal = true, window = 3}), 1e-5, "causal window")
    H.close(sdpa(q, k, v, {window = 2}), ref_sdpa(q, k, v, {window = 2}), 1e-5, "window only")
  end)

  it("shares kv heads across query heads (grouped-query)", function()
    local q, k, v = keng.randn({2, 6, 4, 4}), keng.randn({2, 2, 5, 4}), keng.randn({2, 2, 5, 4})
    H.close(sdpa(q, k, v, {causal = true}), ref_sdpa(q, k, v, {causal = true}), 1e-5, "gqa")
    -- head h uses kv head h // 3: heads 1..3 equal to an MHA call with kv head 1 repeated
    local mha = sdpa(q:narrow(2, 1, 3), k:narrow(2, 1, 1):expand({2, 3, 5, 4}), v:narrow(2, 1, 1):expand({2, 3, 5, 4}))
    H.close(sdpa(q, k, v):narrow(2, 1, 3), mha, 1e-6, "gqa grouping")
  end)

  it("takes bool and float masks broadcast to [B,H,T,S]", function()
    local q, k, v = keng.randn({2, 2, 4, 4}), keng.randn({2, 2, 6, 4}), keng.randn({2, 2, 6, 4})
    local bm = keng.rand({2, 1, 4, 6}):gt(0.4)
    H.close(sdpa(q, k, v, {mask = bm}), ref_sdpa(q, k, v, {mask = bm}), 1e-5, "bool mask [B,1,T,S]")
    local bm2 = keng.rand({4, 6}):gt(0.3)
    H.close(sdpa(q, k, v, {mask = bm2, causal = true}), ref_sdpa(q, k, v, {mask = bm2, causal = true}), 1e-5,
      "bool mask [T,S] + causal")
    local fm = keng.randn({1, 2, 1, 6})
    H.close(sdpa(q, k, v, {mask = fm}), ref_sdpa(q, k, v, {mask = fm}), 1e-5, "float mask [1,H,1,S]")
    local fm64 = keng.randn({4, 6}, {dtype = "f64"})
    H.close(sdpa(q, k, v, {mask = fm64}), ref_sdpa(q, k, v, {mask = fm64}), 1e-5, "f64 float mask")
  end)

  it("gives zeros for fully masked rows, and zero gradient through them", function()
    local rows = {}
    for i = 1, 3 do rows[i] = {} for j = 1, 5 do rows[i][j] = i ~= 2 end end
    local bm = keng.tensor(rows, {dtype = "bool"})
    local fr = {}
    for i = 1, 3 do fr[i] = {} for j = 1, 5 do fr[i][j] = i == 3 and -math.huge or 0.5 * j end end
    local fm = keng.tensor(fr)
    local q, k, v = H.leaf({1, 2, 3, 4}), H.leaf({1, 2, 5, 4}), H.leaf({1, 2, 5, 4})
    for _, m in ipairs({bm, fm}) do
      local out = sdpa(q, k, v, {mask = m})
      H.close(out, ref_sdpa(q, k, v, {mask = m}), 1e-10, "masked rows")
      local dead = m.dtype == "bool" and 2 or 3
      for _, x in ipairs(H.flat(out:narrow(3, dead, 1))) do assert.are.equal(0, x) end
      q.grad, k.grad, v.grad = nil, nil, nil
      out:sum():backward()
      for _, g in ipairs({q.grad, k.grad, v.grad}) do
        for _, x in ipairs(H.flat(g)) do assert.is_true(x == x and math.abs(x) < math.huge) end
      end
      for _, x in ipairs(H.flat(q.grad:narrow(3, dead, 1))) do assert.are.equal(0, x) end
    end
  end)

  it("spans several query and key blocks (causal, window, GQA)", function()
    local q, k, v = keng.randn({1, 4, 70, 8}), keng.randn({1, 2, 150, 8}), keng.randn({1, 2, 150, 8})
    H.close(sdpa(q, k, v), ref_sdpa(q, k, v), 1e-5, "full")
    H.close(sdpa(q, k, v, {causal = true}), ref_sdpa(q, k, v, {causal = true}), 1e-5, "causal")
    H.close(sdpa(q, k, v, {causal = true, window = 45}), ref_sdpa(q, k, v, {causal = true, window = 45}), 1e-5,
      "causal window")
  end)

  it("accepts non-contiguous q, k, v", function()
    local q, k, v = keng.randn({1, 2, 5, 4}), keng.randn({1, 2, 6, 4}), keng.randn({1, 2, 6, 4})
    local nq, nk, nv = H.noncontig(q), H.noncontig(k), H.noncontig(v)
    assert.is_false(nq.is_contiguous)
    H.close(sdpa(nq, nk, nv, {causal = true}), ref_sdpa(q, k, v, {causal = true}), 1e-5, "noncontig")
    -- permuted [B,T,H,D] storage, as a model's projection gives it
    local qt = q:permute{1, 3, 2, 4}:contiguous():permute{1, 3, 2, 4}
    H.close(sdpa(qt, k, v), ref_sdpa(q, k, v), 1e-5, "permuted q")
  end)

  it("runs in bf16 close to f32 and in f64 exactly", function()
    local q, k, v = keng.randn({1, 2, 20, 16}), keng.randn({1, 2, 30, 16}), keng.randn({1, 2, 30, 16})
    local out = sdpa(q:bf16(), k:bf16(), v:bf16(), {causal = true})
    assert.are.equal("bf16", out.dtype)
    H.close(out, sdpa(q, k, v, {causal = true}), 3e-2, "bf16 vs f32")
    local o64 = sdpa(q:to("f64"), k:to("f64"), v:to("f64"), {causal = true})
    assert.are.equal("f64", o64.dtype)
    H.close(o64, ref_sdpa(q, k, v, {causal = true}), 1e-12, "f64")
    local o16 = sdpa(q:to("f16"), k:to("f16"), v:to("f16"))
    H.close(o16, sdpa(q, k, v), 5e-3, "f16 vs f32")
  end)

  it("has gradients matching finite differences (f64, causal, GQA, float mask, window)", function()
    local q, k, v = H.leaf({1, 2, 3, 3}), H.leaf({1, 1, 4, 3}), H.leaf({1, 1, 4, 3})
    H.gradcheck(function(a, b, c) return sdpa(a, b, c, {causal = true}) end, {q, k, v})
    local fm = keng.randn({1, 2, 3, 4}, {dtype = "f64"})
    H.gradcheck(function(a, b, c) return sdpa(a, b, c, {mask = fm, scale = 0.7}) end, {q, k, v})
    local q2, k2, v2 = H.leaf({2, 2, 4, 2}), H.leaf({2, 2, 5, 2}), H.leaf({2, 2, 5, 2})
    H.gradcheck(function(a, b, c) return sdpa(a, b, c, {causal = true, window = 2}) end, {q2, k2, v2})
    local bm = keng.rand({2, 1, 4, 5}):gt(0.3)
    H.gradcheck(function(a, b, c) return sdpa(a, b, c, {mask = bm}) end, {q2, k2, v2})
  end)

  it("has gradients matching composed ops across several blocks", function()
    local T, S, D = 70, 140, 4
    for _, case in ipairs({{false, 0}, {true, 0}, {true, 50}}) do
      local causal, window = case[1], case[2]
      local q, k, v = H.leaf({1, 2, T, D}), H.leaf({1, 2, S, D}), H.leaf({1, 2, S, D})
      local g = keng.randn({1, 2, T, D}, {dtype = "f64"})
      local out = sdpa(q, k, v, {causal = causal, window = window})
      ;(out * g):sum():backward()
      local gq, gk, gv = q.grad, k.grad, v.grad
      q.grad, k.grad, v.grad = nil, nil, nil
      local ref = composed_sdpa(q, k, v, band_bias(T, S, causal, window), 1 / math.sqrt(D))
      H.close(out, ref, 1e-10, "composed forward")
      ;(ref * g):sum():backward()
      local tag = " causal=" .. tostring(causal) .. " window=" .. window
      H.close(gq, q.grad, 1e-9, "dq" .. tag)
      H.close(gk, k.grad, 1e-9, "dk" .. tag)
      H.close(gv, v.grad, 1e-9, "dv" .. tag)
    end
  end)

  -- f32 and bf16 run the AVX2 tiles (f64 the BLAS ones): odd lengths, D not a multiple of 8
  -- or 16, several query and key tiles, masks, against composed ops in f64 on the same values
  it("has f32 and bf16 values and gradients matching composed f64 ops across tiles", function()
    local cases = {
      {T = 70, S = 131, D = 64, causal = true, window = 0},
      {T = 97, S = 97, D = 80, causal = false, window = 30, fmask = true},
      {T = 50, S = 77, D = 20, causal = false, window = 0, bmask = true},
    }
    for _, c in ipairs(cases) do
      for _, dt in ipairs({"f32", "bf16"}) do
        local leaves = {}
        for i, s in ipairs({c.T, c.S, c.S}) do
          leaves[i] = keng.randn({2, 2, s, c.D}):to(dt):detach()
          leaves[i].requires_grad = true
        end
        local q, k, v = leaves[1], leaves[2], leaves[3]
        local bias, mask = band_bias(c.T, c.S, c.causal, c.window), nil
        if c.fmask then
          mask = keng.randn({1, 2, c.T, c.S})
          bias = bias + mask:to("f64")
        elseif c.bmask then -- key padding [B,1,1,S]: the last 10 keys of batch 2 hidden
          local rows = {{}, {}}
          for j = 1, c.S do rows[1][j], rows[2][j] = true, j <= c.S - 10 end
          mask = keng.tensor(rows, {dtype = "bool"}):reshape{2, 1, 1, c.S}
          bias = bias + keng.where(mask, keng.zeros({1}, {dtype = "f64"}), keng.full({1}, -1e9, {dtype = "f64"}))
        end
        local g = keng.randn({2, 2, c.T, c.D})
        local out = sdpa(q, k, v, {causal = c.causal, window = c.window, mask = mask})
        assert.are.equal(dt, out.dtype)
        ;(out:to("f32") * g):sum():backward()
        local q64, k64, v64 = q:to("f64"):detach(), k:to("f64"):detach(), v:to("f64"):detach()
        for _, t in ipairs({q64, k64, v64}) do t.requires_grad = true end
        local ref = composed_sdpa(q64, k64, v64, bias, 1 / math.sqrt(c.D))
        ;(ref * g:to("f64")):sum():backward()
        local tol, tag = dt == "f32" and 2e-5 or 2e-2, string.format(" %s T=%d S=%d D=%d", dt, c.T, c.S, c.D)
        H.close(out, ref, tol, "out" .. tag)
        H.close(q.grad, q64.grad, tol, "dq" .. tag)
        H.close(k.grad, k64.grad, tol, "dk" .. tag)
        H.close(v.grad, v64.grad, tol, "dv" .. tag)
      end
    end
  end)

  it("raises on bad shapes, dtypes and masks", function()
    local q, k, v = keng.randn({1, 3, 4, 4}), keng.randn({1, 2, 5, 4}), keng.randn({1, 2, 5, 4})
    local e = H.raises(function() sdpa(q, k, v) end, "scaled_dot_product_attention")
    assert.truthy(e:find("[1,3,4,4]", 1, true))
    H.raises(function() sdpa(keng.randn({3, 4, 4}), k, v) end, "scaled_dot_product_attention")
    H.raises(function() sdpa(keng.randn({1, 2, 4, 3}), k, v) end, "scaled_dot_product_attention")
    H.raises(function() sdpa(keng.randn({1, 2, 4, 4}), k, v:bf16()) end, "scaled_dot_product_attention")
    local e2 = H.raises(function() sdpa(keng.randn({1, 2, 4, 4}), k, v, {mask = keng.ones({3, 5})}) end,
      "scaled_dot_product_attention")
    assert.truthy(e2:find("mask [3,5]", 1, true))
    H.raises(function() sdpa(keng.randn({1, 2, 4, 4}), k, v, {mask = keng.ones({4, 5}, {dtype = "i64"})}) end,
      "scaled_dot_product_attention")
  end)
end)

-- The math route (engine/ops/sdpa_route.h): GEMM -> masked softmax -> GEMM of engine ops. On the
-- GPU it takes D > 256 and big calls; keng.backends.sdpa_math sends every call there, so it is
-- checked here on the CPU against the same references as the fused kernel.
describe("scaled_dot_product_attention: the math route", function()
  keng.manual_seed(11)
  local function math_route(fn)
    keng.backends.sdpa_math = true
    local ok, err = pcall(fn)
    keng.backends.sdpa_math = false
    if not ok then error(err, 0) end
  end

  it("is taken when asked, counted in cudnn_sdpa_stats.routes, and the switch takes booleans only", function()
    assert.is_false(keng.backends.sdpa_math)
    local q, k, v = keng.randn({1, 1, 2, 4}), keng.randn({1, 1, 3, 4}), keng.randn({1, 1, 3, 4})
    local before = keng.backends.cudnn_sdpa_stats.routes
    sdpa(q, k, v)
    math_route(function() sdpa(q, k, v) end)
    local after = keng.backends.cudnn_sdpa_stats.routes
    assert.are.equal(before.cpu + 1, after.cpu)
    assert.are.equal(before.math + 1, after.math)
    H.raises(function() keng.backends.sdpa_math = 1 end, "keng.backends.sdpa_math must be a boolean")
  end)

  it("matches naive attention: causal (T < S, T = S, T > S), window, GQA, masks, non-contiguous", function()
    math_route(function()
      for _, ts in ipairs({{3, 7}, {6, 6}, {6, 4}}) do
        local T, S = ts[1], ts[2]
        local q, k, v = keng.randn({2, 4, T, 8}), keng.randn({2, 2, S, 8}), keng.randn({2, 2, S, 8})
        H.close(sdpa(q, k, v, {causal = true}), ref_sdpa(q, k, v, {causal = true}), 1e-5, "causal " .. T .. "x" .. S)
        H.close(sdpa(q, k, v, {scale = 0.3}), ref_sdpa(q, k, v, {scale = 0.3}), 1e-5, "scale " .. T .. "x" .. S)
      end
      local q, k, v = keng.randn({1, 2, 5, 4}), keng.randn({1, 2, 9, 4}), keng.randn({1, 2, 9, 4})
      H.close(sdpa(q, k, v, {causal = true, window = 3}), ref_sdpa(q, k, v, {causal = true, window = 3}), 1e-5,
        "causal window")
      H.close(sdpa(q, k, v, {window = 2}), ref_sdpa(q, k, v, {window = 2}), 1e-5, "window only")
      local bm = keng.rand({1, 1, 5, 9}):gt(0.4)
      H.close(sdpa(q, k, v, {mask = bm, causal = true}), ref_sdpa(q, k, v, {mask = bm, causal = true}), 1e-5,
        "bool mask + causal")
      local fm = keng.randn({2, 1, 9})
      H.close(sdpa(q, k, v, {mask = fm}), ref_sdpa(q, k, v, {mask = fm}), 1e-5, "float mask [H,1,S]")
      local vec = keng.rand({9}):gt(0.5)                          -- a mask of fewer than 2 dims
      H.close(sdpa(q, k, v, {mask = vec}), ref_sdpa(q, k, v, {mask = vec}), 1e-5, "bool mask [S]")
      local nq, nk, nv = H.noncontig(q), H.noncontig(k), H.noncontig(v)
      H.close(sdpa(nq, nk, nv, {causal = true}), ref_sdpa(q, k, v, {causal = true}), 1e-5, "noncontig")
    end)
  end)

  it("takes a head dim of 512 (the SD VAE's one head), f64 exactly and bf16 close", function()
    local q, k, v = keng.randn({1, 1, 6, 512}), keng.randn({1, 1, 6, 512}), keng.randn({1, 1, 6, 512})
    local fused = sdpa(q, k, v)
    math_route(function()
      local out = sdpa(q, k, v)
      assert.are.same({1, 1, 6, 512}, out.shape)
      H.close(out, ref_sdpa(q, k, v), 1e-5, "D 512")
      H.close(out, fused, 1e-5, "math vs the fused kernel")
      local q64, k64, v64 = q:to("f64"), k:to("f64"), v:to("f64")
      H.close(sdpa(q64, k64, v64, {causal = true}), ref_sdpa(q, k, v, {causal = true}), 1e-12, "f64")
      local ob = sdpa(q:bf16(), k:bf16(), v:bf16())
      assert.are.equal("bf16", ob.dtype)
      H.close(ob, fused, 3e-2, "bf16 vs f32")
      -- scores in f32 from bf16 inputs, P rounded to bf16 for P·V (as cuDNN): within about a bf16
      -- rounding of the fused kernel; scores rounded to bf16 are 7e-2 off on these large logits
      local qb, kb, vb = (keng.randn({1, 2, 32, 64}) * 3):bf16(), (keng.randn({1, 2, 32, 64}) * 3):bf16(),
        keng.randn({1, 2, 32, 64}):bf16()
      local mb = sdpa(qb, kb, vb)
      keng.backends.sdpa_math = false
      local fb = sdpa(qb, kb, vb)
      keng.backends.sdpa_math = true
      H.close(mb:float(), fb:float(), 1.5e-2, "math bf16 vs fused bf16")
    end)
  end)

  it("gives zeros for fully masked rows with finite gradients, and matches finite differences", function()
    math_route(function()
      local rows, fr = {}, {}
      for i = 1, 3 do
        rows[i], fr[i] = {}, {}
        for j = 1, 5 do rows[i][j] = i ~= 2; fr[i][j] = i == 3 and -math.huge or 0.5 * j end
      end
      local bm, fm = keng.tensor(rows, {dtype = "bool"}), keng.tensor(fr, {dtype = "f64"})
      local q, k, v = H.leaf({1, 2, 3, 4}), H.leaf({1, 2, 5, 4}), H.leaf({1, 2, 5, 4})
      for _, m in ipairs({bm, fm}) do
        local out = sdpa(q, k, v, {mask = m})
        H.close(out, ref_sdpa(q, k, v, {mask = m}), 1e-10, "masked rows")
        local dead = m.dtype == "bool" and 2 or 3
        for _, x in ipairs(H.flat(out:narrow(3, dead, 1))) do assert.are.equal(0, x) end
        q.grad, k.grad, v.grad = nil, nil, nil
        out:sum():backward()
        for _, g in ipairs({q.grad, k.grad, v.grad}) do
          for _, x in ipairs(H.flat(g)) do assert.is_true(x == x and math.abs(x) < math.huge) end
        end
        for _, x in ipairs(H.flat(q.grad:narrow(3, dead, 1))) do assert.are.equal(0, x) end
      end
      local q1, k1, v1 = H.leaf({1, 2, 3, 3}), H.leaf({1, 1, 4, 3}), H.leaf({1, 1, 4, 3})
      H.gradcheck(function(a, b, c) return sdpa(a, b, c, {causal = true}) end, {q1, k1, v1})
      H.gradcheck(function(a, b, c) return sdpa(a, b, c, {mask = fm:narrow(2, 1, 4), scale = 0.7}) end, {q1, k1, v1})
      local q2, k2, v2 = H.leaf({2, 2, 4, 2}), H.leaf({2, 2, 5, 2}), H.leaf({2, 2, 5, 2})
      H.gradcheck(function(a, b, c) return sdpa(a, b, c, {causal = true, window = 2}) end, {q2, k2, v2})
      local bm2 = keng.rand({2, 1, 4, 5}):gt(0.3)
      H.gradcheck(function(a, b, c) return sdpa(a, b, c, {mask = bm2}) end, {q2, k2, v2})
    end)
  end)
end)

describe("scaled_dot_product_attention: the math route in batch chunks (child process)", function()
  local function sh_quote(x) return "'" .. tostring(x):gsub("'", "'\\''") .. "'" end
  local function keng_bin()
    local env = os.getenv("KENG_BIN")
    if env and env ~= "" then return env end
    local p = io.popen("readlink /proc/$PPID/exe 2>/dev/null")
    local self = p:read("a"):gsub("%s+$", "")
    p:close()
    return self:match("keng$") and self or nil
  end

  it("splits a no-grad call into chunks of KENG_SDPA_MATH_CHUNK bytes of scores, same values", function()
    local bin = keng_bin()
    assert.truthy(bin, "no keng binary (set KENG_BIN)")
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write([[
local keng = require "keng"
keng.manual_seed(3)
local q, k, v = keng.randn({5, 2, 3, 4}), keng.randn({5, 1, 6, 4}), keng.randn({5, 1, 6, 4})
local bm = keng.rand({5, 1, 3, 6}):gt(0.3)
local fm = keng.randn({3, 6})
local worst = 0
for _, o in ipairs({{causal = true}, {mask = bm}, {mask = fm, window = 2}}) do
  local a = keng.scaled_dot_product_attention(q, k, v, o)
  keng.backends.sdpa_math = true
  local b = keng.scaled_dot_product_attention(q, k, v, o)
  keng.backends.sdpa_math = false
  worst = math.max(worst, (a - b):abs():max():item())
end
io.stdout:write("worst ", worst, "\n")
]])
    f:close()
    -- 2 heads · 3 · 6 · 4 bytes = 144 per batch row: 300 bytes hold 2 rows, so B 5 goes as 2, 2, 1
    local p = io.popen("KENG_SDPA_MATH_CHUNK=300 KENG_DEBUG=1 " .. sh_quote(bin) .. " " .. sh_quote(script) .. " 2>&1")
    local out = p:read("a")
    p:close()
    os.remove(script)
    local worst = tonumber(out:match("worst (%S+)"))
    assert.truthy(worst, out)
    assert.is_true(worst < 1e-5, out)
    local chunks = {}
    for b in out:gmatch("matmul%s+f32%[(%d),1,6,4%] f32%[%d,1,4,6%]") do chunks[#chunks + 1] = tonumber(b) end
    assert.are.same({2, 2, 1, 2, 2, 1, 2, 2, 1}, chunks)
  end)
end)

describe("scaled_dot_product_attention: scale and window edge cases", function()
  keng.manual_seed(13)

  it("propagates a NaN or infinite scale as NaN (as PyTorch), on the default route too", function()
    local q, k, v = keng.randn({1, 2, 3, 4}), keng.randn({1, 2, 5, 4}), keng.randn({1, 2, 5, 4})
    for _, sc in ipairs({0 / 0, math.huge, -math.huge}) do
      for _, dt in ipairs({"f32", "f64", "bf16"}) do
        local out = sdpa(q:to(dt), k:to(dt), v:to(dt), {scale = sc, causal = true})
        for _, x in ipairs(H.flat(out)) do assert.is_true(x ~= x, "scale " .. sc .. " " .. dt .. " gave " .. x) end
      end
    end
    -- a row that sees no key still gives zeros (keng's rule for masked rows), whatever the scale
    local bm = keng.tensor({{true, true, false, true, true}, {false, false, false, false, false},
                            {true, false, false, false, false}}, {dtype = "bool"})
    local out = sdpa(q, k, v, {scale = 0 / 0, mask = bm}):tolist()
    for h = 1, 2 do
      for d = 1, 4 do
        assert.are.equal(0, out[1][h][2][d])
        assert.is_true(out[1][h][1][d] ~= out[1][h][1][d])
      end
    end
  end)

  it("differentiates a float mask that needs a gradient (a learned bias) on the default route", function()
    local q, k, v = H.leaf({1, 2, 3, 4}), H.leaf({1, 1, 5, 4}), H.leaf({1, 1, 5, 4})
    local bias = H.leaf({2, 3, 5})
    H.gradcheck(function(a, b, c, m) return sdpa(a, b, c, {mask = m, causal = true}) end, {q, k, v, bias})
    local q2 = H.leaf({1, 2, 3, 4}):detach()                        -- only the bias needs one
    bias.grad = nil
    sdpa(q2, k:detach(), v:detach(), {mask = bias}):sum():backward()
    assert.truthy(bias.grad)
    H.close(bias.grad:sum(-1), keng.zeros({2, 3}, {dtype = "f64"}), 1e-12, "softmax rows: the bias gradient sums to 0")
  end)

  it("treats a window >= S as no window (Mistral passes 4096 at T = 128)", function()
    local q, k, v = keng.randn({1, 2, 6, 4}), keng.randn({1, 2, 6, 4}), keng.randn({1, 2, 6, 4})
    local plain = sdpa(q, k, v, {causal = true})
    H.close(sdpa(q, k, v, {causal = true, window = 6}), plain, 0, "window = S")
    H.close(sdpa(q, k, v, {causal = true, window = 4096}), plain, 0, "window 4096")
    -- one less is a real window: the last row loses its first key
    local w5 = sdpa(q, k, v, {causal = true, window = 5})
    H.close(w5, ref_sdpa(q, k, v, {causal = true, window = 5}), 1e-5, "window = S - 1")
    assert.is_true((w5 - plain):abs():max():item() > 1e-4)
  end)

  it("takes no keys (S = 0: zeros, zero gradients) and an empty head dim", function()
    local q = keng.randn({1, 2, 3, 4}, {requires_grad = true})
    local k = keng.randn({1, 2, 0, 4}, {requires_grad = true})
    local v = keng.randn({1, 2, 0, 4}, {requires_grad = true})
    local o = sdpa(q, k, v)
    H.close(o, keng.zeros({1, 2, 3, 4}), 0, "no keys")
    local loss = (o * keng.randn({1, 2, 3, 4})):sum()
    loss:backward()
    H.close(q.grad, keng.zeros({1, 2, 3, 4}), 0, "dq")
    local e = keng.randn({1, 2, 3, 0}, {requires_grad = true})
    local oe = sdpa(e, keng.randn({1, 2, 5, 0}), keng.randn({1, 2, 5, 0}))
    assert.are.same({1, 2, 3, 0}, oe.shape)
    oe:sum():backward()
    assert.are.same({1, 2, 3, 0}, e.grad.shape)
  end)
end)

-- Hugging Face's rope with inverse frequencies base^(-2(i-1)/D)
local function ref_rope(x, pos, base)
  local D, f = x.shape[#x.shape], {}
  for i = 1, D // 2 do f[i] = base ^ (-2 * (i - 1) / D) end
  return H.ref_rope(x, pos, f, 1)
end

describe("rope", function()
  keng.manual_seed(11)

  it("rotates halves as Hugging Face's rotate_half, positions [T] and [B,T]", function()
    local x = keng.randn({2, 3, 5, 8})
    local pos = keng.tensor({0, 1, 2, 7, 100}, {dtype = "i64"})
    local y = keng.rope(x, pos)
    assert.are.same(x.shape, y.shape)
    H.close(y, ref_rope(x, pos, 10000), 1e-5, "positions [T]")
    local pb = keng.tensor({{3, 4, 5, 6, 7}, {0, 0, 1, 1, 9}}, {dtype = "i32"})
    H.close(keng.rope(x, pb, {base = 500}), ref_rope(x, pb, 500), 1e-5, "positions [B,T], base 500")
    -- batch rows of positions equal to the previous row share table entries (decode): runs of
    -- equal rows, a row equal to an earlier but not the previous one, strided positions
    local x4 = keng.randn({4, 2, 3, 8})
    local p4 = keng.tensor({{5, 6, 7}, {5, 6, 7}, {1, 2, 3}, {5, 6, 7}}, {dtype = "i64"})
    H.close(keng.rope(x4, p4), ref_rope(x4, p4, 10000), 1e-5, "equal position rows")
    local p4t = keng.tensor({{5, 5, 1, 5}, {6, 6, 2, 6}, {7, 7, 3, 7}}, {dtype = "i64"}):transpose()
    H.close(keng.rope(x4, p4t), ref_rope(x4, p4, 10000), 1e-5, "equal position rows, strided")
    -- position 0 is the identity; positions matter
    H.close(keng.rope(x, keng.zeros({5}, {dtype = "i64"})), x, 0, "position 0")
    H.close(keng.rope(x:narrow(3, 1, 1), keng.tensor({0}, {dtype = "i64"})), x:narrow(3, 1, 1), 0, "first row")
    -- 2-D x [T, D] and the t:rope method
    local x2 = keng.randn({5, 6})
    H.close(x2:rope(pos), ref_rope(x2, pos, 10000), 1e-5, "2-D")
  end)

  it("accepts non-contiguous x and runs in bf16 close to f32", function()
    local x = keng.randn({2, 4, 6})
    local pos = keng.tensor({5, 1, 2, 3}, {dtype = "i64"})
    local nx = H.noncontig(x)
    assert.is_false(nx.is_contiguous)
    H.close(keng.rope(nx, pos), ref_rope(x, pos, 10000), 1e-5, "noncontig")
    local yb = keng.rope(x:bf16(), pos)
    assert.are.equal("bf16", yb.dtype)
    H.close(yb, keng.rope(x, pos), 2e-2, "bf16 vs f32")
    local y64 = keng.rope(x:to("f64"), pos)
    H.close(y64, ref_rope(x, pos, 10000), 1e-12, "f64")
  end)

  it("has gradients matching finite differences (the inverse rotation)", function()
    local x = H.leaf({2, 3, 4})
    H.gradcheck(function(a) return keng.rope(a, keng.tensor({0, 3, 17}, {dtype = "i64"})) end, {x})
    H.gradcheck(function(a) return keng.rope(a, keng.tensor({{1, 2, 3}, {9, 8, 7}}, {dtype = "i64"}), {base = 100}) end,
      {x})
  end)

  it("raises on an odd head dim, bad positions and float positions", function()
    local pos = keng.tensor({0, 1, 2}, {dtype = "i64"})
    H.raises(function() keng.rope(keng.randn({2, 3, 5}), pos) end, "rope")
    local e = H.raises(function() keng.rope(keng.randn({2, 4, 6}), pos) end, "rope")
    assert.truthy(e:find("[3]", 1, true))
    H.raises(function() keng.rope(keng.randn({2, 3, 6}), keng.zeros({3, 3}, {dtype = "i64"})) end, "rope")
    H.raises(function() keng.rope(keng.randn({2, 3, 6}), keng.tensor({0, 1, 2}, {dtype = "f32"})) end, "rope")
  end)
end)
