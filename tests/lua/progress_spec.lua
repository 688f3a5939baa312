-- progress_spec.lua — progress of long work (keng.progress task / loading lines): Stable Diffusion
-- sampling, generate, checkpoint loading. On stderr; by default only when stderr is a terminal
-- (never into a pipe), `progress = true` forces plain lines, `false` silences; KENG_PROGRESS=1
-- stands for a terminal (the "\r" redraw). Child keng processes check what a pipe receives.
local keng = require "keng"
local H = require "helper"
local progress = require "keng.progress"
local nn = require "keng.nn"

local function sink()
  local out = {}
  return {write = function(_, ...) for _, s in ipairs{...} do out[#out + 1] = s end end, flush = function() end},
    function() return table.concat(out) end
end

-- runs fn with io.stderr replaced by a sink; -> what was written
local function stderr_of(fn)
  local s, text = sink()
  local saved = io.stderr
  io.stderr = s
  local ok, e = pcall(fn)
  io.stderr = saved
  assert(ok, e)
  return text()
end

describe("progress task", function()
  it("redraws one line with \\r on a terminal and ends it with a newline", function()
    local s, text = sink()
    local t = progress.task("sampling", 20, {tty = true, out = s})
    for i = 1, 7 do t:update(i) end
    assert.truthy(text():find("^\rsampling  1/20 %[>%.+%] %- ETA: %d+s %- %d+[mu]?s/step"), text())
    t:update(20, "3.0 tok/s")
    t:finish("3.0 tok/s")
    assert.truthy(text():find("\rsampling 20/20 %[=+%] %- %d+s %- %d+[mu]?s/step %- 3%.0 tok/s *\n$"), text())
  end)

  it("is silent off a terminal unless forced, then prints plain lines each tenth", function()
    local s, text = sink()
    local t = progress.task("sampling", 20, {tty = false, out = s})
    assert.is_false(t.active)
    for i = 1, 20 do t:update(i) end
    t:finish()
    assert.are.equal("", text())
    s, text = sink()
    t = progress.task("sampling", 20, {tty = false, enabled = true, out = s})
    for i = 1, 20 do t:update(i) end
    t:finish()
    local lines = {}
    for l in text():gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.are.equal(10, #lines, text())
    assert.is_nil(text():find("\r", 1, true))
    assert.truthy(lines[1]:find("^sampling  2/20 %["), lines[1])
    assert.truthy(lines[10]:find("^sampling 20/20 %[=+%] %- %d+s"), lines[10])
    s, text = sink()
    t = progress.task("sampling", 20, {tty = true, enabled = false, out = s})
    t:update(3)
    t:finish()
    assert.are.equal("", text())
  end)

  it("reports a checkpoint load per tensor as a model takes the tensors, with tensors and bytes", function()
    local path = os.tmpname() .. ".safetensors"
    local src = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    keng.save(path, src:state_dict())
    local s, text = sink()
    local sd = progress.loading(path, function() return keng.load(path) end, {enabled = true, tty = false, out = s})
    assert.are.equal("", text(), "nothing is read yet, nothing shown yet")
    local m = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    m:load_state_dict(sd)
    os.remove(path)
    local lines = {}
    for l in text():gmatch("[^\n]+") do lines[#lines + 1] = l end
    local name = path:match("[^/]*$")
    -- plain lines off a terminal: the tenths (tensors 1, 2, 3 of 4), then the final line
    assert.are.equal(4, #lines, text())
    assert.truthy(lines[1]:find("loading " .. name .. " 1/4 [", 1, true), lines[1])
    assert.truthy(lines[1]:find("/tensor - 0.0/0.1 kB", 1, true), lines[1])
    assert.truthy(lines[4]:find("^loaded " .. name:gsub("%p", "%%%0") .. ": 4/4 tensors, 0%.1 kB in [%d.]+s %(.+/s%) *$"), lines[4])
    assert.is_nil(text():find("\r", 1, true))
    -- a model that takes part of the checkpoint ends the load there ("2/4"); loading the rest
    -- later reports nothing more
    keng.save(path, src:state_dict())
    s, text = sink()
    sd = progress.loading(path, function() return keng.load(path) end, {enabled = true, tty = false, out = s})
    os.remove(path)
    local calls = 0
    progress.on_tensor = function() calls = calls + 1 end
    nn.Sequential(nn.Linear(4, 3)):load_state_dict(sd, {strict = false})
    assert.are.equal(2, calls)
    assert.truthy(text():find(": 2/4 tensors, ", 1, true), text())
    local before = text()
    nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)):load_state_dict(sd)
    progress.on_tensor = nil
    assert.are.equal(2, calls)
    assert.are.equal(before, text())
    -- a terminal redraws one line
    s, text = sink()
    keng.save(path, src:state_dict())
    sd = progress.loading(path, function() return keng.load(path) end, {tty = true, enabled = true, out = s})
    m:load_state_dict(sd)
    os.remove(path)
    assert.truthy(text():find("^\rloading " .. name:gsub("%p", "%%%0") .. " 1/4 %["), text())
    assert.truthy(text():find("\rloaded " .. name .. ": 4/4 tensors", 1, true), text())
    -- below min_bytes and not forced: nothing
    s, text = sink()
    keng.save(path, src:state_dict())
    sd = progress.loading(path, function() return keng.load(path) end, {tty = true, out = s})
    m:load_state_dict(sd)
    os.remove(path)
    assert.are.equal("", text())
    -- a sharded index's size is its shards'
    local total = 0
    for _, n in ipairs{1, 2, 3} do
      local f = io.open(string.format("tests/fixtures/sd_sharded/vae/diffusion_pytorch_model-0000%d-of-00003.safetensors", n), "rb")
      total = total + f:seek("end")
      f:close()
    end
    assert.are.equal(total, progress.checkpoint_bytes("tests/fixtures/sd_sharded/vae/diffusion_pytorch_model.safetensors.index.json"))
  end)

  it("every from_pretrained calls the loading hook once per tensor, counting tensors and bytes", function()
    local function tensors_of(file)
      local n, bytes = 0, 0
      for _, t in pairs(keng.load(file)) do n, bytes = n + 1, bytes + t:numel() * keng.dtype_sizes[t.dtype] end
      return n, bytes
    end
    local cases = {
      {"bert", function() return require("models.bert").from_pretrained("tests/fixtures/bert") end, "tests/fixtures/bert/model.safetensors"},
      {"clip", function() return require("models.clip").from_pretrained("tests/fixtures/clip/text_encoder") end,
       "tests/fixtures/clip/text_encoder/model.safetensors"},
      {"sam", function() return require("models.sam").from_pretrained("tests/fixtures/sam") end, "tests/fixtures/sam/model.safetensors"},
      {"unet", function() return require("models.unet").from_pretrained("tests/fixtures/sd/unet") end,
       "tests/fixtures/sd/unet/diffusion_pytorch_model.safetensors"},
      {"vae (sharded)", function() return require("models.vae").from_pretrained("tests/fixtures/sd_sharded/vae") end,
       "tests/fixtures/sd_sharded/vae/diffusion_pytorch_model.safetensors.index.json"},
      {"gemma", function() return require("models.gemma").from_pretrained("tests/fixtures/gemma") end, "tests/fixtures/gemma/model.safetensors"},
      {"llama", function() return require("models.llama").from_pretrained("tests/fixtures/llama") end, "tests/fixtures/llama/model.safetensors"},
    }
    for _, c in ipairs(cases) do
      local calls, last = 0, nil
      progress.on_tensor = function(path, done, total, bytes, total_bytes)
        calls = calls + 1
        assert.are.equal(calls, done, c[1])
        last = {path = path, done = done, total = total, bytes = bytes, total_bytes = total_bytes}
      end
      local ok, e = pcall(c[2])
      progress.on_tensor = nil
      assert(ok, e)
      local n, bytes = tensors_of(c[3])
      assert.are.equal(n, calls, c[1] .. ": one call per tensor")
      assert.are.same({path = c[3], done = n, total = n, bytes = bytes, total_bytes = bytes}, last, c[1])
    end
  end)
end)

describe("progress of models", function()
  local function sd_pipe()
    local sd = require "models.stable_diffusion"
    return sd.Pipeline({unet = require("models.unet").from_pretrained("tests/fixtures/sd/unet"),
                        vae = require("models.vae").from_pretrained("tests/fixtures/sd/vae")})
  end

  it("draws Stable Diffusion's sampling steps when asked, and refuses a non-boolean", function()
    local pipe = sd_pipe()
    keng.manual_seed(0)
    local lat, cond = keng.randn({1, 4, 8, 8}), keng.randn({1, 5, 32})
    local a, b
    local text = stderr_of(function() a = pipe:denoise(lat, cond, nil, {num_steps = 3, progress = true}) end)
    assert.truthy(text:find("sampling 3/3 [==============================] - ", 1, true), text)
    assert.are.equal("", stderr_of(function() b = pipe:denoise(lat, cond, nil, {num_steps = 3, progress = false}) end))
    H.close(a, b, 0, "progress changes nothing")
    H.raises(function() pipe:text_to_image("a cat", {progress = 1}) end,
      "text_to_image: progress must be true, false or nil (on when stderr is a terminal), got number")
    H.raises(function() pipe:text_to_image("a cat", {progres = true}) end, "unknown option 'progres'")
  end)

  it("draws generate's tokens with tokens/s", function()
    local lm = require("models.gemma").from_pretrained("tests/fixtures/gemma")
    local ids
    local text = stderr_of(function() ids = lm:generate({{2, 5}}, {max_new_tokens = 4, progress = true}) end)
    assert.truthy(text:find("generate 4/4 %[=+%] %- [%d.]+[mu]?s %- %d+[mu]?s/tok %- [%d.]+ tok/s\n$")
      or text:find("generate 4/4 %[=+%] %- %d+s %- %d+[mu]?s/tok %- [%d.]+ tok/s\n$"), text)
    local beams = stderr_of(function() lm:generate({{2, 5}}, {max_new_tokens = 3, num_beams = 2, progress = true}) end)
    assert.truthy(beams:find("beam search %d/3 %["), beams)
    local quiet = lm:generate({{2, 5}}, {max_new_tokens = 4, progress = false})
    assert.are.same(ids, quiet)
    H.raises(function() lm:generate({{2, 5}}, {max_new_tokens = 4, progress = "yes"}) end,
      "progress must be true, false or nil")
  end)

  -- what a pipe receives: nothing by default, "\r" only when KENG_PROGRESS=1 says terminal
  local function run_child(code, env)
    local path = os.tmpname() .. ".lua"
    local f = assert(io.open(path, "w"))
    f:write(code)
    f:close()
    local p = io.popen((env or "env -u KENG_PROGRESS") .. " '" .. H.keng_bin() .. "' '" .. path .. "' 2>&1")
    local out = p:read("a")
    local ok = p:close()
    os.remove(path)
    assert(ok, "child keng failed: " .. out)
    return out
  end
  local SD = [[
local sd = require "models.stable_diffusion"
local pipe = sd.Pipeline({unet = require("models.unet").from_pretrained("tests/fixtures/sd/unet"),
                          vae = require("models.vae").from_pretrained("tests/fixtures/sd/vae")})
pipe:denoise(keng.randn({1, 4, 8, 8}), keng.randn({1, 5, 32}), nil, {num_steps = 3, progress = PROGRESS})
io.write("done\n")
]]

  it("prints nothing into a pipe by default, plain lines when forced, \\r when KENG_PROGRESS=1", function()
    assert.are.equal("done\n", run_child((SD:gsub("PROGRESS", "nil"))))
    local forced = run_child((SD:gsub("PROGRESS", "true")))
    assert.is_nil(forced:find("\r", 1, true))
    assert.truthy(forced:find("sampling 3/3 [", 1, true), forced)
    local tty = run_child((SD:gsub("PROGRESS", "nil")), "env KENG_PROGRESS=1")
    assert.truthy(tty:find("\rsampling 3/3 [", 1, true), tty)
    assert.are.equal("done\n", run_child((SD:gsub("PROGRESS", "nil")), "env KENG_PROGRESS=0"))
  end)
end)
