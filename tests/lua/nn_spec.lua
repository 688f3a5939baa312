-- nn_spec.lua — keng.nn: the Module base (registration, names, traversal, train/eval, to,
-- state_dict, meta, summary), each layer's forward against a reference built in this file
-- from engine ops or by hand, initialiser statistics, precision policies, and training an MLP
-- with a plain SGD loop. Shape letters: B batch, T length, C features, H heads, D head dim.
local keng = require "keng"
local nn = require "keng.nn"
local precision = require "keng.precision"
local H = require "helper"

local function names(m)
  local out = {}
  for _, e in ipairs(m:named_parameter_list()) do out[#out + 1] = e[1] end
  return out
end

local function same_shape(t, shape) assert.are.same(shape, t.shape) end

-- a user module with a nested submodule, its own parameter and a buffer
local Block = nn.Module:extend("Block")
function Block:init(d)
  self.query = nn.Linear(d, d)
  self.scale = self:param("scale", {d}, "ones")
  self.value = nn.Linear(d, d, {bias = false})
  self:buffer("steps", keng.zeros({1}))
end
function Block:forward(x) return self.query(x) * self.scale + self.value(x) end

describe("Module registration", function()
  it("names parameters in assignment order, dotted and depth first", function()
    local m = nn.Sequential(Block(3), nn.ReLU(), nn.Linear(3, 2))
    assert.are.same({"1.query.weight", "1.query.bias", "1.scale", "1.value.weight", "3.weight", "3.bias"}, names(m))
    local sd_keys = m:state_dict_keys()
    assert.are.same({"1.query.weight", "1.query.bias", "1.scale", "1.value.weight", "1.steps", "3.weight", "3.bias"}, sd_keys)
    assert.are.equal(6, #m:parameters())
    local np = m:named_parameters()
    assert.are.equal(m[1].query.weight, np["1.query.weight"])
    assert.are.equal(m[3].bias, np["3.bias"])
    assert.are.equal(3, #m)
    assert.are.equal(3, #m:children())
    -- modules(): self first, then depth first
    local kinds = {}
    for _, mod in ipairs(m:modules()) do kinds[#kinds + 1] = mod.__name end
    assert.are.same({"Sequential", "Block", "Linear", "Linear", "ReLU", "Linear"}, kinds)
  end)

  it("registers parameters of a user class as leaves that require grad", function()
    local b = Block(4)
    for _, e in ipairs(b:named_parameter_list()) do
      assert.is_true(e[2].requires_grad, e[1])
      assert.is_true(e[2].is_leaf, e[1])
    end
    same_shape(b.query.weight, {4, 4})
    same_shape(b.scale, {4})
    assert.is_nil(b.value.bias)
    assert.are.equal(4 * 4 + 4 + 4 + 4 * 4, b:num_params())
  end)

  it("keeps a re-assigned name in place, unregisters on nil, ignores plain fields", function()
    local M = nn.Module:extend("M")
    function M:init()
      self.a = nn.Linear(2, 2)
      self.b = nn.Linear(2, 2)
      self.size = 2                                  -- a plain field
      self.note = keng.zeros({2})                    -- no requires_grad: a plain field
      self.w = keng.ones({2}, {requires_grad = true}) -- a leaf that requires grad: a parameter
    end
    local m = M()
    assert.are.same({"a.weight", "a.bias", "b.weight", "b.bias", "w"}, names(m))
    m.a = nn.Linear(2, 2, {bias = false})
    assert.are.same({"a.weight", "b.weight", "b.bias", "w"}, names(m))
    m.b = nil
    assert.are.same({"a.weight", "w"}, names(m))
    assert.is_nil(m.b)
    assert.are.equal(2, m.size)
    m.layers = {nn.Linear(2, 2), nn.Tanh()}         -- a plain list of modules becomes a ModuleList
    assert.are.equal("ModuleList", m.layers.__name)
    assert.are.same({"a.weight", "w", "layers.1.weight", "layers.1.bias"}, names(m))
    H.raises(function() m.w = "x" end, "cannot assign a string to 'w'")
  end)

  it("ModuleList indexes, appends and iterates", function()
    local ml = nn.ModuleList({nn.Linear(2, 3), nn.Linear(3, 4)})
    ml:append(nn.Linear(4, 5))
    assert.are.equal(3, #ml)
    local outs = {}
    for i, l in ipairs(ml) do outs[i] = l.out_features end
    assert.are.same({3, 4, 5}, outs)
    assert.are.same({"1.weight", "1.bias", "2.weight", "2.bias", "3.weight", "3.bias"}, names(ml))
  end)

  it("ModuleList{first = 0} names its elements as PyTorch does (the 0-based rule)", function()
    local ml = nn.ModuleList({nn.Linear(2, 3), nn.Linear(3, 4)}, {first = 0})
    ml:append(nn.Linear(4, 5))
    assert.are.equal(3, #ml)
    assert.are.equal(3, ml[0].out_features)
    assert.are.equal(5, ml[2].out_features)
    assert.are.same({"0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"}, names(ml))
    assert.are.equal(0, #nn.ModuleList({}, {first = 0}))
    H.raises(function() nn.ModuleList({}, {first = 2}) end, "ModuleList: first must be 0 or 1, got 2")
    H.raises(function() nn.ModuleList({}, {frist = 0}) end, "unknown option 'frist'")
  end)

  it("counts tied parameters once and keeps both names in state_dict", function()
    local M = nn.Module:extend("Tied")
    function M:init()
      self.embed = nn.Embedding(5, 3)
      self.head = nn.Linear(3, 5, {bias = false})
      self.head.weight = self.embed.weight
    end
    local m = M()
    assert.are.equal(15, m:num_params())
    assert.are.same({"embed.weight"}, names(m))
    local sd = m:state_dict()
    assert.is_not_nil(sd["head.weight"])
    m:to("bf16")
    assert.are.equal(m.embed.weight, m.head.weight)
    assert.are.equal("bf16", m.head.weight.dtype)
  end)

  it("raises a clear error for an unknown initialiser or a bad shape", function()
    local M = nn.Module:extend("Bad")
    function M:init(init, shape) self:param("w", shape or {2}, init) end
    H.raises(function() M("nope") end, "unknown initialiser 'nope'")
    H.raises(function() M("zeros", {2, 1.5}) end, "param: 'w': size 2 of [2,1.5]")
    H.raises(function() M(function() return keng.zeros({3}) end) end, "returned shape [3], expected [2]")
    H.raises(function() nn.Module():forward() end, "Module does not define forward")
  end)

  it("raises on an initialiser option it does not know, naming it and the valid ones", function()
    H.raises(function() nn.initializers.normal({2}, {stdd = 1}) end,
      "normal: unknown option 'stdd' (valid: device, dtype, mean, std, stddev)")
    H.raises(function() nn.initializers.kaiming_uniform({2, 2}, {fan_out = 3}) end,
      "he_uniform: unknown option 'fan_out' (valid: device, dtype, fan_in)")
    local M = nn.Module:extend("Opts")
    function M:init(init, opts, shape) self:param("w", shape or {2}, init, opts) end
    -- std on a uniform draw used to be dropped without a word
    H.raises(function() M("uniform", {std = 0.02}) end,
      "param: 'w' (uniform): unknown option 'std' (valid: device, dtype, high, low, maxval, minval, requires_grad)")
    H.raises(function() M(nil, {std = 0.02}) end, "param: 'w' (glorot_uniform): unknown option 'std'")
    H.raises(function() M("zeros", {normalize = false}) end, "param: 'w' (zeros): unknown option 'normalize'")
    H.raises(function() M("zeros", {std = 1}, keng.ones({2})) end, "param: 'w': unknown option 'std'")
    H.raises(function() nn.Linear(2, 3, {std = 0.02}) end, "unknown option 'std'")
    H.raises(function() nn.Embedding(4, 3, {std = 0.02}) end, "param: 'weight' (uniform): unknown option 'std'")
    -- known options still apply; a user's function gets whatever it was given
    keng.manual_seed(3)
    local m = M("constant", {value = 2.5, requires_grad = false})
    assert.are.same({2.5, 2.5}, m.w:tolist())
    assert.is_false(m.w.requires_grad)
    local seen
    M(function(shape, o) seen = o.scale; return keng.full(shape, o.scale) end, {scale = 4})
    assert.are.equal(4, seen)
  end)
end)

describe("layers", function()
  it("Linear computes x·Wᵀ + b", function()
    keng.manual_seed(1)
    local l = nn.Linear(4, 3)
    local x = keng.randn({2, 5, 4})
    local ref = x:matmul(l.weight:transpose(1, 2)) + l.bias
    H.close(l(x), ref, 1e-5, "linear")
    same_shape(l.weight, {3, 4})
    local nb = nn.Linear(4, 3, {bias = false})
    H.close(nb(x), x:matmul(nb.weight:transpose(1, 2)), 1e-5, "no bias")
    H.raises(function() l(keng.randn({2, 5})) end, "Linear(4 -> 3): input [2,5] has 5 features, expected 4")
  end)

  it("Embedding picks rows by 0-based id", function()
    keng.manual_seed(2)
    local e = nn.Embedding(6, 3)
    local ids = keng.tensor({{0, 5}, {2, 2}})
    local y = e(ids)
    same_shape(y, {2, 2, 3})
    local w = e.weight:tolist()
    H.close(y, {{w[1], w[6]}, {w[3], w[3]}}, 0, "rows")
  end)

  it("LayerNorm, RMSNorm and GroupNorm match composites of engine ops", function()
    keng.manual_seed(3)
    local x = keng.randn({2, 3, 6}) * 2 + 0.5
    local ln = nn.LayerNorm(6)
    keng.no_grad(function() ln.weight:copy_(keng.randn({6})); ln.bias:copy_(keng.randn({6})) end)
    local mu = x:mean(-1, true)
    local var = ((x - mu) ^ 2):mean(-1, true)
    H.close(ln(x), (x - mu) / (var + 1e-5):sqrt() * ln.weight + ln.bias, 1e-5, "layer norm")

    local rms = nn.RMSNorm(6)
    keng.no_grad(function() rms.weight:copy_(keng.randn({6})) end)
    local r = (x ^ 2):mean(-1, true) + 1e-6
    H.close(rms(x), x / r:sqrt() * rms.weight, 1e-5, "rms norm")

    local gemma = nn.RMSNorm(6, {unit_offset = true})
    H.close(gemma.weight, keng.zeros({6}), 0, "unit_offset starts at zero")
    keng.no_grad(function() gemma.weight:copy_(keng.randn({6})) end)
    H.close(gemma(x), x / r:sqrt() * (gemma.weight + 1), 1e-5, "rms norm (1 + w)")

    local gn = nn.GroupNorm(2, 4)
    keng.no_grad(function() gn.weight:copy_(keng.randn({4})); gn.bias:copy_(keng.randn({4})) end)
    local xi = keng.randn({3, 4, 5})
    local g = xi:reshape{3, 2, 10}
    local gm = g:mean(-1, true)
    local gv = ((g - gm) ^ 2):mean(-1, true)
    local ref = ((g - gm) / (gv + 1e-5):sqrt()):reshape{3, 4, 5} * gn.weight:reshape{4, 1} + gn.bias:reshape{4, 1}
    H.close(gn(xi), ref, 1e-5, "group norm")
    H.raises(function() nn.GroupNorm(3, 4) end, "4 channels do not split into 3 groups")
  end)

  it("Conv2d matches a convolution written by hand", function()
    keng.manual_seed(4)
    local conv = nn.Conv2d(2, 3, 3, {padding = 1})
    same_shape(conv.weight, {3, 2, 3, 3})
    local x = keng.randn({1, 2, 4, 5})
    local y = conv(x)
    same_shape(y, {1, 3, 4, 5})
    local xs, w, b = x:tolist()[1], conv.weight:tolist(), conv.bias:tolist()
    local ref = {}
    for o = 1, 3 do
      ref[o] = {}
      for i = 1, 4 do
        ref[o][i] = {}
        for j = 1, 5 do
          local s = b[o]
          for c = 1, 2 do for di = 1, 3 do for dj = 1, 3 do
            local ii, jj = i + di - 2, j + dj - 2
            if ii >= 1 and ii <= 4 and jj >= 1 and jj <= 5 then s = s + xs[c][ii][jj] * w[o][c][di][dj] end
          end end end
          ref[o][i][j] = s
        end
      end
    end
    H.close(y[1], ref, 1e-5, "conv2d")
    local strided = nn.Conv2d(2, 4, {3, 1}, {stride = 2, groups = 2, bias = false})
    same_shape(strided.weight, {4, 1, 3, 1})
    H.close(strided(x), nn.functional.conv2d(x, strided.weight, nil, {stride = 2, groups = 2}), 1e-6, "groups")
    same_shape(nn.Conv2d(2, 2, 5, {padding = "same"})(x), {1, 2, 4, 5})
  end)

  it("ConvTranspose2d inverts the shape of a strided conv and matches the scatter by hand", function()
    keng.manual_seed(5)
    local up = nn.ConvTranspose2d(2, 3, 2, {stride = 2})
    same_shape(up.weight, {2, 3, 2, 2})
    local x = keng.randn({1, 2, 3, 3})
    local y = up(x)
    same_shape(y, {1, 3, 6, 6})
    -- stride 2, kernel 2: every output pixel receives exactly one input pixel
    local xs, w, b = x:tolist()[1], up.weight:tolist(), up.bias:tolist()
    local ref = {}
    for o = 1, 3 do
      ref[o] = {}
      for i = 1, 6 do
        ref[o][i] = {}
        for j = 1, 6 do
          local s = b[o]
          local si, ki, sj, kj = (i - 1) // 2 + 1, (i - 1) % 2 + 1, (j - 1) // 2 + 1, (j - 1) % 2 + 1
          for c = 1, 2 do s = s + xs[c][si][sj] * w[c][o][ki][kj] end
          ref[o][i][j] = s
        end
      end
    end
    H.close(y[1], ref, 1e-5, "conv_transpose2d")
  end)

  it("activations match their formulas", function()
    local x = keng.tensor({-3, -1, -0.2, 0, 0.5, 2})
    local xs = x:tolist()
    local function map(f) local o = {} for i, v in ipairs(xs) do o[i] = f(v) end return o end
    local function erf(v)  -- Abramowitz-Stegun 7.1.26 is too coarse; integrate instead
      local n, s = 2000, 0
      for k = 0, n - 1 do local t = (k + 0.5) * v / n; s = s + math.exp(-t * t) end
      return 2 / math.sqrt(math.pi) * s * v / n
    end
    local sig = function(v) return 1 / (1 + math.exp(-v)) end
    H.close(nn.ReLU()(x), map(function(v) return math.max(v, 0) end), 1e-6, "relu")
    H.close(nn.SiLU()(x), map(function(v) return v * sig(v) end), 1e-5, "silu")
    H.close(nn.Tanh()(x), map(function(v) return (math.exp(2 * v) - 1) / (math.exp(2 * v) + 1) end), 1e-5, "tanh")
    H.close(nn.QuickGELU()(x), map(function(v) return v * sig(1.702 * v) end), 1e-5, "quick gelu")
    H.close(nn.GELU()(x), map(function(v) return 0.5 * v * (1 + erf(v / math.sqrt(2))) end), 1e-5, "gelu")
    H.close(nn.GELU({approximate = "tanh"})(x), map(function(v)
      local u = math.sqrt(2 / math.pi) * (v + 0.044715 * v ^ 3)
      return 0.5 * v * (1 + (math.exp(2 * u) - 1) / (math.exp(2 * u) + 1))
    end), 1e-5, "gelu tanh")
    H.close(nn.Softplus()(x), map(function(v) return math.log(1 + math.exp(v)) end), 1e-6, "softplus")
    local sp = nn.Softplus({beta = 2, threshold = 1})
    H.close(sp(x), map(function(v) return 2 * v > 1 and v or math.log(1 + math.exp(2 * v)) / 2 end), 1e-6,
      "softplus beta 2 threshold 1")
    assert.are.equal("Softplus(beta=2, threshold=1)", tostring(sp))
    H.close(nn.functional.softplus(x, {beta = 2, threshold = 1}), sp(x), 0, "F.softplus")
    H.raises(function() nn.Softplus({beta = 0}) end, "Softplus: beta must be a finite non-zero number, got 0")
    H.raises(function() nn.Softplus({threshold = "x"}) end, "Softplus: threshold must be a number, got x")
    H.raises(function() nn.Softplus({betta = 2}) end, "Softplus: unknown option 'betta' (valid: beta, threshold)")
  end)

  it("Sequential chains its children", function()
    keng.manual_seed(6)
    local a, b = nn.Linear(3, 4), nn.Linear(4, 2)
    local s = nn.Sequential(a, nn.Tanh(), b)
    local x = keng.randn({5, 3})
    H.close(s(x), b(a(x):tanh()), 1e-6, "sequential")
    local s2 = nn.Sequential({nn.Linear(3, 3)}):append(nn.ReLU())
    assert.are.equal(2, #s2)
    H.raises(function() nn.Sequential(a, 3) end, "argument 2 is a number, not a module")
  end)

  it("MultiHeadAttention matches softmax(QKᵀ/√D)V by hand, causal and grouped-query", function()
    keng.manual_seed(7)
    local B, T, C, Hh, Hkv = 2, 5, 8, 4, 2
    local D = C // Hh
    local mha = nn.MultiHeadAttention(C, Hh, {kv_heads = Hkv, causal = true})
    same_shape(mha.key.weight, {Hkv * D, C})
    local x = keng.randn({B, T, C})
    local q = keng.linear(x, mha.query.weight, mha.query.bias):reshape{B, T, Hh, D}:permute{1, 3, 2, 4}
    local k = keng.linear(x, mha.key.weight, mha.key.bias):reshape{B, T, Hkv, D}:permute{1, 3, 2, 4}
    local v = keng.linear(x, mha.value.weight, mha.value.bias):reshape{B, T, Hkv, D}:permute{1, 3, 2, 4}
    k, v = k:repeat_interleave(Hh // Hkv, 2), v:repeat_interleave(Hh // Hkv, 2)   -- [B, H, T, D]
    local scores = q:matmul(k:transpose(-1, -2)) / math.sqrt(D)                   -- [B, H, T, T]
    local allowed = keng.ones({T, T}):tril(0):gt(0)
    scores = keng.where(allowed, scores, -1e30)
    local a = keng.softmax(scores, -1):matmul(v)                                  -- [B, H, T, D]
    local ref = keng.linear(a:permute{1, 3, 2, 4}:reshape{B, T, C}, mha.out.weight, mha.out.bias)
    H.close(mha(x), ref, 1e-5, "mha")
    assert.are.same({"query.weight", "query.bias", "key.weight", "key.bias", "value.weight", "value.bias",
      "out.weight", "out.bias"}, names(mha))
    -- cross-attention: keys from a context of another length
    local ctx = keng.randn({B, 3, C})
    same_shape(mha(x, {context = ctx, causal = false}), {B, T, C})
  end)

  it("MultiHeadAttention takes a checkpoint's names and making order", function()
    local m = nn.MultiHeadAttention(8, 2, {names = {query = "q_proj", key = "k_proj", value = "v_proj", out = "out_proj"},
      order = {"key", "value", "query", "out"}})
    assert.are.same({"k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias", "q_proj.weight", "q_proj.bias",
      "out_proj.weight", "out_proj.bias"}, names(m))
    local x = keng.randn({2, 3, 8})
    local ref = nn.MultiHeadAttention(8, 2)
    keng.no_grad(function()
      for _, r in ipairs{{"query", "q_proj"}, {"key", "k_proj"}, {"value", "v_proj"}, {"out", "out_proj"}} do
        ref[r[1]].weight:copy_(m[r[2]].weight)
        ref[r[1]].bias:copy_(m[r[2]].bias)
      end
    end)
    H.close(m(x), ref(x), 0, "renamed")
  end)

  it("MultiHeadAttention with key/value widths of their own, out_bias and a 'list.0' name (diffusers')", function()
    keng.manual_seed(9)
    local B, T, S, C, Hh, D = 2, 4, 3, 8, 2, 3
    local m = nn.MultiHeadAttention(C, Hh, {head_dim = D, kdim = 6, vdim = 5, bias = false, out_bias = true,
      names = {query = "to_q", key = "to_k", value = "to_v", out = "to_out.0"}})
    assert.are.same({"to_q.weight", "to_k.weight", "to_v.weight", "to_out.0.weight", "to_out.0.bias"}, names(m))
    same_shape(m.to_k.weight, {Hh * D, 6})
    same_shape(m.to_v.weight, {Hh * D, 5})
    same_shape(m.to_out[0].weight, {C, Hh * D})
    local x, ctx, val = keng.randn({B, T, C}), keng.randn({B, S, 6}), keng.randn({B, S, 5})
    local function heads(t, L) return t:reshape{B, L, Hh, D}:permute{1, 3, 2, 4} end
    local q = heads(keng.linear(x, m.to_q.weight), T)
    local k = heads(keng.linear(ctx, m.to_k.weight), S)
    local v = heads(keng.linear(val, m.to_v.weight), S)
    local a = keng.softmax(q:matmul(k:transpose(-1, -2)) / math.sqrt(D), -1):matmul(v)   -- [B, H, T, D]
    local ref = keng.linear(a:permute{1, 3, 2, 4}:reshape{B, T, Hh * D}, m.to_out[0].weight, m.to_out[0].bias)
    H.close(m(x, {context = ctx, value = val}), ref, 1e-5, "kdim / vdim / value")
    H.raises(function() nn.MultiHeadAttention(C, Hh, {names = {out = "to_out.1"}}) end, "must end in .0, got 'to_out.1'")
  end)

  it("TransformerEncoderLayer is post-LN or pre-LN around attention and the MLP, by hand", function()
    keng.manual_seed(3)
    local B, T, C, Hh, F = 2, 4, 8, 2, 16
    local x = keng.randn({B, T, C})
    local mask = keng.tensor({{true, true, true, false}, {true, true, true, true}}):reshape{B, 1, 1, T}
    local post = nn.TransformerEncoderLayer(C, Hh, F, {eps = 1e-6, activation = keng.relu})
    assert.are.same({"attn.query.weight", "attn.query.bias", "attn.key.weight", "attn.key.bias", "attn.value.weight",
      "attn.value.bias", "attn.out.weight", "attn.out.bias", "attn_norm.weight", "attn_norm.bias", "fc1.weight",
      "fc1.bias", "fc2.weight", "fc2.bias", "mlp_norm.weight", "mlp_norm.bias"}, names(post))
    local function mlp(l, m, h) return m.fc2(keng.relu(m.fc1(h))) end
    local h = post.attn_norm(x + post.attn(x, {mask = mask}))
    H.close(post(x, {mask = mask}), post.mlp_norm(h + mlp(post, post, h)), 0, "post-LN")
    local pre = nn.TransformerEncoderLayer(C, Hh, F, {norm_first = true, causal = true, activation = keng.relu,
      names = {attn = "self_attn", attn_norm = "ln1", mlp = "mlp", mlp_norm = "ln2"}})
    assert.are.equal("mlp.fc1.weight", names(pre)[11])
    h = x + pre.self_attn(pre.ln1(x))
    H.close(pre(x), h + mlp(pre, pre.mlp, pre.ln2(h)), 0, "pre-LN")
    assert.is_true(pre.self_attn.causal)
    -- dropout acts on both branches while training, not at all in eval
    local d = nn.TransformerEncoderLayer(C, Hh, F, {dropout = 0.5})
    d:eval()
    H.close(d(x), d.mlp_norm(d.attn_norm(x + d.attn(x)) + d.fc2(keng.gelu(d.fc1(d.attn_norm(x + d.attn(x)))))), 0,
      "eval: no dropout")
  end)

  it("TransformerEncoderLayer takes an attention module of the caller's (SAM's ViT), after its norm", function()
    keng.manual_seed(4)
    local C, F = 8, 16
    local att = nn.Linear(C, C)                                       -- any module called as att(x, attn_opts)
    local l = nn.TransformerEncoderLayer(C, 2, F, {norm_first = true, attention = att,
      names = {attn = "attn", attn_norm = "layer_norm1", mlp = "mlp", fc1 = "lin1", fc2 = "lin2", mlp_norm = "layer_norm2"}})
    assert.are.same({"layer_norm1.weight", "layer_norm1.bias", "attn.weight", "attn.bias", "mlp.lin1.weight",
      "mlp.lin1.bias", "mlp.lin2.weight", "mlp.lin2.bias", "layer_norm2.weight", "layer_norm2.bias"}, names(l))
    local x = keng.randn({2, 3, 3, C})                                -- [B, h, w, C]: leading dims pass through
    local h = x + att(l.layer_norm1(x))
    H.close(l(x), h + l.mlp.lin2(keng.gelu(l.mlp.lin1(l.layer_norm2(h)))), 0, "given attention")
  end)
end)

describe("initialisers", function()
  local function stats(t)
    local mean = t:mean():item()
    return mean, math.sqrt(((t - mean) ^ 2):mean():item()), t:min():item(), t:max():item()
  end

  it("follow Keras' defaults and ranges", function()
    keng.manual_seed(8)
    local l = nn.Linear(300, 200)
    local limit = math.sqrt(6 / (300 + 200))
    local mean, std, lo, hi = stats(l.weight)
    assert.is_true(lo >= -limit and hi <= limit, "glorot_uniform within the limit")
    assert.is_true(hi > 0.98 * limit and lo < -0.98 * limit, "glorot_uniform fills the range")
    assert.is_true(math.abs(mean) < 0.002)
    assert.is_true(math.abs(std - limit / math.sqrt(3)) < 0.002, "uniform std = limit/√3")
    H.close(l.bias, keng.zeros({200}), 0, "zero bias")

    local _, _, elo, ehi = stats(nn.Embedding(1000, 50).weight)
    assert.is_true(elo >= -0.05 and ehi <= 0.05 and ehi > 0.049, "embedding uniform(-0.05, 0.05)")

    local M = nn.Module:extend("Init")
    function M:init()
      self:param("hu", {200, 300}, "he_uniform")
      self:param("hn", {200, 300}, "he_normal")
      self:param("n", {200, 300}, "normal")
      self:param("o", {7}, "ones")
      self:param("c", {2}, function(shape) return keng.full(shape, 3) end)
      self:param("xn", {200, 300}, "xavier_uniform")
    end
    local m = M()
    local hl = math.sqrt(6 / 300)
    _, _, lo, hi = stats(m.hu)
    assert.is_true(lo >= -hl and hi <= hl and hi > 0.98 * hl, "he_uniform limit √(6/fan_in)")
    _, std, lo, hi = stats(m.hn)
    assert.is_true(math.abs(std - math.sqrt(2 / 300)) < 0.003, "he_normal std √(2/fan_in): " .. std)
    local cut = 2 * math.sqrt(2 / 300) / 0.87962566103423978
    assert.is_true(lo >= -cut - 1e-6 and hi <= cut + 1e-6, "he_normal truncated at 2 std")
    _, std = stats(m.n)
    assert.is_true(math.abs(std - 0.05) < 0.002, "normal std 0.05")
    H.close(m.o, keng.ones({7}), 0)
    H.close(m.c, {3, 3}, 0)
    _, _, lo, hi = stats(m.xn)
    assert.is_true(lo >= -limit and hi <= limit and hi > 0.98 * limit, "xavier is glorot")
    -- conv fans include the receptive field
    assert.are.same({2 * 9, 4 * 9}, {nn.initializers.fans({4, 2, 3, 3})})
  end)
end)

describe("train / eval", function()
  it("Dropout drops and rescales only in training mode", function()
    keng.manual_seed(9)
    local m = nn.Sequential(nn.Identity(), nn.Dropout(0.25))
    assert.is_true(m[2].training)
    local x = keng.ones({100, 100})
    local y = m(x)
    local zeros = y:eq(0):float():mean():item()
    assert.is_true(math.abs(zeros - 0.25) < 0.02, "drop rate " .. zeros)
    local kept = keng.where(y:gt(0), y, 1 / 0.75)
    H.close(kept, keng.full({100, 100}, 1 / 0.75), 1e-6, "kept values scaled by 1/(1-p)")
    m:eval()
    assert.is_false(m.training)
    assert.is_false(m[2].training)
    H.close(m(x), x, 0, "identity in eval")
    m:train()
    assert.is_true(m[2].training)
    m:train(false)
    assert.is_false(m[2].training)
  end)
end)

describe("state_dict", function()
  it("round-trips into a fresh model", function()
    keng.manual_seed(10)
    local function make() return nn.Sequential(Block(4), nn.LayerNorm(4), nn.Linear(4, 2)) end
    local a, b = make(), make()
    local x = keng.randn({3, 4})
    local ya = a(x)
    assert.is_true((ya - b(x)):abs():max():item() > 1e-3, "fresh models differ")
    keng.no_grad(function() a[1].steps:fill_(7) end)
    local res = b:load_state_dict(a:state_dict())
    assert.are.same({}, res.missing)
    H.close(b(x), ya, 0, "same output after loading")
    H.close(b[1].steps, {7}, 0, "buffer loaded")
    assert.is_true(b[1].query.weight.requires_grad)
    -- loading copies: the source is not aliased
    keng.no_grad(function() a[3].weight:fill_(0) end)
    assert.is_true(b[3].weight:abs():max():item() > 0)
  end)

  it("lists every missing and unexpected key and each shape mismatch", function()
    local m = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    local sd = m:state_dict()
    sd["1.bias"] = nil
    sd["2.weight"] = keng.zeros({2, 5})
    sd["extra.weight"] = keng.zeros({1})
    sd["1.scale"] = keng.zeros({1})
    local err = H.raises(function() m:load_state_dict(sd) end, 'missing keys: "1.bias"')
    assert.is_truthy(err:find('unexpected keys: "1.scale", "extra.weight"', 1, true), err)
    assert.is_truthy(err:find("size mismatch for 2.weight: checkpoint [2,5], model [2,4]", 1, true), err)
    -- non-strict: key problems are reported, shape mismatches still raise
    sd["2.weight"] = keng.zeros({2, 4})
    local res = m:load_state_dict(sd, {strict = false})
    assert.are.same({"1.bias"}, res.missing)
    assert.are.same({"1.scale", "extra.weight"}, res.unexpected)
    H.close(m[2].weight, keng.zeros({2, 4}), 0, "non-strict loads what matches")
    sd["2.weight"] = keng.zeros({3, 4})
    H.raises(function() m:load_state_dict(sd, {strict = false}) end, "size mismatch for 2.weight")
  end)

  it("skips non-persistent buffers", function()
    local M = nn.Module:extend("Buf")
    function M:init() self:buffer("kept", keng.ones({2})); self:buffer("cache", keng.ones({2}), {persistent = false}) end
    local sd = M():state_dict()
    assert.is_not_nil(sd.kept)
    assert.is_nil(sd.cache)
  end)
end)

describe("to", function()
  it("converts parameters in place of the fields, keeping leaves and requires_grad", function()
    keng.manual_seed(11)
    local m = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Embedding(5, 4))
    m[2].bias.requires_grad = false
    local before = m[1].weight:clone()
    local ret = m:to("bf16")
    assert.are.equal(m, ret)
    for _, e in ipairs(m:named_parameter_list()) do
      assert.are.equal("bf16", e[2].dtype, e[1])
      assert.is_true(e[2].is_leaf, e[1])
    end
    assert.is_true(m[1].weight.requires_grad)
    assert.is_false(m[2].bias.requires_grad)
    H.close(m[1].weight, before, 1e-2, "values kept to bf16 precision")
    -- a bf16 model takes f32 input and computes in bf16
    local y = m[1](keng.randn({2, 3}))
    assert.are.equal("bf16", y.dtype)
    y:float():sum():backward()
    assert.are.equal("bf16", m[1].weight.grad.dtype)
    m:to{dtype = "f32", device = "cpu"}
    assert.are.equal("f32", m[3].weight.dtype)
    H.raises(function() m:to(3) end, "to: a dtype, a device or {dtype=, device=} expected")
  end)
end)

describe("meta device", function()
  it("counts a 7B model's parameters without allocating", function()
    collectgarbage()
    local before = keng.memory_stats().allocated
    -- LLaMA-2-7B shapes: 32 blocks of attention and a gated MLP, untied embeddings
    local Llama = nn.Module:extend("Llama")
    function Llama:init(o)
      local C, F, V = 4096, 11008, 32000
      self.embed_tokens = nn.Embedding(V, C, o)
      self.layers = nn.ModuleList()
      for _ = 1, 32 do
        local blk = nn.Module()
        blk.input_layernorm = nn.RMSNorm(C, o)
        blk.self_attn = nn.MultiHeadAttention(C, 32, {bias = false, device = o.device})
        blk.post_attention_layernorm = nn.RMSNorm(C, o)
        blk.gate_proj = nn.Linear(C, F, {bias = false, device = o.device})
        blk.up_proj = nn.Linear(C, F, {bias = false, device = o.device})
        blk.down_proj = nn.Linear(F, C, {bias = false, device = o.device})
        self.layers:append(blk)
      end
      self.norm = nn.RMSNorm(C, o)
      self.lm_head = nn.Linear(C, V, {bias = false, device = o.device})
    end
    local m = Llama({device = "meta"})
    assert.are.equal(6738415616, m:num_params())
    assert.are.equal("meta", m.layers[7].gate_proj.weight.device)
    local s = m:summary({quiet = true, depth = 1})
    assert.is_truthy(s:find("Total params: 6,738,415,616", 1, true), s)
    -- a forward on meta tensors computes shapes only
    local y = m.layers[1].self_attn(keng.empty({1, 3, 4096}, {device = "meta"}))
    assert.are.same({1, 3, 4096}, y.shape)
    assert.are.equal(before, keng.memory_stats().allocated)
  end)

  it("materialises from a state dict", function()
    keng.manual_seed(12)
    local real = nn.Linear(3, 2)
    local meta = nn.Linear(3, 2, {device = "meta"})
    meta:load_state_dict(real:state_dict())
    assert.are.equal("cpu", meta.weight.device)
    assert.is_true(meta.weight.requires_grad and meta.weight.is_leaf)
    local x = keng.randn({4, 3})
    H.close(meta(x), real(x), 0, "same outputs")
  end)
end)

describe("summary", function()
  it("lists layers, output shapes and totals with thousands separators", function()
    local m = nn.Sequential(nn.Linear(100, 50), nn.ReLU(), nn.Linear(50, 10))
    m[3].bias.requires_grad = false
    m(keng.randn({8, 100}))
    local printed
    local s = m:summary({print_fn = function(t) printed = t end})
    assert.are.equal(s, printed)
    assert.is_truthy(s:find('Model: "Sequential"', 1, true))
    assert.is_truthy(s:find("1%s+Linear%s+%[8,50%]%s+5,050"), s)
    assert.is_truthy(s:find("2%s+ReLU%s+%[8,50%]%s+0"), s)
    assert.is_truthy(s:find("Total params: 5,560", 1, true), s)
    assert.is_truthy(s:find("Trainable params: 5,550", 1, true), s)
    assert.is_truthy(s:find("Frozen params: 10", 1, true), s)
    assert.are.equal(5550, m:num_params({trainable = true}))
  end)
end)

describe("precision policies", function()
  after_each(function() precision.set_policy("float32") end)

  it("bfloat16 makes parameters and outputs bf16", function()
    precision.set_policy("bfloat16")
    assert.are.equal("bfloat16", precision.policy())
    local l = nn.Linear(4, 3)
    assert.are.equal("bf16", l.weight.dtype)
    assert.are.equal("bf16", l(keng.randn({2, 4})).dtype)
    precision.set_policy("float32")
    assert.are.equal("f32", nn.Linear(4, 3).weight.dtype)
    H.raises(function() precision.set_policy("f8") end, "set_policy: unknown policy 'f8'")
  end)

  it("mixed_bfloat16 keeps f32 masters and computes in bf16", function()
    keng.manual_seed(13)
    precision.set_policy("mixed_bfloat16")
    local m = nn.Sequential(nn.Embedding(10, 8), nn.LayerNorm(8), nn.Linear(8, 4))
    local conv = nn.Conv2d(2, 2, 1)
    precision.set_policy("float32")
    for _, p in ipairs(m:parameters()) do assert.are.equal("f32", p.dtype) end
    local y = m(keng.tensor({{1, 2, 3}}))
    assert.are.equal("bf16", y.dtype)
    assert.are.equal("bf16", conv(keng.randn({1, 2, 3, 3})).dtype)
    -- close to the f32 computation
    local ref = keng.linear(keng.layer_norm(keng.embedding(keng.tensor({{1, 2, 3}}), m[1].weight),
      m[2].weight, m[2].bias), m[3].weight, m[3].bias)
    H.close(y, ref, 3e-2, "mixed vs f32")
    y:float():sum():backward()
    assert.are.equal("f32", m[3].weight.grad.dtype)
    assert.are.equal("f32", m[1].weight.grad.dtype)
    -- an explicit dtype overrides the policy
    precision.set_policy("mixed_bfloat16")
    local f64 = nn.Linear(2, 2, {dtype = "f64"})
    assert.are.equal("f64", f64(keng.randn({1, 2})).dtype)
  end)
end)

describe("training", function()
  it("gradients reach every parameter", function()
    keng.manual_seed(14)
    local M = nn.Module:extend("Tiny")
    function M:init()
      self.embed = nn.Embedding(7, 8)
      self.attn = nn.MultiHeadAttention(8, 2, {causal = true})
      self.norm = nn.RMSNorm(8)
      self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
      self.ln = nn.LayerNorm(8)
      self.head = nn.Linear(8, 7)
    end
    function M:forward(ids)
      local x = self.embed(ids)
      x = x + self.attn(self.norm(x))
      x = x + self.mlp(self.ln(x))
      return self.head(x)
    end
    local m = M()
    local ids = keng.randint(0, 7, {2, 5})
    keng.cross_entropy(m(ids):reshape{10, 7}, ids:reshape{10}):backward()
    for _, e in ipairs(m:named_parameter_list()) do
      assert.is_not_nil(e[2].grad, e[1] .. " has no gradient")
      assert.is_true(e[2].grad:abs():sum():item() > 0, e[1] .. " has a zero gradient")
    end
    m:zero_grad()
    assert.is_nil(m.head.weight.grad)
  end)

  it("predict delegates to keng.train", function()
    keng.manual_seed(16)
    local m = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5), nn.Linear(4, 2))
    local x = keng.randn({10, 3})
    local y = m:predict({x = x}, {batch_size = 4, verbose = 0})
    m:eval()
    H.close(y, m(x), 1e-6, "predict runs in eval mode over batches")
  end)

  it("a small MLP learns with a plain SGD loop", function()
    keng.manual_seed(15)
    -- two classes: inside or outside the circle of radius 1
    local N = 256
    local x = keng.randn({N, 2})
    local y = (x ^ 2):sum(2):gt(1):long()
    local m = nn.Sequential(nn.Linear(2, 32), nn.Tanh(), nn.Linear(32, 2))
    local loss
    for _ = 1, 300 do
      loss = keng.cross_entropy(m(x), y)
      m:zero_grad()
      loss:backward()
      keng.no_grad(function()
        for _, p in ipairs(m:parameters()) do p:sub_(p.grad * 0.5) end
      end)
    end
    assert.is_true(loss:item() < 0.25, "final loss " .. loss:item())
    local acc = m(x):argmax(2):eq(y):float():mean():item()
    assert.is_true(acc > 0.9, "accuracy " .. acc)
  end)
end)
