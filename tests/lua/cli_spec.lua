-- cli_spec.lua — the `keng` executable: -e, scripts with arguments, error exit codes and
-- tracebacks, --version, --help, --ops, the piped REPL (auto-print, `;` suppression, multi-line
-- chunks) and a real terminal session through `script` (history file in $HOME).
-- The binary: $KENG_BIN, else the keng running these specs (/proc/<parent of a shell>/exe),
-- else arg[-1], else the first build*/keng found from the source root.
local keng = require "keng"
local H = require "helper"

local sh_quote, run_capture, read = H.sh_quote, H.run, H.try_read
local KENG = H.keng_bin()
local tmp = H.tmpdir()
local function write(name, text) return H.write(tmp .. "/" .. name, text) end

-- runs keng with a shell argument string; returns stdout, stderr, exit code
local function keng_run(args, stdin)
  local errf = tmp .. "/stderr"
  local cmd = sh_quote(KENG) .. " " .. args .. " 2>" .. sh_quote(errf)
  if stdin then cmd = "printf '%s' " .. sh_quote(stdin) .. " | " .. cmd end
  local out, code = run_capture(cmd)
  return out, read(errf) or "", code
end

local function has(s, needle) return s:find(needle, 1, true) ~= nil end
local function lines(s)
  local t = {}
  for l in s:gmatch("([^\n]*)\n") do t[#t + 1] = l end
  return t
end

describe("keng executable", function()
  it("is found", function()
    assert.truthy(KENG, "no keng binary: set KENG_BIN")
  end)

  it("-e runs code with keng preloaded", function()
    local out, err, code = keng_run("-e " .. sh_quote("print(1 + 1, keng.version, keng.zeros({2, 3}):numel())"))
    assert.are.equal(0, code, err)
    assert.are.equal("2\t" .. keng.version .. "\t6\n", out)
    out = keng_run("-e " .. sh_quote("io.write('a')") .. " -e " .. sh_quote("io.write('b')"))
    assert.are.equal("ab", out)
  end)

  it("runs a script with its arguments in arg and ...", function()
    local path = write("args.lua", [[
local n = select("#", ...)
print(#arg, arg[1], arg[2], n, (...))
print(arg[0]:match("args%.lua$") ~= nil, arg[-1] ~= nil)
print(keng.tensor({{1, 2}, {3, 4}}):sum():item())
]])
    local out, err, code = keng_run(sh_quote(path) .. " alpha 'b c'")
    assert.are.equal(0, code, err)
    local l = lines(out)
    assert.are.equal("2\talpha\tb c\t2\talpha", l[1])
    assert.are.equal("true\ttrue", l[2])
    assert.are.equal("10", l[3])
  end)

  it("a script error exits 1 with a traceback on stderr", function()
    local path = write("fail.lua", [[
local function inner() error("boom at depth") end
local function outer() inner() end
print("before")
outer()
print("after")
]])
    local out, err, code = keng_run(sh_quote(path))
    assert.are.equal(1, code)
    assert.are.equal("before\n", out)
    assert.truthy(has(err, "boom at depth"), err)
    assert.truthy(has(err, "stack traceback"), err)
    assert.truthy(has(err, "inner"), err)
    -- an engine error carries the op and shapes
    path = write("shape.lua", "keng.zeros({2, 3}):matmul(keng.zeros({4, 5}))\n")
    out, err, code = keng_run(sh_quote(path))
    assert.are.equal(1, code)
    assert.truthy(has(err, "matmul") and has(err, "[2,3]") and has(err, "[4,5]"), err)
    -- -e errors and syntax errors too
    out, err, code = keng_run("-e " .. sh_quote("error('from e')"))
    assert.are.equal(1, code)
    assert.truthy(has(err, "from e"), err)
    out, err, code = keng_run(sh_quote(write("syntax.lua", "local = 3\n")))
    assert.are.equal(1, code)
    assert.truthy(has(err, "syntax.lua"), err)
    out, err, code = keng_run(sh_quote(tmp .. "/does_not_exist.lua"))
    assert.are.equal(1, code)
    assert.truthy(has(err, "does_not_exist"), err)
  end)

  it("--version and --help", function()
    local out, _, code = keng_run("--version")
    assert.are.equal(0, code)
    assert.truthy(out:match("^keng " .. keng.version:gsub("%.", "%%.")), out)
    assert.truthy(has(out, "Lua 5.4"), out)
    out, _, code = keng_run("--help")
    assert.are.equal(0, code)
    for _, opt in ipairs({"usage", "-e", "-i", "--ops", "--version"}) do
      assert.truthy(has(out, opt), "--help lacks " .. opt)
    end
    local _, err
    out, err, code = keng_run("--no-such-option")
    assert.are.equal(1, code)
    assert.truthy(has(err, "--no-such-option"), err)
  end)

  it("--ops lists every op with kind, kernels and backward columns", function()
    local out, _, code = keng_run("--ops")
    assert.are.equal(0, code)
    local l = lines(out)
    assert.truthy(l[1]:match("^op%s+kind%s+cpu%s+cuda%s+backward"), l[1])
    local ops = keng.ops()
    assert.are.equal(#ops + 1, #l)
    local rows = {}
    for i = 2, #l do
      local name, kind, cpu, cuda, bw = l[i]:match("^(%S+)%s+(%S+)%s+(%S+)%s+(%S+)%s+(.-)%s*$")
      assert.truthy(name, "malformed line: " .. l[i])
      rows[name] = {kind = kind, cpu = cpu, cuda = cuda, backward = bw}
    end
    for _, op in ipairs(ops) do
      local r = rows[op.name]
      assert.truthy(r, "--ops lacks " .. op.name)
      assert.are.equal(op.kind, r.kind)
    end
    assert.are.same({kind = "kernel", cpu = "yes", backward = "yes"},
      {kind = rows.matmul.kind, cpu = rows.matmul.cpu, backward = rows.matmul.backward})
    assert.are.equal("no-grad", rows.eq.backward)
    assert.are.equal("view", rows.permute.kind)
    assert.are.equal("via parts", rows.mean.backward)
  end)
end)

describe("REPL on a pipe", function()
  it("prints expressions, suppresses with ';', continues multi-line chunks", function()
    local out, err, code = keng_run("", "1+1\nx = 5;\nx\nfor i=1,2 do\nprint(i)\nend\n2+2;\n")
    assert.are.equal(0, code, err)
    assert.are.equal("2\n5\n1\n2\n", out)
    assert.are.equal("", err)
  end)

  it("keeps going after an error and prints several values and tensors", function()
    local out, err, code = keng_run("", "error('oops')\nlocal a = 1\n1, 'two', nil\nkeng.arange(3)\nnil\n")
    assert.are.equal(0, code)
    assert.truthy(has(err, "oops"), err)
    local l = lines(out)
    assert.are.equal("1\ttwo\tnil", l[1])
    assert.truthy(has(l[2], "tensor([0, 1, 2]"), l[2])
    assert.are.equal("nil", l[3])
    -- a syntax error that is not an unfinished chunk is reported, not waited on
    out, err = keng_run("", "x = = 1\nprint('still here')\n")
    assert.truthy(has(err, "stdin"), err)
    assert.are.equal("still here\n", out)
  end)

  it("-i runs a script, then the REPL sees its globals", function()
    local path = write("setup.lua", "answer = 41\n")
    local out, err, code = keng_run("-i " .. sh_quote(path), "answer + 1\n")
    assert.are.equal(0, code, err)
    assert.are.equal("42\n", out)
  end)
end)

describe("REPL on a terminal", function()
  local has_script = os.execute("command -v script >/dev/null 2>&1")
  it("writes ~/.keng_history through readline", function()
    if not has_script then
      print("(skipped: no `script` command for a pseudo-terminal)")
      return
    end
    local home = tmp .. "/home"
    os.execute("mkdir -p " .. sh_quote(home))
    -- lines typed, a pause for keng to read them, then Ctrl-D
    local cmd = "(printf '6*7\\nhist_marker = 1;\\n'; sleep 1; printf '\\004') | HOME=" .. sh_quote(home) ..
      " timeout 20 script -qfc " .. sh_quote(sh_quote(KENG)) .. " /dev/null 2>&1"
    local out = run_capture(cmd)
    assert.truthy(has(out, "keng " .. keng.version), "banner missing: " .. out)
    assert.truthy(has(out, "42"), "no result printed: " .. out)
    assert.falsy(has(out, "PANIC"), out)
    local hist = read(home .. "/.keng_history")
    assert.truthy(hist, "no history file in " .. home)
    assert.truthy(has(hist, "6*7") and has(hist, "hist_marker = 1;"), hist)
  end)
end)

describe("keng process limits", function()
  it("runs a script with hundreds of arguments (the stack is grown for them)", function()
    local path = write("many.lua", "print(select('#', ...), #arg, arg[300])\n")
    local args = {}
    for i = 1, 300 do args[i] = "a" .. i end
    local out, err, code = keng_run(sh_quote(path) .. " " .. table.concat(args, " "))
    assert.are.equal(0, code, err)
    assert.are.equal("300\t300\ta300\n", out)
  end)

  it("the REPL prints as many results as the stack holds, else says so", function()
    local out, err, code = keng_run("", "table.unpack({}, 1, 999980)\n'after'\n")
    assert.are.equal(0, code, err)
    assert.are.equal("after\n", out)
    assert.truthy(has(err, "error printing result"), err)
  end)
end)

-- a terminal session through `script`: keys are sent as the prompts appear (polling its output)
local function tty_session(home)
  local outf = tmp .. "/tty.out"
  os.remove(outf)
  local p = io.popen("HOME=" .. sh_quote(home) .. " timeout 60 script -qfc " .. sh_quote(sh_quote(KENG)) ..
    " /dev/null > " .. sh_quote(outf) .. " 2>&1", "w")
  local s = {}
  function s.send(keys) p:write(keys); p:flush() end
  function s.output() return read(outf) or "" end
  -- waits until the output holds `n` copies of `needle` (plain text); returns whether it did
  function s.wait(needle, n)
    for _ = 1, 300 do
      local o, count, at = s.output(), 0, 1
      while true do
        local i, j = o:find(needle, at, true)
        if not i then break end
        count, at = count + 1, j + 1
      end
      if count >= (n or 1) then return true end
      os.execute("sleep 0.05")
    end
    return false
  end
  function s.close() p:close() end
  return s
end

describe("REPL on a terminal: Ctrl-C, completion, history", function()
  local has_script = os.execute("command -v script >/dev/null 2>&1")
  it("Ctrl-C drops the line or the pending chunk; a raising __index does not break completion", function()
    if not has_script then
      print("(skipped: no `script` command for a pseudo-terminal)")
      return
    end
    local home = tmp .. "/home2"
    os.execute("mkdir -p " .. sh_quote(home))
    local s = tty_session(home)
    assert.truthy(s.wait("> "), s.output())
    s.send("\003")                           -- Ctrl-C at an idle prompt
    assert.truthy(s.wait("> ", 2), s.output())
    s.send("1+1\n")                          -- must not be 'interrupted!'
    assert.truthy(s.wait("> ", 3), s.output())
    s.send("for i = 1, 2 do\n")
    assert.truthy(s.wait(">> "), s.output())
    s.send("print('never' .. 'run')")
    s.send("\003")                           -- Ctrl-C on a continuation line drops the chunk
    assert.truthy(s.wait("> ", 5), s.output())
    s.send("40+2\n")
    assert.truthy(s.wait("42"), s.output())
    s.send("setmetatable(_G, {__index = function(_, k) error('undefined global ' .. k, 2) end});\n")
    assert.truthy(s.wait("> ", 7), s.output())
    s.send("nosuch.fi\t\t")                  -- completion looks up a global that raises
    s.send("\n")
    assert.truthy(s.wait("undefined global nosuch"), s.output())
    s.send("6*8\n")
    assert.truthy(s.wait("48"), s.output())
    s.send("os.exit(0)\n")                    -- leaves without the REPL's own exit path
    s.close()
    local out = s.output()
    assert.falsy(has(out, "PANIC"), out)
    assert.falsy(has(out, "interrupted"), out)
    assert.falsy(has(out, "neverrun"), out)  -- the echo shows 'never' .. 'run', a run would print neverrun
    assert.truthy(out:find("[\r\n]2\r?\n"), out)
    local hist = read(home .. "/.keng_history") or ""
    for _, l in ipairs({"1+1", "40+2", "6*8", "os.exit(0)"}) do
      assert.truthy(has(hist, l), "history lacks " .. l .. ": " .. hist)
    end
  end)
end)

teardown(function() os.execute("rm -rf " .. sh_quote(tmp)) end)
