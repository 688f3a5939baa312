-- helper.lua — shared test kit for the busted specs (run inside keng: `keng tests/run.lua`).
--   H.close(a, b, tol, msg)       asserts tensors/numbers/lists agree elementwise (abs+rel tol)
--   H.gradcheck(fn, inputs, opts) central finite differences in f64 against loss:backward()
--   H.raises(fn, pattern)         asserts fn errors with a message matching pattern (plain find)
--   H.noncontig(t)                the same values as t, laid out non-contiguously
--   H.device                      the device specs run on: KENG_DEVICE (cpu, cuda, cuda:N), default cpu
--   H.t(data, opts)               keng.tensor(data, opts) on H.device (opts.device wins)
--   H.ref_rope(x, pos, f, scale)  Hugging Face's rotate_half rope, computed in Lua (f64)
--   H.golden_runs(gold)           a golden file's generation runs {prompt = ids, gen = ids}
--   H.with_model_dir(src, edit, fn)  fn(dir) on a copy of a checkpoint directory, config.json edited
--   H.keng_bin()                  the keng executable running the specs (nil when none is found)
-- Files and processes (one copy for every spec):
--   H.root                        the source tree's root (where tests/ lies)
--   H.sh_quote(s)                 s as one single-quoted shell word
--   H.read(path) / H.try_read(path)  a file's bytes; read raises naming the path, try_read gives nil
--   H.exists(path)                whether path can be opened for reading
--   H.write(path, s)              writes s to path (binary), returns path
--   H.read_json(path, opts)       keng.json.decode of a file (opts passed on)
--   H.tmpname(suffix)             a fresh path that does not exist yet
--   H.tmpdir()                    a fresh, empty directory
--   H.run(cmd)                    runs a shell command: stdout, exit code, how it ended ("exit"/"signal")
--   H.capture_stderr(fn)          runs fn with io.stderr captured, returns what it wrote
local keng = require "keng"
local H = {}

H.device = os.getenv("KENG_DEVICE") or "cpu"

function H.t(data, opts)
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  if o.device == nil then o.device = H.device end
  return keng.tensor(data, o)
end

local function flat(x)
  if keng.is_tensor(x) then
    local t = x:double():contiguous():reshape{-1}:tolist()
    return t
  elseif type(x) == "table" then
    local out = {}
    local function walk(v) if type(v) == "table" then for _, e in ipairs(v) do walk(e) end else out[#out + 1] = v end end
    walk(x)
    return out
  else
    return {x}
  end
end
H.flat = flat

function H.close(a, b, tol, msg)
  tol = tol or 1e-5
  if keng.is_tensor(a) and keng.is_tensor(b) then
    assert(#a.shape == #b.shape, (msg or "") .. ": ndim differs")
    for i = 1, #a.shape do
      assert(a.shape[i] == b.shape[i],
        string.format("%s: shape [%s] vs [%s]", msg or "", table.concat(a.shape, ","), table.concat(b.shape, ",")))
    end
  end
  local fa, fb = flat(a), flat(b)
  assert(#fa == #fb, string.format("%s: %d elements vs %d", msg or "close", #fa, #fb))
  local worst, wi = 0, 0
  for i = 1, #fa do
    local x, y = fa[i], fb[i]
    if type(x) == "boolean" then x = x and 1 or 0 end
    if type(y) == "boolean" then y = y and 1 or 0 end
    local err = math.abs(x - y) / (1 + math.abs(y))
    if x ~= x and y ~= y then err = 0 end                 -- both NaN
    if x == y then err = 0 end                             -- equal infinities
    if err ~= err then err = math.huge end
    if err > worst then worst, wi = err, i end
  end
  assert(worst <= tol, string.format("%s: worst element %d: %s vs %s (err %.3g > tol %.3g)",
    msg or "close", wi, tostring(fa[wi]), tostring(fb[wi]), worst, tol))
  return true
end

function H.raises(fn, pattern)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error matching '" .. pattern .. "', but the call succeeded")
  err = tostring(err)
  assert(err:find(pattern, 1, true), "error '" .. err .. "' does not contain '" .. pattern .. "'")
  return err
end

H.root = debug.getinfo(1, "S").source:match("^@(.*)/tests/lua/helper.lua$") or "."

function H.sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

H.try_read = require("keng.util").read_file

function H.read(path)
  local s = H.try_read(path)
  if s == nil then error("helper.read: cannot open '" .. tostring(path) .. "'", 2) end
  return s
end

function H.exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

function H.write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
  return path
end

function H.read_json(path, opts) return require("keng.json").decode(H.read(path), opts) end

function H.tmpname(suffix)
  local p = os.tmpname()
  os.remove(p)
  return p .. (suffix or "")
end

function H.tmpdir()
  local p = H.tmpname()
  assert(os.execute("mkdir -p " .. H.sh_quote(p)))
  return p
end

function H.run(cmd)
  local p = io.popen(cmd, "r")
  local out = p:read("a")
  local ok, how, code = p:close()
  return out, code or (ok and 0 or 1), how
end

function H.capture_stderr(fn)
  local saved, out = io.stderr, {}
  io.stderr = {write = function(_, ...) for _, s in ipairs{...} do out[#out + 1] = s end end}
  local ok, err = pcall(fn)
  io.stderr = saved
  assert(ok, err)
  return table.concat(out)
end

-- $KENG_BIN (tests/run_all.sh sets it), else the keng running this process (the parent of a
-- shell it starts), else arg[-1], else the first build*/keng under the source root
local function is_keng(path)
  return path ~= nil and path ~= "" and path:match("keng$") ~= nil and H.exists(path)
end
function H.keng_bin()
  local env = os.getenv("KENG_BIN")
  if is_keng(env) then return env end
  local self = (H.run("readlink /proc/$PPID/exe 2>/dev/null")):gsub("%s+$", "")
  if is_keng(self) then return self end
  if arg and is_keng(arg[-1]) then return arg[-1] end
  local found = (H.run("ls -d " .. H.sh_quote(H.root) .. "/build*/keng 2>/dev/null | head -n 1")):gsub("%s+$", "")
  if is_keng(found) then return found end
  return nil
end

-- the same values as t with non-contiguous strides (stored transposed, viewed back)
function H.noncontig(t)
  if t.ndim < 2 then
    local n = t.shape[1] or 1
    local big = keng.zeros({n, 2}, {dtype = t.dtype})
    big:select(2, 1):copy_(t)
    local v = big:select(2, 1)
    assert(not v.is_contiguous or n <= 1)
    return v
  end
  local tt = t:transpose(-1, -2):contiguous():transpose(-1, -2)
  assert(not tt.is_contiguous)
  return tt
end

-- Checks d(loss)/d(input) of every input with requires_grad against central differences.
-- fn(...) takes the inputs and returns a tensor; the loss is sum(out * w) for a fixed random w.
-- Inputs must be f64 tensors. opts: eps (1e-6), tol (1e-6)
function H.gradcheck(fn, inputs, opts)
  opts = opts or {}
  local eps, tol = opts.eps or 1e-6, opts.tol or 1e-6
  keng.manual_seed(opts.seed or 1234)
  local out = fn(table.unpack(inputs))
  local w = keng.randn(out.shape, {dtype = "f64"})
  local function loss() return (fn(table.unpack(inputs)) * w):sum() end
  for _, x in ipairs(inputs) do if keng.is_tensor(x) and x.requires_grad then x.grad = nil end end
  loss():backward()
  for k, x in ipairs(inputs) do
    if keng.is_tensor(x) and x.requires_grad then
      assert(x.dtype == "f64", "gradcheck inputs must be f64")
      assert(x.grad, "input " .. k .. " got no gradient")
      local analytic = flat(x.grad)
      local n = x:numel()
      local xf = x:detach():reshape{-1}  -- shares storage with x
      local numeric = {}
      keng.no_grad(function()
        for i = 1, n do
          local v = xf[i]:item()
          xf[i] = v + eps
          local lp = loss():item()
          xf[i] = v - eps
          local lm = loss():item()
          xf[i] = v
          numeric[i] = (lp - lm) / (2 * eps)
        end
      end)
      H.close(analytic, numeric, tol, "gradient of input " .. k)
    end
  end
  return true
end

-- a random f64 leaf that requires grad
function H.leaf(shape, scale)
  local t = keng.randn(shape, {dtype = "f64"})
  if scale then t = t * scale end
  t = t:detach()
  t.requires_grad = true
  return t
end

-- H.copy_files({dest = src, ...}, dir) -> dir: each src file copied to dir/dest (dir and the
-- sub-directories of dest made); how specs assemble a model directory from fixture files
function H.copy_files(files, dir)
  for dest, src in pairs(files) do
    local sub = dest:match("^(.*)/[^/]+$")
    assert(os.execute("mkdir -p " .. H.sh_quote(dir .. (sub and "/" .. sub or ""))))
    H.write(dir .. "/" .. dest, H.read(src))
  end
  return dir
end

-- H.with_model_dir(src, edit, fn) -> fn(dir), where dir is a fresh temporary directory holding
-- src's *.safetensors and src/config.json as edit(j) leaves it (j decoded with keng.json, so
-- json.null writes a null); dir is removed afterwards, also when fn raises
function H.with_model_dir(src, edit, fn)
  local json = require "keng.json"
  local dir = H.tmpdir()
  assert(os.execute("cp " .. src .. "/*.safetensors " .. H.sh_quote(dir) .. "/"))
  local j = json.decode(H.read(src .. "/config.json"))
  edit(j)
  H.write(dir .. "/config.json", json.encode(j, {indent = "  "}))
  local ok, r = pcall(fn, dir)
  os.execute("rm -rf " .. H.sh_quote(dir))
  if not ok then error(r, 0) end
  return r
end

-- Hugging Face's rotate_half rope in f64: x [..., T, D], pos [T] or [B, T], frequencies f[1..D/2],
-- cos/sin = (cos, sin)(pos · f[i]) · scale
function H.ref_rope(x, pos, f, scale)
  local shape, D = x.shape, x.shape[#x.shape]
  local T, half = shape[#shape - 1], D // 2
  local rows = x:to("f64"):reshape{-1, D}:tolist()
  local P = pos:to("f64"):reshape{-1}:tolist()
  local per_b = #rows // (pos.ndim == 2 and pos.shape[1] or 1)
  local out = {}
  for r, row in ipairs(rows) do
    local t = (r - 1) % T
    local p = P[((r - 1) // per_b) * T + t + 1]
    local y = {}
    for i = 1, half do
      local c, s = math.cos(p * f[i]) * scale, math.sin(p * f[i]) * scale
      y[i] = row[i] * c - row[i + half] * s
      y[i + half] = row[i + half] * c + row[i] * s
    end
    out[r] = y
  end
  return keng.tensor(out, {dtype = "f64"}):reshape(shape)
end

-- the generation runs of a golden file: {prompt = ids, gen = ids} for prompt.0, gen.0, prompt.1, ...
function H.golden_runs(gold)
  local out, n = {}, 0
  while gold["prompt." .. n] do
    out[#out + 1] = {prompt = gold["prompt." .. n]:tolist(), gen = gold["gen." .. n]:tolist()}
    n = n + 1
  end
  return out
end

return H
