-- decode_spec.lua — keng.decode_qkv (engine/ops/decode.c, engine/cpu/decode.c, engine/cuda/decode.cu):
-- the fused decode step's q/k RoPE + KV-cache write against the unfused ops (rope, narrow +
-- copy_) in every float dtype, bit for bit; non-contiguous qkv; positions [T] and [B, T]; T > 1;
-- columns taken modulo the cache length; the caches' other columns untouched; a scaled RoPE's
-- inv_freq and scale against keng.rope with the same options; every error.
-- Shape letters: B batch, T tokens, H query heads, Hkv key/value heads, D head dim, L cache.
local keng = require "keng"
local H_ = require "helper"

local DEV = H_.device

-- the reference: split qkv into heads, rope q and k, write k and v at the columns
local function reference(qkv, pos, ck, cv, cols, H, Hkv, base, ro)
  local B, T = qkv.shape[1], qkv.shape[2]
  local D = qkv.shape[3] // (H + 2 * Hkv)
  local y = qkv:view{B, T, H + 2 * Hkv, D}:transpose(2, 3)          -- [B, heads, T, D]
  ro = ro or {base = base}
  local q = keng.rope(y:narrow(2, 1, H), pos, ro)
  local k = keng.rope(y:narrow(2, H + 1, Hkv), pos, ro)
  local v = y:narrow(2, H + Hkv + 1, Hkv)
  local L = ck.shape[3]
  for t, c in ipairs(cols) do
    ck:narrow(3, c % L + 1, 1):copy_(k:narrow(3, t, 1))
    cv:narrow(3, c % L + 1, 1):copy_(v:narrow(3, t, 1))
  end
  return q
end

local function case(dtype, B, T, H, Hkv, D, L, cols, pos2d, base, ro)
  keng.manual_seed(B * 100 + T * 10 + H)
  local qkv = keng.randn({B, T, (H + 2 * Hkv) * D}, {device = DEV}):to(dtype)
  local pos
  if pos2d then pos = keng.randint(0, 50, {B, T}, {device = DEV}) else pos = keng.randint(0, 50, {T}, {device = DEV}) end
  local ck0, cv0 = keng.randn({B, Hkv, L, D}, {device = DEV}):to(dtype), keng.randn({B, Hkv, L, D}, {device = DEV}):to(dtype)
  local ck, cv, rk, rv = ck0:clone(), cv0:clone(), ck0:clone(), cv0:clone()
  local o = {heads = H, kv_heads = Hkv, base = base}
  for k, v in pairs(ro or {}) do o[k] = v end
  local q = keng.decode_qkv(qkv, pos, ck, cv, keng.tensor(cols, {device = DEV}), o)
  local want = reference(qkv, pos, rk, rv, cols, H, Hkv, base or 10000, ro)
  return q, want, ck, rk, cv, rv
end

describe("keng.decode_qkv", function()
  it("equals rope + cache writes bit for bit (f32, f64, bf16, f16; T = 1 and 3; [T] and [B, T] positions)", function()
    for _, dt in ipairs({"f32", "f64", "bf16", "f16"}) do
      for _, c in ipairs({{2, 1, 4, 2, 8, 6, {2}, true}, {1, 3, 2, 2, 16, 9, {4, 5, 6}, false},
                          {3, 1, 8, 1, 4, 5, {0}, true, 500}}) do
        local q, want, ck, rk, cv, rv = case(dt, table.unpack(c))
        local what = dt .. " B=" .. c[1] .. " T=" .. c[2]
        assert.are.same(want.shape, q.shape)
        assert.are.equal(dt, q.dtype)
        H_.close(q, want, 0, what .. " q")
        H_.close(ck, rk, 0, what .. " cache_k")
        H_.close(cv, rv, 0, what .. " cache_v")
      end
    end
  end)

  it("rows that share a position (the kernel reuses their cos/sin) equal the reference bit for bit", function()
    for _, p in ipairs({{{7}, {7}, {3}, {7}, {3}, {3}}, {{4, 5}, {4, 5}, {4, 6}}, {4, 5}}) do
      keng.manual_seed(5)
      local pos = keng.tensor(p, {dtype = "i64", device = DEV})
      local T = pos.ndim == 2 and pos.shape[2] or pos.shape[1]
      local B = pos.ndim == 2 and pos.shape[1] or 3
      local H, Hkv, D, L = 2, 1, 8, 6
      local qkv = keng.randn({B, T, (H + 2 * Hkv) * D}, {device = DEV}):to("bf16")
      local ck = keng.zeros({B, Hkv, L, D}, {device = DEV}):to("bf16")
      local cv = ck:clone()
      local rk, rv = ck:clone(), cv:clone()
      local cols = {}
      for t = 1, T do cols[t] = t end
      local q = keng.decode_qkv(qkv, pos, ck, cv, keng.tensor(cols, {device = DEV}), {heads = H, kv_heads = Hkv})
      local want = reference(qkv, pos, rk, rv, cols, H, Hkv, 10000)
      H_.close(q, want, 0, "q")
      H_.close(ck, rk, 0, "cache_k")
    end
  end)

  it("rotates by a scaled RoPE's inv_freq and scale as keng.rope does, bit for bit", function()
    for _, dt in ipairs({"f32", "f64", "bf16"}) do
      for _, c in ipairs({{2, 1, 4, 2, 8, 6, {2}, true}, {1, 3, 2, 2, 16, 9, {4, 5, 6}, false}}) do
        local D = c[5]
        local f = {}
        for i = 1, D // 2 do f[i] = 10000 ^ (-2 * (i - 1) / D) / (i % 3 + 1.5) end   -- not base^(-2i/D)
        local ro = {inv_freq = keng.tensor(f, {dtype = "f64", device = DEV}), scale = 1.25}
        local q, want, ck, rk, cv, rv = case(dt, c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], nil, ro)
        H_.close(q, want, 0, dt .. " q")
        H_.close(ck, rk, 0, dt .. " cache_k")
        H_.close(cv, rv, 0, dt .. " cache_v")
        -- and it is not the plain rotation: the options reach the kernel
        local q0 = case(dt, c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8])
        assert.is_true((q0:double() - q:double()):abs():max():item() > 0, dt)
      end
    end
    local f32 = keng.tensor({1, 0.5, 0.25, 0.125}, {device = DEV})  -- an f32 inv_freq is read too
    local q, want = case("f32", 1, 1, 2, 1, 8, 4, {1}, false, nil, {inv_freq = f32})
    H_.close(q, want, 0, "f32 inv_freq")
  end)

  it("takes columns modulo the cache length (a ring) and leaves the other columns alone", function()
    local q, want, ck, rk, cv, rv = case("f32", 2, 2, 2, 1, 4, 5, {7, -1}, true)
    H_.close(ck, rk, 0, "cache_k")                                   -- 7 -> 2, -1 -> 4
    H_.close(cv, rv, 0, "cache_v")
    H_.close(q, want, 0, "q")
  end)

  it("reads a non-contiguous qkv", function()
    local B, T, H, Hkv, D, L = 2, 2, 2, 1, 4, 4
    local nc = keng.randn({(H + 2 * Hkv) * D, T, B}, {device = DEV}):permute{3, 2, 1}  -- [B, T, C] strided
    assert.is_false(nc.is_contiguous)
    local qkv = nc:contiguous()
    local pos = keng.tensor({{1, 2}, {3, 4}}, {device = DEV})
    local a1, a2 = keng.zeros({B, Hkv, L, D}, {device = DEV}), keng.zeros({B, Hkv, L, D}, {device = DEV})
    local b1, b2 = a1:clone(), a2:clone()
    local col = keng.tensor({0, 1}, {device = DEV})
    local o = {heads = H, kv_heads = Hkv}
    H_.close(keng.decode_qkv(nc, pos, a1, a2, col, o), keng.decode_qkv(qkv, pos, b1, b2, col, o), 0, "q")
    H_.close(a1, b1, 0, "cache_k")
  end)

  it("refuses bad input, naming the op and the shapes", function()
    local z = function(s, dt) return keng.zeros(s, {dtype = dt, device = DEV}) end
    local qkv, pos, col = z({2, 1, 32}), keng.tensor({{1}, {2}}, {device = DEV}), keng.tensor({0}, {device = DEV})
    local ck, cv = z({2, 1, 4, 4}), z({2, 1, 4, 4})
    local o = {heads = 2, kv_heads = 1}
    local ok = keng.decode_qkv(qkv:narrow(3, 1, 16), pos, ck, cv, col, o)   -- (2 + 2) · 4 = 16
    assert.are.same({2, 2, 1, 4}, ok.shape)
    H_.raises(function() keng.decode_qkv(z({2, 1, 18}), pos, ck, cv, col, o) end,
      "decode_qkv: qkv [2,1,18] must be [B, T, (heads + 2·kv_heads)·D] = [B, T, 4·D] with D even")
    H_.raises(function() keng.decode_qkv(qkv:narrow(3, 1, 16), pos, z({2, 2, 4, 4}), cv, col, o) end,
      "cache_k [2,2,4,4] must be [B, kv_heads, L, D] = [2, 1, L, 4]")
    H_.raises(function() keng.decode_qkv(qkv:narrow(3, 1, 16), pos, ck, z({2, 1, 4, 4}, "bf16"), col, o) end,
      "cache_v is bf16, qkv f32: one dtype expected")
    H_.raises(function() keng.decode_qkv(qkv:narrow(3, 1, 16), pos, ck, z({2, 1, 4, 8}):narrow(4, 1, 4), col, o) end,
      "must be contiguous (it is written in place)")
    H_.raises(function() keng.decode_qkv(qkv:narrow(3, 1, 16), pos, ck, ck, col, o) end, "share storage")
    H_.raises(function() keng.decode_qkv(qkv:narrow(3, 1, 16), keng.tensor({{1, 2}}, {device = DEV}), ck, cv, col, o) end,
      "positions [1,2] must be [B, T] or [T]")
    H_.raises(function() keng.decode_qkv(qkv:narrow(3, 1, 16), pos, ck, cv, keng.tensor({0, 1}, {device = DEV}), o) end,
      "col [2] must be [T] = [1]")
    H_.raises(function() keng.decode_qkv(qkv:narrow(3, 1, 16), pos:float(), ck, cv, col, o) end, "positions")
    H_.raises(function() keng.decode_qkv(qkv:narrow(3, 1, 16), pos, ck, cv, col, {heads = 2, kv_heads = 1, bse = 5}) end,
      "unknown option 'bse' (valid: base, heads, inv_freq, kv_heads, scale)")
    H_.raises(function() keng.decode_qkv(qkv:narrow(3, 1, 16), pos, ck, cv, col, {heads = 2, kv_heads = 1, inv_freq = 3}) end,
      "decode_qkv: inv_freq must be a tensor, got number")
    H_.raises(function()
      keng.decode_qkv(qkv:narrow(3, 1, 16), pos, ck, cv, col, {heads = 2, kv_heads = 1, inv_freq = z({3})})
    end, "decode_qkv: inv_freq [3] must be [D/2] = [2] for qkv [2,1,16]")
    H_.raises(function()
      keng.decode_qkv(qkv:narrow(3, 1, 16), pos, ck, cv, col, {heads = 2, kv_heads = 1, inv_freq = keng.tensor({1, 2}, {device = DEV})})
    end, "inv_freq")
    H_.raises(function() keng.decode_qkv(qkv:narrow(3, 1, 16), pos, ck, cv, col, {heads = 2, kv_heads = 1, scale = 0 / 0}) end,
      "decode_qkv: scale")
    H_.raises(function() keng.decode_qkv(qkv:narrow(3, 1, 16), pos, ck, cv, col, {heads = 2}) end,
      "heads and kv_heads must be integers")
    H_.raises(function() keng.decode_qkv(qkv:narrow(3, 1, 16), pos, ck, cv, col, {heads = 2, kv_heads = 1, base = -1}) end,
      "base -1 must be positive")
  end)

  it("is not differentiable: refuses a qkv that requires grad, and a cache that does", function()
    local qkv = keng.randn({1, 1, 16}, {requires_grad = true})
    local pos, col = keng.tensor({{1}}), keng.tensor({0})
    local ck, cv = keng.zeros({1, 1, 2, 4}), keng.zeros({1, 1, 2, 4})
    H_.raises(function() keng.decode_qkv(qkv, pos, ck, cv, col, {heads = 2, kv_heads = 1}) end,
      "decode_qkv: not differentiable (a decode-time op)")
    local q = keng.no_grad(function() return keng.decode_qkv(qkv, pos, ck, cv, col, {heads = 2, kv_heads = 1}) end)
    assert.is_false(q.requires_grad)
    local leaf = keng.zeros({1, 1, 2, 4}, {requires_grad = true})
    H_.raises(function() keng.decode_qkv(qkv:detach(), pos, leaf, cv, col, {heads = 2, kv_heads = 1}) end,
      "cannot be modified in place")
  end)
end)
