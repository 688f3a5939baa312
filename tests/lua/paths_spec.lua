-- paths_spec.lua — files and paths: every loader refuses a directory, a device or a FIFO at
-- once (no absurd allocation, no endless read, no blocked open) and a file over its size cap;
-- an index's shards stay inside the model directory after symlinks are resolved; `require`
-- finds keng's own modules before the working directory's; the unrestricted `load` cannot be
-- fished out of the wrapper's upvalues.
local keng = require "keng"
local H = require "helper"

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local tmp = os.tmpname()
os.remove(tmp)
assert(os.execute("mkdir -p " .. sh_quote(tmp)))
local function path(name) return tmp .. "/" .. name end
local function write(p, s)
  local f = assert(io.open(p, "wb"))
  f:write(s)
  f:close()
  return p
end

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
    H.raises(function() keng.image.read_png("/dev/zero") end, "png_read: image '/dev/zero' is not a regular file")
    H.raises(function() keng.wordpiece(fifo) end, "is not a regular file (a device, FIFO or socket)")
    H.raises(function() keng.clip_tokenizer(fifo, fifo) end, "is not a regular file")
    H.raises(function() keng.sentencepiece(fifo) end, "is not a regular file")
    H.raises(function() keng.image.read_png(fifo) end, "is not a regular file")
    H.raises(function() keng.load(fifo) end, "not a regular file")
  end)

  it("refuse a file over the size cap before reading it", function()
    H.raises(function() keng.wordpiece(big) end, "is 2147483648 bytes, more than the 1073741824 a vocabulary can be")
    H.raises(function() keng.sentencepiece(big) end, "more than the 1073741824 a SentencePiece model can be")
    H.raises(function() keng.clip_tokenizer(big, big) end, "more than the")
  end)
end)

teardown(function() os.execute("rm -rf " .. sh_quote(tmp)) end)
