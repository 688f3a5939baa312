-- tokenizer_json_spec.lua — tokenizer.json pipelines (engine/io/tokenizer_json*.c) through
-- keng.tokenizers.from_file, id for id and string for string against the reference library
-- `tokenizers` on the fixtures of tests/fixtures/gen/gen_tokenizer_json.py: byte-level BPE as
-- GPT-2 / Llama 3 / Qwen 2, Metaspace BPE with byte fallback as Llama 2 / Mistral, WordPiece as
-- BERT, Unigram with a Precompiled charsmap as T5, CLIP, and two tokenizers built to exercise the
-- other normalizers, pre-tokenizers, added-token flags and decoders. Also: the batch helpers,
-- option checks, from_dir, and files that use what keng does not implement.
local keng = require "keng"
local json = require "keng.json"
local T = require "keng.tokenizers"
local H = require "helper"

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local DIR = here .. "/../fixtures/tokenizer_json/"
local NAMES = {"added", "wordlevel", "gpt2", "llama3", "qwen2", "llama2", "llama2_legacy", "bert", "t5", "unigram_bf", "clip", "misc", "pieces", "regex_o200k",
               "regex_r50k", "regex_deepseek"}

local read, write = H.read, H.write

local function show(ids) return "{" .. table.concat(ids, ",") .. "}" end

local function same(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

for _, name in ipairs(NAMES) do
  describe("tokenizer.json " .. name, function()
    local g = json.decode(read(DIR .. name .. ".golden.json"))
    local tok = T.from_file(DIR .. name .. ".json")

    it("has the reference's vocabulary size", function()
      assert.are.equal(g.vocab_size, tok:vocab_size())
    end)

    it("encodes every text to the reference's ids, with and without special tokens", function()
      assert(#g.texts >= 200, "fixture too small")
      for i, text in ipairs(g.texts) do
        local ids = tok:encode(text)
        assert(same(ids, g.ids[i]), string.format("text %d %q: got %s, reference %s", i, text, show(ids), show(g.ids[i])))
        local plain = g.plain[tostring(i)] or g.ids[i]
        local got = tok:encode(text, {add_special_tokens = false})
        assert(same(got, plain), string.format("text %d %q without specials: got %s, reference %s", i, text, show(got),
          show(plain)))
      end
    end)

    it("decodes the encodings as the reference does, with and without special tokens", function()
      for i, ids in ipairs(g.ids) do
        assert.are.equal(g.decoded[i], tok:decode(ids))
        assert.are.equal(g.decoded_skip[tostring(i)] or g.decoded[i], tok:decode(ids, {skip_special_tokens = true}))
      end
    end)

    it("post-processes pairs with the reference's ids and type ids", function()
      for _, c in ipairs(g.pairs) do
        local a, b = tok:encode(c[1], {add_special_tokens = false}), tok:encode(c[2], {add_special_tokens = false})
        local ids, types = tok.raw:post_process(a, b, true)
        assert(same(ids, c[3]), string.format("pair %q %q: got %s, reference %s", c[1], c[2], show(ids), show(c[3])))
        assert(same(types, c[4]), string.format("pair %q %q: type ids %s, reference %s", c[1], c[2], show(types), show(c[4])))
      end
    end)

    it("decodes random id lists as the reference does", function()
      for _, c in ipairs(g.decode) do
        local got, skip = tok:decode(c[1]), tok:decode(c[1], {skip_special_tokens = true})
        assert(got == c[2], string.format("%s: got %q, reference %q", show(c[1]), got, c[2]))
        assert(skip == c[3], string.format("%s skipping specials: got %q, reference %q", show(c[1]), skip, c[3]))
      end
    end)
  end)
end

describe("tokenizers.from_file objects", function()
  local bert = T.from_file(DIR .. "bert.json", {pad_token = "[PAD]"})
  local llama = T.from_file(DIR .. "llama2.json", {bos_token = "<s>", eos_token = "</s>"})

  it("looks tokens up both ways, added tokens included", function()
    local id = bert:token_to_id("[CLS]")
    assert.are.equal("[CLS]", bert:id_to_token(id))
    assert.is_nil(bert:token_to_id("no such token"))
    assert.is_nil(bert:id_to_token(100000))
    assert.are.equal("WordPiece", bert.model_type)
  end)

  it("decodes a tensor of ids and refuses ids outside the vocabulary", function()
    local ids = bert:encode("hello world")
    assert.are.equal(bert:decode(ids), bert:decode(keng.tensor(ids, {dtype = "i64"})))
    H.raises(function() bert:decode({5, 100000}) end, "decode: id 100000 (element 2) is outside [0, 500)")
    H.raises(function() bert:decode({-1}) end, "decode: id -1 (element 1)")
  end)

  it("refuses text that is not UTF-8", function()
    H.raises(function() bert:encode("ab\xff") end, "encode: the text is not UTF-8 (byte 3)")
  end)

  it("refuses unknown option keys, naming them", function()
    H.raises(function() bert:encode("x", {add_special = true}) end, "encode: unknown option 'add_special' (valid: add_bos, add_eos, add_special_tokens)")
    H.raises(function() bert:decode({1}, {skip_special = true}) end, "decode: unknown option 'skip_special' (valid: skip_special_tokens)")
    H.raises(function() bert:encode_batch({"x"}, {maxlen = 3}) end, "encode_batch: unknown option 'maxlen'")
    H.raises(function() T.from_file(DIR .. "bert.json", {pad = "[PAD]"}) end, "tokenizers.from_file: unknown option 'pad'")
    H.raises(function() T.from_dir(DIR, {lowercase = true}) end, "tokenizers.from_dir: unknown option 'lowercase'")
    H.raises(function() T.from_file(DIR .. "bert.json", {pad_token = "<pad>"}) end, "pad_token '<pad>' is not in")
    H.raises(function() bert:encode_batch({"x"}, {side = "middle"}) end, 'side must be "left" or "right"')
  end)

  it("the legacy tokenizers refuse unknown option keys too", function()
    local sp = T.sentencepiece(here .. "/../fixtures/sentencepiece/bpe.model")
    H.raises(function() sp:encode("x", {add_bo = true}) end, "encode: unknown option 'add_bo' (valid: add_bos, add_eos)")
    H.raises(function() sp:encode_batch({"x"}, {maxlen = 3}) end, "encode_batch: unknown option 'maxlen'")
    H.raises(function() sp:pack({"x"}, {len = 3}) end, "pack: unknown option 'len' (valid: add_bos, add_eos, seq_len)")
    H.raises(function() sp:encode_batch({"x"}, {side = "up"}) end, 'side must be "left" or "right"')
    H.raises(function() T.bert(here .. "/../fixtures/bert/vocab.txt", {lower = true}) end, "tokenizers.bert: unknown option 'lower'")
    local b = T.bert(here .. "/../fixtures/bert/vocab.txt")
    H.raises(function() b:encode_batch({"x"}, {side = "left"}) end, "encode_batch: unknown option 'side' (valid: max_length, padding, truncation)")
    local ct = require "keng.clip_tokenize"
    H.raises(function() ct.load(here .. "/../fixtures/clip/tokenizer", {pad = 0}) end, "clip_tokenize.load: unknown option 'pad'")
    H.raises(function() ct.load(here .. "/../fixtures/clip/tokenizer"):encode_batch({"x"}, {length = 7}) end,
      "encode_batch: unknown option 'length' (valid: max_length, pad_id)")
  end)

  it("puts bos / eos around the ids with add_bos / add_eos (the SentencePiece surface)", function()
    local plain = llama:encode("Hello world", {add_special_tokens = false})
    assert.are.same({1, table.unpack(plain)}, llama:encode("Hello world", {add_bos = true}))
    local both = llama:encode("Hello world", {add_bos = true, add_eos = true})
    assert.are.equal(2, both[#both])
    assert.are.same(llama:encode("Hello world"), llama:encode("Hello world", {add_bos = true}))
    H.raises(function() bert:encode("x", {add_bos = true}) end, "add_bos, but")
    H.raises(function() llama:encode("x", {add_bos = true, add_special_tokens = true}) end, "exclude each other")
  end)

  it("batches pairs with the post-processor's special tokens, type ids, padding and truncation", function()
    local a, b = bert:encode("the quick brown fox", {add_special_tokens = false}), bert:encode("hello", {add_special_tokens = false})
    local cls, sep, pad = bert:token_to_id("[CLS]"), bert:token_to_id("[SEP]"), bert:token_to_id("[PAD]")
    local r = bert:encode_batch({{"the quick brown fox", "hello"}, "hello"})
    local n = #a + #b + 3
    assert.are.same({2, n}, r.token_ids.shape)
    local want = {cls, table.unpack(a)}
    want[#want + 1] = sep
    for _, id in ipairs(b) do want[#want + 1] = id end
    want[#want + 1] = sep
    assert.are.same(want, r.token_ids[1]:tolist())
    local types = r.segment_ids[1]:tolist()
    assert.are.equal(0, types[1]); assert.are.equal(0, types[#a + 2]); assert.are.equal(1, types[#a + 3]); assert.are.equal(1, types[n])
    local row2 = r.token_ids[2]:tolist()
    assert.are.same({cls, b[1]}, {row2[1], row2[2]})
    assert.are.equal(pad, row2[n])
    assert.are.equal(#b + 2, r.padding_mask[2]:long():sum():item())
    -- truncation: the longer segment loses its last ids first, the specials stay
    local t = bert:encode_batch({{"the quick brown fox", "hello"}}, {max_length = #b + 3 + 1})
    assert.are.same({cls, a[1], sep, b[1], sep}, t.token_ids[1]:tolist())
    H.raises(function() bert:encode_batch({"the quick brown fox"}, {max_length = 3, truncation = false}) end,
      "more than max_length 3")
    local l = bert:encode_batch({"hello", "the quick brown fox"}, {side = "left", padding = "longest", max_length = 64})
    assert.are.same({2, #a + 2}, l.token_ids.shape)
    assert.are.equal(cls, l.token_ids[1]:tolist()[#a + 2 - #b - 1])
  end)

  it("packs texts into rows", function()
    local p = llama:pack({"Hello world", "the quick brown fox jumps over the lazy dog"}, {seq_len = 4})
    assert.are.equal(4, p.shape[2])
    assert.are.equal(1, p[1][1]:item())
  end)
end)

describe("tokenizers.from_dir", function()
  local function tmpdir()
    local d = os.tmpname()
    os.remove(d)
    assert(os.execute("mkdir -p '" .. d .. "'"))
    return d
  end

  it("picks tokenizer.json and reads the special tokens of tokenizer_config.json", function()
    local d = tmpdir()
    write(d .. "/tokenizer.json", read(DIR .. "llama2.json"))
    write(d .. "/tokenizer_config.json", '{"bos_token": "<s>", "eos_token": {"content": "</s>"}, "model_max_length": 16}')
    local tok = T.from_dir(d)
    os.execute("rm -rf '" .. d .. "'")
    assert.are.equal(1, tok.bos_id)
    assert.are.equal(2, tok.eos_id)
    assert.are.equal(2, tok.pad_id) -- no pad token: eos
    assert.are.equal(16, tok.max_length)
    assert.are.same(T.from_file(DIR .. "llama2.json"):encode("Hi there"), tok:encode("Hi there"))
    -- model_max_length truncates but does not pad: rows are as wide as the longest
    assert.are.same({1, #tok:encode("Hi")}, tok:encode_batch({"Hi"}).token_ids.shape)
    assert.are.same({1, 16}, tok:encode_batch({string.rep("the quick brown fox ", 10)}).token_ids.shape)
  end)

  it("falls back to the legacy files, and names what it looked for", function()
    local sp = T.from_dir(here .. "/../fixtures/clip/tokenizer")
    assert.is_truthy(sp.bos_id)
    local d = tmpdir()
    local err = H.raises(function() T.from_dir(d) end, "has no tokenizer.json, vocab.txt, tokenizer.model or vocab.json + merges.txt")
    os.execute("rm -rf '" .. d .. "'")
    assert(err:find(d, 1, true))
  end)
end)

describe("tokenizer.json files keng refuses", function()
  local path = os.tmpname()
  local function fresh() return json.decode(read(DIR .. "gpt2.json")) end
  local function refuses(j, pattern)
    write(path, type(j) == "string" and j or json.encode(j))
    local ok, err = pcall(T.from_file, path)
    assert(not ok, "expected the load to fail with '" .. pattern .. "'")
    err = tostring(err)
    assert(err:find(pattern, 1, true), "error '" .. err .. "' does not contain '" .. pattern .. "'")
  end
  local function edit(f)
    local j = fresh()
    f(j)
    return j
  end

  it("names unknown components, keys and unsupported settings", function()
    refuses(edit(function(j) j.decoder = {type = "CTC"} end), "decoder: the type 'CTC' is not supported")
    refuses(edit(function(j) j.model.dropout = 0.1 end), "model BPE: dropout must be null")
    refuses(edit(function(j) j.model.frobnicate = 1 end), "model BPE: the key 'frobnicate' is not supported")
    refuses(edit(function(j) j.post_processor.extra = 1 end), "post_processor ByteLevel: the key 'extra' is not supported")
    refuses(edit(function(j) j.normalizer = {type = "Frob"} end), "normalizer: the type 'Frob' is not supported")
    refuses(edit(function(j) j.normalizer = {type = "Precompiled", precompiled_charsmap = "!!"} end),
      "precompiled_charsmap is not base64")
    refuses(edit(function(j) j.pre_tokenizer = {type = "UnicodeScripts"} end),
      "pre_tokenizer: the type 'UnicodeScripts' is not supported")
    refuses(edit(function(j) j.model.type = "Frob" end), "model: the type 'Frob' is not supported")
    refuses(edit(function(j) j.extra_key = 1 end), "tokenizer.json: the key 'extra_key' is not supported")
    refuses(edit(function(j) j.version = "2.0" end), "version must be \"1.0\"")
  end)

  it("names regex syntax it does not implement", function()
    local function with_regex(re)
      return edit(function(j)
        j.pre_tokenizer = {type = "Split", pattern = {Regex = re}, behavior = "Isolated", invert = false}
      end)
    end
    refuses(with_regex("(?<=a)b"), "lookbehind (?<= (?<! is not supported")
    refuses(with_regex("(a)\\1"), "the escape \\1 (anchors, backreferences, \\R \\X \\K) is not supported")
    refuses(with_regex("\\p{Greek}"), "the property \\p{Greek} is not supported")
    refuses(with_regex("[[:alpha:]]"), "nested classes and [:posix:] brackets are not supported")
    refuses(with_regex("(a"), "missing )")
    refuses(with_regex("*a"), "a quantifier with nothing to repeat")
  end)

  it("fails cleanly on files that are not tokenizer.json", function()
    refuses("{", "not JSON")
    refuses("[]", "not a tokenizer.json")
    refuses(edit(function(j) j.model.vocab["zz_dup"] = 0 end), "is given twice")
    refuses(edit(function(j) j.model.merges[1] = {"no_such_token", "x"} end), "'no_such_token' is not in the vocabulary")
    refuses(edit(function(j) j.model.vocab["zz_big"] = 99999 end), "must be an integer in [0, 601)")
  end)
  os.remove(path)
end)

describe("model loaders with a transformers-5 tokenizer.json", function()
  local root = io.popen("pwd"):read("l")
  local function tmpdir()
    local d = os.tmpname()
    os.remove(d)
    assert(os.execute("mkdir -p '" .. d .. "'"))
    return d
  end

  it("CLIP: tokenizer.json gives the ids of vocab.json + merges.txt", function()
    local raw = keng.clip_tokenizer(here .. "/../fixtures/clip/tokenizer/vocab.json", here .. "/../fixtures/clip/tokenizer/merges.txt")
    local tok = T.from_file(DIR .. "clip.json")
    local g = json.decode(read(DIR .. "clip.golden.json"))
    for i, text in ipairs(g.texts) do
      local a, b = raw:encode(text), tok:encode(text, {add_special_tokens = false})
      assert(same(a, b), string.format("text %d %q: clip_tokenizer %s, tokenizer.json %s", i, text, show(a), show(b)))
    end
  end)

  it("stable_diffusion.from_pretrained reads a tokenizer/ that holds only tokenizer.json", function()
    local sd = require "models.stable_diffusion"
    local d = tmpdir()
    local links = {}
    for _, p in ipairs{"tests/fixtures/sd/unet", "tests/fixtures/sd/vae", "tests/fixtures/sd/scheduler",
                       "tests/fixtures/clip/text_encoder"} do
      links[#links + 1] = root .. "/" .. p
    end
    assert(os.execute("mkdir -p " .. d .. "/tokenizer && ln -s " .. table.concat(links, " ") .. " " .. d .. "/"))
    write(d .. "/tokenizer/tokenizer.json", read(DIR .. "clip.json"))
    local ok, pipe = pcall(sd.from_pretrained, d)
    os.execute("rm -rf '" .. d .. "'")
    assert(ok, tostring(pipe))
    local P = {"a photograph of an astronaut riding a horse", "Hello, WORLD!! 123"}
    local want = require("keng.clip_tokenize").load(here .. "/../fixtures/clip/tokenizer"):encode_batch(P)
    assert.are.same(want:tolist(), pipe.tokenizer:encode_batch(P):tolist())
  end)

  it("gemma.from_pretrained takes tokenizer.json (and its config's bos) over nothing", function()
    local gemma = require "models.gemma"
    local d = tmpdir()
    for _, f in ipairs{"config.json", "model.safetensors"} do write(d .. "/" .. f, read("tests/fixtures/gemma/" .. f)) end
    write(d .. "/tokenizer.json", read(DIR .. "llama2.json"))
    write(d .. "/tokenizer_config.json", '{"bos_token": "<s>", "eos_token": "</s>"}')
    local ok, lm = pcall(gemma.from_pretrained, d)
    os.execute("rm -rf '" .. d .. "'")
    assert(ok, tostring(lm))
    assert.are.equal(T.Json, getmetatable(lm.tokenizer))
    assert.are.same({1, table.unpack(lm.tokenizer:encode("Hi", {add_special_tokens = false}))},
      lm.tokenizer:encode("Hi", {add_bos = true}))
  end)
end)

describe("directories saved by transformers 5", function()
  for _, name in ipairs{"bert", "qwen2", "llama", "gemma"} do
    it(name .. ": from_dir encodes, decodes and names bos/eos/pad as transformers' AutoTokenizer", function()
      local d = DIR .. "tf5_" .. name
      local g = json.decode(read(d .. "/golden.json"))
      local tok = T.from_dir(d)
      for i, text in ipairs(g.texts) do
        local ids = tok:encode(text)
        assert(same(ids, g.ids[i]), string.format("text %d %q: got %s, transformers %s", i, text, show(ids), show(g.ids[i])))
        assert.are.equal(g.decoded[i], tok:decode(g.ids[i]))
      end
      for _, k in ipairs{"bos", "eos", "pad"} do
        if g.special[k] ~= json.null then assert.are.equal(g.special[k], tok[k .. "_id"], k) end
      end
    end)
  end
end)
