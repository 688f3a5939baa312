-- cuda_backend_spec.lua — the parts of the CUDA backend's issue-8 work that run without a GPU:
-- keng.backends.cudnn_sdpa and its stats, keng.cuda.on_replay outside a capture, the optimizers'
-- device scalars (lr_t / step_t: the same numbers as plain lr / step, bit for bit) and their CUDA
-- Graph replay hook (driven by hand: each hook call must leave the host state and the scalar
-- buffer exactly as an eager step would), keng.bench's choice between graph replays and eager
-- steps, and the numerics guard / linear on the cpu. tests/gpu/{compare,graph}.lua check the GPU
-- side (cuDNN vs flash vs cpu, fused linear, Adam replay == eager).
local keng = require "keng"
local optim = require "keng.optim"
local bench = require "keng.bench"
local H = require "helper"

describe("keng.backends.cudnn_sdpa", function()
  it("defaults to true, round-trips and checks its type", function()
    assert.is_true(keng.backends.cudnn_sdpa)
    keng.backends.cudnn_sdpa = false
    assert.is_false(keng.backends.cudnn_sdpa)
    keng.backends.cudnn_sdpa = true
    assert.is_true(keng.backends.cudnn_sdpa)
    H.raises(function() keng.backends.cudnn_sdpa = "yes" end, "cudnn_sdpa must be a boolean")
    H.raises(function() keng.backends.nope = true end, "known: allow_tf32, cudnn_sdpa")
  end)

  it("exposes read-only stats with a count per fallback reason", function()
    local s = keng.backends.cudnn_sdpa_stats
    for _, k in ipairs({"cudnn", "plans", "build_failures", "exec_failures", "fallback"}) do
      assert.are.equal("number", type(s[k]), k)
    end
    local sum = s.build_failures + s.exec_failures
    for _, k in ipairs({"other", "off", "dtype", "head_dim", "mask", "window", "causal_t_gt_s", "layout", "align",
                        "empty"}) do
      assert.are.equal("number", type(s.reasons[k]), k)
      sum = sum + s.reasons[k]
    end
    assert.are.equal(s.fallback, sum)
    H.raises(function() keng.backends.cudnn_sdpa_stats = {} end, "read-only")
  end)

  it("leaves cpu attention alone (no cuda call is counted)", function()
    local before = keng.backends.cudnn_sdpa_stats
    local q = keng.randn({1, 2, 4, 8}, {dtype = "bf16"})
    local a = keng.scaled_dot_product_attention(q, q, q, {causal = true})
    keng.backends.cudnn_sdpa = false
    local b = keng.scaled_dot_product_attention(q, q, q, {causal = true})
    keng.backends.cudnn_sdpa = true
    H.close(a, b, 0)
    local after = keng.backends.cudnn_sdpa_stats
    assert.are.equal(before.cudnn, after.cudnn)
    assert.are.equal(before.fallback, after.fallback)
  end)
end)

describe("keng.cuda.on_replay", function()
  it("returns false outside a capture and keeps nothing", function()
    local called = false
    assert.is_false(keng.cuda.on_replay(function() called = true end))
    assert.is_false(called)
    H.raises(function() keng.cuda.on_replay(42) end, "function expected")
  end)
end)

-- ---- optimizer device scalars -------------------------------------------------------------------

local makers = {
  sgd = function(ps, o) return optim.SGD(ps, o or {lr = 0.1, momentum = 0.9, weight_decay = 0.01}) end,
  nesterov = function(ps, o) return optim.SGD(ps, o or {lr = 0.05, momentum = 0.5, nesterov = true}) end,
  adam = function(ps, o) return optim.Adam(ps, o or {lr = 0.01, weight_decay = 0.1}) end,
  adamw = function(ps, o) return optim.AdamW(ps, o or {lr = 0.02}) end,
}

local function params(seed, dt)
  keng.manual_seed(seed)
  local a, b = keng.randn({5, 3}, {dtype = dt}), keng.randn({4}, {dtype = dt})
  a.requires_grad, b.requires_grad = true, true
  return {a, b}
end

-- grads of step s (deterministic), param 2 has none on step 2 (its step count falls behind)
local function set_grads(ps, s, dt)
  keng.manual_seed(100 + s)
  ps[1].grad = keng.randn(ps[1].shape, {dtype = dt})
  ps[2].grad = s ~= 2 and keng.randn(ps[2].shape, {dtype = dt}) or nil
end

describe("optimizer device scalars (lr_t / step_t)", function()
  for _, dt in ipairs({"f64", "f32", "bf16"}) do
    for name, make in pairs(makers) do
      it(name .. " gives the plain path's numbers bit for bit, " .. dt .. ", with a schedule", function()
        local pa, pb = params(1, dt), params(1, dt)
        local oa, ob = make(pa), make(pb)
        oa.device_scalars, ob.device_scalars = false, true
        local sched = optim.schedules.cosine(0.05, 6, {warmup = 2})
        oa:set_schedule(sched); ob:set_schedule(sched)
        for s = 1, 4 do
          set_grads(pa, s, dt); set_grads(pb, s, dt)
          oa:step(); ob:step()
        end
        for i = 1, 2 do H.close(pb[i], pa[i], 0, name) end
        assert.is_nil(oa.scalars)
        -- the buffer holds {lr, step of each param} as of the last step
        local sc = ob.scalars:tolist()
        assert.are.equal(ob.lr, sc[1])
        assert.are.same({4, 3}, {sc[2], sc[3]})
      end)
    end
  end

  it("the engine reads one-element f64 tensors and checks them", function()
    local p = keng.tensor({1, 2, 3}, {dtype = "f32"})
    local g = keng.tensor({0.5, -1, 2}, {dtype = "f32"})
    local m, v = keng.zeros({3}), keng.zeros({3})
    local q = p:clone()
    local m2, v2 = keng.zeros({3}), keng.zeros({3})
    keng._adam_step_(p, g, m, v, {lr = 0.01, step = 3})
    keng._adam_step_(q, g, m2, v2, {lr = 123, step = 1, lr_t = keng.tensor({0.01}, {dtype = "f64"}),
                                    step_t = keng.tensor({3}, {dtype = "f64"})})
    H.close(q, p, 0)
    H.raises(function() keng._adam_step_(q, g, m2, v2, {lr = 0.1, step = 1, lr_t = keng.tensor({0.01})}) end,
      "lr_t must be a one-element f64 tensor")
    H.raises(function() keng._sgd_step_(q, g, nil, {lr = 0.1, step_t = keng.zeros({2}, {dtype = "f64"})}) end,
      "step_t must be a one-element f64 tensor")
    H.raises(function() keng._sgd_step_(q, g, nil, {lr = 0.1, step_t = keng.tensor({1.5}, {dtype = "f64"})}) end,
      "not an integer")
    H.raises(function() keng._sgd_step_(q, g, nil, {lr = 0.1, lr_t = 3}) end, "option 'lr_t' must be a tensor")
  end)
end)

-- The replay hook, driven by hand with keng.cuda.on_replay stubbed to "capturing": the captured
-- step() does the host bookkeeping without writing the buffer; hook(false) writes it (the launch
-- right after the capture); each hook(true) must advance lr, the step counts and iterations as
-- an eager step() would and write them. The reference optimizer runs eager steps.
describe("optimizer replay hook", function()
  local real = keng.cuda.on_replay
  local function capture(fn)
    local hooks, id = {}, 7
    keng.cuda.on_replay = function(h) hooks[#hooks + 1] = h; return id end
    local ok, err = pcall(fn)
    keng.cuda.on_replay = real
    assert(ok, err)
    return hooks
  end

  for name, make in pairs(makers) do
    it(name .. ": replays leave state and scalars as eager steps do, schedule included", function()
      local pa, pb = params(3, "f32"), params(3, "f32")
      local oa, ob = make(pa), make(pb)
      oa.device_scalars, ob.device_scalars = true, true
      local sched = optim.schedules.linear_warmup(0.1, 5)
      oa:set_schedule(sched); ob:set_schedule(sched)
      for s = 1, 2 do                                             -- warm-up: eager on both
        set_grads(pa, s, "f32"); set_grads(pb, s, "f32")
        oa:step(); ob:step()
      end
      set_grads(pa, 3, "f32")
      oa:step()                                                   -- the reference: eager step 3
      set_grads(pb, 3, "f32")
      local stale = ob.scalars:tolist()
      local hooks = capture(function() ob:step() end)             -- "captured" step 3
      assert.are.equal(1, #hooks)
      assert.are.same(stale, ob.scalars:tolist())                 -- nothing written while capturing
      hooks[1](false)                                             -- launch right after the capture
      assert.are.same(oa.scalars:tolist(), ob.scalars:tolist())
      assert.are.equal(oa.iterations, ob.iterations)
      for s = 4, 7 do                                             -- replays vs eager steps
        set_grads(pa, 3, "f32")                                   -- a graph replays the captured grads' pattern
        oa:step()
        hooks[1](true)
        assert.are.same(oa.scalars:tolist(), ob.scalars:tolist(), "step " .. s)
        assert.are.equal(oa.iterations, ob.iterations)
        assert.are.equal(oa.lr, ob.lr)
        for i = 1, 2 do assert.are.equal(oa.state[i].step, ob.state[i].step) end
      end
    end)
  end

  it("refuses a second step in one capture, and a first step inside a capture", function()
    local ps = params(4, "f32")
    local o = makers.adam(ps)
    o.device_scalars = true
    set_grads(ps, 1, "f32")
    o:step()
    keng.cuda.on_replay = function() return 9 end
    local ok, err = pcall(function() o:step(); o:step() end)
    keng.cuda.on_replay = real
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("called twice inside one keng.cuda.graph capture", 1, true))
    local o2 = makers.sgd(params(5, "f32"))
    o2.device_scalars = true
    set_grads(o2.params, 1, "f32")
    keng.cuda.on_replay = function() return 10 end
    ok, err = pcall(function() o2:step() end)
    keng.cuda.on_replay = real
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("first step inside a keng.cuda.graph capture", 1, true))
  end)
end)

-- ---- bench: graph replays only on the GPU tier ----------------------------------------------------

describe("keng.bench CUDA Graph selection", function()
  it("never graphs the CPU tier, a cpu device or ctx.graph = false", function()
    assert.is_false(bench.graphable({tier = "cpu", device = "cpu"}))
    assert.is_false(bench.graphable({tier = "gpu", device = "cpu"}))
    assert.is_false(bench.graphable({tier = "gpu", device = "cuda", graph = false}))
    assert.is_false(bench.graphable(nil))
    assert.are.equal(keng.cuda.is_available(), bench.graphable({tier = "gpu", device = "cuda"}))
  end)

  it("on the CPU tier hands back fn itself with one warm-up call", function()
    local calls = 0
    local step, warmup, info = bench.graphed(function() calls = calls + 1; return calls end, {tier = "cpu", device = "cpu"})
    assert.are.equal(1, warmup)
    assert.is_false(info.graph)
    assert.are.equal(1, step())
    assert.are.equal(2, step())
    local r = bench.run(step, {steps = 3, warmup = warmup, gc = false})
    assert.are.equal(3, r.steps)
    assert.are.equal(6, calls)
  end)
end)

-- ---- numerics guard and linear on the cpu (the cuda side: tests/gpu/compare.lua) -------------------

describe("numerics guard and linear (cpu)", function()
  it("the guard still raises on a cpu NaN and passes finite outputs", function()
    local was = keng.debug.check_numerics(true)
    local ok, err = pcall(function() return keng.tensor({-1, 4}):sqrt() end)
    local fine = keng.tensor({1, 4}):sqrt()
    keng.debug.check_numerics(was)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("check_numerics", 1, true))
    H.close(fine, keng.tensor({1, 2}), 0)
  end)

  it("linear with a bias equals matmul + bias with and without grad mode", function()
    keng.manual_seed(8)
    local x, w, b = keng.randn({3, 4, 5}), keng.randn({6, 5}), keng.randn({6})
    local ref = x:matmul(w:transpose(1, 2)) + b
    H.close(keng.linear(x, w, b), ref, 0)
    keng.no_grad(function() H.close(keng.linear(x, w, b), ref, 0) end)
  end)
end)
