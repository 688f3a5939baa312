-- numerics_spec.lua — hardening at run time: keng.debug.check_numerics (and
-- KENG_CHECK_NUMERICS=1) raising on NaN/Inf outputs with the op and shapes; TerminateOnNaN on a
-- NaN that comes from the data; an impossible allocation raising "out of memory" and the session
-- going on; an error inside fit leaving the last checkpoint intact; binary chunks refused by
-- load / loadfile / dofile / require in the keng executable.
local keng = require "keng"
local H = require "helper"
local nn = require "keng.nn"
local optim = require "keng.optim"
local train = require "keng.train"
local cbs = require "keng.callbacks"

local sh_quote, read, write, tmpdir, keng_bin = H.sh_quote, H.try_read, H.write, H.tmpdir, H.keng_bin

-- runs fn with check_numerics on, restoring the previous setting
local function checked(fn)
  local was = keng.debug.check_numerics(true)
  local ok, err = pcall(fn)
  keng.debug.check_numerics(was)
  if not ok then error(err, 0) end
end

describe("keng.debug.check_numerics", function()
  it("is off by default: a NaN passes silently", function()
    assert.is_false(keng.debug.check_numerics())
    local y = keng.log(keng.tensor{-1.5, 1.5})
    assert.is_true(y[1]:item() ~= y[1]:item())
  end)

  it("returns the previous setting and refuses non-booleans", function()
    assert.is_false(keng.debug.check_numerics(true))
    assert.is_true(keng.debug.check_numerics(false))
    H.raises(function() keng.debug.check_numerics("yes") end, "boolean expected")
  end)

  it("raises on a NaN output naming the op, the output and the input shapes", function()
    checked(function()
      local x = keng.tensor({{-1, 2, 3}, {4, 5, -6}}, {dtype = "f32"})
      local err = H.raises(function() return x:log() end, "log: check_numerics: output 1 f32[2,3] has 2 NaN and 0 Inf")
      assert.truthy(err:find("first at flat index 0", 1, true), err)
      assert.truthy(err:find("inputs (f32[2,3])", 1, true), err)
      -- finite results pass, and the session goes on
      H.close(x:abs():log(), keng.tensor{{0, math.log(2), math.log(3)}, {math.log(4), math.log(5), math.log(6)}})
    end)
  end)

  it("raises on an Inf the op created, not on one its inputs already held", function()
    checked(function()
      H.raises(function() return keng.tensor{1.5, 2.5} / keng.tensor{1.5, 0.0} end, "div: check_numerics: output 1 f32[2] has 0 NaN and 1 Inf")
      H.raises(function() return keng.tensor{100.0}:exp() * 1e30 end, "check_numerics")
      local mask = keng.full({2, 2}, -math.huge)                      -- asked for: no error
      local y = mask + keng.ones({2, 2})                              -- propagated: no error
      assert.are.equal(-math.huge, y[1][1]:item())
      H.close(keng.softmax(keng.tensor{{0, -math.huge}}, -1), keng.tensor{{1, 0}})
    end)
  end)

  it("checks bf16, f16 and f64 outputs and non-contiguous views", function()
    checked(function()
      for _, dt in ipairs{"bf16", "f16", "f64"} do
        H.raises(function() return keng.tensor{-1.5, 4.5}:to(dt):sqrt() end, "sqrt: check_numerics: output 1 " .. dt .. "[2] has 1 NaN")
      end
      local x = keng.zeros({3, 4})
      H.raises(function() x:transpose(1, 2):add_(keng.full({4, 3}, 0 / 0)) end, "check_numerics")
    end)
  end)

  it("catches a NaN born in backward (sqrt at 0 has an infinite slope)", function()
    checked(function()
      local x = keng.tensor{0.0, 4.0}:requires_grad_()
      local y = x:sqrt():sum()                                        -- forward is finite
      H.raises(function() y:backward() end, "check_numerics")
    end)
  end)

  it("KENG_CHECK_NUMERICS=1 turns it on; the traceback shows the script's line", function()
    local bin = keng_bin()
    assert.truthy(bin, "no keng binary (set KENG_BIN)")
    local dir = tmpdir()
    write(dir .. "/nan.lua", "local x = keng.tensor{1.5, -1.5}\nlocal y = x:sqrt()\nprint('not reached')\n")
    local p = io.popen("cd " .. sh_quote(dir) .. " && KENG_CHECK_NUMERICS=1 " .. sh_quote(bin) .. " nan.lua 2>&1; echo rc=$?")
    local out = p:read("a")
    p:close()
    assert.truthy(out:find("sqrt: check_numerics: output 1 f32[2] has 1 NaN", 1, true), out)
    assert.truthy(out:find("nan.lua:2", 1, true), out)
    assert.is_nil(out:find("not reached", 1, true), out)
    assert.truthy(out:find("rc=1", 1, true), out)
    p = io.popen("cd " .. sh_quote(dir) .. " && KENG_CHECK_NUMERICS=0 " .. sh_quote(bin) .. " nan.lua 2>&1")
    out = p:read("a")
    p:close()
    assert.truthy(out:find("not reached", 1, true), out)
    os.execute("rm -rf " .. sh_quote(dir))
  end)
end)

describe("resource errors", function()
  it("an allocation larger than memory raises 'out of memory' and the session goes on", function()
    local err = H.raises(function() return keng.empty({1e6, 1e6}) end, "out of memory: asked 4000000000000 bytes")
    assert.truthy(err:find("pool holds", 1, true), err)
    H.raises(function() return keng.zeros({1e6, 1e6}, {dtype = "f64"}) end, "out of memory: asked 8000000000000 bytes")
    H.close(keng.ones({2, 2}):sum(), 4)
  end)

  it("TerminateOnNaN stops fit at the step whose batch holds a NaN", function()
    local x = keng.randn({8, 1})
    local y = x * 2
    local rows = x:tolist()
    rows[5][1] = 0 / 0                                                -- batch 3 of 2 rows
    x = keng.tensor(rows)
    local m = nn.Linear(1, 1)
    local tn = cbs.TerminateOnNaN{verbose = 0}
    local h = train.fit(m, {x = x, y = y}, {loss = "mse", batch_size = 2, epochs = 2, verbose = 0, shuffle = false,
      optimizer = optim.SGD(m:parameters(), {lr = 0.01}), callbacks = {tn}})
    assert.truthy(tn.message:find("step 3", 1, true), tn.message)
    assert.truthy(h.stop_reason:find("TerminateOnNaN", 1, true))
    assert.are.equal(3, #h.steps)
  end)

  it("an error inside fit leaves the last checkpoint intact and loadable", function()
    local dir = tmpdir()
    local x = keng.randn({8, 1})
    local y = x * 3
    local m = nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1))
    local snap
    local epoch = 0
    local ck = cbs.ModelCheckpoint(dir .. "/last.safetensors", {monitor = "loss", save_best_only = false})
    local boom = cbs.Lambda{
      on_epoch_begin = function(_, e) epoch = e end,
      on_epoch_end = function(_, e)
        snap = {}
        for k, t in pairs(m:state_dict()) do snap[k] = t:clone() end
      end,
      on_batch_begin = function() if epoch == 3 then error("boom in epoch 3") end end}
    local ok, err = pcall(train.fit, m, {x = x, y = y}, {loss = "mse", batch_size = 4, epochs = 5, verbose = 0,
      optimizer = optim.SGD(m:parameters(), {lr = 0.1}), callbacks = {boom, ck}})
    assert.is_false(ok)
    assert.truthy(tostring(err):find("boom in epoch 3", 1, true), tostring(err))
    local sd, meta = keng.load(dir .. "/last.safetensors")
    assert.are.equal("2", meta.epoch)
    for k, t in pairs(snap) do
      assert.are.equal(0, sd[k]:ne(t):sum():item(), k .. " differs from the epoch-2 weights")
    end
    local p = io.popen("ls -A " .. sh_quote(dir))
    local listing = p:read("a")
    p:close()
    assert.are.equal("last.safetensors\n", listing, "no temp files left behind")
    os.execute("rm -rf " .. sh_quote(dir))
  end)
end)

describe("Lua loading (the keng executable refuses binary chunks)", function()
  local dump = string.dump(function() return 42 end)

  it("load refuses a binary chunk even when mode 'b' is asked; text loads keep their env", function()
    local f, err = load(dump)
    assert.is_nil(f)
    assert.truthy(err:find("binary", 1, true), err)
    f, err = load(dump, "x", "b")
    assert.is_nil(f)
    assert.truthy(err:find("binary", 1, true), err)
    assert.are.equal(3, load("return 1 + 2")())
    assert.are.equal(7, load("return y", "=y", "t", {y = 7})())
    local g = load("return print", "=p", "bt", nil)                   -- explicit nil env stays nil
    H.raises(g, "upvalue '_ENV'")
    local parts, i = {"return ", "5"}, 0
    assert.are.equal(5, load(function() i = i + 1 return parts[i] end)())
  end)

  it("loadfile, dofile and require refuse bytecode files", function()
    local dir = tmpdir()
    write(dir .. "/bc.lua", dump)
    write(dir .. "/txt.lua", "return 'text ok'")
    local f, err = loadfile(dir .. "/bc.lua")
    assert.is_nil(f)
    assert.truthy(err:find("binary", 1, true), err)
    f, err = loadfile(dir .. "/bc.lua", "b")
    assert.is_nil(f, "mode 'b' is overridden")
    H.raises(function() dofile(dir .. "/bc.lua") end, "binary")
    assert.are.equal("text ok", dofile(dir .. "/txt.lua"))
    local saved = package.path
    package.path = dir .. "/?.lua;" .. saved
    local ok, rerr = pcall(require, "bc")
    local ok2, val = pcall(require, "txt")
    package.path = saved
    package.loaded.bc, package.loaded.txt = nil, nil
    assert.is_false(ok)
    assert.truthy(tostring(rerr):find("binary", 1, true), tostring(rerr))
    assert.is_true(ok2, tostring(val))
    assert.are.equal("text ok", val)
    os.execute("rm -rf " .. sh_quote(dir))
  end)

  it("keng refuses a bytecode script", function()
    local bin = keng_bin()
    local dir = tmpdir()
    write(dir .. "/bc.lua", dump)
    local p = io.popen(sh_quote(bin) .. " " .. sh_quote(dir .. "/bc.lua") .. " 2>&1; echo rc=$?")
    local out = p:read("a")
    p:close()
    assert.truthy(out:find("binary", 1, true), out)
    assert.truthy(out:find("rc=1", 1, true), out)
    os.execute("rm -rf " .. sh_quote(dir))
  end)
end)
