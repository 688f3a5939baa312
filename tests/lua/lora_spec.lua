-- lora_spec.lua — keng.lora: adapter names, shapes and initialisation; the adapted forward
-- against x·Wᵀ + b + (x·A)·B·scale computed here; training through fit leaves every base weight
-- bit-identical and changes only the adapters; the trainable count is rank·(in + out) per
-- target; merge gives the adapted model's outputs; adapters save and load on their own.
-- Shape letters: B batch, T length, C features, r rank.
local keng = require "keng"
local H = require "helper"
local nn = require "keng.nn"
local optim = require "keng.optim"
local train = require "keng.train"
local lora = require "keng.lora"

-- query and value of different widths, plus an untargeted out projection
local Block = nn.Module:extend("LoraBlock")
function Block:init()
  self.query = nn.Linear(6, 8)
  self.value = nn.Linear(6, 4)
  self.out = nn.Linear(12, 3)
end
function Block:forward(x)                                      -- x [B, 6] -> [B, 3]
  return self.out(keng.cat({self.query(x):tanh(), self.value(x)}, -1))
end

-- a small encoder whose attention projections are named query/key/value/out
local Enc = nn.Module:extend("LoraEncoder")
function Enc:init(C)
  self.ln = nn.LayerNorm(C)
  self.attn = nn.MultiHeadAttention(C, 2)
  self.head = nn.Linear(C, 1)
end
function Enc:forward(x)                                        -- x [B, T, C] -> [B, 1]
  local h = x + self.attn(self.ln(x))
  return self.head(h:mean(2))
end

local function snapshot(m)
  local out = {}
  for k, t in pairs(m:state_dict()) do out[k] = t:clone() end
  return out
end

local function bit_equal(a, b) return a:ne(b):sum():item() == 0 end

describe("lora.enable", function()
  it("adds lora_a [in, r] (he_uniform) and lora_b [r, out] (zeros) to the targets only", function()
    keng.manual_seed(1)
    local m = Block()
    lora.enable(m, {rank = 3})
    local p = m:named_parameters()
    assert.are.same({6, 3}, p["query.lora_a"].shape)
    assert.are.same({3, 8}, p["query.lora_b"].shape)
    assert.are.same({6, 3}, p["value.lora_a"].shape)
    assert.are.same({3, 4}, p["value.lora_b"].shape)
    assert.is_nil(p["out.lora_a"])
    local limit = math.sqrt(6 / 6)                             -- he_uniform with fan_in = in
    assert.is_true(p["query.lora_a"]:abs():max():item() <= limit)
    assert.is_true(p["query.lora_a"]:abs():max():item() > limit / 4, "A looks unset")
    assert.are.equal(0, p["query.lora_b"]:abs():sum():item())
    -- base names keep their form; adapters are in the state_dict too
    local sd = m:state_dict()
    for _, k in ipairs{"query.weight", "query.bias", "value.weight", "out.weight", "query.lora_a", "value.lora_b"} do
      assert.truthy(sd[k], k)
    end
  end)

  it("freezes everything else; trainable = rank·(in + out) per target", function()
    local m = Block()
    local total = m:num_params()
    lora.enable(m, {rank = 2, targets = {"query", "value"}})
    assert.are.equal(2 * (6 + 8) + 2 * (6 + 4), m:num_params{trainable = true})
    assert.are.equal(total + 2 * (6 + 8) + 2 * (6 + 4), m:num_params())
    for name, t in pairs(m:named_parameters()) do
      assert.are.equal(name:find("lora_", 1, true) ~= nil, t.requires_grad, name)
    end
  end)

  it("starts from the base model's outputs and computes x·Wᵀ + b + (x·A)·B·alpha/r", function()
    keng.manual_seed(2)
    local m = Block()
    local x = keng.randn({5, 6})
    local y0 = m(x)
    lora.enable(m, {rank = 2, alpha = 8})
    assert.is_true(bit_equal(m(x), y0), "B = 0 must leave the outputs unchanged")
    keng.no_grad(function() m.query.lora_b:copy_(keng.randn({2, 8})); m.value.lora_b:copy_(keng.randn({2, 4})) end)
    local function ref(l) return keng.linear(x, l.weight, l.bias) + x:matmul(l.lora_a):matmul(l.lora_b) * (8 / 2) end
    H.close(m.query(x), ref(m.query), 1e-5, "query")
    H.close(m.value(x), ref(m.value), 1e-5, "value")
    local want = m.out(keng.cat({ref(m.query):tanh(), ref(m.value)}, -1))
    H.close(m(x), want, 1e-5, "block")
    -- without alpha there is no scaling (Keras)
    local m2 = Block()
    lora.enable(m2, {rank = 4})
    keng.no_grad(function() m2.query.lora_b:copy_(keng.randn({4, 8})) end)
    local q = m2.query
    H.close(q(x), keng.linear(x, q.weight, q.bias) + x:matmul(q.lora_a):matmul(q.lora_b), 1e-5, "alpha nil")
  end)

  it("names the Linear layers when no target matches", function()
    H.raises(function() lora.enable(Block(), {targets = {"wq"}}) end,
      "no Linear layer is named wq (Linear layers: query, value, out)")
    H.raises(function() lora.enable(Block(), {rank = 0}) end, "rank must be a positive integer")
  end)
end)

describe("LoRA training", function()
  for _, name in ipairs{"SGD", "Adam", "AdamW"} do
    it("changes only the adapters (base weights bit-identical) with " .. name, function()
      keng.manual_seed(3)
      local m = Enc(8)
      local x = keng.randn({32, 5, 8})
      local y = x:select(3, 1):mean(2, true) * 2                 -- [32, 1]
      lora.enable(m, {rank = 2, targets = {"query", "value"}})
      local before = snapshot(m)
      local trainable = {}
      for _, p in ipairs(m:parameters()) do if p.requires_grad then trainable[#trainable + 1] = p end end
      assert.are.equal(4, #trainable)
      local opt = ({SGD = function(p) return optim.SGD(p, {lr = 0.1, momentum = 0.9}) end,
                    Adam = function(p) return optim.Adam(p, {lr = 0.01}) end,
                    AdamW = function(p) return optim.AdamW(p, {lr = 0.01}) end})[name](m:parameters())
      local h = train.fit(m, {x = x, y = y}, {loss = "mse", optimizer = opt, epochs = 8, batch_size = 8, verbose = 0})
      assert.is_true(h:last("loss") < h.history.loss[1], string.format("loss %.4f -> %.4f", h.history.loss[1], h:last("loss")))
      local after = m:state_dict()
      for k, t in pairs(before) do
        if k:find("lora_", 1, true) then
          assert.is_false(bit_equal(after[k], t), k .. " did not train")
        else
          assert.is_true(bit_equal(after[k], t), k .. " changed")
        end
      end
    end)
  end

  it("the default fit optimizer trains the adapters too (AdamW over trainable params)", function()
    keng.manual_seed(4)
    local m = Block()
    local x = keng.randn({16, 6})
    lora.enable(m, {rank = 2})
    local w = m.query.weight:clone()
    train.fit(m, {x = x, y = keng.zeros({16, 3})}, {loss = "mse", epochs = 2, batch_size = 8, verbose = 0})
    assert.is_true(bit_equal(m.query.weight, w))
    assert.is_true(m.query.lora_b:abs():sum():item() > 0)
  end)
end)

describe("lora.merge", function()
  it("folds A·B into W: the same outputs, no adapters, the old requires_grad flags", function()
    keng.manual_seed(5)
    local m = Enc(8)
    local x = keng.randn({4, 5, 8})
    m.head.bias.requires_grad = false                            -- frozen before enable: stays frozen
    lora.enable(m, {rank = 2, alpha = 4})
    keng.no_grad(function()
      for _, l in ipairs{m.attn.query, m.attn.value} do l.lora_b:copy_(keng.randn(l.lora_b.shape) * 0.3) end
    end)
    local adapted = m(x)
    local base_before = m.attn.query.weight:clone()
    lora.merge(m)
    H.close(m(x), adapted, 1e-5, "merged outputs")
    assert.is_false(bit_equal(m.attn.query.weight, base_before), "W must absorb A·B")
    for name, t in pairs(m:named_parameters()) do
      assert.is_nil(name:find("lora_", 1, true), name .. " survived merge")
      assert.are.equal(name ~= "head.bias", t.requires_grad, name)
    end
    assert.is_nil(rawget(m.attn.query, "forward"))
    H.raises(function() lora.merge(m) end, "lora.merge: the model has no LoRA adapters")
  end)
end)

describe("adapters on their own", function()
  it("save with keng.save and load into a fresh model with the same base", function()
    keng.manual_seed(6)
    local m = Block()
    local base = snapshot(m)
    lora.enable(m, {rank = 2})
    keng.no_grad(function() m.query.lora_b:copy_(keng.randn({2, 8})); m.value.lora_b:copy_(keng.randn({2, 4})) end)
    local ad = lora.adapters(m)
    local names = {}
    for k in pairs(ad) do names[#names + 1] = k end
    table.sort(names)
    assert.are.same({"query.lora_a", "query.lora_b", "value.lora_a", "value.lora_b"}, names)
    local path = os.tmpname() .. ".safetensors"
    keng.save(path, ad, {rank = "2"})
    local loaded, meta = keng.load(path)
    os.remove(path)
    assert.are.equal("2", meta.rank)
    local m2 = Block()
    m2:load_state_dict(base)
    lora.enable(m2, {rank = 2})
    lora.load_adapters(m2, loaded)
    local x = keng.randn({3, 6})
    H.close(m2(x), m(x), 0, "reloaded adapters")
    -- mismatches are named
    local bad = {}
    for k, t in pairs(loaded) do bad[k] = t end
    bad["query.lora_a"] = nil
    bad["extra.lora_a"] = keng.zeros({1})
    H.raises(function() lora.load_adapters(m2, bad) end, "missing query.lora_a; unexpected extra.lora_a")
    bad = {}
    for k, t in pairs(loaded) do bad[k] = t end
    bad["value.lora_b"] = keng.zeros({2, 5})
    H.raises(function() lora.load_adapters(m2, bad) end, "value.lora_b: checkpoint [2,5], model [2,4]")
  end)
end)
