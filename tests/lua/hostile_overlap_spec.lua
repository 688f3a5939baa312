-- hostile_overlap_spec.lua — in-place writes whose destination overlaps itself or an input
-- (issue 16, item 6). The kernels write element i while reading element i of each input; any
-- other sharing made the result depend on the order of the writes (expand{4,3}:add_(1) gave 4
-- in every element, b:t():add_(b) mixed updated and old values). As PyTorch, such calls are
-- refused; element-for-element sharing (x:add_(x)) and disjoint views of one tensor stay fine.
local keng = require "keng"
local H = require "helper"

local SELF = "has elements that share memory"
local PARTIAL = "shares memory with the destination"

describe("in-place overlap", function()
  it("refuses a destination whose elements share memory", function()
    local e = keng.zeros({1, 3}):expand{4, 3}
    H.raises(function() e:add_(1) end, "add_: the destination [4,3] " .. SELF)
    H.raises(function() e:mul_(keng.ones({4, 3})) end, "mul_: the destination [4,3] " .. SELF)
    H.raises(function() e:fill_(2) end, "fill_: the destination [4,3] " .. SELF)
    H.raises(function() e:zero_() end, "fill_:")
    H.raises(function() e:copy_(keng.ones({4, 3})) end, "copy_: the destination [4,3] " .. SELF)
    -- a single broadcast element written three times
    local one = keng.zeros({1}):expand{3}
    H.raises(function() one:add_(keng.tensor({1, 2, 3})) end, SELF)
    -- and nothing was written by the refused calls
    H.close(e, keng.zeros({4, 3}))
  end)

  it("refuses an input that overlaps the destination partially", function()
    local b = keng.arange(4):reshape{2, 2}:double()
    H.raises(function() b:transpose():add_(b) end, "add_: input 1 [2,2] " .. PARTIAL .. " [2,2]")
    H.raises(function() b:add_(b:transpose()) end, PARTIAL)
    H.raises(function() b:add_(b[1]) end, PARTIAL)               -- a broadcast row of b itself
    H.raises(function() b:copy_(b:transpose()) end, "copy_: input 1")
    local x = keng.arange(6):double()
    H.raises(function() x:narrow(1, 2, 4):add_(x:narrow(1, 1, 4)) end, PARTIAL) -- shifted by one
    H.close(b, {0, 1, 2, 3}) -- untouched
  end)

  it("allows element-for-element sharing and disjoint views", function()
    local x = keng.tensor({1, 2, 3}, {dtype = "f64"})
    x:add_(x)
    H.close(x, {2, 4, 6})
    x:mul_(x:view{3})
    H.close(x, {4, 16, 36})
    local g = keng.tensor({{1, 10}, {2, 20}, {3, 30}}, {dtype = "f64"})
    g:select(2, 1):add_(g:select(2, 2)) -- interleaved columns: no element shared
    H.close(g, {{11, 10}, {22, 20}, {33, 30}})
    g:narrow(1, 1, 1):copy_(g:narrow(1, 3, 1)) -- disjoint rows
    H.close(g, {{33, 30}, {22, 20}, {33, 30}})
    local t = keng.zeros({2, 3}):transpose()
    t:add_(1) -- transposed but not overlapping
    H.close(t, keng.ones({3, 2}))
  end)

  it("past 2^24 elements: dense blocks that intersect are refused, interleaved views pass", function()
    local b = keng.zeros({4097, 4097}, {dtype = "u8"}) -- 2^24 + 8193 elements
    H.raises(function() b:transpose():add_(b) end, PARTIAL)
    local g = keng.zeros({(1 << 24) + 1, 2}, {dtype = "u8"})
    g:select(2, 2):fill_(3)
    g:select(2, 1):add_(g:select(2, 2)) -- the columns interleave but share no element
    assert.equal(3, g[(1 << 24) + 1][1]:item())
  end)

  it("index ops refuse any sharing between destination and source", function()
    local ids = keng.tensor({0, 1}, {dtype = "i64"})
    local d = keng.zeros({2, 2}, {dtype = "f64"})
    H.raises(function() d:index_add_(1, ids, d) end, "index_add_: input 2 [2,2] " .. PARTIAL)
    H.raises(function() d:scatter_add_(1, keng.zeros({2, 2}, {dtype = "i64"}), d) end, "scatter_add_: input 2")
    local w = keng.zeros({1, 2}, {dtype = "f64"}):expand{3, 2}
    H.raises(function() w:index_add_(1, keng.tensor({0}, {dtype = "i64"}), keng.ones({1, 2}, {dtype = "f64"})) end, SELF)
  end)
end)
