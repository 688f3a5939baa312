-- backends_spec.lua — keng.backends switches and keng.cuda.graph's argument checks (the GPU
-- behaviour of keng.cuda.graph is checked by tests/gpu/graph.lua on a GPU).
local keng = require "keng"
local H = require "helper"

describe("keng.backends", function()
  it("allow_tf32 defaults to false and round-trips", function()
    assert.is_false(keng.backends.allow_tf32)
    keng.backends.allow_tf32 = true
    assert.is_true(keng.backends.allow_tf32)
    keng.backends.allow_tf32 = false
    assert.is_false(keng.backends.allow_tf32)
  end)

  it("rejects non-booleans and unknown settings", function()
    H.raises(function() keng.backends.allow_tf32 = 1 end, "must be a boolean")
    H.raises(function() keng.backends.allow_fp8 = true end, "no setting 'allow_fp8'")
    assert.is_nil(keng.backends.allow_fp8)
  end)

  it("does not change CPU matmul results", function()
    local a, b = keng.randn({5, 7}), keng.randn({7, 3})
    local before = a:matmul(b)
    keng.backends.allow_tf32 = true
    local after = a:matmul(b)
    keng.backends.allow_tf32 = false
    H.close(after, before, 0)
  end)
end)

describe("keng.cuda.graph", function()
  it("needs a function", function()
    H.raises(function() keng.cuda.graph(42) end, "function expected")
  end)

  if not keng.cuda.is_available() then
    it("raises a clear error without CUDA", function()
      H.raises(function() keng.cuda.graph(function() end) end, "CUDA is not available")
    end)
  else
    it("checks its options", function()
      H.raises(function() keng.cuda.graph(function() end, {warmup = -1}) end, "warmup must be an integer")
      H.raises(function() keng.cuda.graph(function() end, {device = "cpu"}) end, "device must be cuda")
    end)
  end
end)

describe("helper device", function()
  it("H.t creates on H.device unless told otherwise", function()
    local t = H.t({1, 2, 3})
    assert.is_truthy(t.device:find(H.device == "cuda" and "cuda" or H.device, 1, true))
    assert.are.equal("cpu", H.t({1}, {device = "cpu"}).device)
    assert.are.equal("f64", H.t({1}, {dtype = "f64"}).dtype)
  end)
end)
