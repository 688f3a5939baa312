-- bandwidth_spec.lua — keng.memory_bandwidth (engine/cpu/bandwidth.c, the STREAM-style roofline
-- of the decode rows): results, options and their errors; and a smoke run of
-- scripts/bench/decode.lua (ms/token, GB/s) on mistral_tiny as a child process.
local keng = require "keng"

local root = debug.getinfo(1, "S").source:match("^@(.*)/tests/lua/bandwidth_spec.lua$") or "."
package.path = root .. "/scripts/?.lua;" .. package.path

-- the keng running this spec ($KENG_BIN when tests/run_all.sh sets it)
local function keng_exe()
  local env = os.getenv("KENG_BIN")
  if env and env ~= "" then return env end
  local p = io.popen("readlink /proc/$PPID/exe 2>/dev/null")
  local self = p:read("a"):gsub("%s+$", "")
  p:close()
  return self
end

describe("keng.memory_bandwidth", function()
  it("measures a read and a triad over a small buffer", function()
    local r = keng.memory_bandwidth{threads = 1, mib = 1, reps = 2}
    assert.equals(1, r.threads)
    assert.equals(1 << 20, r.bytes)
    assert.is_true(r.read > 0 and r.read < 1e5)
    assert.is_true(r.triad > 0 and r.triad < 1e5)
    local r2 = keng.memory_bandwidth{threads = 2, mib = 1, reps = 1}
    assert.equals(2, r2.threads)
  end)

  it("refuses unknown options and bad values", function()
    assert.has_error(function() keng.memory_bandwidth{thread = 1} end,
      "memory_bandwidth: unknown option 'thread' (valid: threads, mib, reps)")
    assert.has_error(function() keng.memory_bandwidth{mib = 0} end)
    assert.has_error(function() keng.memory_bandwidth{reps = 1.5} end)
    assert.has_error(function() keng.memory_bandwidth(3) end)
  end)
end)

describe("scripts/bench/decode.lua", function()
  local exe = keng_exe()
  local function run(args)
    local p = io.popen(string.format("cd '%s' && '%s' scripts/bench/decode.lua %s 2>&1; echo rc=$?", root, exe, args))
    local out = p:read("a")
    p:close()
    return out
  end

  it("times mistral_tiny and prints ms/token and GB/s as JSON", function()
    local out = run("--model mistral_tiny --tokens 3 --repeats 1 --threads 1 --format json")
    assert.truthy(out:match("rc=0"), out)
    local j = require("keng.json").decode(out:match("^(%b{})"))
    assert.equals("mistral_tiny", j.model)
    assert.equals(1, j.batch)
    assert.is_true(j.ms_per_token > 0)
    assert.is_true(j.weight_bytes > 16e6)                            -- the 16 MB LM head at least
  end)

  it("refuses an unknown option", function()
    local out = run("--modle x")
    assert.truthy(out:match("unknown option %-%-modle"), out)
    assert.truthy(out:match("rc=2"), out)
  end)

  it("--profile N prints one step's op profile, linear first", function()
    local out = run("--model mistral_tiny --tokens 3 --repeats 1 --threads 1 --profile 3")
    assert.truthy(out:match("rc=0"), out)
    assert.truthy(out:match("%(all ops%)"), out)
    assert.truthy(out:match("\n%s+[%d.]+%s+[%d.]+%%%s+[%d.]+%s+[%d.]*%s*linear"), out)
  end)
end)

describe("scripts/bench/stream.lua --gemv", function()
  it("prints each GEMV shape's GB/s against the read figure of the same run (JSON)", function()
    local exe = keng_exe()
    local p = io.popen(string.format("cd '%s' && '%s' scripts/bench/stream.lua --mib 8 --cache-mib 1 --reps 1 " ..
      "--threads 1 --gemv 1 --format json 2>&1; echo rc=$?", root, exe))
    local out = p:read("a")
    p:close()
    assert.truthy(out:match("rc=0"), out)
    local j = require("keng.json").decode(out:match("^(%b{})"))
    assert.equals(6, #j.gemv)
    for _, g in ipairs(j.gemv) do
      assert.equals(1, g.threads)
      assert.is_true(g.gb_per_s > 0 and g.read > 0, g.shape)
      assert.is_true(math.abs(g.pct - 100 * g.gb_per_s / g.read) < 1e-9, g.shape)
      if g.dram then assert.is_true(g.K * g.M * 2 * g.copies > 8 * 1048576, g.shape) -- cycled past --mib
      else assert.equals(1, g.copies, g.shape) end
    end
    assert.equals("head 2048->32000", j.gemv[5].shape)
    local q = io.popen(string.format("cd '%s' && '%s' scripts/bench/stream.lua --gemv 2 2>&1; echo rc=$?", root, exe))
    local bad = q:read("a")
    q:close()
    assert.truthy(bad:match("%-%-gemv must be 0 or 1") and bad:match("rc=2"), bad)
  end)
end)
