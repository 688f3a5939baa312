-- io_spec.lua — checkpoints: keng.save / keng.load in safetensors. Bit-exact round trips for
-- every dtype (bf16 NaN payloads, -0, subnormals, integer extremes, non-contiguous, 0-d and
-- empty tensors), metadata, tensors that outlive their table (mmap), one spec per validation
-- rule on files written by hand with string.pack, an interrupted save in a child keng
-- (KENG_IO_FAIL_AFTER_BYTES) leaving the old file byte-identical, pickle refusal, sharding.
-- File layout: [N: u64 little-endian][N bytes of JSON header][data section].
local keng = require "keng"
local H = require "helper"

local sh_quote, read_bytes, write_bytes = H.sh_quote, H.try_read, H.write
local tmp = H.tmpdir()
local function path(name) return tmp .. "/" .. name end

-- a safetensors file from a header string and a data string
local function st_bytes(header, data) return string.pack("<I8", #header) .. header .. (data or "") end
local function write_st(name, header, data) return write_bytes(path(name), st_bytes(header, data)) end

-- the data section of a safetensors file
local function data_section(bytes)
  local n = string.unpack("<I8", bytes)
  return bytes:sub(9 + n)
end

local function ls(dir)
  local p = io.popen("ls -A " .. sh_quote(dir))
  local out = p:read("a")
  p:close()
  return out
end

-- every element identical, NaN matching NaN and -0 told apart from 0
local function same_values(a, b, msg)
  assert.are.same(a.shape, b.shape, msg)
  assert.equal(a.dtype, b.dtype, msg)
  local fa, fb = H.flat(a), H.flat(b)
  for i = 1, #fa do
    local x, y = fa[i], fb[i]
    if type(x) == "number" and x ~= x then
      assert(y ~= y, string.format("%s: element %d: NaN vs %s", msg, i, tostring(y)))
    else
      assert(x == y, string.format("%s: element %d: %s vs %s", msg, i, tostring(x), tostring(y)))
      if x == 0 and type(x) == "number" and math.type(x) == "float" then
        assert(1 / x == 1 / y, string.format("%s: element %d: signed zero differs", msg, i))
      end
    end
  end
end

local function load_error(p) return H.raises(function() keng.load(p) end, "load: " .. p .. ": ") end

describe("keng.save / keng.load round trip", function()
  local inf, nan = math.huge, 0 / 0
  local tensors = {
    f32 = keng.tensor({1.5, -0.0, inf, -inf, nan, 1e-45, 3.4028234663852886e38, -2.5e-20}, {dtype = "f32"}),
    f64 = keng.tensor({1 / 3, -0.0, 1e-310, -1.7976931348623157e308, nan, inf}, {dtype = "f64"}),
    f16 = keng.tensor({1.0, -0.0, 65504, 6e-8, inf, nan}, {dtype = "f16"}),
    bf16 = keng.tensor({{1.0, -0.0}, {3e38, nan}, {-inf, 1e-40}}, {dtype = "bf16"}),
    i64 = keng.tensor({math.maxinteger, math.mininteger, -1, 0, 1 << 53 | 1}, {dtype = "i64"}),
    i32 = keng.tensor({2147483647, -2147483648, -7, 0}, {dtype = "i32"}),
    u8 = keng.tensor({0, 1, 127, 128, 255}, {dtype = "u8"}),
    bool = keng.tensor({{true, false, true}}),
    scalar = keng.tensor(2.5, {dtype = "f64"}),
    empty = keng.zeros({0, 3}),
    empty2 = keng.zeros({2, 0}, {dtype = "bf16"}),
  }

  it("keeps every dtype, value, shape and special float", function()
    local p = path("all.safetensors")
    keng.save(p, tensors)
    local back, meta = keng.load(p)
    assert.are.same({}, meta)
    local n = 0
    for name, t in pairs(tensors) do
      n = n + 1
      assert.truthy(back[name], name .. " missing after load")
      same_values(back[name], t, name)
      assert.equal("cpu", back[name].device)
      assert.is_false(back[name].requires_grad)
    end
    for name in pairs(back) do assert.truthy(tensors[name], "unexpected " .. name) end
    assert.equal(11, n)
    assert.equal(0, back.scalar.ndim)
    assert.equal(2.5, back.scalar:item())
  end)

  it("writes byte-identical files when the loaded tensors are saved again", function()
    local p1, p2 = path("again1.safetensors"), path("again2.safetensors")
    keng.save(p1, tensors, {k = "v"})
    local back, meta = keng.load(p1)
    keng.save(p2, back, meta)
    local b1, b2 = read_bytes(p1), read_bytes(p2)
    assert.equal(#b1, #b2)
    assert.is_true(b1 == b2, "re-saved file differs")
  end)

  it("moves bf16 and f32 NaN payloads, -0 and subnormals bit for bit, also through a view", function()
    -- bf16 bit patterns: quiet NaN with payload, signalling NaN, negative NaN, -0, smallest
    -- subnormal, inf; f32: a NaN with a payload in the low bits
    local bf = {0x7FC1, 0x7F81, 0xFFC3, 0x8000, 0x0001, 0x7F80}
    local bf_data = string.pack("<" .. string.rep("I2", #bf), table.unpack(bf))
    local f32_data = string.pack("<I4I4", 0x7FC00123, 0xFFBADBAD)
    local header = string.format(
      '{"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"f":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}}')
    local p = write_st("payload.safetensors", header, bf_data .. f32_data)
    local t = keng.load(p)
    local out = path("payload_out.safetensors")
    keng.save(out, {b = t.b, f = t.f})
    -- written widest first: f (4-byte) then b (2-byte)
    assert.equal(f32_data .. bf_data, data_section(read_bytes(out)))
    -- a transposed view is gathered without touching the bits
    keng.save(out, {b = t.b:transpose(1, 2)})
    local tb = {bf[1], bf[4], bf[2], bf[5], bf[3], bf[6]}
    assert.equal(string.pack("<" .. string.rep("I2", 6), table.unpack(tb)), data_section(read_bytes(out)))
    local back = keng.load(out).b
    assert.are.same({3, 2}, back.shape)
    assert.is_true(back.is_contiguous)
  end)

  it("saves non-contiguous views (transpose, narrow, expand, select) as their values", function()
    local base = keng.arange(24, {dtype = "f32"}):reshape{4, 6}
    local views = {
      t = base:transpose(1, 2),
      n = base:narrow(2, 2, 3),
      e = keng.tensor({1, 2, 3}, {dtype = "i32"}):expand{4, 3},
      s = base:select(2, 5),
      nc = H.noncontig(keng.randn({3, 5}, {dtype = "f64"})),
    }
    for name, v in pairs(views) do
      if name ~= "e" then assert.is_false(v.is_contiguous, name .. " should be a strided view") end
    end
    local p = path("views.safetensors")
    keng.save(p, views)
    local back = keng.load(p)
    for name, v in pairs(views) do
      same_values(back[name], v:contiguous(), name)
      assert.is_true(back[name].is_contiguous)
    end
  end)

  it("saves tensors that require grad and results of ops (values only)", function()
    local w = keng.randn({3, 4}, {requires_grad = true})
    local y = w * 2
    local p = path("grad.safetensors")
    keng.save(p, {w = w, y = y})
    local back = keng.load(p)
    same_values(back.w, w:detach(), "w")
    same_values(back.y, y:detach(), "y")
    assert.is_false(back.w.requires_grad)
  end)

  it("round-trips metadata: unicode, quotes, control characters, numbers as strings", function()
    local meta = {format = "pt", note = 'say "hi"\n\ttab\\slash \1', ["ключ"] = "значение ✓ 𝔘",
                  empty = "", step = 1200}
    local p = path("meta.safetensors")
    keng.save(p, {x = keng.ones({2})}, meta)
    local _, back = keng.load(p)
    meta.step = "1200"
    assert.are.same(meta, back)
  end)

  it("saves a file with metadata and no tensors, and one with neither", function()
    local p = path("nothing.safetensors")
    keng.save(p, {}, {only = "meta"})
    local t, m = keng.load(p)
    assert.are.same({}, t)
    assert.are.same({only = "meta"}, m)
    keng.save(p, {})
    t, m = keng.load(p)
    assert.are.same({}, t)
    assert.are.same({}, m)
  end)

  it("pads the header with spaces to a multiple of 8 and sorts names", function()
    local p = path("layout.safetensors")
    keng.save(p, {zeta = keng.ones({1}, {dtype = "u8"}), alpha = keng.ones({1}, {dtype = "f64"}),
                  mid = keng.ones({3}, {dtype = "bf16"})})
    local bytes = read_bytes(p)
    local n = string.unpack("<I8", bytes)
    assert.equal(0, n % 8)
    local header = bytes:sub(9, 8 + n)
    assert.truthy(header:match("^{.*} *$"))
    local a, m, z = header:find('"alpha"'), header:find('"mid"'), header:find('"zeta"')
    assert.is_true(a < m and m < z, "header names are not sorted: " .. header)
    -- widest dtype first in the data section, so every tensor is aligned for its dtype
    assert.truthy(header:find('"alpha":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}', 1, true), header)
    assert.truthy(header:find('"mid":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]}', 1, true), header)
    assert.truthy(header:find('"zeta":{"dtype":"U8","shape":[1],"data_offsets":[14,15]}', 1, true), header)
    assert.equal(8 + n + 15, #bytes)
  end)
end)

describe("keng.load memory mapping", function()
  it("keeps tensors usable after the table and the file are gone", function()
    local p = path("mmap.safetensors")
    local src = keng.randn({64, 32})
    keng.save(p, {w = src, b = keng.arange(5)})
    collectgarbage()
    local before = keng.memory_stats("cpu").allocated
    local w = keng.load(p).w
    -- mapped, not copied: the allocator saw none of the 8 KB
    assert.is_true(keng.memory_stats("cpu").allocated - before < 64 * 32 * 4, "loaded tensor was copied")
    collectgarbage()
    collectgarbage()
    os.remove(p)
    assert.is_nil(read_bytes(p))
    same_values(w, src, "w after the table was collected and the file removed")
    H.close((w * 2):sum(), src:sum() * 2, 1e-5)
  end)

  it("writes to a loaded tensor stay private (the file is not modified)", function()
    local p = path("cow.safetensors")
    keng.save(p, {w = keng.ones({4, 4})})
    local before = read_bytes(p)
    local t = keng.load(p)
    t.w:fill_(7)
    assert.equal(7 * 16, t.w:sum():item())
    t = nil
    collectgarbage()
    assert.is_true(read_bytes(p) == before, "file changed after an in-place write to a loaded tensor")
    assert.equal(16, keng.load(p).w:sum():item())
  end)

  it("saving over the file the tensors were loaded from keeps them valid", function()
    local p = path("inplace.safetensors")
    local src = keng.randn({16, 16})
    keng.save(p, {w = src})
    local sd = keng.load(p)
    sd.w2 = sd.w * 2
    keng.save(p, sd, {round = "2"})   -- the mapping still reads the replaced file's bytes
    same_values(sd.w, src, "loaded tensor after its file was replaced")
    local back, meta = keng.load(p)
    same_values(back.w, src, "w")
    same_values(back.w2, src * 2, "w2")
    assert.equal("2", meta.round)
  end)

  it("copies a tensor whose bytes are misaligned for its dtype and still loads it right", function()
    -- header of 9 bytes: the data section starts at byte 17, misaligned for f32 and f64
    local vals = {1.25, -2.5, 1e30}
    local hdr = '{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"d":{"dtype":"F64","shape":[1],"data_offsets":[12,20]}}'
    hdr = hdr .. string.rep(" ", (8 - #hdr % 8) % 8 + 1) -- one byte off a multiple of 8
    assert.equal(1, #hdr % 8)
    local p = write_st("misaligned.safetensors", hdr, string.pack("<fffd", vals[1], vals[2], vals[3], math.pi))
    collectgarbage()
    local before = keng.memory_stats("cpu").allocated
    local t = keng.load(p)
    assert.is_true(keng.memory_stats("cpu").allocated - before >= 20, "misaligned tensors should be copies")
    H.close(t.a, keng.tensor(vals, {dtype = "f32"}), 0)
    assert.equal(math.pi, t.d:item())
  end)
end)

describe("keng.load validation (one spec per rule)", function()
  local good_hdr = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
  local good_data = string.pack("<ff", 1, 2)

  it("accepts the reference file these corruptions start from", function()
    local t = keng.load(write_st("good.safetensors", good_hdr, good_data))
    H.close(t.a, keng.tensor({1, 2}), 0)
  end)

  it("rejects a file shorter than the 8-byte header length", function()
    local err = load_error(write_bytes(path("short.safetensors"), "\5\0\0"))
    assert.truthy(err:find("too short for the 8-byte header length", 1, true))
    load_error(write_bytes(path("zero.safetensors"), ""))
  end)

  it("rejects a header length beyond the end of the file", function()
    local p = write_bytes(path("beyond.safetensors"), string.pack("<I8", 4096) .. good_hdr .. good_data)
    local err = load_error(p)
    assert.truthy(err:find("header length 4096 runs past the end of the file", 1, true), err)
  end)

  it("rejects a truncated header (file cut inside the JSON)", function()
    local full = st_bytes(good_hdr, good_data)
    local err = load_error(write_bytes(path("trunc_hdr.safetensors"), full:sub(1, 30)))
    assert.truthy(err:find("runs past the end of the file", 1, true), err)
  end)

  it("rejects a truncated data section", function()
    local full = st_bytes(good_hdr, good_data)
    local err = load_error(write_bytes(path("trunc_data.safetensors"), full:sub(1, #full - 3)))
    assert.truthy(err:find("run past the data section (5 bytes)", 1, true), err)
  end)

  it("rejects a huge header length (over 100 MB)", function()
    local p = write_bytes(path("huge.safetensors"), string.pack("<I8", 100000001) .. good_hdr .. good_data)
    assert.truthy(load_error(p):find("exceeds the 100 MB limit", 1, true))
    p = write_bytes(path("huge2.safetensors"), string.pack("<I8", -1) .. good_hdr)
    assert.truthy(load_error(p):find("exceeds the 100 MB limit", 1, true))
  end)

  it("rejects bad JSON", function()
    local err = load_error(write_st("badjson.safetensors", '{"a":{"dtype":"F32",,}}   ', good_data))
    assert.truthy(err:find("header is not valid JSON", 1, true), err)
    err = load_error(write_st("trailing.safetensors", good_hdr .. "x", good_data))
    assert.truthy(err:find("trailing characters", 1, true), err)
  end)

  it("rejects a header that is not a JSON object", function()
    local err = load_error(write_st("array.safetensors", "[1, 2]  ", ""))
    assert.truthy(err:find("header must be a JSON object", 1, true), err)
    err = load_error(write_st("string.safetensors", '"hello" ', ""))
    assert.truthy(err:find("header must be a JSON object", 1, true), err)
  end)

  it("rejects a header that is not UTF-8", function()
    local hdr = '{"a\xff":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    local err = load_error(write_st("utf8.safetensors", hdr, good_data))
    assert.truthy(err:find("invalid UTF-8", 1, true), err)
    -- an overlong encoding of '/' and a lone surrogate escape
    load_error(write_st("overlong.safetensors", '{"a\xc0\xaf":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', good_data))
    err = load_error(write_st("surrogate.safetensors", '{"a\\ud800":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', good_data))
    assert.truthy(err:find("surrogate", 1, true), err)
  end)

  it("rejects duplicate keys", function()
    local hdr = '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
    local err = load_error(write_st("dup.safetensors", hdr, good_data))
    assert.truthy(err:find('duplicate key "a"', 1, true), err)
    hdr = '{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    assert.truthy(load_error(write_st("dup2.safetensors", hdr, good_data)):find("duplicate key", 1, true))
  end)

  it("stays strict JSON: no NaN / Infinity tokens (keng.json reads those), no overflowing numbers", function()
    local entry = '"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
    for _, v in ipairs{"NaN", "Infinity", "-Infinity"} do
      local err = load_error(write_st("nonfinite.safetensors", "{" .. entry .. ',"x":' .. v .. "}", good_data))
      assert.truthy(err:find("header is not valid JSON: invalid JSON at line 1, column", 1, true), err)
    end
    local err = load_error(write_st("huge.safetensors", "{" .. entry .. ',"x":1e400}', good_data))
    assert.truthy(err:find("number 1e400 is out of the range of a double", 1, true), err)
  end)

  it("rejects unsupported and unknown dtypes, naming them", function()
    local err = load_error(write_st("i16.safetensors", '{"a":{"dtype":"I16","shape":[4],"data_offsets":[0,8]}}', good_data))
    assert.truthy(err:find("tensor 'a' has dtype I16, which keng does not support", 1, true), err)
    err = load_error(write_st("q4.safetensors", '{"a":{"dtype":"Q4_K","shape":[8],"data_offsets":[0,8]}}', good_data))
    assert.truthy(err:find("unknown dtype 'Q4_K'", 1, true), err)
    err = load_error(write_st("numdt.safetensors", '{"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}}', good_data))
    assert.truthy(err:find('"dtype" must be a string', 1, true), err)
  end)

  it("rejects an entry that lacks dtype, shape or data_offsets, or is not an object", function()
    local err = load_error(write_st("noshape.safetensors", '{"a":{"dtype":"F32","data_offsets":[0,8]}}', good_data))
    assert.truthy(err:find('lacks "shape"', 1, true), err)
    err = load_error(write_st("nooff.safetensors", '{"a":{"dtype":"F32","shape":[2]}}', good_data))
    assert.truthy(err:find('lacks "data_offsets"', 1, true), err)
    err = load_error(write_st("notobj.safetensors", '{"a":[1]}', good_data))
    assert.truthy(err:find("entry 'a' must be an object", 1, true), err)
  end)

  it("rejects shapes that are not lists of non-negative integers", function()
    for i, shape in ipairs({"[-2]", "[2.0]", "[1e1]", '["2"]', "2", "[18446744073709551616]"}) do
      local hdr = '{"a":{"dtype":"F32","shape":' .. shape .. ',"data_offsets":[0,8]}}'
      local err = load_error(write_st("shape" .. i .. ".safetensors", hdr, good_data))
      assert.truthy(err:find("shape", 1, true), shape .. ": " .. err)
    end
    local err = load_error(write_st("dims.safetensors",
      '{"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,8],"data_offsets":[0,8]}}', good_data))
    assert.truthy(err:find("has 9 dims; keng supports at most 8", 1, true), err)
  end)

  it("rejects a shape whose byte size differs from end - begin", function()
    local err = load_error(write_st("mismatch.safetensors", '{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', good_data))
    assert.truthy(err:find("shape [3] of F32 needs a different number of bytes but data_offsets [0, 8] hold 8", 1, true), err)
    -- an element count that overflows 64 bits must not wrap around to a matching size
    err = load_error(write_st("overflow.safetensors",
      '{"a":{"dtype":"F32","shape":[4294967296,4294967296,1],"data_offsets":[0,8]}}', good_data))
    assert.truthy(err:find("more than 2^64", 1, true), err)
    err = load_error(write_st("wrap.safetensors",
      '{"a":{"dtype":"F64","shape":[2305843009213693953],"data_offsets":[0,8]}}', good_data))
    assert.truthy(err:find("needs", 1, true), err)
  end)

  it("rejects data_offsets that end before they begin or are malformed", function()
    local err = load_error(write_st("rev.safetensors", '{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}', good_data))
    assert.truthy(err:find("data_offsets [8, 0] end before they begin", 1, true), err)
    for i, off in ipairs({"[0]", "[0,8,8]", "[-1,7]", "[0,8.5]", '"0-8"'}) do
      local e = load_error(write_st("off" .. i .. ".safetensors", '{"a":{"dtype":"F32","shape":[2],"data_offsets":' .. off .. '}}', good_data))
      assert.truthy(e:find('"data_offsets" must be [begin, end]', 1, true), off .. ": " .. e)
    end
  end)

  it("rejects offsets out of the data section's range", function()
    local err = load_error(write_st("range.safetensors", '{"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', good_data))
    assert.truthy(err:find("tensor 'a': data_offsets [4, 12] run past the data section (8 bytes)", 1, true), err)
  end)

  it("rejects overlapping offsets", function()
    local hdr = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
    local err = load_error(write_st("overlap.safetensors", hdr, good_data))
    assert.truthy(err:find("tensors 'a' [0, 8) and 'b' [4, 8) overlap", 1, true), err)
    -- two names over the same bytes
    hdr = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}'
    assert.truthy(load_error(write_st("alias.safetensors", hdr, good_data)):find("overlap", 1, true))
  end)

  it("rejects a gap in the data section", function()
    local hdr = '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}'
    local err = load_error(write_st("gap.safetensors", hdr, good_data .. "pad!"))
    assert.truthy(err:find("gap of 4 bytes in the data section before tensor 'b'", 1, true), err)
    -- a gap at the start
    hdr = '{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
    assert.truthy(load_error(write_st("gap0.safetensors", hdr, good_data)):find("gap of 4 bytes", 1, true))
  end)

  it("rejects bytes after the last tensor", function()
    local err = load_error(write_st("tail.safetensors", good_hdr, good_data .. "\0\0\0\0"))
    assert.truthy(err:find("data section has 12 bytes but the tensors cover only 8", 1, true), err)
  end)

  it("rejects __metadata__ that is not a string -> string map", function()
    local hdr = '{"__metadata__":{"step":12},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    local err = load_error(write_st("metanum.safetensors", hdr, good_data))
    assert.truthy(err:find("__metadata__ must map strings to strings; 'step' holds a number", 1, true), err)
    hdr = '{"__metadata__":"x","a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    assert.truthy(load_error(write_st("metastr.safetensors", hdr, good_data)):find("__metadata__ must be an object", 1, true))
  end)

  it("survives deep nesting without exhausting the stack", function()
    local hdr = '{"a":' .. string.rep("[", 100000) .. string.rep("]", 100000) .. "}"
    local err = load_error(write_st("deep.safetensors", hdr, ""))
    assert.truthy(err:find("nested deeper than", 1, true), err)
  end)

  it("accepts a header length whose first bytes look like a pickle (N = 640)", function()
    local hdr = good_hdr .. string.rep(" ", 640 - #good_hdr)
    local bytes = st_bytes(hdr, good_data)
    assert.equal("\x80\x02", bytes:sub(1, 2))
    local t = keng.load(write_bytes(path("n640.safetensors"), bytes))
    H.close(t.a, keng.tensor({1, 2}), 0)
  end)

  it("reports a missing file and a directory without a checkpoint", function()
    local err = load_error(path("no_such_file.safetensors"))
    assert.truthy(err:find("No such file", 1, true), err)
    os.execute("mkdir -p " .. sh_quote(path("emptydir")))
    err = load_error(path("emptydir"))
    assert.truthy(err:find("neither model.safetensors nor model.safetensors.index.json", 1, true), err)
    os.execute("mkfifo " .. sh_quote(path("fifo")))
    err = load_error(path("fifo"))
    assert.truthy(err:find("not a regular file", 1, true), err)
  end)
end)

describe("keng.load refuses pickle checkpoints", function()
  it("by extension (.bin, .pt, .pth, .ckpt), before reading", function()
    for _, ext in ipairs({"bin", "pt", "pth", "ckpt"}) do
      local p = write_bytes(path("model." .. ext), st_bytes(string.format("%-8s", "{}"), ""))
      local err = load_error(p)
      assert.truthy(err:find("pickle checkpoint", 1, true), err)
      assert.truthy(err:find("Convert it to safetensors", 1, true), err)
    end
  end)

  it("by content: pickle protocol 2 and the zip format of torch.save", function()
    local err = load_error(write_bytes(path("pickled.weights"), "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19."))
    assert.truthy(err:find("pickle checkpoint", 1, true), err)
    err = load_error(write_bytes(path("zipped.weights"), "PK\3\4\0\0\0\0\0\0" .. string.rep("\0", 64)))
    assert.truthy(err:find("Convert it to safetensors", 1, true), err)
  end)

  it("in a directory holding only pytorch_model.bin", function()
    local dir = path("hf_pickle")
    os.execute("mkdir -p " .. sh_quote(dir))
    write_bytes(dir .. "/pytorch_model.bin", "\x80\x02}q\0.")
    local err = load_error(dir)
    assert.truthy(err:find("pytorch_model.bin, a pickle checkpoint", 1, true), err)
  end)
end)

describe("keng.save errors and atomicity", function()
  local function find_keng()
    local env = os.getenv("KENG_BIN")
    local f = env and env ~= "" and io.open(env, "rb")
    if f then f:close() return env end
    local p = io.popen("readlink /proc/$PPID/exe 2>/dev/null")
    local self = p:read("a"):gsub("%s+$", "")
    p:close()
    if self:match("keng$") then return self end
    local root = debug.getinfo(1, "S").source:match("^@(.*)/tests/lua/io_spec.lua$") or "."
    p = io.popen("ls -d " .. sh_quote(root) .. "/build*/keng 2>/dev/null | head -n 1")
    local found = p:read("a"):gsub("%s+$", "")
    p:close()
    return found ~= "" and found or nil
  end
  local KENG = find_keng()

  -- runs `code` in a child keng with KENG_IO_FAIL_AFTER_BYTES=n; returns stderr and exit code
  local function child_save(n, code)
    local errf = path("child.err")
    local cmd = "KENG_IO_FAIL_AFTER_BYTES=" .. n .. " " .. sh_quote(KENG) .. " -e " .. sh_quote(code) ..
                " 2>" .. sh_quote(errf)
    local ok, _, rc = os.execute(cmd)
    return read_bytes(errf) or "", ok and 0 or rc
  end

  it("an interrupted save leaves the old file byte-identical and no temp file", function()
    assert.truthy(KENG, "no keng binary: set KENG_BIN")
    local dir = path("atomic")
    os.execute("mkdir -p " .. sh_quote(dir))
    local p = dir .. "/model.safetensors"
    keng.save(p, {w = keng.arange(10, {dtype = "f32"})}, {version = "old"})
    local old = read_bytes(p)
    local code = string.format("keng.save(%q, {w = keng.ones({64, 64}), b = keng.zeros({3})}, {version = 'new'})", p)
    -- fail inside the length word, inside the header, and halfway through the data
    for _, n in ipairs({0, 5, 40, 8000}) do
      local err, rc = child_save(n, code)
      assert.is_true(rc ~= 0, "child save with a fault after " .. n .. " bytes should fail")
      assert.truthy(err:find("injected failure after " .. n .. " bytes", 1, true), err)
      assert.is_true(read_bytes(p) == old, "old checkpoint changed by a save failing after " .. n .. " bytes")
      assert.equal("model.safetensors\n", ls(dir))
    end
    local _, meta = keng.load(p)
    assert.equal("old", meta.version)
    -- a limit beyond the file's size lets the same save through
    local err, rc = child_save(1000000, code)
    assert.equal(0, rc, err)
    local t, m = keng.load(p)
    assert.equal("new", m.version)
    assert.are.same({64, 64}, t.w.shape)
    assert.equal("model.safetensors\n", ls(dir))
  end)

  it("removes the temp files a killed save of the same target left, not a live save's", function()
    local dir = path("stale")
    os.execute("mkdir -p " .. sh_quote(dir))
    local stale = dir .. "/.m.safetensors.tmp-Ab12Cd"       -- as mkstemp names them
    local live = dir .. "/.m.safetensors.tmp-Ef34Gh"
    local other = dir .. "/.n.safetensors.tmp-Ij56Kl"        -- another target's
    local odd = dir .. "/.m.safetensors.tmp-notmine1"        -- not the pattern
    for _, f in ipairs({stale, live, other, odd}) do write_bytes(f, string.rep("x", 1000)) end
    -- a save still running holds a lock on its temp file (util-linux flock stands in for it)
    local ready = dir .. "/ready"
    os.execute("flock -x " .. sh_quote(live) .. " sh -c 'touch " .. sh_quote(ready) .. "; sleep 3' &")
    for _ = 1, 100 do
      if read_bytes(ready) then break end
      os.execute("sleep 0.05")
    end
    keng.save(dir .. "/m.safetensors", {w = keng.ones({2})})
    assert.is_nil(read_bytes(stale), "the stale temp file is still there")
    for _, f in ipairs({live, other, odd}) do assert.truthy(read_bytes(f), f .. " was removed") end
    assert.are.same({2}, keng.load(dir .. "/m.safetensors").w.shape)
  end)

  it("replaces an existing file and keeps its permissions", function()
    local p = path("perm.safetensors")
    keng.save(p, {a = keng.ones({1})})
    os.execute("chmod 640 " .. sh_quote(p))
    keng.save(p, {a = keng.zeros({2})})
    local f = io.popen("stat -c %a " .. sh_quote(p))
    local mode = f:read("a"):gsub("%s+$", "")
    f:close()
    assert.equal("640", mode)
    assert.are.same({2}, keng.load(p).a.shape)
  end)

  it("rejects bad arguments with messages naming them", function()
    local p = path("bad.safetensors")
    H.raises(function() keng.save(p, {a = 1}) end, "tensor expected for 'a'")
    H.raises(function() keng.save(p, {keng.ones({1})}) end, "tensor names must be strings")
    H.raises(function() keng.save(p, {a = keng.ones({1})}, {flag = true}) end, "metadata values must be strings; 'flag'")
    H.raises(function() keng.save(p, "x") end, "bad argument #2")
    H.raises(function() keng.save(p, {__metadata__ = keng.ones({1})}) end, "'__metadata__' is reserved")
    H.raises(function() keng.save(p, {m = keng.zeros({2}, {device = "meta"})}) end, "on the meta device")
    H.raises(function() keng.save(p, {a = keng.ones({1})}, {bad = "\xff"}) end, "not valid UTF-8")
    local err = H.raises(function() keng.save(path("no/such/dir/x.safetensors"), {a = keng.ones({1})}) end,
                         "save: " .. path("no/such/dir/x.safetensors") .. ": cannot create a temp file")
    assert.truthy(err:find("No such file", 1, true), err)
    assert.is_nil(read_bytes(p))
  end)
end)

describe("sharded checkpoints", function()
  local dir = path("sharded")
  os.execute("mkdir -p " .. sh_quote(dir))
  local full = {["embed.weight"] = keng.randn({5, 4}), ["h.0.w"] = keng.randn({4, 4}, {dtype = "bf16"}),
                ["h.1.w"] = keng.randn({4, 4}), ["head.bias"] = keng.arange(3)}
  keng.save(dir .. "/model-00001-of-00002.safetensors",
            {["embed.weight"] = full["embed.weight"], ["h.0.w"] = full["h.0.w"]}, {format = "pt"})
  keng.save(dir .. "/model-00002-of-00002.safetensors", {["h.1.w"] = full["h.1.w"], ["head.bias"] = full["head.bias"]})
  local function index(map, extra)
    local parts = {}
    for name, file in pairs(map) do parts[#parts + 1] = string.format("%q: %q", name, file) end
    return '{"metadata": {"total_size": 224' .. (extra or "") .. '}, "weight_map": {' .. table.concat(parts, ", ") .. "}}"
  end
  local map = {["embed.weight"] = "model-00001-of-00002.safetensors", ["h.0.w"] = "model-00001-of-00002.safetensors",
               ["h.1.w"] = "model-00002-of-00002.safetensors", ["head.bias"] = "model-00002-of-00002.safetensors"}
  write_bytes(dir .. "/model.safetensors.index.json", index(map))

  local function check(t, meta)
    local n = 0
    for name, v in pairs(full) do
      n = n + 1
      same_values(t[name], v, name)
    end
    for name in pairs(t) do assert.truthy(full[name], "unexpected " .. name) end
    assert.equal(4, n)
    assert.equal("224", meta.total_size)
    assert.equal("pt", meta.format)
  end

  it("loads and merges every shard through the index file", function()
    check(keng.load(dir .. "/model.safetensors.index.json"))
  end)

  it("loads a directory holding the index", function()
    check(keng.load(dir))
  end)

  it("prefers model.safetensors in a directory", function()
    local d2 = path("single")
    os.execute("mkdir -p " .. sh_quote(d2))
    keng.save(d2 .. "/model.safetensors", {x = keng.ones({2})})
    local t = keng.load(d2)
    H.close(t.x, keng.ones({2}), 0)
  end)

  it("fails when the weight map and the shards disagree", function()
    local bad = {}
    for k, v in pairs(map) do bad[k] = v end
    bad["missing.w"] = "model-00002-of-00002.safetensors"
    local p = write_bytes(dir .. "/missing.index.json", index(bad))
    local err = load_error(p)
    assert.truthy(err:find("weight_map lists 'missing.w' in 'model-00002-of-00002.safetensors', but that shard has no such tensor", 1, true), err)
    bad["missing.w"] = nil
    bad["h.1.w"] = nil
    err = load_error(write_bytes(dir .. "/unlisted.index.json", index(bad)))
    assert.truthy(err:find("holds 'h.1.w', which the weight_map does not list", 1, true), err)
    bad["h.1.w"] = "model-00001-of-00002.safetensors"
    err = load_error(write_bytes(dir .. "/moved.index.json", index(bad)))
    assert.truthy(err:find("but the weight_map puts it in 'model-00001-of-00002.safetensors'", 1, true), err)
    err = load_error(write_bytes(dir .. "/escape.index.json", index({x = "../x.safetensors"})))
    assert.truthy(err:find("leaves the index's directory", 1, true), err)
    err = load_error(write_bytes(dir .. "/nomap.index.json", '{"metadata": {}}'))
    assert.truthy(err:find('no "weight_map"', 1, true), err)
  end)

  it("reports a corrupt shard with the shard's path", function()
    local d3 = path("badshard")
    os.execute("mkdir -p " .. sh_quote(d3))
    write_st("badshard/s1.safetensors", '{"a":{"dtype":"F32","shape":[9],"data_offsets":[0,8]}}', string.rep("\0", 8))
    write_bytes(d3 .. "/model.safetensors.index.json", '{"weight_map": {"a": "s1.safetensors"}}')
    H.raises(function() keng.load(d3) end, "load: " .. d3 .. "/s1.safetensors: tensor 'a': shape [9]")
  end)
end)

teardown(function() os.execute("rm -rf " .. sh_quote(tmp)) end)
