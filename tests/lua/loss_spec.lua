-- loss_spec.lua — cross_entropy and mse_loss: values against plain Lua references, gradients
-- against finite differences, ignore_index, non-contiguous and bf16 inputs, error messages.
local keng = require "keng"
local H = require "helper"

-- per-row losses -log softmax(row)[t + 1] of logits rows (a list of lists) and 0-based targets;
-- ignored rows give nil
local function ce_rows(rows, targets, ignore)
  local out = {}
  for r, row in ipairs(rows) do
    if targets[r] ~= ignore then
      local m = -math.huge
      for _, v in ipairs(row) do m = math.max(m, v) end
      local s = 0
      for _, v in ipairs(row) do s = s + math.exp(v - m) end
      out[r] = m + math.log(s) - row[targets[r] + 1]
    end
  end
  return out
end

local function ce_ref(logits, targets, reduction, ignore)
  local c = logits.shape[#logits.shape]
  local flat, rows = H.flat(logits), {}
  for r = 0, #flat // c - 1 do
    local row = {}
    for j = 1, c do row[j] = flat[r * c + j] end
    rows[#rows + 1] = row
  end
  local t = H.flat(targets)
  local per = ce_rows(rows, t, ignore or -100)
  if reduction == "none" then
    local out = {}
    for r = 1, #rows do out[r] = per[r] or 0 end
    return out
  end
  local s, n = 0, 0
  for r = 1, #rows do if per[r] then s, n = s + per[r], n + 1 end end
  if reduction == "sum" then return s end
  return s / n
end

describe("cross_entropy", function()
  keng.manual_seed(11)
  local logits = keng.randn({4, 5}, {dtype = "f64"})
  local targets = keng.tensor({0, 4, 2, 2}, {dtype = "i64"})

  it("matches a reference for each reduction", function()
    H.close(keng.cross_entropy(logits, targets), ce_ref(logits, targets, "mean"), 1e-6, "mean")
    H.close(keng.cross_entropy(logits, targets, {reduction = "sum"}), ce_ref(logits, targets, "sum"), 1e-6, "sum")
    local none = logits:cross_entropy(targets, {reduction = "none"})
    assert.are.same({4}, none.shape)
    H.close(none, ce_ref(logits, targets, "none"), 1e-6, "none")
    assert.are.same({}, keng.cross_entropy(logits, targets).shape)
  end)

  it("takes [..., C] logits and i32 targets", function()
    local l3 = keng.randn({2, 3, 4})
    local t3 = keng.tensor({{0, 1, 3}, {3, 2, 0}}, {dtype = "i32"})
    local loss = keng.cross_entropy(l3, t3, {reduction = "none"})
    assert.are.same({2, 3}, loss.shape)
    H.close(loss, ce_ref(l3, t3, "none"), 1e-5, "none over [2,3,4]")
    H.close(keng.cross_entropy(l3, t3), ce_ref(l3, t3, "mean"), 1e-5, "mean over [2,3,4]")
  end)

  it("ignores rows whose target is ignore_index (default -100)", function()
    local t = keng.tensor({0, -100, 2, -100}, {dtype = "i64"})
    local m = keng.cross_entropy(logits, t)
    H.close(m, ce_ref(logits, t, "mean"), 1e-6, "mean over the kept rows")
    local per = ce_rows(logits:tolist(), {0, -100, 2, -100}, -100)
    H.close(m, (per[1] + per[3]) / 2, 1e-6, "divides by the kept count")
    local t2 = keng.tensor({1, 3, 3, 0}, {dtype = "i64"})
    H.close(keng.cross_entropy(logits, t2, {ignore_index = 3, reduction = "sum"}),
      ce_ref(logits, t2, "sum", 3), 1e-6, "explicit ignore_index")
    local none = keng.cross_entropy(logits, t2, {ignore_index = 3, reduction = "none"}):tolist()
    assert.are.equal(0, none[2])
    assert.are.equal(0, none[3])
  end)

  it("is stable for large logits", function()
    local big = keng.tensor({{1000, 0}, {0, -1000}}, {dtype = "f32"})
    local t = keng.tensor({0, 1}, {dtype = "i64"})
    H.close(keng.cross_entropy(big, t, {reduction = "none"}), {0, 1000}, 1e-6, "large")
  end)

  it("gives f32 for f32 and bf16 logits, f64 for f64; works on non-contiguous input", function()
    assert.are.equal("f64", keng.cross_entropy(logits, targets).dtype)
    local f = logits:float()
    assert.are.equal("f32", keng.cross_entropy(f, targets).dtype)
    local b = keng.cross_entropy(logits:bf16(), targets)
    assert.are.equal("f32", b.dtype)
    H.close(b, ce_ref(logits:bf16(), targets, "mean"), 1e-5, "bf16 logits, f32 math")
    H.close(b, ce_ref(logits, targets, "mean"), 2e-2, "bf16 near f64")
    local nc = H.noncontig(f)
    H.close(keng.cross_entropy(nc, H.noncontig(targets), {reduction = "none"}),
      ce_ref(logits, targets, "none"), 1e-5, "non-contiguous")
  end)

  it("gradients match finite differences", function()
    for _, red in ipairs({"mean", "sum", "none"}) do
      H.gradcheck(function(l) return keng.cross_entropy(l, targets, {reduction = red}) end, {H.leaf({4, 5})})
    end
    local t = keng.tensor({0, -100, 2, 1}, {dtype = "i64"})
    H.gradcheck(function(l) return keng.cross_entropy(l, t) end, {H.leaf({4, 5})})
    local t3 = keng.tensor({{0, 1, 3}, {3, 2, 0}}, {dtype = "i64"})
    H.gradcheck(function(l) return keng.cross_entropy(l, t3, {ignore_index = 2}) end, {H.leaf({2, 3, 4})})
  end)

  it("gradient is (softmax - onehot) / count", function()
    local l = H.leaf({2, 3})
    keng.cross_entropy(l, keng.tensor({1, 0}, {dtype = "i64"})):backward()
    local rows, g = l:tolist(), l.grad:tolist()
    for r, t in ipairs({1, 0}) do
      local s = 0
      for _, v in ipairs(rows[r]) do s = s + math.exp(v) end
      for j = 1, 3 do
        local want = (math.exp(rows[r][j]) / s - (j - 1 == t and 1 or 0)) / 2
        H.close(g[r][j], want, 1e-9, "row " .. r .. " class " .. j)
      end
    end
  end)

  it("float rows of many classes (the vector exp path) agree with the f64 kernel, values and gradients", function()
    local function leaf(t)
      t = t:detach()
      t.requires_grad = true
      return t
    end
    keng.manual_seed(7)
    for _, c in ipairs({1, 7, 33, 1003}) do
      local x64 = keng.randn({5, c}, {dtype = "f64"}) * 4
      x64:narrow(1, 2, 1):fill_(-math.huge)   -- a row of -inf except its target
      x64:narrow(1, 2, 1):narrow(2, 1, 1):fill_(0)
      local t = keng.tensor({0, 0, c - 1, c // 2, 0}, {dtype = "i64"})
      for _, red in ipairs({"mean", "none"}) do
        local l64 = leaf(x64)
        local want = keng.cross_entropy(l64, t, {reduction = red})
        want:sum():backward()
        for _, dt in ipairs({"f32", "bf16"}) do
          local src = x64:to(dt):to("f64")      -- the values the f32/bf16 kernel sees
          local l64r = leaf(src)
          local ref = keng.cross_entropy(l64r, t, {reduction = red})
          ref:sum():backward()
          -- also through a transposed (non-contiguous) view
          for _, view in ipairs({false, true}) do
            local xl = view and src:to(dt):transpose(1, 2):contiguous():transpose(1, 2) or src:to(dt)
            local l = leaf(xl)
            local got = keng.cross_entropy(l, t, {reduction = red})
            got:sum():backward()
            H.close(got:to("f64"), ref, 2e-5 * math.max(1, c / 100), dt .. " C=" .. c .. " " .. red)
            H.close(l.grad:to("f64"), l64r.grad, dt == "bf16" and 1e-2 or 1e-6, dt .. " grad C=" .. c .. " " .. red)
          end
        end
      end
    end
  end)

  it("rejects bad input", function()
    H.raises(function() keng.cross_entropy(logits, keng.tensor({0, 5, 1, 1}, {dtype = "i64"})) end, "out of range")
    H.raises(function() keng.cross_entropy(logits, keng.tensor({0, -1, 1, 1}, {dtype = "i64"})) end, "cross_entropy")
    H.raises(function() keng.cross_entropy(logits, keng.tensor({0, 1, 1}, {dtype = "i64"})) end, "cross_entropy")
    H.raises(function() keng.cross_entropy(logits, logits:select(2, 1)) end, "cross_entropy")
    H.raises(function() keng.cross_entropy(logits, targets, {reduction = "avg"}) end, "reduction")
  end)
end)

describe("mse_loss", function()
  keng.manual_seed(12)
  local a, b = keng.randn({3, 4}, {dtype = "f64"}), keng.randn({3, 4}, {dtype = "f64"})
  local function sq(x, y)
    local fa, fb, out = H.flat(x), H.flat(y), {}
    for i = 1, #fa do out[i] = (fa[i] - fb[i]) ^ 2 end
    return out
  end
  local function lsum(t) local s = 0; for _, v in ipairs(t) do s = s + v end; return s end

  it("matches a reference for each reduction", function()
    local d = sq(a, b)
    H.close(keng.mse_loss(a, b), lsum(d) / 12, 1e-6, "mean")
    assert.are.same({}, keng.mse_loss(a, b).shape)
    H.close(a:mse_loss(b, {reduction = "sum"}), lsum(d), 1e-6, "sum")
    H.close(keng.mse_loss(a, b, {reduction = "none"}), d, 1e-6, "none")
  end)

  it("works on non-contiguous and bf16 input", function()
    H.close(keng.mse_loss(H.noncontig(a), b), keng.mse_loss(a, b), 1e-12, "non-contiguous")
    local r = keng.mse_loss(a:bf16(), b:bf16())
    assert.are.equal("bf16", r.dtype)
    H.close(r:float(), keng.mse_loss(a, b), 2e-2, "bf16")
  end)

  it("gradients match finite differences", function()
    H.gradcheck(function(x, y) return keng.mse_loss(x, y) end, {H.leaf({3, 4}), H.leaf({3, 4})})
    H.gradcheck(function(x, y) return keng.mse_loss(x, y, {reduction = "none"}) end, {H.leaf({2, 3}), H.leaf({2, 3})})
  end)

  it("rejects bad input", function()
    H.raises(function() keng.mse_loss(a, keng.randn({5})) end, "mse_loss")
    H.raises(function() keng.mse_loss(a, b, {reduction = "avg"}) end, "reduction")
  end)
end)

-- golden values from torch.nn.functional.cross_entropy (tests/fixtures/gen/gen_loss.py)
describe("cross_entropy with class weights and label smoothing (PyTorch's)", function()
  local g = keng.load("tests/fixtures/loss/cross_entropy.safetensors")
  local cases = {
    {weight = g.weight},
    {label_smoothing = 0.1},
    {weight = g.weight, label_smoothing = 0.1},
    {weight = g.weight, label_smoothing = 0.3, ignore_index = 2},
  }
  local function targets(k)
    local t = g.targets:clone()
    if k == 4 then t:narrow(1, 3, 1):fill_(3) end
    return t
  end
  local function opts(k, red, extra)
    local o = {reduction = red}
    for key, v in pairs(cases[k]) do o[key] = v end
    for key, v in pairs(extra or {}) do o[key] = v end
    return o
  end

  it("loss and gradient match torch for every case and reduction (f64 and f32)", function()
    for k = 1, #cases do
      for _, red in ipairs({"mean", "sum", "none"}) do
        for _, dt in ipairs({"f64", "f32"}) do
          local o = opts(k, red)
          if o.weight then o.weight = o.weight:to(dt) end
          local x = g.logits:to(dt):detach():requires_grad_()
          local loss = keng.cross_entropy(x, targets(k), o)
          local tol = dt == "f64" and 1e-10 or 1e-5
          local name = string.format("case %d %s %s", k, red, dt)
          H.close(loss:reshape{-1}, g["loss_" .. k .. "_" .. red], tol, name)
          loss:sum():backward()
          H.close(x.grad, g["dlogits_" .. k .. "_" .. red], tol, name .. " gradient")
        end
      end
    end
  end)

  it("works on non-contiguous logits and weights; gradients match finite differences", function()
    local o = opts(3, "mean")
    local x = H.noncontig(g.logits)
    H.close(keng.cross_entropy(x, targets(3), {weight = H.noncontig(g.weight), label_smoothing = 0.1}):reshape{1},
      g.loss_3_mean, 1e-10, "non-contiguous")
    for k = 1, #cases do
      for _, red in ipairs({"mean", "none"}) do
        H.gradcheck(function(l) return keng.cross_entropy(l, targets(k), opts(k, red)) end, {H.leaf({6, 5})})
      end
    end
    assert.truthy(o)
  end)

  it("label_smoothing 0 and weight of ones give the plain loss", function()
    local t = targets(1)
    H.close(keng.cross_entropy(g.logits, t, {weight = keng.ones({5}, {dtype = "f64"}), label_smoothing = 0}),
      keng.cross_entropy(g.logits, t), 1e-12, "ones")
  end)

  it("refuses unknown options, a bad weight and a smoothing outside [0, 1]", function()
    local t = targets(1)
    H.raises(function() keng.cross_entropy(g.logits, t, {smoothing = 0.1}) end,
      "cross_entropy: unknown option 'smoothing' (valid: reduction, ignore_index, label_smoothing, weight)")
    H.raises(function() keng.cross_entropy(g.logits, t, {weight = keng.ones({4})}) end,
      "cross_entropy: weight [4] must be [C] for logits [6,5]")
    H.raises(function() keng.cross_entropy(g.logits, t, {weight = {1, 2, 3, 4, 5}}) end,
      "cross_entropy: weight must be a tensor")
    H.raises(function() keng.cross_entropy(g.logits, t, {weight = keng.ones({5}, {dtype = "i64"})}) end, "weight")
    H.raises(function() keng.cross_entropy(g.logits, t, {weight = keng.ones({5}):requires_grad_()}) end,
      "weight requires grad")
    keng.no_grad(function()   -- without a tape the weight's requires_grad does not matter
      keng.cross_entropy(g.logits, t, {weight = keng.ones({5}, {dtype = "f64"}):requires_grad_()})
    end)
    H.raises(function() keng.cross_entropy(g.logits, t, {label_smoothing = 1.5}) end,
      "label_smoothing must be in [0, 1], got 1.5")
    H.raises(function() keng.cross_entropy(g.logits, t, {label_smoothing = 0 / 0}) end, "label_smoothing")
    H.raises(function() keng.cross_entropy(g.logits, t, {ignore_index = 1.5}) end, "ignore_index must be an integer")
    H.raises(function() keng.mse_loss(g.logits, g.logits, {reduce = "sum"}) end, "mse_loss: unknown option 'reduce'")
  end)
end)

-- bf16/f16/f32 logits are read in their own dtype (on AVX-512 machines by the row kernels of
-- engine/cpu/loss.c) with f32 math; the gradient comes back in the logits' dtype (PyTorch's
-- F.cross_entropy on bf16 logits). The reference is the f64 kernel on the same (rounded) values,
-- itself checked against finite differences and torch's goldens above.
describe("cross_entropy on bf16, f16 and f32 logits", function()
  local function leaf(t)
    t = t:detach()
    t.requires_grad = true
    return t
  end
  -- loss and dlogits of cross_entropy(x, t, o) after sum():backward()
  local function run(x, t, o)
    local l = leaf(x)
    local loss = keng.cross_entropy(l, t, o)
    loss:sum():backward()
    return loss, l.grad
  end
  -- every element of got (rounded to dt) within half a dt ulp of ref, plus 1e-6 for the f32 math
  -- (p - 1 at the target cancels: an absolute slack, gradients here are at most 1)
  local function rounded_close(got, ref, dt, msg)
    local half = dt == "bf16" and 2 ^ -8 or dt == "f16" and 2 ^ -11 or 2 ^ -23
    local over = ((got:to("f64") - ref):abs() - ref:abs() * (half * 1.01) - 1e-6):max():item()
    assert(over <= 0, string.format("%s: an element is %.3g beyond half a %s ulp of the f64 gradient", msg, over, dt))
  end

  it("values and gradients match f64 for every row length, reduction and smoothing", function()
    keng.manual_seed(21)
    for _, c in ipairs({1, 15, 16, 17, 33, 1003, 2100}) do
      local x64 = keng.randn({3, c}, {dtype = "f64"}) * 4
      local t = keng.tensor({0, c - 1, c // 2}, {dtype = "i64"})
      for _, dt in ipairs({"f32", "bf16", "f16"}) do
        local src = x64:to(dt):to("f64")        -- the values the dt kernel sees
        for _, red in ipairs({"mean", "sum", "none"}) do
          for _, eps in ipairs({0, 0.1}) do
            local o = {reduction = red, label_smoothing = eps}
            local want, dwant = run(src, t, o)
            local got, dgot = run(src:to(dt), t, o)
            local name = string.format("%s C=%d %s eps=%g", dt, c, red, eps)
            assert.are.equal(dt == "f64" and "f64" or "f32", got.dtype)
            assert.are.equal(dt, dgot.dtype, name .. " gradient dtype")
            H.close(got:to("f64"), want, 1e-6, name)
            rounded_close(dgot, dwant, dt, name .. " gradient")
          end
        end
      end
    end
  end)

  it("reads rows of a non-contiguous tensor (a narrowed and a transposed view)", function()
    keng.manual_seed(22)
    local big = keng.randn({4, 1040}, {dtype = "f64"}) * 3
    local t = keng.tensor({3, 1002, 0, 517}, {dtype = "i64"})
    for _, dt in ipairs({"bf16", "f32"}) do
      local x = big:to(dt):narrow(2, 7, 1003)  -- rows of unit stride, 1040 apart
      assert.is_false(x.is_contiguous)
      local want, dwant = run(x:to("f64"), t, {reduction = "none"})
      local got, dgot = run(x, t, {reduction = "none"})
      H.close(got:to("f64"), want, 1e-6, dt .. " narrowed")
      rounded_close(dgot, dwant, dt, dt .. " narrowed gradient")
      local xt = x:contiguous():transpose(1, 2):contiguous():transpose(1, 2)   -- class stride 4
      local got2, dgot2 = run(xt, t, {reduction = "none"})
      H.close(got2:to("f64"), want, 1e-6, dt .. " transposed")
      rounded_close(dgot2, dwant, dt, dt .. " transposed gradient")
    end
  end)

  it("ignore_index rows count for nothing and get exact zero gradients, even rows of NaN", function()
    keng.manual_seed(23)
    local x64 = keng.randn({4, 1003}, {dtype = "f64"})
    x64:narrow(1, 2, 1):fill_(0 / 0)                      -- an ignored row of NaN
    x64:narrow(1, 4, 1):fill_(-math.huge)                 -- a row of -inf but its target
    x64:narrow(1, 4, 1):narrow(2, 6, 1):fill_(2)
    for _, ii in ipairs({-100, 7}) do
      local t = keng.tensor({4, ii, 1000, 5}, {dtype = "i64"})
      for _, dt in ipairs({"bf16", "f32"}) do
        local src = x64:to(dt):to("f64")
        local want, dwant = run(src, t, {ignore_index = ii})
        local got, dgot = run(src:to(dt), t, {ignore_index = ii})
        H.close(got, want, 1e-6, dt .. " mean over 3 kept rows")
        assert.are.equal(0, dgot:select(1, 2):abs():sum():item())
        assert.are.equal(0, dgot:select(1, 4):abs():sum():item())   -- p = onehot: exactly 0
        rounded_close(dgot:narrow(1, 1, 1), dwant:narrow(1, 1, 1), dt, dt .. " kept row")
        local none = keng.cross_entropy(src:to(dt), t, {ignore_index = ii, reduction = "none"}):tolist()
        assert.are.equal(0, none[2])
      end
    end
    -- a NaN logit in a kept row makes the loss NaN (as torch)
    local nan = keng.tensor({{1, 0 / 0, 2}}, {dtype = "bf16"})
    local l = keng.cross_entropy(nan, keng.tensor({0}, {dtype = "i64"})):item()
    assert.is_true(l ~= l)
  end)

  it("the scalar path (KENG_NO_SIMD=1) gives the vector path's loss and gradient", function()
    local code = "keng.manual_seed(5); local x = (keng.randn({6, 2100}) * 3):bf16():detach():requires_grad_(); " ..
      "local t = keng.randint(0, 2100, {6}); local l = keng.cross_entropy(x, t, {label_smoothing = 0.05}); " ..
      "l:backward(); io.write(string.format('%.7f %.7f %s', l:item(), x.grad:float():abs():sum():item(), x.grad.dtype))"
    local function run_with(env)
      local p = io.popen("env " .. env .. " " .. H.keng_bin() .. " -e \"" .. code .. "\" 2>&1")
      local out = p:read("a")
      p:close()
      return out
    end
    local a, b = run_with("-u KENG_NO_SIMD"), run_with("KENG_NO_SIMD=1")
    local a1, a2, adt = a:match("(%S+) (%S+) (%S+)")
    local b1, b2, bdt = b:match("(%S+) (%S+) (%S+)")
    assert.truthy(a1 and b1, a .. " / " .. b)
    assert.are.equal("bf16", adt)
    assert.are.equal("bf16", bdt)
    assert.truthy(math.abs(a1 - b1) < 1e-5 and math.abs(a2 - b2) < 1e-3 * a2, a .. " / " .. b)
  end)

  it("names the bad target's value and 1-based position, the dtype and the shapes", function()
    local x = keng.zeros({2, 3, 5}, {dtype = "bf16"})
    H.raises(function() keng.cross_entropy(x, keng.tensor({{0, 1, 2}, {3, 5, 4}}, {dtype = "i64"})) end,
      "cross_entropy: target 5 at position [2,2] of targets [2,3] is out of range for 5 classes (logits [2,3,5])")
    H.raises(function() keng.cross_entropy(x:view{6, 5}, keng.tensor({0, 1, 2, 3, 4, -1}, {dtype = "i64"})) end,
      "target -1 at position [6] of targets [6]")
    H.raises(function() keng.cross_entropy(x, keng.zeros({2, 3})) end,
      "cross_entropy: targets must be an integer tensor (i32 or i64), got f32")
    H.raises(function() keng.cross_entropy(x, keng.zeros({2, 5}, {dtype = "i64"})) end,
      "cross_entropy: logits [2,3,5] and targets [2,5]: targets must have the logits' shape without the last (class) dim")
    H.raises(function() keng.cross_entropy(keng.zeros({2, 3}, {dtype = "i64"}), keng.zeros({2}, {dtype = "i64"})) end,
      "cross_entropy: logits")
  end)
end)
