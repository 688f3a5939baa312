-- gpu_harness_spec.lua — the one-call GPU check (tests/gpu/prepare.sh, run.sh, summary.lua and the
-- PyTorch peer) cannot be run here, so its contracts are checked statically: prepare.sh stages
-- every library CMakeLists.txt looks for, run.sh returns at most 8 files and runs exactly
-- config.lua's rows, the peer uses the same row ids, both scripts parse (`bash -n`), and
-- summary.lua pairs keng rows with the peer's and computes the H200 floor. The full dry run
-- (`KENG_GPU_DRY_RUN=1 bash tests/gpu/run.sh`, a few minutes) is not part of this suite.
local root = debug.getinfo(1, "S").source:match("^@(.*)/tests/lua/gpu_harness_spec.lua$") or "."
package.path = root .. "/scripts/?.lua;" .. package.path
local config = require "bench.config"
local json = require "keng.json"

local H = require "helper"
local function read(path) return H.read(root .. "/" .. path) end
local sh_quote = H.sh_quote

-- what CMakeLists.txt searches for: find_package names, pkg_check_modules modules, find_path
-- headers and find_library names (the first after NAMES)
local KEYWORDS = {REQUIRED = true, QUIET = true, IMPORTED_TARGET = true, GLOBAL = true, NO_CMAKE_PATH = true}
local function cmake_requirements(text)
  local out, seen = {}, {}
  local function add(x) if x and not seen[x] then seen[x] = true; out[#out + 1] = x end end
  text = text:gsub("#[^\n]*", "")
  for args in text:gmatch("find_package%s*(%b())") do add(args:match("^%(%s*([%w_]+)")) end
  for args in text:gmatch("pkg_check_modules%s*(%b())") do
    local words = {}
    for w in args:sub(2, -2):gmatch("[^%s]+") do words[#words + 1] = w end
    for i = 2, #words do if not KEYWORDS[words[i]] then add(words[i]) end end
  end
  for args in text:gmatch("find_path%s*(%b())") do add(args:match("^%(%s*[%w_]+%s+([^%s%)]+)")) end
  for args in text:gmatch("find_library%s*(%b())") do
    add(args:match("^%(%s*[%w_]+%s+NAMES%s+([^%s%)]+)") or args:match("^%(%s*[%w_]+%s+([^%s%)]+)"))
  end
  return out
end

-- prepare.sh's provides=( "key:packages" ... ) table
local function provides(text)
  local body = assert(text:match("\nprovides=%((.-)\n%)"), "prepare.sh has no provides=( ... ) table")
  local map = {}
  for key, pkgs in body:gmatch('"([^:"]+):([^"]*)"') do map[key] = pkgs end
  return map
end

local function bash_array(text, name)
  local body = assert(text:match("\n" .. name .. "=%((.-)%)"), "run.sh has no " .. name .. "=( ... )")
  local out = {}
  for w in body:gsub("#[^\n]*", ""):gmatch("[^%s]+") do out[#out + 1] = w end
  return out
end

describe("tests/gpu/prepare.sh", function()
  local cmake = cmake_requirements(read("CMakeLists.txt"))
  local map = provides(read("tests/gpu/prepare.sh"))

  it("the parser finds CMakeLists.txt's libraries", function()
    local set = {}
    for _, r in ipairs(cmake) do set[r] = true end
    for _, want in ipairs({"OpenMP", "PkgConfig", "lua5.4", "cblas.h", "openblas", "readline", "PNG", "CUDAToolkit"}) do
      assert.is_true(set[want] == true, want .. " not found in CMakeLists.txt by the parser")
    end
  end)

  it("stages a package (or names the device image) for every library CMakeLists.txt needs", function()
    local missing = {}
    for _, r in ipairs(cmake) do if not map[r] or map[r]:match("^%s*$") then missing[#missing + 1] = r end end
    assert.are.same({}, missing)
  end)

  it("stages libpng with zlib's headers (FindPNG needs ZLIB) and the busted stack", function()
    assert.truthy(map.PNG:find("libpng-dev", 1, true))
    assert.truthy(map.ZLIB:find("zlib1g-dev", 1, true))
    for _, p in ipairs({"lua-busted", "lua-luassert", "lua-say", "lua-penlight", "lua-cliargs", "lua-system",
                        "lua-term", "lua-mediator", "lua-dkjson", "lua-filesystem"}) do
      assert.truthy(map.busted:find(p, 1, true), p .. " missing from the busted entry")
    end
  end)

  it("names only Debian packages or (image)", function()
    for key, pkgs in pairs(map) do
      for p in pkgs:gmatch("[^%s]+") do
        assert.truthy(p == "(image)" or p:match("^[a-z0-9][a-z0-9.+-]+$"), key .. ": bad package name " .. p)
      end
    end
  end)
end)

describe("tests/gpu/prepare.sh and run.sh", function()
  local prep, run = read("tests/gpu/prepare.sh"), read("tests/gpu/run.sh")

  it("carry the staged tree packed (the unpacked tree is over the device tool's 64 MiB) and unpack it there", function()
    assert.truthy(prep:find('"$deps/prefix/prefix.tar.xz"', 1, true), "prepare.sh does not write prefix/prefix.tar.xz")
    assert.truthy(run:find('-xJf "$deps/prefix/prefix.tar.xz"', 1, true), "run.sh does not unpack prefix/prefix.tar.xz")
    assert.truthy(prep:find("64 * 1048576", 1, true), "prepare.sh does not check the size the call sends")
    -- the unpacked tree stays out of the carried folders
    assert.truthy(prep:find('p="$deps/root"', 1, true))
    assert.truthy(run:find('root="$deps/root"', 1, true))
  end)

  it("stage libudev (hwloc, under Open MPI, needs it; the device image may lack it)", function()
    assert.truthy(provides(prep)["ompi-c"]:find("libudev1", 1, true))
  end)
end)

describe("tests/gpu/run.sh", function()
  local text = read("tests/gpu/run.sh")

  it("returns at most 8 files, with names the device tool accepts", function()
    local files = bash_array(text, "OUT_FILES")
    assert.is_true(#files >= 1 and #files <= 8, #files .. " files")
    local seen = {}
    for _, f in ipairs(files) do
      assert.truthy(f:match("^[%w._-]+$"), f)
      assert.is_nil(seen[f], "twice: " .. f)
      seen[f] = true
    end
    -- every file put into $OUT is one of them, and nothing else writes there
    for line in text:gmatch("[^\n]+") do
      line = line:gsub("^%s*#.*", ""):gsub("%s#%s.*", "")         -- comments
      for n in line:gmatch("put ([%w._-]+)") do assert.truthy(seen[n], "put " .. n .. " is not in OUT_FILES") end
      if line:find("$out/", 1, true) then
        local ok = line:find('"$out/$n', 1, true) or line:find('"$out/run.log"', 1, true) or
                   line:find('"$out/summary.md"', 1, true)
        assert.truthy(ok, "writes into $OUT outside put(): " .. line)
      end
    end
    -- summary.lua writes summary.md and results.json
    for n in read("tests/gpu/summary.lua"):gmatch('outdir %.%. "/([%w._-]+)"') do
      assert.truthy(seen[n], "summary.lua writes " .. n .. ", not in OUT_FILES")
    end
  end)

  it("runs every row of scripts/bench/config.lua once, Gemma generate b1 and Gemma fit first", function()
    local ids, seen = {}, {}
    for _, spec in ipairs(bash_array(text, "ROWS")) do
      local id, steps, cap = spec:match("^([%w_]+):(%d+):(%d+)$")
      assert.truthy(id, "bad ROWS entry " .. spec)
      assert.is_nil(seen[id], "twice: " .. id)
      seen[id] = true
      ids[#ids + 1] = id
    end
    local want = {}
    for _, r in ipairs(config.rows) do want[#want + 1] = r.id end
    local got = {table.unpack(ids)}
    table.sort(want)
    table.sort(got)
    assert.are.same(want, got)
    assert.are.equal("gemma_generate_1", ids[1])
    assert.are.equal("gemma_fit", ids[2])
  end)

  it("names only files that exist (specs, check scripts, bench files, the peer)", function()
    local seen = 0
    for path in text:gmatch("[%w_/]+%.[%a]+") do
      if path:match("^tests/") or path:match("^scripts/") then
        seen = seen + 1
        local f = io.open(root .. "/" .. path)
        assert.truthy(f, "run.sh names " .. path .. ", which does not exist")
        if f then f:close() end
      end
    end
    assert.is_true(seen >= 10, seen .. " paths found in run.sh")
  end)

  it("and prepare.sh parse (bash -n)", function()
    for _, f in ipairs({"tests/gpu/run.sh", "tests/gpu/prepare.sh"}) do
      assert.is_true(os.execute("bash -n " .. sh_quote(root .. "/" .. f)) == true, f)
    end
  end)
end)

describe("the PyTorch and Keras peers", function()
  it("use the row ids of config.lua (peer_spec.py, which both import)", function()
    local got, want = {}, {}
    local body = assert(read("scripts/bench/peers/peer_spec.py"):match("\nROWS = %[(.-)\n%]"))
    for _, peer in ipairs{"peer_rows.py", "keras3.py"} do
      assert.truthy(read("scripts/bench/peers/" .. peer):find("\nfrom peer_spec import", 1, true), peer)
      assert.is_nil(read("scripts/bench/peers/" .. peer):find("\nROWS = [", 1, true), peer .. " keeps its own ROWS")
    end
    for id in body:gmatch('%("([%w_]+)", "') do got[#got + 1] = id end
    for _, r in ipairs(config.rows) do want[#want + 1] = r.id end
    assert.are.same(want, got)
  end)

  it("time their steps with peer_spec.time_steps, not copies of its loop", function()
    assert.truthy(read("scripts/bench/peers/peer_spec.py"):find("\ndef time_steps(fn, steps, sync", 1, true))
    for _, peer in ipairs{"peer_rows.py", "keras3.py"} do
      local src = read("scripts/bench/peers/" .. peer)
      assert.truthy(src:match("\nfrom peer_spec import [^\n]*time_steps") or
        src:match("\nfrom peer_spec import %b()"):find("time_steps", 1, true), peer .. " does not import time_steps")
      assert.is_nil(src:find("for _ in range(steps):", 1, true), peer .. " keeps its own timing loop")
    end
  end)
end)

describe("tests/gpu/summary.lua", function()
  local summary = dofile(root .. "/tests/gpu/summary.lua")
  local tmp = os.tmpname()
  os.remove(tmp)
  assert(os.execute("mkdir -p " .. sh_quote(tmp .. "/rows/gemma_generate_1") .. " " .. sh_quote(tmp .. "/out")))
  local function write(path, s)
    local f = assert(io.open(tmp .. "/" .. path, "w"))
    f:write(s)
    f:close()
  end
  write("meta.tsv", "commit\tabc\ngpu\tNVIDIA H200, 580, 143771 MiB\nbudget\t500\n")
  write("stages.tsv", "build\tok\t120\tCUDA ON\ncompare.lua\tfailed\t40\texit 1\n")
  write("rows.tsv", "gemma_generate_1\tran\t0\t30\t100\t3\ngemma_fit\ttimeout\t124\t100\t100\t10\n" ..
    "bert_fit\tskipped\t\t0\t0\t10\n")
  write("compare.log", "sdpa D=256  bf16  max err 0.5  tol 0.03  FAIL\n\n700 cases on cuda: 699 passed, 1 failed\n")
  write("rows/gemma_fit.log", "[ 1/1] Gemma fit ... \nline a\nkeng: out of memory in matmul\n")
  -- a generate row: 8.5e9 bf16 params read once for each of 44 decoded tokens at 4.8 TB/s = 155.8 ms
  write("rows/gemma_generate_1/2026-01-01-gpu.json", json.encode({framework = "keng", rows = {{
    id = "gemma_generate_1", row = "Gemma generate", task = "generate", batch = 1, dtype = "bf16",
    device = "NVIDIA H200", status = "ok", mean_ms = 311.6, median_ms = 300, min_ms = 290, params = 8.5e9,
    max_length = 50, shapes = {prompts = {1, 6}}, flops_per_step = 1e9, keras = {best = 703.46}}}}))
  write("peer.json", json.encode({framework = "pytorch", rows = {
    {id = "gemma_generate_1", status = "ok", mean_ms = 623.2},
    {id = "gemma_fit", status = "failed", reason = "OutOfMemoryError: CUDA out of memory"},
    {id = "sam_fit", status = "ok", mean_ms = 120.5, batch = 1, dtype = "f32"}}}))

  it("pairs keng rows with the peer's and computes the H200 floor", function()
    local res = summary.write(tmp, tmp .. "/out")
    local r = res.rows[1]
    assert.are.equal("ok", r.status)
    assert.are.equal(0.5, r.ratio)
    assert.is_true(math.abs(r.floor_ms - 8.5e9 * 2 * 44 / 4.8e12 * 1e3) < 1e-6)
    assert.are.equal("HBM", r.floor_by)
    assert.is_true(math.abs(r.pct_floor - 100 * r.floor_ms / 311.6) < 1e-9)
    assert.are.equal("timeout", res.rows[2].status)
    assert.are.equal("keng: out of memory in matmul", res.rows[2].log_tail[3])
    assert.are.equal("OutOfMemoryError: CUDA out of memory", res.rows[2].peer_reason)
    assert.are.equal("skipped", res.rows[3].status)
    assert.are.equal(1, res.compare.failed)
  end)

  it("lists the rows only the peer ran (keng stopped early: the peer runs beside the build)", function()
    local r = summary.build(tmp).rows[4]
    assert.are.equal("sam_fit", r.id)
    assert.are.equal("not run", r.status)
    assert.are.equal(120.5, r.peer_ms)
  end)

  it("writes summary.md and results.json", function()
    local md = io.open(tmp .. "/out/summary.md"):read("a")
    assert.truthy(md:find("| gemma_generate_1 | 1 | bf16 | 3 | 311.60 (300.00, 290.00) | 623.20 | 0.50 | 155.8 (HBM) | 50% | 703.46 | ok |", 1, true))
    assert.truthy(md:find("keng: out of memory in matmul", 1, true))
    assert.truthy(md:find("sdpa D=256", 1, true))
    assert.truthy(md:find("gemma_fit: OutOfMemoryError", 1, true))
    local doc = json.decode(io.open(tmp .. "/out/results.json"):read("a"))
    assert.are.equal("keng-gpu-check/1", doc.schema)
    assert.are.equal(4, #doc.rows)
  end)

  it("reads JSON without the keng module as the engine does (plain lua5.4 runs it when the build failed)", function()
    local docs = {'{"a": [1, 2.5, -3e2, null, true, false], "b": {"c": "x\\"y\\\\z\\n\\u00e9\\ud83d\\ude00"}, "d": []}',
                  '[NaN, Infinity, -Infinity, 0, {"e": null}]', '  {"rows": [{"id": "gemma_fit", "mean_ms": 232.5}]} '}
    for _, d in ipairs(docs) do
      local got = summary.plain_json_decode(d, json.null, json.array_mt)
      local want = json.decode(d)
      assert.are.equal(json.encode(want), json.encode(got), d)
    end
    assert.are.equal(json.array_mt, getmetatable(summary.plain_json_decode("[]", json.null, json.array_mt)))
    assert.has_error(function() summary.plain_json_decode('{"a": 1', json.null, json.array_mt) end)
    assert.has_error(function() summary.plain_json_decode('[1] x', json.null, json.array_mt) end)
  end)

  it("runs under plain lua5.4 (no keng module) where one is installed", function()
    if not os.execute("command -v lua5.4 >/dev/null 2>&1") then return pending("no lua5.4 here") end
    local out = tmp .. "/plain"
    assert(os.execute("mkdir -p " .. sh_quote(out)))
    assert.is_true(os.execute("cd " .. sh_quote(root) .. " && lua5.4 tests/gpu/summary.lua " .. sh_quote(tmp) .. " " ..
      sh_quote(out) .. " 2>&1") == true)
    local md = io.open(out .. "/summary.md"):read("a")
    assert.truthy(md:find("| gemma_generate_1 | 1 | bf16 | 3 | 311.60 (300.00, 290.00) | 623.20 | 0.50 |", 1, true))
  end)

  it("has no floor off an H200 (the dry run on a CPU)", function()
    assert.is_nil(summary.floor({device = "Intel Xeon", task = "fit", dtype = "f32", flops_per_step = 1e12}))
    local ms, by = summary.floor({device = "NVIDIA H200", task = "fit", dtype = "f32", flops_per_step = 494.7e12, tf32 = true})
    assert.are.equal(1000, ms)
    assert.are.equal("tf32", by)
  end)
  teardown(function() os.execute("rm -rf " .. sh_quote(tmp)) end)
end)
