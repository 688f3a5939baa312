-- util_spec.lua — keng.util: shape_str's one form, the one class helper (what nn.Module, the
-- optimizers and the callbacks are made with), dtype sizes against the engine's (the data
-- offsets keng.save writes), and keng.nn.functional being the engine functions themselves.
local keng = require "keng"
local H = require "helper"
local util = require "keng.util"

describe("keng.util", function()
  it("shape_str takes a tensor or a shape list, in the engine's one form", function()
    assert.are.equal("[2,3]", util.shape_str(keng.zeros({2, 3})))
    assert.are.equal("[2,3]", util.shape_str(keng.zeros({2, 3}), ","))
    -- the same string the engine writes in its own messages
    local e = H.raises(function() keng.zeros({2, 3}):matmul(keng.zeros({4, 5})) end, "matmul")
    assert.truthy(e:find("[2,3]", 1, true) and e:find("[4,5]", 1, true), e)
    assert.are.equal("[4]", util.shape_str({4}))
    assert.are.equal("[]", util.shape_str(keng.tensor(1)))
  end)

  it("class makes callable subclasses that inherit methods and the listed metamethods", function()
    local Base = {}
    Base.__index = Base
    Base.__name = "Base"
    function Base:hello() return "hello from " .. self.__name end
    function Base.__tostring(o) return "<" .. o.__name .. " " .. o.x .. ">" end
    local function new(cls, x) return setmetatable({x = x}, cls) end
    local A = util.class(Base, "A", new, {"__tostring"})
    local B = util.class(A, "B", new, {"__tostring"})
    local b = B(7)
    assert.are.equal("hello from B", b:hello())
    assert.are.equal("<B 7>", tostring(b))
    assert.are.equal(A, B.super)
    assert.are.equal("class B", tostring(B))
    function A:hello() return "A's" end                    -- a method added later is seen below
    assert.are.equal("A's", b:hello())
  end)

  it("nn.Module, the optimizers and the callbacks are made by it", function()
    local nn, optim, cbs = require "keng.nn", require "keng.optim", require "keng.callbacks"
    local M = nn.Module:extend("M")
    assert.are.equal(nn.Module, M.super)
    assert.are.equal("class M", tostring(M))
    assert.are.equal(optim.Adam, optim.AdamW.super)
    assert.truthy(tostring(optim.SGD({keng.zeros({1}, {requires_grad = true})})):find("^SGD%(1 params"))
    local C = cbs.Callback:extend("C")
    function C:init(v) self.v = v end
    assert.are.equal(5, C(5).v)
    assert.are.equal(cbs.Callback, C.super)
  end)

  it("dtype_size agrees with the engine for every dtype (the bytes keng.save writes)", function()
    local path = H.tmpname(".safetensors")
    for _, d in ipairs({"f64", "f32", "bf16", "f16", "i64", "i32", "i8", "u8", "bool"}) do
      keng.save(path, {t = keng.zeros({3}, {dtype = d})})
      local s = H.read(path)
      local n = string.unpack("<I8", s)
      local a, b = s:sub(9, 8 + n):match('"data_offsets":%[(%d+),(%d+)%]')
      assert.are.equal(tonumber(b) - tonumber(a), 3 * util.dtype_size(d), d)
      assert.are.equal(3 * util.dtype_size(d), util.nbytes(keng.zeros({3}, {dtype = d})), d)
    end
    os.remove(path)
    assert.is_nil(util.dtype_size("f8"))
  end)

  it("read_file gives a file's bytes, nil when it cannot be opened", function()
    local p = H.write(H.tmpname(), "a\0b\r\n")
    assert.are.equal("a\0b\r\n", util.read_file(p))
    os.remove(p)
    assert.is_nil(util.read_file(p))
  end)

  it("keng.nn.functional's names are the engine functions", function()
    local F = require("keng.nn").functional
    for _, name in ipairs({"softmax", "linear", "scaled_dot_product_attention", "gelu", "pad"}) do
      assert.are.equal(keng[name], F[name], name)
    end
  end)
end)
