-- attention_decode_spec.lua — the CPU decode-step attention (engine/cpu/attention_decode.c):
-- scaled_dot_product_attention with at most 4 query rows over an f32 or bf16 KV cache read in
-- place, against the f64 kernel on the same (upcast) values: plain, grouped-query, causal and
-- windowed bands, float and bool masks broadcast over heads, rows that see no key, non-unit
-- query strides, a narrowed cache (the valid length of a longer one), the gradient through
-- its log-sum-exp, and the shapes it leaves to the tiled kernel (D not a multiple of 8).
-- Shape letters: B batch, H query heads, Hkv key/value heads, T query rows, S keys, D head dim.
local keng = require "keng"
local H_ = require "helper"

local sdpa = keng.scaled_dot_product_attention

-- out of dtype's q/k/v vs the f64 kernel on the same values
local function check(dtype, B, H, Hkv, T, S, D, opts, tol, msg)
  keng.manual_seed(B * 1000 + H * 100 + T * 10 + S)
  local q = (keng.randn({B, H, T, D}) * 2):to(dtype)
  local k = (keng.randn({B, Hkv, S, D}) * 2):to(dtype)
  local v = keng.randn({B, Hkv, S, D}):to(dtype)
  local got = keng.no_grad(function() return sdpa(q, k, v, opts) end)
  local o64 = {}
  for key, val in pairs(opts or {}) do o64[key] = val end
  if o64.mask and o64.mask.dtype ~= "bool" then o64.mask = o64.mask:double() end
  local want = sdpa(q:double(), k:double(), v:double(), o64)
  H_.close(got:double(), want, tol, msg)
  return q, k, v
end

describe("decode-step attention (at most 4 query rows)", function()
  it("matches the f64 kernel in f32 (within f32 rounding) and bf16 (the output's rounding)", function()
    for _, c in ipairs({{1, 4, 4, 1, 9, 64}, {2, 8, 2, 1, 70, 32}, {1, 6, 3, 1, 131, 16}, {3, 2, 1, 1, 1, 8},
                        {1, 4, 4, 1, 300, 128}, {2, 4, 2, 3, 20, 40}}) do
      local B, H, Hkv, T, S, D = table.unpack(c)
      local shape = string.format("B%d H%d/%d T%d S%d D%d", B, H, Hkv, T, S, D)
      check("f32", B, H, Hkv, T, S, D, nil, 2e-6, "f32 " .. shape)
      check("bf16", B, H, Hkv, T, S, D, nil, 8e-3, "bf16 " .. shape)
    end
  end)

  it("honours causal and window bands (T > 1) and float / bool masks broadcast over heads", function()
    check("f32", 2, 4, 2, 3, 40, 32, {causal = true}, 2e-6, "causal")
    check("bf16", 2, 4, 2, 4, 40, 32, {causal = true, window = 7}, 8e-3, "window")
    keng.manual_seed(3)
    local fm = keng.where(keng.rand({2, 1, 1, 50}):lt(0.3), -1e30, 0.0)        -- [B, 1, 1, S] additive
    check("bf16", 2, 8, 2, 1, 50, 32, {mask = fm}, 8e-3, "float mask")
    check("f32", 2, 8, 2, 1, 50, 32, {mask = fm}, 2e-6, "float mask f32")
    local bm = keng.rand({2, 8, 1, 50}):gt(0.5)                                  -- [B, H, 1, S] bool
    check("f32", 2, 8, 2, 1, 50, 32, {mask = bm}, 2e-6, "bool mask")
  end)

  it("a row that sees no key gives zeros, as the tiled kernel", function()
    local q, k, v = keng.randn({1, 2, 1, 16}), keng.randn({1, 2, 5, 16}), keng.randn({1, 2, 5, 16})
    local m = keng.zeros({1, 2, 1, 5}):gt(1)                                     -- all false
    local got = sdpa(q, k, v, {mask = m})
    H_.close(got, keng.zeros({1, 2, 1, 16}), 0, "no key")
  end)

  it("reads a narrowed cache (the valid length) and a strided query in place", function()
    keng.manual_seed(7)
    local ck, cv = keng.randn({1, 2, 64, 32}):to("bf16"), keng.randn({1, 2, 64, 32}):to("bf16")
    local k, v = ck:narrow(3, 1, 23), cv:narrow(3, 1, 23)                       -- not contiguous
    local q = keng.randn({1, 8, 2, 32}):to("bf16"):narrow(3, 2, 1)                 -- row stride 64
    assert.is_false(q.is_contiguous)
    local got = sdpa(q, k, v)
    local want = sdpa(q:double(), k:double(), v:double())
    H_.close(got:double(), want, 8e-3, "narrowed cache")
  end)

  it("gives the gradient the f64 kernel gives (its log-sum-exp feeds the backward)", function()
    keng.manual_seed(11)
    local function grads(dtype)
      local q = keng.randn({1, 4, 1, 16}):double():to(dtype):requires_grad_()
      local k = keng.randn({1, 2, 9, 16}):double():to(dtype):requires_grad_()
      local v = keng.randn({1, 2, 9, 16}):double():to(dtype):requires_grad_()
      local w = keng.randn({1, 4, 1, 16}):double():to(dtype)
      keng.manual_seed(11)
      ;(sdpa(q, k, v) * w):sum():backward()
      return q.grad, k.grad, v.grad
    end
    keng.manual_seed(11)
    local a = {grads("f32")}
    keng.manual_seed(11)
    local b = {grads("f64")}
    for i = 1, 3 do H_.close(a[i]:double(), b[i], 1e-5, "grad " .. i) end
  end)

  it("leaves head dims that are not a multiple of 8 to the tiled kernel (same results)", function()
    check("f32", 1, 4, 2, 1, 33, 12, nil, 2e-6, "D 12")
    check("bf16", 1, 4, 2, 1, 33, 6, nil, 8e-3, "D 6")
  end)
end)
