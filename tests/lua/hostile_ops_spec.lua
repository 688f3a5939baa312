-- hostile_ops_spec.lua — one property spec per op family (issue 16, "done means"): every op is
-- fed empty (a 0-size dim), huge (sizes near 2^62), NaN, overlapping (transposed, expanded,
-- offset and self-aliased views) and wrongly typed inputs. Each must give a clear error or a
-- correct result, never a crash: a view gives what its contiguous copy gives, NaN reaches the
-- output where PyTorch's would, and a wrong type names the function, never "attempt to index".
-- The suite runs under the ASan/UBSan build too (tests/run_all.sh build-asan).
local keng = require "keng"
local H = require "helper"

local nan = 0 / 0
local HUGE = 1 << 62
local function f64(shape) -- distinct, well-scaled values
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return (keng.arange(n):double() * 0.37):sin():reshape(shape)
end
local function ids(list) return keng.tensor(list, {dtype = "i64"}) end

-- the result's tensors as one flat list of numbers (tensors, or lists of tensors)
local function values(r)
  if keng.is_tensor(r) then return H.flat(r) end
  local out = {}
  for _, t in ipairs(r) do for _, v in ipairs(H.flat(t)) do out[#out + 1] = v end end
  return out
end
local function any_nan(r)
  for _, v in ipairs(values(r)) do if v ~= v then return true end end
  return false
end
local function pack(...) return {n = select("#", ...), ...} end
local function result(r) return r.n > 1 and {table.unpack(r, 1, r.n)} or r[1] end

-- a clear error: a string naming the function (name, or any op for nil) or the argument, not
-- an internal Lua error
local function clear_error(err, name, what)
  err = tostring(err)
  assert(not err:find("attempt to", 1, true) and not err:find("nil value", 1, true),
    what .. ": internal error leaked: " .. err)
  local named = name and err:find(name, 1, true) or (not name and err:find(":%d+: [%w_]+: "))
  assert(named or err:find("bad argument", 1, true), what .. ": the error does not name the function: " .. err)
end

-- the views of x that must compute like x:contiguous()
local function layouts(x)
  local v = {contiguous = x, transposed = H.noncontig(x)}
  local row = x:narrow(1, 1, 1):contiguous()
  v.expanded = row:expand(x.shape)                          -- one row, read many times
  local big = keng.zeros({x.shape[1] + 1, table.unpack(x.shape, 2)}, {dtype = x.dtype})
  big:narrow(1, 2, x.shape[1]):copy_(x)
  v.offset = big:narrow(1, 2, x.shape[1])                   -- a view that does not start at 0
  return v
end

-- families: each op is run(x) on a float tensor of the family's shape; nan = true when a NaN
-- in x must reach the output; huge() must raise naming `name`
local FAMILIES = {
  elementwise = {shape = {4, 6}, ops = {
    {name = "add", run = function(x) return x + x end, nan = true},
    {name = "sub", run = function(x) return x - x:narrow(1, 1, 1) end, nan = true},
    {name = "mul", run = function(x) return x * 2.5 end, nan = true},
    {name = "div", run = function(x) return x / (x:abs() + 1) end, nan = true},
    {name = "pow", run = function(x) return x:abs() ^ 1.5 end, nan = true},
    {name = "maximum", run = function(x) return x:maximum(x:transpose(1, 2):transpose(1, 2) * 0.5) end, nan = true},
    {name = "relu", run = function(x) return x:relu() end, nan = true},
    {name = "gelu", run = function(x) return x:gelu() end, nan = true},
    {name = "silu", run = function(x) return x:silu() end, nan = true},
    {name = "sigmoid", run = function(x) return x:sigmoid() end, nan = true},
    {name = "tanh", run = function(x) return x:tanh() end, nan = true},
    {name = "exp", run = function(x) return x:exp() end, nan = true},
    {name = "clamp", run = function(x) return x:clamp(-0.5, 0.5) end, nan = true},
    {name = "where", run = function(x) return keng.where(x:gt(0), x, 0) end},
    {name = "eq", run = function(x) return x:eq(x) end},
    {name = "to", run = function(x) return x:to("bf16") end, nan = true},
  }},
  reduce = {shape = {4, 6}, ops = {
    {name = "sum", run = function(x) return x:sum(2) end, nan = true},
    {name = "mean", run = function(x) return x:mean(1, true) end, nan = true},
    {name = "var", run = function(x) return x:var(2) end, nan = true},
    {name = "max", run = function(x) return pack(x:max(2)) end, nan = true},
    {name = "min", run = function(x) return x:min() end, nan = true},
    {name = "argmax", run = function(x) return x:argmax(2) end},
    {name = "cumsum", run = function(x) return x:cumsum(2) end, nan = true},
    {name = "topk", run = function(x) return pack(x:topk(2, 2)) end, nan = true,
     huge = function(x) return x:topk(HUGE, 2) end},
  }},
  index = {shape = {4, 6}, ops = {
    {name = "cat", run = function(x) return keng.cat({x, x, x:narrow(1, 1, 1)}, 1) end, nan = true,
     huge = function(x) local e = x:narrow(1, 1, 1):expand{1 << 58, 6}; return keng.cat({e, e, e, e}, 1) end},
    {name = "stack", run = function(x) return keng.stack({x, x}, 2) end, nan = true},
    {name = "pad", run = function(x) return keng.pad(x, {1, 2}) end, nan = true,
     huge = function(x) return keng.pad(x, {HUGE, HUGE}) end},
    {name = "gather", run = function(x) return x:gather(2, ids({{0, 5}, {1, 1}, {2, 0}, {5, 5}}):narrow(1, 1, x.shape[1])) end},
    {name = "index_select", run = function(x) return x:index_select(2, ids({5, 1, 0})) end, nan = true},
    {name = "repeat_interleave", run = function(x) return x:repeat_interleave(2, 1) end, nan = true,
     huge = function(x) return x:repeat_interleave(HUGE, 1) end},
    {name = "tril", run = function(x) return x:tril() end},
    {name = "embedding", run = function(x) return keng.embedding(ids({{0, 3}, {3, 3}}), x) end},
  }},
  view = {shape = {4, 6}, ops = {
    {name = "reshape", run = function(x) return x:reshape{6, -1} end, nan = true,
     huge = function(x) return x:reshape{HUGE + 1, 4} end},
    {name = "view", run = function(x) return x:contiguous():view{2, 12} end, nan = true,
     huge = function(x) return x:contiguous():view{(HUGE >> 1) + 3, 8} end},
    {name = "transpose", run = function(x) return x:transpose(1, 2):contiguous() end, nan = true},
    {name = "permute", run = function(x) return x:unsqueeze(1):permute{3, 1, 2} end, nan = true},
    {name = "narrow", run = function(x) return x:narrow(2, 2, 3) end, nan = true,
     huge = function(x) return x:narrow(2, 2, HUGE) end},
    {name = "select", run = function(x) return x:select(2, -1) end},
    {name = "expand", run = function(x) return x:unsqueeze(1):expand{3, -1, -1} end, nan = true,
     huge = function(x) return x:unsqueeze(1):expand{HUGE, -1, -1} end},
    {name = "split", run = function(x) return x:split(4, 2) end, nan = true},
    {name = "squeeze", run = function(x) return x:unsqueeze(2):squeeze(2) end, nan = true},
    {name = "flatten", run = function(x) return x:flatten() end, nan = true},
  }},
  matmul = {shape = {4, 6}, ops = {
    {name = "matmul", run = function(x) return x:matmul(x:transpose(1, 2)) end, nan = true,
     huge = function(x) return x:matmul(keng.zeros({1, 1}, {dtype = x.dtype}):expand{6, HUGE}) end},
    {name = "linear", run = function(x) return keng.linear(x, x:narrow(1, 1, 3), x:narrow(1, 1, 1):narrow(2, 1, 3):reshape{3}) end, nan = true},
  }},
  norm = {shape = {4, 6}, ops = {
    {name = "layer_norm", run = function(x) return keng.layer_norm(x, keng.ones({6}, {dtype = "f64"}), keng.zeros({6}, {dtype = "f64"})) end, nan = true},
    {name = "rms_norm", run = function(x) return keng.rms_norm(x, x:narrow(1, 1, 1):reshape{6}) end, nan = true,
     huge = function(x) return keng.rms_norm(x:unsqueeze(1):expand{HUGE, -1, -1}, keng.ones({6}, {dtype = x.dtype})) end},
    {name = "group_norm", run = function(x) return keng.group_norm(x:reshape{x.shape[1], 6, 1}, 3, nil, nil) end, nan = true},
  }},
  softmax = {shape = {4, 6}, ops = {
    {name = "softmax", run = function(x) return x:softmax(2) end, nan = true,
     huge = function(x) return x:reshape{-1, 1}:expand{-1, HUGE}:softmax(2) end},
    {name = "log_softmax", run = function(x) return x:log_softmax(1) end, nan = true},
  }},
  conv = {shape = {2, 4, 5, 5}, ops = {
    {name = "conv2d", run = function(x) return keng.conv2d(x, f64({3, 4, 3, 3}), nil, {padding = 1}) end, nan = true,
     huge = function(x) return keng.conv2d(x, f64({3, 4, 3, 3}), nil, {stride = (1 << 32) + 1}) end},
    {name = "conv2d", run = function(x) return keng.conv2d(x, f64({4, 1, 3, 3}), nil, {groups = 4, dilation = 2, padding = 1}) end, nan = true,
     huge = function(x) return keng.conv2d(x, f64({3, 4, 3, 3}), nil, {padding = 1 << 31}) end},
    {name = "conv_transpose2d", run = function(x) return keng.conv_transpose2d(x, f64({4, 2, 3, 3}), nil, {stride = 2}) end, nan = true,
     huge = function(x) return keng.conv_transpose2d(x, f64({4, 2, 3, 3}), nil, {dilation = 1 << 31}) end},
    {name = "interpolate", run = function(x) return keng.interpolate(x, {scale = 2}) end, nan = true},
  }},
  loss = {shape = {4, 6}, ops = {
    {name = "cross_entropy", run = function(x) return keng.cross_entropy(x, ids({0, 5, 2, 1}):narrow(1, 1, x.shape[1])) end, nan = true},
    {name = "mse_loss", run = function(x) return keng.mse_loss(x, x * 0.5) end, nan = true,
     huge = function(x) return keng.mse_loss(x, x:unsqueeze(1):expand{HUGE, -1, -1}) end},
  }},
  attention = {shape = {1, 2, 4, 8}, ops = {
    {name = "scaled_dot_product_attention", run = function(x) return keng.scaled_dot_product_attention(x, x, x) end, nan = true,
     huge = function(x) local k = x:expand{HUGE, -1, -1, -1}; return keng.scaled_dot_product_attention(x, k, k) end},
    {name = "scaled_dot_product_attention", run = function(x) return keng.scaled_dot_product_attention(x, x * 0.5, x, {causal = true}) end, nan = true},
  }},
  creation = {shape = {4, 6}, ops = {
    {name = "zeros", run = function(x) return keng.zeros(x.shape, {dtype = x.dtype}) + x end, nan = true,
     huge = function() return keng.zeros({HUGE, 4}) end},
    {name = "full", run = function(x) return keng.full(x.shape, 2.5, {dtype = x.dtype}) * x end, nan = true,
     huge = function() return keng.full({1 << 40, 1 << 40}, 1) end},
    {name = "empty", run = function(x) return keng.empty(x.shape):fill_(1) * x end, nan = true,
     huge = function() return keng.empty({1 << 31, 1 << 31}) end},
    {name = "arange", run = function(x) return keng.arange(x.shape[1]):double() + x:sum(2) end,
     huge = function() return keng.arange(0, 1e300) end},
    {name = "randn", run = function(x) return keng.randn(x.shape):mul(0) + x end, nan = true,
     huge = function() return keng.randn({HUGE}) end},
    {name = "tensor", run = function(x) return keng.tensor(x:tolist(), {dtype = "f64"}) end, nan = true},
  }},
}
-- every unary op of the op table (engine/ops/elementwise.def) joins the elementwise family, so a
-- new activation is fed the hostile inputs without an edit here
do
  local listed = {}
  for _, op in ipairs(FAMILIES.elementwise.ops) do listed[op.name] = true end
  for _, op in ipairs(keng.ops()) do
    if op.kind == "unary" and not listed[op.name] then
      local name = op.name
      table.insert(FAMILIES.elementwise.ops, {name = name, run = function(x) return x[name](x) end,
        nan = name ~= "logical_not"})
    end
  end
end

local WRONG = {"x", {}, true, 1.5, function() end}

for family, spec in pairs(FAMILIES) do
  describe("hostile inputs: " .. family, function()
    for k, op in ipairs(spec.ops) do
      local label = op.name .. " #" .. k
      it(label .. ": views compute like their contiguous copies", function()
        for how, v in pairs(layouts(f64(spec.shape))) do
          local got = result(pack(op.run(v)))
          local want = result(pack(op.run(v:contiguous())))
          H.close(values(got), values(want), 1e-9, label .. " " .. how)
        end
      end)

      it(label .. ": an empty input gives an empty result or a clear error", function()
        local shape = {table.unpack(spec.shape)}
        shape[1] = 0
        local ok, r = pcall(function() return result(pack(op.run(f64(shape)))) end)
        if not ok then clear_error(r, nil, label .. " empty") end
      end)

      it(label .. ": NaN " .. (op.nan and "reaches the output" or "does not crash"), function()
        local x = f64(spec.shape)
        x:reshape{-1}[2] = nan -- row 1, column 2
        local ok, r = pcall(function() return result(pack(op.run(x))) end)
        assert(ok, label .. ": " .. tostring(r))
        if op.nan then assert.is_true(any_nan(r), label .. " lost the NaN") end
      end)

      it(label .. ": wrongly typed arguments raise naming the function", function()
        local x = f64(spec.shape)
        local fn = keng[op.name] or x[op.name]
        for _, w in ipairs(WRONG) do
          for pos = 1, 4 do -- w in each argument slot, tensors in the others
            local args = {x, x, x, x}
            args[pos] = w
            local ok, err = pcall(fn, table.unpack(args))
            if not ok then clear_error(err, op.name, string.format("%s given a %s as argument %d", label, type(w), pos)) end
          end
        end
      end)

      if op.huge then
        it(label .. ": sizes near 2^62 are refused", function()
          local ok, err = pcall(op.huge, f64(spec.shape))
          assert(not ok, label .. ": a huge size was accepted")
          clear_error(err, nil, label .. " huge")
          assert(tostring(err):find("too large", 1, true) or tostring(err):find("2^59", 1, true) or
                 tostring(err):find("out of range", 1, true) or tostring(err):find("does not fit", 1, true),
                 label .. ": " .. tostring(err))
        end)
      end
    end
  end)
end
