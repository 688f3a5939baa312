-- paths_spec.lua — files and paths: every loader refuses a directory, a device or a FIFO at
-- once (no absurd allocation, no endless read, no blocked open) and a file over its size cap;
-- an index's shards stay inside the model directory after symlinks are resolved; `require`
-- finds keng's own modules before the working directory's; the unrestricted `load` cannot be
-- fished out of the wrapper's upvalues.
local keng = require "keng"
local H = require "helper"

local sh_quote, write = H.sh_quote, H.write
local tmp = H.tmpdir()
local function path(name) return tmp .. "/" .. name end

describe("loaders on files that are not regular files", function()
  local fifo, big = path("fifo"), path("big.bin")
  assert(os.execute("mkfifo " .. sh_quote(fifo)))
  assert(os.execute("truncate -s 2G " .. sh_quote(big)))     -- sparse: costs no disk

  it("refuse a directory (no out-of-memory from its 'size')", function()
    H.raises(function() keng.sentencepiece(tmp) end, "sentencepiece: SentencePiece model '" .. tmp .. "' is not a regular file (a directory)")
    H.raises(function() keng.wordpiece(tmp) end, "is not a regular file (a directory)")
    H.raises(function() keng.clip_tokenizer(tmp, tmp) end, "is not a regular file (a directory)")
    H.raises(function() keng.image.read_png(tmp) end, "is not a regular file (a directory)")
  end)

  it("refuse a device and a FIFO without reading or blocking", function()
    H.raises(function() keng.wordpiece("/dev/zero") end, "wordpiece: vocabulary '/dev/zero' is not a regular file")
    H.raises(function() keng.sentencepiece("/dev/zero") end, "is not a regular file")
    H.raises(function() keng.image.read_png("/dev/zero") end, "png_read: /dev/zero: is not a regular file")
    H.raises(function() keng.wordpiece(fifo) end, "is not a regular file (a device, FIFO or socket)")
    H.raises(function() keng.clip_tokenizer(fifo, fifo) end, "is not a regular file")
    H.raises(function() keng.sentencepiece(fifo) end, "is not a regular file")
    H.raises(function() keng.image.read_png(fifo) end, "is not a regular file")
    H.raises(function() keng.load(fifo) end, "not a regular file")
  end)

  it("model config readers cap what they read and name a directory", function()
    local common = require "models.common"
    H.raises(function() common.read_json("/dev/zero", "cfg", 1) end, "cfg: /dev/zero: larger than 64 MiB")
    H.raises(function() common.read_json(tmp, "cfg", 1) end, "cfg: " .. tmp .. ": empty or not a readable file")
  end)

  it("refuse a file over the size cap before reading it", function()
    H.raises(function() keng.wordpiece(big) end, "is 2147483648 bytes, more than the 1073741824 a vocabulary can be")
    H.raises(function() keng.sentencepiece(big) end, "more than the 1073741824 a SentencePiece model can be")
    H.raises(function() keng.clip_tokenizer(big, big) end, "more than the")
  end)
end)

describe("sharded index and symlinks", function()
  local function shard_dir(name, target)
    local dir = path(name)
    os.execute("mkdir -p " .. sh_quote(dir))
    write(dir .. "/model.safetensors.index.json", '{"weight_map": {"w": "model-00001-of-00001.safetensors"}}')
    os.execute("ln -sf " .. sh_quote(target) .. " " .. sh_quote(dir .. "/model-00001-of-00001.safetensors"))
    return dir
  end

  it("refuses a shard that is a symlink leading out of the model directory", function()
    local outside = path("outside.safetensors")
    keng.save(outside, {w = keng.ones({2})})
    local dir = shard_dir("evil", outside)
    H.raises(function() keng.load(dir) end, "shard 'model-00001-of-00001.safetensors' resolves to '")
    H.raises(function() keng.load(dir) end, "outside the model directory")
  end)

  it("follows a symlink that stays inside, and a Hugging Face cache snapshot's link into blobs/", function()
    local dir = path("inside")
    os.execute("mkdir -p " .. sh_quote(dir .. "/store"))
    keng.save(dir .. "/store/real.safetensors", {w = keng.ones({2})})
    shard_dir("inside", "store/real.safetensors")
    assert.are.same({2}, keng.load(dir).w.shape)
    -- models--org--name/snapshots/<rev>/model-...safetensors -> ../../blobs/<hash>
    local repo = path("hub/models--org--tiny")
    os.execute("mkdir -p " .. sh_quote(repo .. "/blobs") .. " " .. sh_quote(repo .. "/snapshots/abc123"))
    keng.save(repo .. "/blobs/0123abcd", {w = keng.ones({3})})
    shard_dir("hub/models--org--tiny/snapshots/abc123", "../../blobs/0123abcd")
    assert.are.same({3}, keng.load(repo .. "/snapshots/abc123").w.shape)
  end)
end)

describe("the Lua environment of the keng executable", function()
  it("keng.* and models.* are looked up in keng's own roots only, never in the working directory", function()
    local cwd = path("cwd")
    os.execute("mkdir -p " .. sh_quote(cwd .. "/keng") .. " " .. sh_quote(cwd .. "/models"))
    write(cwd .. "/keng/stray.lua", "return 'STRAY'")
    write(cwd .. "/models/stray.lua", "return 'STRAY'")
    write(cwd .. "/mymod.lua", "return 'mine'")
    local bin = H.keng_bin()
    local p = io.popen("cd " .. sh_quote(cwd) .. " && " .. sh_quote(bin) .. " -e " .. sh_quote(
      "print(pcall(require, 'keng.stray')); print(pcall(require, 'models.stray')); print(require 'mymod')") .. " 2>&1")
    local out = p:read("a")
    p:close()
    assert.falsy(out:find("STRAY", 1, true), out)
    assert.truthy(out:find("module 'keng.stray' not found", 1, true), out)
    assert.truthy(out:find("module 'models.stray' not found", 1, true), out)
    assert.truthy(out:find("mine", 1, true), out)                      -- user modules still load from ./
  end)

  it("load and loadfile keep no upvalue: the unrestricted load cannot be fished out", function()
    assert.is_nil(debug.getupvalue(load, 1))
    assert.is_nil(debug.getupvalue(loadfile, 1))
    local f, err = load(string.dump(function() return 1 end))
    assert.is_nil(f)
    assert.truthy(err:find("binary chunk", 1, true), err)
    -- the rest of load's contract: reader functions, chunk names, env (an explicit nil too)
    local parts, i = {"return ", "6 * 7"}, 0
    assert.equal(42, load(function() i = i + 1; return parts[i] end)())
    assert.equal(5, load("return x", "=c", "b", {x = 5})())
    assert.is_false(pcall(load("return x", "=c", "t", nil)))
    local g, e = load("x = ", "=mine")
    assert.is_nil(g)
    assert.truthy(e:find("mine:1:", 1, true), e)
  end)
end)

teardown(function() os.execute("rm -rf " .. sh_quote(tmp)) end)
