-- env_spec.lua — the registry of KENG_* environment variables (engine/core/env.def,
-- docs/environment.md): `keng --env` lists every row with its value, an unknown KENG_* variable
-- or a value that does not parse gets a warning naming it, and no code reads a KENG_* variable
-- that is not in the table.
local H = require "helper"

local KENG = H.keng_bin()
local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local tmp = os.tmpname()

-- stdout, stderr of `env <assignments> keng <args>`
local function run(assign, args)
  local cmd = "env " .. assign .. " " .. sh_quote(KENG) .. " " .. args .. " 2>" .. sh_quote(tmp)
  local p = io.popen(cmd, "r")
  local out = p:read("a")
  p:close()
  local f = io.open(tmp)
  local err = f:read("a")
  f:close()
  return out, err
end

-- the rows of env.def: {name, type, default, scope}
local function rows()
  local f = assert(io.open("engine/core/env.def"))
  local t = {}
  for line in f:lines() do
    local name, ty, def, scope = line:match('^KG_ENV%((KENG_[A-Z0-9_]+),%s*(%u+),%s*"([^"]*)",%s*(%u+),')
    if name then t[#t + 1] = {name = name, type = ty, def = def, scope = scope} end
  end
  f:close()
  return t
end

describe("environment registry", function()
  it("keng --env lists every variable of env.def with its type, scope, default and value", function()
    local out, err = run("-u KENG_NUM_THREADS KENG_DEBUG=0 KENG_SOFTMAX_DIRECT=0", "--env")
    assert.are.equal("", err)
    local list = rows()
    assert.truthy(#list >= 20, "env.def rows not found")
    for _, r in ipairs(list) do
      local line = out:match("\n(" .. r.name .. " [^\n]*)")
      assert(line, "--env lacks " .. r.name)
      local ty, scope, def, value = line:match("^%S+%s+(%S+)%s+(%S+)%s+(%S+)%s+(%S+)")
      assert.are.same({r.type, r.scope, r.def == "" and "-" or r.def}, {ty, scope, def}, r.name)
      if r.name == "KENG_DEBUG" then assert.are.equal("0", value)
      elseif r.name == "KENG_SOFTMAX_DIRECT" then assert.are.equal("0", value)
      elseif r.name == "KENG_NUM_THREADS" then assert.are.equal("-", value) end
    end
    assert.truthy(out:find("LAB: kernel-lab switches", 1, true))
  end)

  it("an unknown KENG_* variable is reported by name, with the nearest known one", function()
    local out, err = run("KENG_THREDS=4", "-e 'io.write(keng.num_threads() > 0 and \"ran\" or \"\")'")
    assert.are.equal("ran", out) -- a warning, not an error
    assert.truthy(err:find("unknown environment variable KENG_THREDS (did you mean KENG_NUM_THREADS?)", 1, true), err)
    local _, err2 = run("KENG_ZZZZZZZZZZZZZZZZ=1", "-e ''")
    assert.truthy(err2:find("unknown environment variable KENG_ZZZZZZZZZZZZZZZZ;", 1, true), err2)
    -- known variables, set or empty, say nothing
    local _, quiet = run("KENG_NO_SIMD=0 KENG_PROGRESS= KENG_DEVICE=cpu", "-e ''")
    assert.are.equal("", quiet)
  end)

  it("a value that does not parse is reported and the default kept", function()
    local out, err = run("KENG_NUM_THREADS=two KENG_DIST_TIMEOUT=1e3x KENG_NO_SIMD=maybe",
      "-e 'io.write(keng.num_threads())'")
    assert.truthy(err:find("KENG_NUM_THREADS=two is not an integer; using the default 0", 1, true), err)
    assert.truthy(err:find("KENG_DIST_TIMEOUT=1e3x is not a number; using the default 1800", 1, true), err)
    assert.truthy(err:find("KENG_NO_SIMD=maybe is not 0 or 1; using the default 0", 1, true), err)
    local _, ok = run("KENG_NO_SIMD=false KENG_SYNC=On KENG_WALL=0", "-e ''")
    assert.are.equal("", ok)
    assert.truthy(tonumber(out) >= 1)
  end)

  it("KENG_NO_SIMD=1 switches every vector path off, the ISA-dispatched kernels' too", function()
    local isa = run("-u KENG_NO_SIMD", "-e 'io.write(keng.cpu_simd())'")
    assert.truthy(isa == "avx512" or isa == "avx2" or isa == "none", isa)
    assert.are.equal("none", (run("KENG_NO_SIMD=1", "-e 'io.write(keng.cpu_simd())'")))
    assert.are.equal(isa, (run("KENG_NO_SIMD=0", "-e 'io.write(keng.cpu_simd())'")))
    -- a direct conv (kg_cpu_vector_isa's kernel) on the scalar path gives the vector path's values
    local conv = "-e 'keng.manual_seed(1); local y = keng.conv2d(keng.randn({1, 8, 9, 9}), keng.randn({16, 8, 3, 3})); " ..
      "io.write(string.format(\"%.6f %.6f\", y:sum():item(), y:abs():sum():item()))'"
    local a, b = run("-u KENG_NO_SIMD", conv), run("KENG_NO_SIMD=1", conv)
    local a1, a2 = a:match("(%S+) (%S+)")
    local b1, b2 = b:match("(%S+) (%S+)")
    assert.truthy(a1 and b1, a .. " / " .. b)
    assert.truthy(math.abs(a1 - b1) < 1e-3 and math.abs(a2 - b2) < 1e-3, a .. " / " .. b)
  end)

  it("values reach the engine (KENG_NUM_THREADS, KENG_CHECK_NUMERICS)", function()
    local out = run("KENG_NUM_THREADS=1", "-e 'io.write(keng.num_threads())'")
    assert.are.equal("1", out)
    local _, err = run("KENG_CHECK_NUMERICS=1", "-e 'local t = keng.tensor({-1}):log()'")
    assert.truthy(err:find("log", 1, true) and err:lower():find("nan", 1, true), err)
  end)

  it("no source reads a KENG_* variable that is not in env.def", function()
    local known = {}
    for _, r in ipairs(rows()) do known[r.name] = true end
    local p = io.popen("grep -rhoE 'getenv\\(\"KENG_[A-Z0-9_]+\"' engine lua_bindings scripts tests 2>/dev/null")
    local found = p:read("a")
    p:close()
    local n = 0
    for name in found:gmatch('"(KENG_[A-Z0-9_]+)"') do
      n = n + 1
      assert(known[name], name .. " is read with getenv but is not a row of engine/core/env.def")
    end
    assert.truthy(n > 0)
    -- and the engine reads none directly: kg_env_* only
    local q = io.popen("grep -rlE 'getenv\\(\"KENG_' engine lua_bindings 2>/dev/null")
    local direct = q:read("a")
    q:close()
    assert.are.equal("", direct, "engine code reads KENG_* with getenv instead of kg_env_*: " .. direct)
  end)
end)
