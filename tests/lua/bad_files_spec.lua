-- bad_files_spec.lua — every file in tests/fixtures/bad/ (malformed inputs for the file
-- parsers: seeds of the fuzz corpora and reproducers of what fuzzing found, see
-- docs/security.md) must fail with a clean error naming the file and the rule it breaks, and
-- the session must go on. A new file there without an entry below fails the last test.
local keng = require "keng"
local H = require "helper"

local root = debug.getinfo(1, "S").source:match("^@(.*)/tests/lua/bad_files_spec.lua$") or "."
local BAD = root .. "/tests/fixtures/bad/"
local CLIP_MERGES = root .. "/tests/fixtures/clip/tokenizer/merges.txt"

local load = function(f) return keng.load(BAD .. f) end
local sp = function(f) return keng.sentencepiece(BAD .. f) end
local wp = function(f) return keng.wordpiece(BAD .. f) end
local png = function(f) return keng.image.read_png(BAD .. f) end
local gguf = function(f) return keng.gguf.load(BAD .. f) end

-- file -> {reader, substring the error must hold}
local cases = {
  ["st_huge_header_len.safetensors"] = {load, "header length 9223372036854775808 exceeds the 100 MB limit"},
  ["st_header_past_end.safetensors"] = {load, "header length 5000 runs past the end of the file"},
  ["st_overlap.safetensors"] = {load, "tensors 'a' [0, 8) and 'b' [4, 12) overlap"},
  ["st_offsets_past_end.safetensors"] = {load, "run past the data section"},
  ["st_shape_overflow.safetensors"] = {load, "needs more than 2^64 bytes"},
  -- fuzz finding: an empty tensor whose other sizes overflow the strides (undefined behaviour)
  ["st_zero_dim_overflow.safetensors"] = {load, "shape [0,24967296,4294967296,216] is too large"},
  ["st_size_mismatch.safetensors"] = {load, "tensor 'a': shape [3] of F32"},
  ["st_truncated.safetensors"] = {load, "runs past the end of the file (40 bytes)"},
  ["st_bad_utf8_name.safetensors"] = {load, "invalid UTF-8 in a string"},
  ["st_dup_name.safetensors"] = {load, "duplicate key \"a\""},
  ["st_deep.safetensors"] = {load, "nested deeper than 64 levels"},
  ["st_gap.safetensors"] = {load, "gap of 4 bytes in the data section"},
  ["st_pickle_inside.safetensors"] = {load, "keng does not load pickles"},
  ["index_escape.json"] = {load, "'../shard.safetensors' leaves the index's directory"},
  ["index_absolute.json"] = {load, "'/etc/passwd' leaves the index's directory"},
  ["index_inner_nul.json"] = {load, "weight_map['a'] must be a file name"},
  ["index_deep.json"] = {load, "nested deeper than 64 levels"},
  ["sp_huge_len.model"] = {sp, "truncated or malformed protobuf field"},
  ["sp_truncated.model"] = {sp, "truncated or malformed protobuf field"},
  ["sp_varint_overlong.model"] = {sp, "truncated or malformed protobuf field"},
  ["vocab_bad_utf8.txt"] = {wp, "line 2 is not valid UTF-8"},
  ["vocab_empty.txt"] = {wp, "is empty"},
  ["clip_bad_ids.json"] = {function(f) return keng.clip_tokenizer(BAD .. f, CLIP_MERGES) end, "token \"a\" has id -1"},
  ["clip_dup_keys.json"] = {function(f) return keng.clip_tokenizer(BAD .. f, CLIP_MERGES) end, "duplicate key \"a\""},
  ["clip_bad_merges.txt"] = {function(f) return keng.clip_tokenizer(BAD .. "clip_vocab.json", BAD .. f) end,
    "line 3: \"zz\" is not a merge"},
  ["clip_vocab.json"] = false,                                        -- valid: the vocab for clip_bad_merges.txt
  ["png_truncated.png"] = {png, "png_read"},
  ["png_bad_crc.png"] = {png, "IDAT: incorrect header check"},
  ["png_short_idat.png"] = {png, "Not enough image data"},
  -- fuzz finding: a 69-byte file whose header claims 30000x30000 made keng allocate 2.7 GB
  ["png_big_dims.png"] = {png, "header claims 30000x30000 pixels, more than the 69-byte file can hold"},
  ["png_huge_dims.png"] = {png, "header claims 100000x100000 pixels"},
  -- GGUF (engine/io/gguf.c; tests/fuzz/make_corpus.py writes these)
  ["gguf_truncated.gguf"] = {gguf, "truncated: tensor 'h' at byte 166 needs 8 bytes, the file has 6 left"},
  ["gguf_huge_tensor_count.gguf"] = {gguf, "tensor count 4611686018427387904 cannot fit in a file of 32 bytes"},
  ["gguf_huge_kv_count.gguf"] = {gguf, "metadata count 9223372036854775808 cannot fit"},
  ["gguf_huge_string.gguf"] = {gguf, "has length 9223372036854775808, past the end of the file"},
  ["gguf_huge_array.gguf"] = {gguf, "array of 1152921504606846976 f32 elements cannot fit in the 15 bytes left"},
  ["gguf_offset_past_end.gguf"] = {gguf, "tensor 'w': bytes [64, +16) run past the data section (16 bytes)"},
  ["gguf_misaligned.gguf"] = {gguf, "tensor 'w': offset 4 is not a multiple of the alignment 32"},
  ["gguf_bad_alignment.gguf"] = {gguf, "general.alignment 3 must be a power of two"},
  ["gguf_unknown_type.gguf"] = {gguf, "tensor 'w' has unknown ggml type 99"},
  ["gguf_unsupported_type.gguf"] = {gguf, "tensor 'w' has type Q5_K, which keng does not read"},
  ["gguf_overlap.gguf"] = {gguf, "tensors 'a' [0, +32) and 'b' [0, +32) overlap"},
  ["gguf_dims_overflow.gguf"] = {gguf, "multiply past 2^59 elements"},
  ["gguf_block_row.gguf"] = {gguf, "row length 33 is not a multiple of Q4_0's block of 32"},
  ["gguf_too_many_dims.gguf"] = {gguf, "tensor 'w' has 5 dims (1 to 4 allowed)"},
  ["gguf_version_1.gguf"] = {gguf, "GGUF version 1 is not supported"},
  ["gguf_big_endian.gguf"] = {gguf, "big-endian GGUF files are not supported"},
  ["gguf_bad_bool.gguf"] = {gguf, "metadata 'b': a bool must be 0 or 1, got 2"},
  ["gguf_dup_key.gguf"] = {gguf, "metadata key 'k' appears twice"},
  ["gguf_dup_tensor.gguf"] = {gguf, "tensor name 'w' appears twice"},
  ["gguf_deep_array.gguf"] = {gguf, "arrays nest deeper than 8"},
  ["gguf_not_gguf.gguf"] = {gguf, "not a GGUF file"},
}

describe("malformed files raise clean errors", function()
  local names = {}
  for name in pairs(cases) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local case = cases[name]
    if case then
      it(name, function()
        local err = H.raises(function() return case[1](name) end, case[2])
        assert.truthy(err:find(name, 1, true), "the error names the file: " .. err)
        H.close(keng.ones({2}):sum(), 2)                              -- the session goes on
      end)
    end
  end

  it("every file in tests/fixtures/bad has a case", function()
    local p = io.popen("ls -1 '" .. BAD .. "'")
    local missing = {}
    for f in p:lines() do if cases[f] == nil then missing[#missing + 1] = f end end
    p:close()
    assert.are.same({}, missing)
  end)
end)

describe("config.json readers", function()
  local json = require "keng.json"
  local function decode_config(text) return json.decode(text, {null_as_nil = true}) end  -- models.common
  local inputs = {
    deep = string.rep("[", 100000),
    unterminated = '{"a": "abc',
    bad_escape = '{"a": "\\u12"}',
    bad_utf8 = '{"k\192\175": 1}',
    empty = "",
  }
  for name, text in pairs(inputs) do
    it(name .. " fails with a string error or decodes", function()
      for _, decode in ipairs{json.decode, decode_config} do
        local ok, err = pcall(decode, text)
        if not ok then assert.are.equal("string", type(err)) end
      end
    end)
  end
  it("read null as json.null, or with null_as_nil as absent (arrays close up)", function()
    local text = '{"w": null, "v": {"d": null, "n": 2}, "ids": [1, null, 2], "a": null}'
    local kept = json.decode(text)
    assert.are.equal(json.null, kept.w)
    assert.are.equal(json.null, kept.ids[2])
    assert.are.same({v = {n = 2}, ids = {1, 2}}, decode_config(text))
    assert.is_nil(decode_config("null"))
  end)
end)
