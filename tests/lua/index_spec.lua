-- index_spec.lua — indexing and layout ops: cat, stack, pad, gather, index_select, embedding,
-- scatter_add_, index_add_, repeat_interleave, tril, triu. References are plain Lua loops over
-- :tolist() of small tensors (or, for the larger determinism checks, one-hot matmuls).
local keng = require "keng"
local H = require "helper"

local function f64(list) return keng.tensor(list, {dtype = "f64"}) end
local function ids(list, dt) return keng.tensor(list, {dtype = dt or "i64"}) end

-- a 2-D reference tensor with distinct values
local function grid(n, m, dt)
  local t = {}
  for i = 1, n do
    t[i] = {}
    for j = 1, m do t[i][j] = 10 * i + j end
  end
  return keng.tensor(t, {dtype = dt or "f64"})
end

describe("cat and stack", function()
  it("concatenates along the first, last and a negative dim", function()
    local a, b, c = grid(2, 3), grid(1, 3) + 100, grid(2, 3) * -1
    local r = keng.cat({a, b}, 1)
    local al, bl = a:tolist(), b:tolist()
    H.close(r, f64({al[1], al[2], bl[1]}), 0, "dim 1")
    local d = keng.cat({a, c, a}, -1)
    local ref, cl = {}, c:tolist()
    for i = 1, 2 do
      ref[i] = {}
      for _, src in ipairs({al, cl, al}) do for j = 1, 3 do ref[i][#ref[i] + 1] = src[i][j] end end
    end
    H.close(d, f64(ref), 0, "dim -1")
    H.close(keng.cat({a, b}), r, 0, "default dim 1")
  end)

  it("promotes dtypes and takes non-contiguous and bf16 inputs", function()
    local a = grid(3, 2, "f32")
    local r = keng.cat({H.noncontig(a), a:to("bf16")}, 2)
    assert.are.equal("f32", r.dtype)
    H.close(r:narrow(2, 1, 2), a, 0, "non-contiguous part")
    H.close(r:narrow(2, 3, 2), a:to("bf16"):float(), 0, "bf16 part")
    local b = keng.cat({a:bf16(), a:bf16()}, 1)
    assert.are.equal("bf16", b.dtype)
    H.close(b:narrow(1, 4, 3), a, 1e-2, "bf16 cat")
  end)

  it("has gradients that are slices of the output gradient", function()
    local a, b, c = H.leaf({2, 3}), H.leaf({2, 1}), H.leaf({2, 2})
    H.gradcheck(function(x, y, z) return keng.cat({x, y, z}, 2) end, {a, b, c})
    H.gradcheck(function(x, y) return keng.cat({x, y}, 1) end, {a, H.leaf({4, 3})})
  end)

  it("stacks along a new dim", function()
    local a, b = grid(2, 3), grid(2, 3) + 1
    local s = keng.stack({a, b})
    assert.are.same({2, 2, 3}, s.shape)
    H.close(s[1], a, 0, "first")
    H.close(s[2], b, 0, "second")
    local t = keng.stack({a, b}, 3)
    assert.are.same({2, 3, 2}, t.shape)
    H.close(t:select(3, 2), b, 0, "last dim")
    H.close(keng.stack({a, b}, -1), t, 0, "dim -1")
    H.gradcheck(function(x, y) return keng.stack({x, y}, 2) end, {H.leaf({2, 3}), H.leaf({2, 3})})
  end)

  it("rejects mismatched shapes", function()
    H.raises(function() keng.cat({grid(2, 3), grid(2, 4)}, 1) end, "cat: tensor 2 [2,4] does not match")
    H.raises(function() keng.stack({grid(2, 3), grid(3, 2)}) end, "stack")
    H.raises(function() keng.cat({}, 1) end, "non-empty list")
  end)
end)

describe("pad", function()
  -- reference pad of a 2-D list by {l, r, t, b}
  local function ref_pad(l, p, v)
    local n, m = #l, #l[1]
    local out = {}
    for i = 1, n + p[3] + p[4] do
      out[i] = {}
      for j = 1, m + p[1] + p[2] do
        local si, sj = i - p[3], j - p[1]
        out[i][j] = (si >= 1 and si <= n and sj >= 1 and sj <= m) and l[si][sj] or v
      end
    end
    return out
  end

  it("pads the last dims with a constant", function()
    local x = grid(2, 3)
    H.close(keng.pad(x, {1, 2}, -1), f64(ref_pad(x:tolist(), {1, 2, 0, 0}, -1)), 0, "last dim")
    H.close(keng.pad(x, {0, 1, 2, 1}, 9), f64(ref_pad(x:tolist(), {0, 1, 2, 1}, 9)), 0, "two dims")
    H.close(keng.pad(H.noncontig(x), {2, 0, 1, 1}), f64(ref_pad(x:tolist(), {2, 0, 1, 1}, 0)), 0, "non-contiguous")
    local b = keng.pad(x:bf16(), {1, 1}, 0.5)
    assert.are.equal("bf16", b.dtype)
    H.close(b, f64(ref_pad(x:tolist(), {1, 1, 0, 0}, 0.5)), 1e-2, "bf16")
  end)

  it("crops with negative pads", function()
    local x = grid(3, 4)
    local r = keng.pad(x, {-1, 1, 0, -2})
    local l = x:tolist()
    H.close(r, f64({{l[1][2], l[1][3], l[1][4], 0}}), 0, "crop")
    H.raises(function() keng.pad(x, {-3, -2}) end, "pad: pads -3, -2 crop dim 2")
  end)

  it("has the cropped gradient", function()
    H.gradcheck(function(x) return keng.pad(x, {1, 2, 0, 3}, 0.25) end, {H.leaf({2, 3, 2})})
    H.gradcheck(function(x) return keng.pad(x, {-1, 2, 1, -1}) end, {H.leaf({3, 4})})
  end)

  it("rejects an odd or too long pad list", function()
    H.raises(function() keng.pad(grid(2, 3), {1, 2, 3}) end, "pad: 3 pad values")
    H.raises(function() keng.pad(grid(2, 3), {1, 1, 1, 1, 1, 1}) end, "pad")
  end)
end)

describe("gather and index_select", function()
  it("gathers along each dim with i64 and i32 indices", function()
    local x = grid(3, 4)
    local xl = x:tolist()
    local idx = {{3, 0}, {1, 1}, {0, 2}}
    local ref = {}
    for i = 1, 3 do ref[i] = {xl[i][idx[i][1] + 1], xl[i][idx[i][2] + 1]} end
    H.close(x:gather(2, ids(idx)), f64(ref), 0, "dim 2")
    H.close(x:gather(-1, ids(idx, "i32")), f64(ref), 0, "i32, dim -1")
    H.close(keng.gather(H.noncontig(x), 2, ids(idx)), f64(ref), 0, "non-contiguous x")
    local i1 = {{2, 0, 1, 2}, {0, 0, 2, 1}}
    local r1 = {}
    for i = 1, 2 do
      r1[i] = {}
      for j = 1, 4 do r1[i][j] = xl[i1[i][j] + 1][j] end
    end
    H.close(x:gather(1, ids(i1)), f64(r1), 0, "dim 1")
    H.close(x:bf16():gather(1, H.noncontig(ids(i1))), f64(r1), 1e-2, "bf16, non-contiguous index")
  end)

  it("sums the gradient over repeated indices", function()
    local idx = ids({{0, 0, 2}, {1, 1, 1}})
    H.gradcheck(function(x) return x:gather(2, idx) end, {H.leaf({2, 4})})
    H.gradcheck(function(x) return x:gather(1, idx) end, {H.leaf({3, 3})})
    local x = H.leaf({2, 4})
    x:gather(2, idx):sum():backward()
    H.close(x.grad, f64({{2, 0, 1, 0}, {0, 3, 0, 0}}), 0, "counts")
  end)

  it("selects slices along a dim", function()
    local x = grid(3, 4)
    local xl = x:tolist()
    local r = x:index_select(2, ids({3, 0, 3}, "i32"))
    local ref = {}
    for i = 1, 3 do ref[i] = {xl[i][4], xl[i][1], xl[i][4]} end
    H.close(r, f64(ref), 0, "dim 2")
    H.close(keng.index_select(H.noncontig(x), 1, ids({2, 2})), f64({xl[3], xl[3]}), 0, "dim 1, non-contiguous")
    H.close(x:float():index_select(-1, ids({1})), f64({{xl[1][2]}, {xl[2][2]}, {xl[3][2]}}), 0, "f32")
    local idx = ids({1, 1, 0, 3})
    H.gradcheck(function(t) return t:index_select(2, idx) end, {H.leaf({2, 4, 3})})
    H.gradcheck(function(t) return t:index_select(3, ids({2, 0, 2})) end, {H.leaf({2, 2, 3})})
  end)

  it("rejects out-of-range and negative indices without crashing", function()
    local x = grid(2, 5)
    H.raises(function() x:gather(2, ids({{7}, {0}})) end, "gather: index 7 out of range for dim 2 of size 5")
    H.raises(function() x:gather(2, ids({{-1}, {0}})) end, "gather: index -1 out of range")
    H.raises(function() x:gather(2, ids({0, 1})) end, "gather: index [2] must have the dims of x [2,5]")
    H.raises(function() x:gather(2, ids({{0}, {1}, {1}})) end, "gather: index [3,1]")
    H.raises(function() x:gather(2, keng.tensor({{0}, {1}}, {dtype = "f32"})) end, "gather: index must be an i32 or i64")
    H.raises(function() x:index_select(1, ids({2})) end, "index_select: index 2 out of range for dim 1 of size 2")
    H.raises(function() x:index_select(1, ids({{0}})) end, "index_select: index [1,1] must be 1-D")
  end)
end)

describe("embedding", function()
  it("looks up rows for ids of any shape", function()
    local tab = grid(5, 3)
    local tl = tab:tolist()
    local id = {{4, 0, 4}, {2, 1, 3}}
    local r = keng.embedding(ids(id), tab)
    assert.are.same({2, 3, 3}, r.shape)
    local ref = {}
    for i = 1, 2 do
      ref[i] = {}
      for j = 1, 3 do ref[i][j] = tl[id[i][j] + 1] end
    end
    H.close(r, f64(ref), 0, "values")
    H.close(keng.embedding(ids(id, "i32"), H.noncontig(tab)), f64(ref), 0, "i32 ids, non-contiguous table")
    H.close(keng.embedding(ids(id), tab:bf16()), f64(ref), 1e-2, "bf16")
    H.close(keng.embedding(ids(3), tab), f64(tl[4]), 0, "0-d id")
  end)

  it("accumulates the table gradient; ids get none", function()
    local id = ids({{1, 3, 1}, {0, 1, 4}})
    H.gradcheck(function(t) return keng.embedding(id, t) end, {H.leaf({5, 2})})
    local tab = H.leaf({5, 2})
    keng.embedding(id, tab):sum():backward()
    H.close(tab.grad, f64({{1, 1}, {3, 3}, {0, 0}, {1, 1}, {1, 1}}), 0, "row counts")
    assert.is_nil(id.grad)
    -- bf16: 300 hits on one row are summed in f32 (adding in bf16 would stall at 256)
    local tb = keng.zeros({2, 4}, {dtype = "bf16"})
    tb.requires_grad = true
    keng.embedding(keng.zeros({300}, {dtype = "i32"}), tb):sum():backward()
    assert.are.equal("bf16", tb.grad.dtype)
    H.close(tb.grad, f64({{300, 300, 300, 300}, {0, 0, 0, 0}}), 0, "bf16 gradient")
  end)

  it("matches a one-hot matmul on a larger problem (parallel, deterministic)", function()
    keng.manual_seed(7)
    local V, C, N = 50, 300, 400
    local id = keng.randint(0, V, {N}, {dtype = "i64"})
    local tab = keng.randn({V, C}, {dtype = "f64"}):detach()
    tab.requires_grad = true
    local g = keng.randn({N, C}, {dtype = "f64"})
    local out = keng.embedding(id, tab)
    local onehot = id:reshape{N, 1}:eq(keng.arange(V)):double()
    H.close(out, onehot:matmul(tab:detach()), 1e-12, "forward")
    out:backward(g)
    local first = tab.grad:clone()
    H.close(first, onehot:transpose(1, 2):matmul(g), 1e-10, "backward")
    tab.grad = nil
    keng.embedding(id, tab):backward(g)
    H.close(tab.grad, first, 0, "same bits on a second run")
  end)

  it("names the bad id and the table size", function()
    local tab = grid(5, 3)
    H.raises(function() keng.embedding(ids({1, 7}), tab) end, "embedding: index 7 out of range for table of 5 rows")
    H.raises(function() keng.embedding(ids({-2}), tab) end, "embedding: index -2 out of range")
    H.raises(function() keng.embedding(keng.tensor({1}, {dtype = "f32"}), tab) end, "embedding: index must be an i32 or i64")
    H.raises(function() keng.embedding(ids({1}), grid(2, 2):reshape{4}) end, "embedding: table [4] must be [V, C]")
  end)
end)

describe("scatter_add_ and index_add_", function()
  it("scatter-adds with repeated indices", function()
    local dst = grid(3, 4)
    local dl = dst:tolist()
    local src = f64({{1, 2, 3}, {4, 5, 6}})
    local idx = {{3, 3, 0}, {1, 2, 1}}
    local sl = src:tolist()
    for i = 1, 2 do for j = 1, 3 do dl[i][idx[i][j] + 1] = dl[i][idx[i][j] + 1] + sl[i][j] end end
    local r = dst:scatter_add_(2, ids(idx), src)
    assert.are.equal(dst, r)
    H.close(dst, f64(dl), 0, "dim 2")
    -- along dim 1, into a non-contiguous destination, from a non-contiguous source
    local base = grid(4, 3)
    local d2 = H.noncontig(base)
    local bl = base:tolist()
    local i2 = {{3, 0, 3}, {3, 1, 0}}
    for i = 1, 2 do for j = 1, 3 do bl[i2[i][j] + 1][j] = bl[i2[i][j] + 1][j] + sl[i][j] end end
    d2:scatter_add_(1, ids(i2, "i32"), H.noncontig(src))
    H.close(d2, f64(bl), 0, "dim 1, non-contiguous")
  end)

  it("index-adds slices", function()
    local dst = grid(4, 2)
    local dl = dst:tolist()
    local src = f64({{1, 2}, {3, 4}, {5, 6}})
    local idx = {2, 0, 2}
    local sl = src:tolist()
    for k = 1, 3 do for j = 1, 2 do dl[idx[k] + 1][j] = dl[idx[k] + 1][j] + sl[k][j] end end
    dst:index_add_(1, ids(idx), src)
    H.close(dst, f64(dl), 0, "dim 1")
    local d2 = grid(2, 3):float()
    local l2 = d2:tolist()
    d2:index_add_(2, ids({2, 2}, "i32"), keng.ones({2, 2}))
    for i = 1, 2 do l2[i][3] = l2[i][3] + 2 end
    H.close(d2, f64(l2), 0, "dim 2 (the last)")
    local b = keng.zeros({3, 2}, {dtype = "bf16"})
    b:index_add_(1, ids({1, 1}), keng.full({2, 2}, 0.5))
    H.close(b, f64({{0, 0}, {1, 1}, {0, 0}}), 0, "bf16")
  end)

  it("is deterministic across thread counts", function()
    keng.manual_seed(3)
    local V, C, K = 40, 260, 500
    local idx = keng.randint(0, V, {K}, {dtype = "i64"})
    local src = keng.randn({K, C}, {dtype = "f32"})
    local function run()
      local d = keng.zeros({V, C}, {dtype = "f32"})
      return d:index_add_(1, idx, src)
    end
    local n = keng.num_threads()
    local a = run()
    keng.set_num_threads(1)
    local b = run()
    keng.set_num_threads(n)
    H.close(a, b, 0, "index_add_ threads")
    local onehot = idx:reshape{K, 1}:eq(keng.arange(V)):float()
    H.close(a, onehot:transpose(1, 2):matmul(src), 1e-4, "against one-hot")
  end)

  it("rejects bad indices, shapes and grad-requiring destinations", function()
    local dst = keng.zeros({3, 2}, {dtype = "f64"})
    H.raises(function() dst:scatter_add_(1, ids({{3, 0}}), f64({{1, 1}})) end,
      "scatter_add_: index 3 out of range for dim 1 of size 3")
    H.raises(function() dst:index_add_(1, ids({0, -1}), f64({{1, 1}, {1, 1}})) end, "index_add_: index -1 out of range")
    H.raises(function() dst:index_add_(1, ids({0}), f64({{1, 1, 1}})) end, "index_add_: src [1,3]")
    H.raises(function() dst:scatter_add_(1, ids({{0, 0, 0}}), f64({{1, 1}})) end, "scatter_add_: index [1,3]")
    local leaf = H.leaf({3, 2})
    H.raises(function() leaf:index_add_(1, ids({0}), f64({{1, 1}})) end, "index_add_: a tensor that requires grad")
    local wide = keng.zeros({1, 2}, {dtype = "f64"}):expand{3, 2}
    H.raises(function() wide:index_add_(1, ids({0}), f64({{1, 1}})) end, "share memory")
  end)
end)

describe("repeat_interleave", function()
  it("repeats each slice n times in place", function()
    local x = grid(2, 3)
    local xl = x:tolist()
    H.close(x:repeat_interleave(2, 1), f64({xl[1], xl[1], xl[2], xl[2]}), 0, "dim 1")
    local ref = {}
    for i = 1, 2 do
      ref[i] = {}
      for j = 1, 3 do for _ = 1, 3 do ref[i][#ref[i] + 1] = xl[i][j] end end
    end
    H.close(H.noncontig(x):repeat_interleave(3, -1), f64(ref), 0, "dim -1, non-contiguous")
    H.close(x:repeat_interleave(2), f64({11, 11, 12, 12, 13, 13, 21, 21, 22, 22, 23, 23}), 0, "flattened")
    assert.are.same({2, 0}, x:repeat_interleave(0, 2).shape)
    H.gradcheck(function(t) return t:repeat_interleave(3, 2) end, {H.leaf({2, 2, 3})})
    H.raises(function() x:repeat_interleave(-1, 1) end, "repeat_interleave: repeats -1")
  end)
end)

describe("tril and triu", function()
  local function ref_tri(l, k, lower)
    local out = {}
    for i = 1, #l do
      out[i] = {}
      for j = 1, #l[1] do
        local keep = lower and (j - i <= k) or (not lower and j - i >= k)
        out[i][j] = keep and l[i][j] or 0
      end
    end
    return out
  end

  it("keeps the lower or upper triangle with a diagonal offset", function()
    local x = grid(3, 4)
    local xl = x:tolist()
    for _, k in ipairs({0, 1, -1, 5}) do
      H.close(x:tril(k), f64(ref_tri(xl, k, true)), 0, "tril " .. k)
      H.close(x:triu(k), f64(ref_tri(xl, k, false)), 0, "triu " .. k)
    end
    H.close(x:tril(), f64(ref_tri(xl, 0, true)), 0, "tril default")
    H.close(keng.triu(H.noncontig(x)), f64(ref_tri(xl, 0, false)), 0, "triu non-contiguous")
    H.close(x:bf16():tril(-1), f64(ref_tri(xl, -1, true)), 1e-2, "bf16")
    local b = keng.stack({x, x * 2}):tril(1)
    H.close(b[2], f64(ref_tri((x * 2):tolist(), 1, true)), 0, "batched")
  end)

  it("has masked gradients and rejects 1-D input", function()
    H.gradcheck(function(t) return t:tril(1) end, {H.leaf({3, 3})})
    H.gradcheck(function(t) return t:triu(-1) end, {H.leaf({2, 3, 4})})
    H.raises(function() keng.arange(3):tril() end, "tril")
  end)
end)
