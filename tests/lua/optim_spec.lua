-- optim_spec.lua — keng.optim: SGD, Adam, AdamW against updates computed by hand in plain Lua
-- (textbook forms, not the kernel's arithmetic), in f64, f32 and bf16; skipping of frozen and
-- grad-less parameters; clip_grad_norm; schedules; state_dict round trips; minimising a
-- quadratic, the Rosenbrock function and a least-squares fit; and error messages.
-- Shapes: parameters are small [N] or [N, M] tensors; grads have the parameter's shape.
local keng = require "keng"
local optim = require "keng.optim"
local H = require "helper"

-- a leaf parameter holding the values of list (f32 unless dtype)
local function param(list, dtype)
  local t = keng.tensor(list, {dtype = dtype or "f32"})
  t.requires_grad = true
  return t
end

-- runs opt over the grads (one list per step) of the single parameter p
local function run_steps(opt, p, grads)
  for _, g in ipairs(grads) do
    p.grad = keng.tensor(g, {dtype = p.dtype})
    opt:step()
  end
end

-- Adam by the paper (Kingma & Ba, Algorithm 1) with Keras' epsilon: Keras adds eps to sqrt(v)
-- before the bias correction, which equals eps / sqrt(1 - b2^t) added to sqrt(v_hat).
-- o: lr, b1, b2, eps, wd, decoupled. Returns p, m, v as lists.
local function ref_adam(p0, grads, o)
  local p, m, v = {}, {}, {}
  for i, x in ipairs(p0) do p[i], m[i], v[i] = x, 0, 0 end
  for t, g in ipairs(grads) do
    for i = 1, #p do
      local gi = g[i]
      if o.wd and not o.decoupled then gi = gi + o.wd * p[i] end
      if o.wd and o.decoupled then p[i] = p[i] * (1 - o.lr * o.wd) end
      m[i] = o.b1 * m[i] + (1 - o.b1) * gi
      v[i] = o.b2 * v[i] + (1 - o.b2) * gi * gi
      local mhat, vhat = m[i] / (1 - o.b1 ^ t), v[i] / (1 - o.b2 ^ t)
      p[i] = p[i] - o.lr * mhat / (math.sqrt(vhat) + o.eps / math.sqrt(1 - o.b2 ^ t))
    end
  end
  return p, m, v
end

-- SGD as torch.optim.SGD. o: lr, momentum, dampening, nesterov, wd. Returns p, buf.
local function ref_sgd(p0, grads, o)
  local p, b = {}, {}
  for i, x in ipairs(p0) do p[i] = x end
  for t, g in ipairs(grads) do
    for i = 1, #p do
      local d = g[i] + (o.wd or 0) * p[i]
      if (o.momentum or 0) > 0 then
        b[i] = t == 1 and d or o.momentum * b[i] + (1 - (o.dampening or 0)) * d
        d = o.nesterov and d + o.momentum * b[i] or b[i]
      end
      p[i] = p[i] - o.lr * d
    end
  end
  return p, b
end

local P0 = {0.5, -1.25, 2.0, 0.0, -0.3}
local GRADS = {{0.1, -0.2, 0.3, 0.05, -1.5}, {0.2, 0.1, -0.4, 0.0, -1.0}, {-0.3, 0.25, 0.2, 0.01, 0.5}}
local function first(n) local out = {} for i = 1, n do out[i] = GRADS[i] end return out end

describe("optim.Adam and AdamW", function()
  it("have Keras 3 defaults", function()
    local p = param({1})
    local a, w = optim.Adam({p}), optim.AdamW({p})
    assert.are.same({1e-3, 0.9, 0.999, 1e-7, 0}, {a.lr, a.hyper.beta1, a.hyper.beta2, a.hyper.eps, a.hyper.weight_decay})
    assert.are.same({1e-3, 0.9, 0.999, 1e-7, 0.004, true},
      {w.lr, w.hyper.beta1, w.hyper.beta2, w.hyper.eps, w.hyper.weight_decay, w.hyper.decoupled})
  end)

  for _, dt in ipairs({"f64", "f32"}) do
    local tol = dt == "f64" and 1e-12 or 2e-6
    for _, nsteps in ipairs({1, 3}) do
      it(string.format("AdamW matches the hand computation, %s, %d step(s)", dt, nsteps), function()
        local o = {lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-3, wd = 0.05, decoupled = true}
        local p = param(P0, dt)
        local opt = optim.AdamW({p}, {lr = o.lr, weight_decay = o.wd, eps = o.eps})
        run_steps(opt, p, first(nsteps))
        local rp, rm, rv = ref_adam(P0, first(nsteps), o)
        H.close(p, rp, tol, "p")
        H.close(opt.state[1].m, rm, tol, "m")
        H.close(opt.state[1].v, rv, tol, "v")
        assert.are.equal(nsteps, opt.state[1].step)
        assert.are.equal(dt, opt.state[1].m.dtype)
      end)

      it(string.format("Adam matches the hand computation, %s, %d step(s)", dt, nsteps), function()
        local o = {lr = 0.01, b1 = 0.8, b2 = 0.99, eps = 1e-7}
        local p = param(P0, dt)
        local opt = optim.Adam({p}, {lr = o.lr, beta1 = o.b1, beta2 = o.b2})
        run_steps(opt, p, first(nsteps))
        H.close(p, (ref_adam(P0, first(nsteps), o)), tol, "p")
      end)
    end
  end

  it("moves each element by lr on the first step (Keras' bias correction)", function()
    local p = param({1, 1, 1}, "f64")
    local opt = optim.Adam({p}, {lr = 0.5})
    run_steps(opt, p, {{3, -0.002, 1e4}})
    -- first step: lr * g / (|g| + eps / sqrt(1 - b2)), i.e. ±lr up to eps
    local e = 1e-7 / math.sqrt(0.001)
    H.close(p, {1 - 0.5 * 3 / (3 + e), 1 + 0.5 * 0.002 / (0.002 + e), 1 - 0.5 * 1e4 / (1e4 + e)}, 1e-12)
    assert.is_true(p[2]:item() > 1.49 and p[2]:item() < 1.5) -- eps shows for tiny grads
  end)

  it("Adam's weight_decay is L2 in the gradient; decoupled = true makes it AdamW", function()
    local o = {lr = 0.05, b1 = 0.9, b2 = 0.999, eps = 1e-7, wd = 0.1}
    local p, q = param(P0, "f64"), param(P0, "f64")
    run_steps(optim.Adam({p}, {lr = o.lr, weight_decay = o.wd}), p, GRADS)
    run_steps(optim.Adam({q}, {lr = o.lr, weight_decay = o.wd, decoupled = true}), q, GRADS)
    H.close(p, (ref_adam(P0, GRADS, o)), 1e-12, "L2")
    o.decoupled = true
    H.close(q, (ref_adam(P0, GRADS, o)), 1e-12, "decoupled")
  end)

  it("keeps bf16 state for bf16 parameters", function()
    local p = param(P0, "bf16")
    local start = p:double():tolist() -- P0 rounded to bf16
    local opt = optim.AdamW({p}, {lr = 0.1})
    run_steps(opt, p, GRADS)
    assert.are.equal("bf16", p.dtype)
    assert.are.equal("bf16", opt.state[1].m.dtype)
    assert.are.equal("bf16", opt.state[1].v.dtype)
    local g = {}
    for s, row in ipairs(GRADS) do g[s] = keng.tensor(row):bf16():double():tolist() end
    local rp = ref_adam(start, g, {lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-7, wd = 0.004, decoupled = true})
    H.close(p, rp, 2e-2, "bf16 p")
  end)

  it("updates non-contiguous parameters like contiguous ones", function()
    keng.manual_seed(3)
    local base = keng.randn({4, 3}, {dtype = "f64"})
    local a = base:clone()
    local b = H.noncontig(base)
    a.requires_grad, b.requires_grad = true, true
    local g = keng.randn({4, 3}, {dtype = "f64"})
    local oa, ob = optim.AdamW({a}, {lr = 0.1}), optim.AdamW({b}, {lr = 0.1})
    for _ = 1, 2 do
      a.grad, b.grad = g:clone(), H.noncontig(g)
      oa:step(); ob:step()
    end
    assert.is_false(b.is_contiguous)
    H.close(b, a, 0, "non-contiguous")
  end)

  it("runs the parallel path on large tensors like engine ops", function()
    keng.manual_seed(4)
    local n = 70000
    local p0, g = keng.randn({n}), keng.randn({n})
    local p = p0:clone()
    p.requires_grad = true
    p.grad = g
    local opt = optim.Adam({p}, {lr = 0.01})
    opt:step()
    -- step 1 by engine ops in f64: m = (1-b1) g, v = (1-b2) g², alpha = lr sqrt(1-b2)/(1-b1)
    local gd = g:double()
    local m, v = gd * 0.1, gd * gd * 0.001
    local ref = p0:double() - m * (0.01 * math.sqrt(0.001) / 0.1) / (v:sqrt() + 1e-7)
    H.close(p, ref, 1e-6, "large")
  end)
end)

describe("optim.SGD", function()
  local cases = {
    {"plain", {lr = 0.1}},
    {"momentum", {lr = 0.1, momentum = 0.9}},
    {"momentum and dampening", {lr = 0.1, momentum = 0.9, dampening = 0.3}},
    {"nesterov", {lr = 0.05, momentum = 0.8, nesterov = true}},
    {"weight decay", {lr = 0.1, momentum = 0.5, wd = 0.2}},
  }
  for _, dt in ipairs({"f64", "f32"}) do
    for _, c in ipairs(cases) do
      it(string.format("%s matches torch.optim.SGD's rule, %s, 1 and 3 steps", c[1], dt), function()
        local o = c[2]
        for _, nsteps in ipairs({1, 3}) do
          local p = param(P0, dt)
          local opt = optim.SGD({p}, {lr = o.lr, momentum = o.momentum, dampening = o.dampening,
                                      nesterov = o.nesterov, weight_decay = o.wd})
          run_steps(opt, p, first(nsteps))
          local rp, rb = ref_sgd(P0, first(nsteps), o)
          H.close(p, rp, dt == "f64" and 1e-12 or 1e-6, "p")
          if o.momentum then H.close(opt.state[1].momentum, rb, dt == "f64" and 1e-12 or 1e-6, "buffer") end
        end
      end)
    end
  end

  it("decoupled weight decay shrinks p by lr * wd", function()
    local p = param({2, -4}, "f64")
    run_steps(optim.SGD({p}, {lr = 0.1, weight_decay = 0.5, decoupled = true}), p, {{1, 1}})
    H.close(p, {2 * (1 - 0.05) - 0.1, -4 * (1 - 0.05) - 0.1}, 1e-12)
  end)

  it("keeps a bf16 momentum buffer for bf16 parameters", function()
    local p = param(P0, "bf16")
    local opt = optim.SGD({p}, {lr = 0.1, momentum = 0.9})
    run_steps(opt, p, GRADS)
    assert.are.equal("bf16", opt.state[1].momentum.dtype)
  end)
end)

describe("optimizer steps", function()
  it("leave frozen and grad-less parameters untouched bit for bit", function()
    keng.manual_seed(5)
    local frozen, nograd, live = keng.randn({3, 2}), keng.randn({4}), keng.randn({2})
    for _, t in ipairs({frozen, nograd, live}) do t.requires_grad = true end
    frozen.grad = keng.ones({3, 2})
    frozen.requires_grad = false
    live.grad = keng.ones({2})
    local f0, n0, l0 = frozen:tolist(), nograd:tolist(), live:tolist()
    for _, opt in ipairs({optim.SGD({frozen, nograd, live}, {momentum = 0.9}),
                          optim.Adam({frozen, nograd, live}), optim.AdamW({frozen, nograd, live})}) do
      opt:step()
      assert.are.same(f0, frozen:tolist())
      assert.are.same(n0, nograd:tolist())
      assert.is_nil(opt.state[1])
      assert.is_nil(opt.state[2])
      assert.is_not_nil(opt.state[3])
    end
    assert.are_not.same(l0, live:tolist())
  end)

  it("run under grad mode on parameters that require grad, and restore the mode", function()
    local p = param({1, 2})
    p.grad = keng.tensor({1, 1}, {dtype = "f32"})
    assert.is_true(keng.is_grad_enabled())
    optim.Adam({p}):step()
    assert.is_true(keng.is_grad_enabled())
    assert.is_true(p.requires_grad)
    assert.is_nil(p.grad_fn)
  end)

  it("bump the version, so a tape that saved the parameter refuses to run backward", function()
    local p = param({1, 2}, "f64")
    local y = (p * p):sum() -- mul saves p
    p.grad = keng.tensor({1, 1}, {dtype = "f64"})
    optim.SGD({p}, {lr = 0.1}):step()
    H.raises(function() y:backward() end, "modified by an in-place operation")
  end)

  it("zero_grad sets grads to nil, or zeroes them with zero_grad(false)", function()
    local p = param({1, 2})
    p.grad = keng.tensor({3, 4}, {dtype = "f32"})
    local opt = optim.SGD({p})
    local g = p.grad
    opt:zero_grad(false)
    assert.are.same({0, 0}, g:tolist())
    assert.are.same({0, 0}, p.grad:tolist())
    opt:zero_grad()
    assert.is_nil(p.grad)
  end)

  it("take the parameters of anything with :parameters()", function()
    local p = param({1})
    local holder = {parameters = function() return {p} end}
    local opt = optim.SGD(holder, {lr = 1})
    p.grad = keng.tensor({0.5})
    opt:step()
    H.close(p, {0.5}, 0)
  end)

  it("use opt.lr as set between steps", function()
    local p = param({0}, "f64")
    local opt = optim.SGD({p}, {lr = 1})
    run_steps(opt, p, {{1}})
    opt.lr = 0.25
    run_steps(opt, p, {{1}})
    H.close(p, {-1.25}, 1e-12)
  end)
end)

describe("optim.clip_grad_norm", function()
  it("returns the global L2 norm and scales grads above max_norm", function()
    local a, b, c = param({0, 0}), param({0}, "f64"), param({0})
    a.grad, b.grad = keng.tensor({3, 4}, {dtype = "f32"}), keng.tensor({12}, {dtype = "f64"})
    local norm = optim.clip_grad_norm({a, b, c}, 6.5)
    H.close(norm, 13, 1e-7)
    local s = 6.5 / (13 + 1e-6)
    H.close(a.grad, {3 * s, 4 * s}, 1e-6)
    H.close(b.grad, {12 * s}, 1e-6)
    assert.is_nil(c.grad)
    -- below the limit nothing changes
    H.close(optim.clip_grad_norm({a, b}, 100), 6.5, 1e-6)
    H.close(a.grad, {3 * s, 4 * s}, 1e-6)
  end)

  it("sums bf16 grads in f32", function()
    local p = param(keng.zeros({1000}):tolist(), "bf16")
    p.grad = keng.full({1000}, 0.1):bf16() -- stored 0.10009765625
    local v = 0.10009765625
    H.close(optim.clip_grad_norm({p}, 1e9), math.sqrt(1000) * v, 1e-6)
  end)

  it("returns 0 when no parameter has a grad, and rejects a bad max_norm", function()
    assert.are.equal(0, optim.clip_grad_norm({param({1})}, 1))
    H.raises(function() optim.clip_grad_norm({param({1})}, 0) end, "clip_grad_norm: max_norm must be a number > 0")
  end)
end)

describe("optim.schedules", function()
  local S = optim.schedules
  it("constant", function()
    local f = S.constant(0.3)
    assert.are.equal(0.3, f(0))
    assert.are.equal(0.3, f(1000))
  end)

  it("linear_warmup reaches lr after warmup_steps steps", function()
    local f = S.linear_warmup(0.1, 4)
    H.close({f(0), f(1), f(2), f(3), f(4), f(100)}, {0.025, 0.05, 0.075, 0.1, 0.1, 0.1}, 1e-15)
  end)

  it("cosine decays from lr to min_lr after a warmup", function()
    local f = S.cosine(1.0, 10)
    H.close({f(0), f(5), f(10), f(20)}, {1, 0.5, 0, 0}, 1e-15)
    H.close(f(2), 0.5 * (1 + math.cos(math.pi * 0.2)), 1e-15)
    local g = S.cosine(1.0, 12, {min_lr = 0.1, warmup = 2})
    H.close({g(0), g(1), g(2), g(7), g(12)}, {0.5, 1, 1, 0.1 + 0.9 * 0.5, 0.1}, 1e-15)
  end)

  it("set the lr before each step (opts.schedule and set_schedule)", function()
    local p = param({0}, "f64")
    local opt = optim.SGD({p}, {schedule = S.linear_warmup(1, 2)})
    run_steps(opt, p, {{1}})
    assert.are.equal(0.5, opt.lr)
    run_steps(opt, p, {{1}, {1}})
    H.close(p, {-2.5}, 1e-12)
    opt:set_schedule(function(step) return step * 0.125 end) -- step 3 next
    run_steps(opt, p, {{1}})
    H.close(p, {-2.875}, 1e-12)
    assert.are.equal(4, opt.iterations)
  end)

  it("reject bad arguments", function()
    H.raises(function() S.cosine(1, 0) end, "schedules.cosine: total_steps must be > 0")
    H.raises(function() S.cosine(1, 10, {min_lr = 2}) end, "schedules.cosine: min_lr must be in [0, 1]")
    H.raises(function() S.linear_warmup(-1, 3) end, "schedules.linear_warmup: lr must be >= 0")
    local p = param({0})
    p.grad = keng.tensor({1}, {dtype = "f32"})
    local opt = optim.SGD({p}, {schedule = function() return -1 end})
    H.raises(function() opt:step() end, "SGD:step: the schedule returned -1 at step 0")
  end)
end)

describe("optimizer state_dict", function()
  for _, kind in ipairs({"SGD", "Adam", "AdamW"}) do
    it(kind .. " round trip gives bit-identical later steps", function()
      keng.manual_seed(7)
      local p0 = keng.randn({3, 4})
      local grads = {}
      for s = 1, 5 do grads[s] = keng.randn({3, 4}) end
      local opts = {lr = 0.05, momentum = kind == "SGD" and 0.9 or nil}
      local a = p0:clone()
      a.requires_grad = true
      local oa = optim[kind]({a}, opts)
      for s = 1, 2 do a.grad = grads[s]; oa:step() end
      local sd = oa:state_dict()
      -- a fresh optimizer on a copy of the parameter, resumed from the state
      local b = a:detach():clone()
      b.requires_grad = true
      local ob = optim[kind]({b}, opts)
      ob:load_state_dict(sd)
      assert.are.equal(2, ob.iterations)
      for s = 3, 5 do
        a.grad, b.grad = grads[s], grads[s]
        oa:step(); ob:step()
      end
      assert.are.same(a:tolist(), b:tolist())
      -- the saved state is a copy: later steps did not change it
      assert.are.equal(2, sd.state[1].step)
      if kind ~= "SGD" then assert.are_not.same(sd.state[1].m:tolist(), oa.state[1].m:tolist()) end
    end)
  end

  it("rejects state for another optimizer or other shapes", function()
    local p = param({1, 2})
    p.grad = keng.tensor({1, 1}, {dtype = "f32"})
    local adam = optim.Adam({p})
    adam:step()
    H.raises(function() optim.SGD({p}):load_state_dict(adam:state_dict()) end, "the state is from a Adam, not a SGD")
    H.raises(function() optim.Adam({param({1, 2, 3})}):load_state_dict(adam:state_dict()) end,
      "parameter 1: state 'm' is [2] but the parameter is [3]")
  end)
end)

describe("optimizers minimise", function()
  -- a quadratic bowl sum(c * (x - t)^2) with uneven curvature
  local function quadratic(opt_fn, steps)
    local x = param({3, -2, 1}, "f64")
    local c, t = keng.tensor({1, 5, 0.5}, {dtype = "f64"}), keng.tensor({1, 2, -1}, {dtype = "f64"})
    local opt = opt_fn({x})
    local loss
    for _ = 1, steps do
      opt:zero_grad()
      loss = (c * (x - t) ^ 2):sum()
      loss:backward()
      opt:step()
    end
    return loss:item()
  end

  local function rosenbrock(opt_fn, steps)
    local xy = param({-1.2, 1}, "f64")
    local opt = opt_fn({xy})
    local loss
    for _ = 1, steps do
      opt:zero_grad()
      local x, y = xy[1], xy[2]
      loss = (1 - x) ^ 2 + 100 * (y - x * x) ^ 2
      loss:backward()
      opt:step()
    end
    return loss:item(), xy:tolist()
  end

  it("a quadratic with SGD, SGD + nesterov, Adam and AdamW", function()
    assert.is_true(quadratic(function(p) return optim.SGD(p, {lr = 0.05}) end, 200) < 1e-8)
    assert.is_true(quadratic(function(p) return optim.SGD(p, {lr = 0.02, momentum = 0.9, nesterov = true}) end, 200) < 1e-8)
    assert.is_true(quadratic(function(p) return optim.Adam(p, {lr = 0.1}) end, 400) < 1e-4)
    assert.is_true(quadratic(function(p) return optim.AdamW(p, {lr = 0.1, weight_decay = 1e-4}) end, 400) < 1e-3)
  end)

  it("the Rosenbrock function with Adam, AdamW and SGD with momentum", function()
    local l1, xy = rosenbrock(function(p) return optim.Adam(p, {lr = 0.02}) end, 3000)
    assert.is_true(l1 < 1e-4, "Adam loss " .. l1)
    H.close(xy, {1, 1}, 2e-2, "Adam minimum")
    local l2 = rosenbrock(function(p) return optim.AdamW(p, {lr = 0.02, weight_decay = 1e-4}) end, 3000)
    assert.is_true(l2 < 1e-3, "AdamW loss " .. l2)
    local l3 = rosenbrock(function(p) return optim.SGD(p, {lr = 1e-3, momentum = 0.9}) end, 3000)
    assert.is_true(l3 < 1e-2, "SGD loss " .. l3)
  end)

  it("a least-squares fit with keng.linear in f32", function()
    keng.manual_seed(11)
    local x = keng.randn({64, 4})
    local w_true = keng.tensor({{0.5, -1, 2, 0.25}})
    local y = keng.linear(x, w_true, keng.tensor({0.3}))
    for _, make in ipairs({function(p) return optim.SGD(p, {lr = 0.1, momentum = 0.9}) end,
                           function(p) return optim.Adam(p, {lr = 0.05}) end,
                           function(p) return optim.AdamW(p, {lr = 0.05}) end}) do
      local w, b = param({{0, 0, 0, 0}}), param({0})
      local opt = make({w, b})
      local loss
      for _ = 1, 300 do
        opt:zero_grad()
        loss = ((keng.linear(x, w, b) - y) ^ 2):mean()
        loss:backward()
        opt:step()
      end
      assert.is_true(loss:item() < 1e-3, opt.__name .. " loss " .. loss:item())
    end
  end)
end)

describe("optimizer errors", function()
  local p = param({1})
  it("name the optimizer and the option", function()
    H.raises(function() optim.Adam({p}, {lr = -1}) end, "Adam: lr must be >= 0, got -1")
    H.raises(function() optim.Adam({p}, {beta1 = 1}) end, "Adam: beta1 must be in [0, 1), got 1")
    H.raises(function() optim.AdamW({p}, {beta2 = -0.1}) end, "AdamW: beta2 must be in [0, 1), got -0.1")
    H.raises(function() optim.AdamW({p}, {eps = 0}) end, "AdamW: eps must be > 0, got 0")
    H.raises(function() optim.SGD({p}, {lr = -0.5}) end, "SGD: lr must be >= 0, got -0.5")
    H.raises(function() optim.SGD({p}, {momentum = 1}) end, "SGD: momentum must be in [0, 1), got 1")
    H.raises(function() optim.SGD({p}, {nesterov = true}) end, "SGD: nesterov needs momentum > 0")
    H.raises(function() optim.Adam({p}, {betas = 1}) end, "Adam: unknown option 'betas'")
    H.raises(function() optim.Adam({p, 3}) end, "Adam: params[2] is a number, not a tensor")
    H.raises(function() optim.Adam({p}, {lr = "fast"}) end, "Adam: lr must be a number, got fast")
  end)

  it("accept Keras' option names", function()
    local o = optim.Adam({p}, {learning_rate = 0.01, beta_1 = 0.8, beta_2 = 0.9, epsilon = 1e-6})
    assert.are.same({0.01, 0.8, 0.9, 1e-6}, {o.lr, o.hyper.beta1, o.hyper.beta2, o.hyper.eps})
  end)

  it("from the engine name the op and the shapes", function()
    local q = param({1, 2, 3})
    local m, v = keng.zeros({3}), keng.zeros({3})
    H.raises(function() keng._adam_step_(q, keng.zeros({2}), m, v, {lr = 0.1, step = 1}) end,
      "adam_step: grad [2] does not match param [3]")
    H.raises(function() keng._adam_step_(q, keng.zeros({3}), m, keng.zeros({3, 1}), {lr = 0.1, step = 1}) end,
      "adam_step: v [3,1] does not match param [3]")
    H.raises(function() keng._adam_step_(q, keng.zeros({3}), m, v, {lr = 0.1, beta2 = 1, step = 1}) end,
      "adam_step: beta2 must be in [0, 1), got 1")
    H.raises(function() keng._adam_step_(q, keng.zeros({3}), m, v, {lr = 0.1, step = 0}) end,
      "adam_step: step must be >= 1, got 0")
    H.raises(function() keng._adam_step_(q, keng.zeros({3}), m, v, {lr = 0.1}) end,
      "_adam_step_: option 'step' must be a number, got nil")
    H.raises(function() keng._sgd_step_(q, keng.zeros({3}), nil, {lr = 0.1, momentum = 0.9}) end,
      "sgd_step: momentum 0.9 needs a momentum buffer")
    H.raises(function() keng._sgd_step_(q, keng.zeros({3}, {dtype = "i32"}), nil, {lr = 0.1}) end, "sgd_step:")
  end)
end)

-- On a machine with a GPU the CPU is the oracle (registered only there: nothing passes by skipping).
if keng.cuda.is_available() then
  describe("optimizers on cuda", function()
    for _, dt in ipairs({"f64", "f32", "bf16"}) do
      it("match the CPU, " .. dt .. ", contiguous and not", function()
        keng.manual_seed(21)
        local base, grads = keng.randn({33, 17}, {dtype = dt}), {}
        for s = 1, 3 do grads[s] = keng.randn({33, 17}, {dtype = dt}) end
        for _, make in ipairs({function(p) return optim.SGD(p, {lr = 0.1, momentum = 0.9, nesterov = true, weight_decay = 0.01}) end,
                               function(p) return optim.Adam(p, {lr = 0.01, weight_decay = 0.1}) end,
                               function(p) return optim.AdamW(p, {lr = 0.01}) end}) do
          for _, noncontig in ipairs({false, true}) do
            local c, g = base:clone(), base:cuda()
            if noncontig then g = H.noncontig(base):cuda() end
            c.requires_grad, g.requires_grad = true, true
            local oc, og = make({c}), make({g})
            for s = 1, 3 do
              c.grad, g.grad = grads[s], grads[s]:cuda()
              oc:step(); og:step()
            end
            H.close(g:cpu(), c, dt == "bf16" and 1e-2 or dt == "f32" and 1e-6 or 1e-12, oc.__name)
          end
        end
      end)
    end
  end)
end
