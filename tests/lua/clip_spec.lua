-- clip_spec.lua — the CLIP tokenizer (engine/io/clip_bpe.c, keng.clip_tokenize) and text encoder
-- (scripts/models/clip.lua) against transformers' CLIPTokenizer / CLIPTextModel golden files in
-- tests/fixtures/clip (written by tests/fixtures/gen/gen_clip.py).
local keng = require "keng"
local H = require "helper"
local json = require "keng.json"
local clip = require "models.clip"
local ct = require "keng.clip_tokenize"

local FIX = "tests/fixtures/clip/"
local VOCAB, MERGES = FIX .. "tokenizer/vocab.json", FIX .. "tokenizer/merges.txt"

local read, capture_stderr = H.read, H.capture_stderr
local function write_tmp(text) return H.write(H.tmpname(), text) end

describe("clip tokenizer", function()
  local tok = keng.clip_tokenizer(VOCAB, MERGES)
  local golden = json.decode(read(FIX .. "tokenizer_golden.json"))

  it("has the reference's vocabulary size and special ids", function()
    assert.are.equal(golden.vocab_size, tok:vocab_size())
    assert.are.equal(golden.bos_id, tok.bos_id)
    assert.are.equal(golden.eos_id, tok.eos_id)
    assert.are.equal("<|endoftext|>", tok:id_to_token(tok.eos_id))
    assert.are.equal(tok.bos_id, tok:token_to_id("<|startoftext|>"))
  end)

  it("encodes every golden text exactly as CLIPTokenizer", function()
    local bad = {}
    for _, c in ipairs(golden.cases) do
      local got, want = table.concat(tok:encode(c.text), " "), table.concat(c.ids, " ")
      if got ~= want then bad[#bad + 1] = string.format("%q: got {%s} want {%s}", c.text, got, want) end
    end
    assert(#golden.cases >= 150, "golden list too short")
    assert(#bad == 0, #bad .. " mismatches, first: " .. tostring(bad[1]))
  end)

  it("decodes every golden id list exactly as CLIPTokenizer", function()
    local bad = {}
    for _, c in ipairs(golden.cases) do
      local got = tok:decode(c.ids)
      if got ~= c.decoded then bad[#bad + 1] = string.format("%q: got %q want %q", c.text, got, c.decoded) end
    end
    assert(#bad == 0, #bad .. " mismatches, first: " .. tostring(bad[1]))
  end)

  it("lower-cases, collapses whitespace and keeps apostrophe suffixes", function()
    assert.are.same(tok:encode("a horse"), tok:encode("  A \t\n HORSE  "))
    local ids = tok:encode("it's")
    assert.are.equal(2, #ids)
    assert.are.equal("'s</w>", tok:id_to_token(ids[2]))
    assert.are.same({}, tok:encode(""))
    assert.are.same({tok.eos_id}, tok:encode("<|endoftext|>"))
  end)

  it("decodes a lone byte of a multi-byte character to U+FFFD and accepts a tensor", function()
    assert.are.equal("\u{FFFD}", tok:decode({tok:token_to_id("Ã")}))
    local ids = tok:encode("a photograph")
    assert.are.equal("a photograph", tok:decode(keng.tensor(ids, {dtype = "i64"})))
  end)

  it("raises on bad text and bad ids", function()
    H.raises(function() tok:encode("ab\xff") end, "not valid UTF-8 at byte 2")
    H.raises(function() tok:decode({1, 100000}) end, "id 100000 (element 2) is outside the vocabulary")
    H.raises(function() tok:decode({1, "x"}) end, "element 2 is a string")
  end)

  it("raises cleanly on missing and corrupt files", function()
    H.raises(function() keng.clip_tokenizer("no/such/vocab.json", MERGES) end, "cannot open vocabulary 'no/such/vocab.json'")
    H.raises(function() keng.clip_tokenizer(VOCAB, "no/such/merges.txt") end, "cannot open merges 'no/such/merges.txt'")
    local cases = {
      {'{"a": 0, "b": ', "is not valid JSON"},
      {'["a", "b"]', "must hold an object"},
      {'{"a": 0, "<|startoftext|>": 1, "<|endoftext|>": 7}', "ids must be the integers 0..2"},
      {'{"a": 0, "<|startoftext|>": 1, "<|endoftext|>": "2"}', "has id of type"},
      {'{"a": 0, "<|startoftext|>": 1, "<|endoftext|>": 1}', "share id 1"},
      {'{"a": 0, "<|startoftext|>": 1}', "lacks the special token <|endoftext|>"},
      {"\x00\x01garbage", "is not valid JSON"},
    }
    for _, c in ipairs(cases) do
      local path = write_tmp(c[1])
      H.raises(function() keng.clip_tokenizer(path, MERGES) end, c[2])
      os.remove(path)
    end
    local mcases = {
      {"#version: 0.2\na b c\n", "line 2: \"a b c\" is not a merge"},
      {"#version: 0.2\nab\n", "line 2: \"ab\" is not a merge"},
      {"#version: 0.2\n\n", "line 2: \"\" is not a merge"},
      {"#version: 0.2\nt h\nzq@ x\n", "line 3: merge \"zq@ x\": \"zq@\" is not in the vocabulary"},
      {"x\xff y\n", "is not in the vocabulary"},
    }
    for _, c in ipairs(mcases) do
      local path = write_tmp(c[1])
      H.raises(function() keng.clip_tokenizer(VOCAB, path) end, c[2])
      os.remove(path)
    end
  end)
end)

describe("clip encode_batch", function()
  local tok = ct.load(FIX .. "tokenizer")
  local golden = json.decode(read(FIX .. "batch_golden.json"))

  it("pads to 77 as BOS ids EOS pad..., as CLIPTokenizer(padding='max_length')", function()
    local ids = tok:encode_batch(golden.prompts)
    assert.are.equal("i64", ids.dtype)
    assert.are.same({2, 77}, ids.shape)
    assert.are.same(golden.ids, ids:tolist())
    assert.are.equal(tok.eos_id, tok.pad_id)  -- SD v1 pads with <|endoftext|>
  end)

  it("truncates an over-long prompt to 77 with a warning naming the dropped words", function()
    local ids
    local msg = capture_stderr(function() ids = tok:encode_batch(golden.long_prompt) end)
    assert.are.same({1, 77}, ids.shape)
    assert.are.same(golden.long_ids, ids:tolist()[1])
    assert(msg:find("truncated", 1, true) and msg:find("word word", 1, true), "warning: " .. msg)
    assert.are.equal("", capture_stderr(function() tok:encode_batch("a short prompt") end))
  end)

  it("takes max_length and pad_id and checks its arguments", function()
    local raw = keng.clip_tokenizer(VOCAB, MERGES)
    local ids = ct.encode_batch(raw, {"a horse"}, {max_length = 8, pad_id = 0}):tolist()[1]
    local body = raw:encode("a horse")
    local want = {raw.bos_id}
    for _, i in ipairs(body) do want[#want + 1] = i end
    want[#want + 1] = raw.eos_id
    while #want < 8 do want[#want + 1] = 0 end
    assert.are.same(want, ids)
    H.raises(function() ct.encode_batch(raw, {}) end, "non-empty list")
    H.raises(function() ct.encode_batch(raw, {"a", 3}) end, "texts[2] is a number")
    H.raises(function() ct.load("no/such/dir") end, "cannot open vocabulary")
  end)
end)

describe("clip text encoder", function()
  it("matches transformers' CLIPTextModel last_hidden_state within 1e-4", function()
    local te = clip.from_pretrained(FIX .. "text_encoder")
    local g = keng.load(FIX .. "text_encoder_golden.safetensors")
    local h = te(g.input_ids)                                       -- [2, 77, 32]
    assert.are.same({2, 77, 32}, h.shape)
    local rel = (h - g.last_hidden_state):abs():max():item() / g.last_hidden_state:abs():max():item()
    assert(rel < 1e-4, "relative error " .. rel)
    H.close(h, g.last_hidden_state, 1e-4, "last_hidden_state")
  end)

  it("uses Hugging Face module names", function()
    local te = clip.from_preset("sd_tiny_text", {device = "meta"})
    local sd = te:state_dict()
    for _, n in ipairs{"text_model.embeddings.token_embedding.weight", "text_model.embeddings.position_embedding.weight",
                       "text_model.encoder.layers.0.self_attn.q_proj.bias", "text_model.encoder.layers.1.mlp.fc1.weight",
                       "text_model.encoder.layers.1.layer_norm2.weight", "text_model.final_layer_norm.bias"} do
      assert(sd[n], "missing " .. n)
    end
  end)

  it("counts 123,060,480 parameters for the ViT-L/14 text preset on meta", function()
    assert.are.equal(123060480, clip.from_preset("clip_vit_l14_text", {device = "meta"}):num_params())
    assert.are.equal(3267136, clip.from_preset("sd_tiny_text", {device = "meta"}):num_params())
  end)

  it("runs the sd_tiny_text preset on a padded batch", function()
    local te = clip.from_preset("sd_tiny_text")
    local ids = ct.load(FIX .. "tokenizer"):encode_batch({"a cat", "a dog"})
    local h = te(ids)
    assert.are.same({2, 77, 64}, h.shape)
    local s = h:abs():sum():item()
    assert(s == s and s < math.huge and s > 0, "non-finite or zero output")
  end)

  it("raises on bad ids, unknown presets and missing files", function()
    local te = clip.from_preset("sd_tiny_text")
    H.raises(function() te(keng.tensor({{1, 49408}})) end, "token id 49408 is outside the vocabulary")
    H.raises(function() te(keng.zeros({1, 78}, {dtype = "i64"})) end, "78 tokens exceed the 77 positions")
    H.raises(function() clip.from_preset("clip_huge") end, "unknown preset 'clip_huge'")
    H.raises(function() clip.from_pretrained("no/such/dir") end, "no config.json in no/such/dir")
    H.raises(function() clip.from_preset("sd_tiny_text", {weights = FIX .. "text_encoder"}) end, "size mismatch")
  end)
end)
