-- sentencepiece_spec.lua — keng.sentencepiece against golden ids and texts from the reference
-- library (tests/fixtures/gen/gen_sentencepiece.py): a BPE model with byte fallback and a
-- unigram model with the nmt_nfkc charsmap; lookups, add_bos/add_eos, corrupt files.
local keng = require "keng"
local H = require "helper"

local DIR = "tests/fixtures/sentencepiece/"

local read, write = H.read, H.write

local golden = H.read_json(DIR .. "golden.json", {null_as_nil = true})

local function same_ids(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

local function show(ids) return "{" .. table.concat(ids, ",") .. "}" end

for _, name in ipairs{"bpe", "unigram", "bpe_gemma"} do
  local g = golden[name]
  describe("sentencepiece " .. name, function()
    local sp = keng.sentencepiece(DIR .. name .. ".model")

    it("reports the reference's vocabulary size and special ids", function()
      assert.are.equal(g.info.vocab_size, sp:vocab_size())
      assert.are.equal(g.info.bos_id, sp.bos_id)
      assert.are.equal(g.info.eos_id, sp.eos_id)
      assert.are.equal(g.info.pad_id, sp.pad_id)
      assert.are.equal(g.info.unk_id, sp.unk_id)
      assert.are.equal(name == "unigram" and "unigram" or "bpe", sp.model_type)
    end)

    it("encodes every golden text to the reference ids", function()
      for _, case in ipairs(g.encode) do
        local ids = sp:encode(case.text)
        assert(same_ids(ids, case.ids),
          string.format("%q: got %s, reference %s", case.text, show(ids), show(case.ids)))
      end
    end)

    it("decodes the encodings as the reference does", function()
      for _, case in ipairs(g.encode) do
        assert.are.equal(case.decoded, sp:decode(case.ids))
      end
    end)

    it("decodes arbitrary id lists (bytes, controls, leading spaces) as the reference does", function()
      for _, case in ipairs(g.decode) do
        local got = sp:decode(case.ids)
        assert(got == case.text, string.format("%s: got %q, reference %q", show(case.ids), got, case.text))
      end
    end)

    it("decodes a 1-D integer tensor", function()
      local case = g.encode[2]
      assert.are.equal(case.decoded, sp:decode(keng.tensor(case.ids, {dtype = "i64"})))
      assert.are.equal(case.decoded, sp:decode(keng.tensor(case.ids, {dtype = "i32"})))
    end)

    it("maps ids and pieces both ways", function()
      for id = 0, sp:vocab_size() - 1 do
        local piece = g.pieces[id + 1]
        assert.are.equal(piece, sp:id_to_piece(id))
        assert.are.equal(id, sp:piece_to_id(piece))
      end
      assert.are.equal(sp.unk_id, sp:piece_to_id("no such piece, surely"))
      H.raises(function() sp:id_to_piece(sp:vocab_size()) end, "outside")
      H.raises(function() sp:id_to_piece(-1) end, "outside")
    end)

    it("adds bos and eos on request", function()
      local plain = sp:encode("Hello world")
      local both = sp:encode("Hello world", {add_bos = true, add_eos = true})
      assert.are.equal(#plain + 2, #both)
      assert.are.equal(sp.bos_id, both[1])
      assert.are.equal(sp.eos_id, both[#both])
      for i = 1, #plain do assert.are.equal(plain[i], both[i + 1]) end
      assert(same_ids(sp:encode("Hello world", {add_bos = true}), {sp.bos_id, table.unpack(plain)}))
      assert.are.equal("Hello world", sp:decode(both)) -- controls decode to nothing
    end)

    it("raises on ids outside the vocabulary and on bad arguments", function()
      H.raises(function() sp:decode({1, sp:vocab_size()}) end, "id " .. sp:vocab_size())
      H.raises(function() sp:decode({-1}) end, "outside")
      H.raises(function() sp:decode({1.5}) end, "not an integer")
      H.raises(function() sp:decode(keng.tensor({1.0, 2.0})) end, "integer tensor")
      H.raises(function() sp:encode(nil) end, "string expected")
    end)

    it("does not crash on invalid UTF-8 and round-trips what it can", function()
      local ids = sp:encode("ab\xff\xc3(\xe2\x82 cd")
      assert(#ids > 0)
      local text = sp:decode(ids)
      assert(utf8.len(text), "decoded text is valid UTF-8")
      if sp.byte_fallback then
        assert(text:find("\u{FFFD}", 1, true), "invalid bytes become U+FFFD: " .. text)
      else
        assert(text:find("\u{2047}", 1, true), "U+FFFD is unknown here: " .. text)
      end
    end)
  end)
end

describe("sentencepiece byte fallback", function()
  it("spells characters outside the vocabulary as <0xNN> pieces (bpe)", function()
    local sp = keng.sentencepiece(DIR .. "bpe.model")
    local ids = sp:encode("\u{1F600}") -- 😀 = F0 9F 98 80
    local pieces = {}
    for i, id in ipairs(ids) do pieces[i] = sp:id_to_piece(id) end
    local s = table.concat(pieces, " ")
    assert(s:find("<0xF0> <0x9F> <0x98> <0x80>", 1, true), s)
    assert.are.equal("\u{1F600}", sp:decode(ids))
  end)

  it("gives unk without byte fallback (unigram) and decodes it as the unk surface", function()
    local sp = keng.sentencepiece(DIR .. "unigram.model")
    local ids = sp:encode("\u{1F600}")
    local has_unk = false
    for _, id in ipairs(ids) do has_unk = has_unk or id == sp.unk_id end
    assert(has_unk)
    assert(sp:decode(ids):find("\u{2047}", 1, true))
  end)
end)

describe("sentencepiece bad files", function()
  local good = read(DIR .. "bpe.model")

  it("raises a clean error for a missing file", function()
    H.raises(function() keng.sentencepiece("/tmp/keng_no_such_file.model") end, "cannot open")
  end)

  it("raises for truncated models", function()
    for _, n in ipairs{0, 1, 5, 100, #good // 2, #good - 1} do
      local path = "/tmp/keng_sp_trunc.model"
      write(path, good:sub(1, n))
      local ok, err = pcall(keng.sentencepiece, path)
      assert(not ok, "truncated to " .. n .. " bytes loaded")
      assert(tostring(err):find("sentencepiece: ", 1, true), err)
    end
  end)

  it("raises for corrupted bytes and for a file that is not a model", function()
    write("/tmp/keng_sp_text.model", "this is not a protobuf at all\n")
    H.raises(function() keng.sentencepiece("/tmp/keng_sp_text.model") end, "sentencepiece")
    -- a huge length prefix right after the first key
    write("/tmp/keng_sp_len.model", good:sub(1, 1) .. "\xff\xff\xff\xff\x0f" .. good:sub(3))
    H.raises(function() keng.sentencepiece("/tmp/keng_sp_len.model") end, "sentencepiece")
    -- random byte flips: each either loads and still encodes, or raises cleanly
    math.randomseed(7)
    for k = 1, 200 do
      local b = {good:byte(1, -1)}
      for _ = 1, 1 + k % 4 do
        local i = math.random(#b)
        b[i] = math.random(0, 255)
      end
      local path = "/tmp/keng_sp_flip.model"
      local chunks = {}
      for i = 1, #b, 4096 do chunks[#chunks + 1] = string.char(table.unpack(b, i, math.min(i + 4095, #b))) end
      write(path, table.concat(chunks))
      local ok, sp = pcall(keng.sentencepiece, path)
      if ok then
        local ids = sp:encode("Hello, world! 😀 Café")
        sp:decode(ids)
      else
        assert(tostring(sp):find("sentencepiece", 1, true), sp)
      end
    end
  end)
end)
