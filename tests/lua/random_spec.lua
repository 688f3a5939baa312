-- random_spec.lua — statistical specs for keng.rand / randn / randint (10^5 samples: means and
-- variances within several standard errors, ranges), manual_seed reproducibility, and the model
-- ops dropout (inverted, Philox mask, backward) and multinomial (frequencies, without-replacement
-- law, errors). Shapes: probs [V] or [B, V]; samples [n] or [B, n], 0-based i64.
local keng = require "keng"
local H = require "helper"

local N = 100000
local function P(list) return keng.tensor(list, {dtype = "f32"}) end

local function stats(list)
  local s, ss, lo, hi = 0, 0, math.huge, -math.huge
  for _, v in ipairs(list) do
    s = s + v
    if v < lo then lo = v end
    if v > hi then hi = v end
  end
  local mean = s / #list
  for _, v in ipairs(list) do ss = ss + (v - mean) ^ 2 end
  return mean, ss / (#list - 1), lo, hi
end

local function same(a, b)
  local fa, fb = H.flat(a), H.flat(b)
  if #fa ~= #fb then return false end
  for i = 1, #fa do if fa[i] ~= fb[i] then return false end end
  return true
end

describe("rand / randn / randint", function()
  it("rand is uniform on [0, 1)", function()
    keng.manual_seed(1)
    local t = keng.rand({N})
    assert.are.equal("f32", t.dtype)
    local mean, var, lo, hi = stats(t:tolist())
    -- standard errors: mean 0.29/316 = 9e-4, var ~ 2.7e-4
    assert.is_true(math.abs(mean - 0.5) < 0.005, "mean " .. mean)
    assert.is_true(math.abs(var - 1 / 12) < 0.002, "var " .. var)
    assert.is_true(lo >= 0 and hi < 1, "range " .. lo .. " " .. hi)
    assert.is_true(lo < 1e-3 and hi > 0.999, "covers the interval")
  end)

  it("rand stays below 1 after rounding to bf16, f16 and f64", function()
    keng.manual_seed(2)
    for _, dt in ipairs({"bf16", "f16", "f64"}) do
      local mean, _, lo, hi = stats(keng.rand({N}, {dtype = dt}):tolist())
      assert.is_true(lo >= 0 and hi < 1, dt .. " range " .. lo .. " " .. hi)
      assert.is_true(math.abs(mean - 0.5) < 0.01, dt .. " mean " .. mean)
    end
  end)

  it("randn is standard normal", function()
    keng.manual_seed(3)
    for _, dt in ipairs({"f32", "f64"}) do
      local list = keng.randn({N}, {dtype = dt}):tolist()
      local mean, var = stats(list)
      -- standard errors: mean 3.2e-3, var 4.5e-3
      assert.is_true(math.abs(mean) < 0.02, dt .. " mean " .. mean)
      assert.is_true(math.abs(var - 1) < 0.025, dt .. " var " .. var)
      local inside, tail = 0, 0
      for _, v in ipairs(list) do
        if math.abs(v) < 1 then inside = inside + 1 end
        if v > 2 then tail = tail + 1 end
      end
      assert.is_true(math.abs(inside / N - 0.6827) < 0.01, dt .. " P(|x|<1) " .. inside / N)
      assert.is_true(math.abs(tail / N - 0.02275) < 0.003, dt .. " P(x>2) " .. tail / N)
    end
  end)

  it("randint draws every integer of [lo, hi) evenly", function()
    keng.manual_seed(4)
    local t = keng.randint(-3, 7, {N})
    assert.are.equal("i64", t.dtype)
    local counts = {}
    for _, v in ipairs(t:tolist()) do
      assert.is_true(v >= -3 and v < 7 and v == math.floor(v), "value " .. v)
      counts[v] = (counts[v] or 0) + 1
    end
    for v = -3, 6 do
      local f = (counts[v] or 0) / N
      assert.is_true(math.abs(f - 0.1) < 0.006, "frequency of " .. v .. ": " .. f)
    end
    local t32 = keng.randint(0, 2, {1000}, {dtype = "i32"})
    assert.are.equal("i32", t32.dtype)
    local mean = stats(t32:tolist())
    assert.is_true(math.abs(mean - 0.5) < 0.08, "i32 mean " .. mean)
    H.raises(function() keng.randint(5, 5, {3}) end, "randint")
  end)

  it("manual_seed makes draws reproducible", function()
    keng.manual_seed(42)
    local a, b = keng.rand({100}), keng.randn({3, 4})
    keng.manual_seed(42)
    local a2, b2 = keng.rand({100}), keng.randn({3, 4})
    assert.is_true(same(a, a2) and same(b, b2), "same seed, same numbers")
    assert.is_false(same(a, keng.rand({100})), "the stream advances")
    keng.manual_seed(43)
    assert.is_false(same(a, keng.rand({100})), "another seed, other numbers")
  end)

  it("honours requires_grad and rejects integer dtypes for rand", function()
    local t = keng.randn({2, 2}, {requires_grad = true})
    assert.is_true(t.requires_grad)
    H.raises(function() keng.rand({2}, {dtype = "i64"}) end, "rand")
  end)
end)

describe("dropout", function()
  it("zeroes a fraction p and scales the rest by 1/(1-p)", function()
    keng.manual_seed(5)
    local x = keng.rand({N}) + 1
    local y = keng.dropout(x, 0.3)
    local xs, ys, zeros = x:tolist(), y:tolist(), 0
    for i = 1, N do
      if ys[i] == 0 then zeros = zeros + 1
      else assert.is_true(math.abs(ys[i] - xs[i] / 0.7) < 1e-5 * ys[i], "kept value " .. i) end
    end
    assert.is_true(math.abs(zeros / N - 0.3) < 0.006, "dropped fraction " .. zeros / N)
  end)

  it("is the identity when not training or p == 0, zeros when p == 1", function()
    local x = keng.randn({4, 5})
    H.close(keng.dropout(x, 0.5, false), x, 0, "eval")
    H.close(keng.dropout(x, 0), x, 0, "p = 0")
    H.close(keng.dropout(x, 1), keng.zeros({4, 5}), 0, "p = 1")
    local l = H.leaf({3, 3})
    keng.dropout(l, 1):sum():backward()
    H.close(l.grad, keng.zeros({3, 3}), 0, "p = 1 gradient")
  end)

  it("passes the gradient through the kept elements only", function()
    keng.manual_seed(6)
    local x = keng.ones({50, 40}, {dtype = "f64"})
    x.requires_grad = true
    local y = keng.dropout(x, 0.4)
    y:sum():backward()
    H.close(x.grad, y:detach(), 1e-12, "grad = mask / (1 - p) = y for x = 1")
    local l = H.leaf({4, 3})
    H.gradcheck(function(t) keng.manual_seed(7); return keng.dropout(t, 0.5) end, {l})
  end)

  it("draws the mask in row-major order from the seed", function()
    local x = keng.randn({6, 7})
    keng.manual_seed(8)
    local a = keng.dropout(x, 0.5)
    keng.manual_seed(8)
    local b = keng.dropout(H.noncontig(x), 0.5)
    H.close(a, b, 0, "noncontig input, same mask")
    assert.is_false(same(a, keng.dropout(x, 0.5)), "next call draws a new mask")
  end)

  it("keeps bf16 storage", function()
    keng.manual_seed(9)
    local x = keng.ones({1000}, {dtype = "bf16"})
    local y = keng.dropout(x, 0.5)
    assert.are.equal("bf16", y.dtype)
    for _, v in ipairs(y:tolist()) do assert.is_true(v == 0 or v == 2, "value " .. v) end
  end)

  it("rejects p outside [0, 1] and integer input", function()
    local x = keng.ones({3})
    H.raises(function() keng.dropout(x, 1.5) end, "dropout")
    H.raises(function() keng.dropout(x, -0.1) end, "p must be in [0, 1]")
    H.raises(function() keng.dropout(keng.ones({3}, {dtype = "i64"}), 0.5) end, "dropout")
  end)
end)

describe("multinomial", function()
  it("samples with replacement in proportion to the weights", function()
    keng.manual_seed(10)
    local s = keng.multinomial(P({1, 2, 3, 4}), N, {replacement = true})
    assert.are.equal("i64", s.dtype)
    assert.are.same({N}, s.shape)
    local counts = {0, 0, 0, 0}
    for _, v in ipairs(s:tolist()) do counts[v + 1] = counts[v + 1] + 1 end
    for k = 1, 4 do
      assert.is_true(math.abs(counts[k] / N - k / 10) < 0.006, "category " .. (k - 1) .. ": " .. counts[k] / N)
    end
  end)

  it("never draws a zero-weight category and honours each row", function()
    keng.manual_seed(11)
    local s = keng.multinomial(P({{0, 1, 0, 0}, {0, 0, 0, 5}}), 20, {replacement = true})
    assert.are.same({2, 20}, s.shape)
    local rows = s:tolist()
    for j = 1, 20 do assert.are.equal(1, rows[1][j]); assert.are.equal(3, rows[2][j]) end
    local p = keng.multinomial(P({0, 2, 0, 1, 0}), 2):tolist()
    table.sort(p)
    assert.are.same({1, 3}, p)
  end)

  it("without replacement gives distinct ids following the sequential law", function()
    keng.manual_seed(12)
    local perm = keng.multinomial(keng.rand({50}) + 0.1, 50):tolist()
    local seen = {}
    for _, v in ipairs(perm) do
      assert.is_true(v >= 0 and v < 50 and not seen[v], "id " .. v)
      seen[v] = true
    end
    -- probs {0.5, 0.25, 0.25}: P(first = 0) = 1/2, P(second = 0) = 2 * 1/4 * (1/2)/(3/4) = 1/3
    local B = 20000
    local s = keng.multinomial(P({2, 1, 1}):reshape{1, 3}:expand{B, 3}, 2):tolist()
    local first, second = 0, 0
    for b = 1, B do
      assert.are_not.equal(s[b][1], s[b][2])
      if s[b][1] == 0 then first = first + 1 end
      if s[b][2] == 0 then second = second + 1 end
    end
    assert.is_true(math.abs(first / B - 0.5) < 0.015, "first " .. first / B)
    assert.is_true(math.abs(second / B - 1 / 3) < 0.015, "second " .. second / B)
  end)

  it("is reproducible under manual_seed", function()
    local probs = keng.rand({3, 10})
    keng.manual_seed(13)
    local a, b = keng.multinomial(probs, 4), keng.multinomial(probs, 6, {replacement = true})
    keng.manual_seed(13)
    assert.is_true(same(a, keng.multinomial(probs, 4)), "without replacement")
    assert.is_true(same(b, keng.multinomial(probs, 6, {replacement = true})), "with replacement")
    keng.manual_seed(13)
    assert.is_true(same(a, keng.multinomial(H.noncontig(probs:transpose(1, 2)):transpose(1, 2), 4)), "noncontig")
  end)

  it("reports bad probabilities and sample counts", function()
    H.raises(function() keng.multinomial(P({0.5, -0.1, 0.6}), 1) end, "probs row 1 has an entry -0.1")
    H.raises(function() keng.multinomial(P({{1, 1}, {0, 0}}), 1) end, "probs row 2 sums to zero")  -- rows 1-based
    H.raises(function() keng.multinomial(P({{1, 1}, {1, 0}}), 2, {replacement = false}) end,
      "probs row 2 has 1 non-zero categories")
    H.raises(function() keng.multinomial(P({1, 1, 1}), 4) end, "without replacement")
    H.raises(function() keng.multinomial(P({1, 0, 1}), 3) end, "non-zero categories")
    H.raises(function() keng.multinomial(keng.ones({2, 2, 2}), 1) end, "multinomial")
    H.raises(function() keng.multinomial(keng.tensor({1, 2}, {dtype = "i64"}), 1) end, "multinomial")
  end)
end)

-- the kernel draws Philox blocks 16 (AVX2: 2 x 8 lanes) at a time and uses all 4 words of each:
-- the mask must stay word i of the stream whatever the offset's place in a block. The words are
-- read back through rand in f64: element j is u = ((w0 >> 5) << 26 | w1 >> 6) / 2^53 of words
-- 2j, 2j+1, so the top 24 bits that dropout compares are floor(u 2^24) and
-- floor(((u 2^53) mod 2^26) / 4), exactly.
describe("dropout's bulk Philox words", function()
  it("are the scalar stream at every offset within a block and odd lengths", function()
    for _, n in ipairs({1, 7, 33, 1000}) do
      for skip = 0, 3 do
        local function advance()
          keng.manual_seed(55)
          if skip > 0 then keng.dropout(keng.ones({skip}), 0.5) end -- uses skip words
        end
        advance()
        local y = keng.dropout(keng.ones({n}), 0.3):tolist()
        advance()
        local u = keng.rand({(n + 1) // 2}, {dtype = "f64"}):tolist()
        for k = 0, n - 1 do
          local v = u[k // 2 + 1]
          local top = k % 2 == 0 and math.floor(v * 2 ^ 24) or math.floor(((v * 2 ^ 53) % 2 ^ 26) / 4)
          local keep = top / 2 ^ 24 >= 0.3
          assert.are.equal(keep, y[k + 1] ~= 0, "n " .. n .. " skip " .. skip .. " word " .. k)
        end
      end
    end
  end)
end)

-- rand/randn/randint draw their words in whole Philox blocks (kg_cpu_philox_words); these
-- values were printed by the per-word scalar kernel (kg_philox_word for each of words 2i, 2i+1)
-- before that change, at an offset that is not a block boundary and across 256-element chunks,
-- and pin the stream the CPU and CUDA kernels share.
describe("the random stream is pinned", function()
  it("rand, randn and randint give the scalar kernel's values", function()
    keng.manual_seed(1)
    keng.rand({3})
    local u = keng.rand({600}, {dtype = "f64"}):tolist()
    local n = keng.randn({600}, {dtype = "f64"}):tolist()
    local k = keng.randint(0, 1000000, {600}):tolist()
    local idx = {1, 2, 255, 256, 257, 258, 511, 512, 513, 600}
    local want_u = {0.24740147260204126, 0.71312967629423973, 0.36145410608085027, 0.50268208615043075,
      0.70962858781927451, 0.1170991220692067, 0.30348553648422205, 0.41892895430304966, 0.45076333185206297,
      0.35770965672188582}
    local want_n = {-1.4428301038355791, 1.1165709357104778, -1.0391579960482689, 0.28145679188905465,
      1.0291753248774391, -0.49648400190345299, 0.3619073898249473, 1.1349919381796008, -0.27233248803284638,
      -0.22957406788449106}
    local want_k = {490572, 401437, 49625, 11864, 650717, 436943, 167366, 180926, 49533, 273376}
    for j, i in ipairs(idx) do
      assert.are.equal(want_u[j], u[i], "rand element " .. i)
      H.close(n[i], want_n[j], 1e-15, "randn element " .. i)
      assert.are.equal(want_k[j], k[i], "randint element " .. i)
    end
  end)
end)
