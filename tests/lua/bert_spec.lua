-- bert_spec.lua — BERT: the WordPiece tokenizer against transformers' BertTokenizer ids (cased
-- and uncased), the keng.tokenizers front (specials, padding, pairs, truncation), a tiny random
-- Hugging Face BertModel loaded by from_pretrained against its PyTorch outputs, preset parameter
-- counts on the meta device, one classifier training step, and the error messages.
-- Fixtures: tests/fixtures/bert/, written by tests/fixtures/gen/gen_bert.py.
-- Shape letters: B batch, T tokens, C hidden, K classes.
local keng = require "keng"
local H = require "helper"
local bert = require "models.bert"
local tokenizers = require "keng.tokenizers"
local json = require "keng.json"

local FIX = "tests/fixtures/bert"
local VOCAB = FIX .. "/vocab.txt"

local sh_quote = H.sh_quote
local tmp = H.tmpdir()
local function write(name, s) return H.write(tmp .. "/" .. name, s) end
local read = H.read

local golden_tok = json.decode(read(FIX .. "/tokenizer_golden.json"))

local function list(t)  -- a JSON array (possibly empty) as a plain list
  local out = {}
  for i, v in ipairs(t) do out[i] = v end
  return out
end

describe("wordpiece tokenizer", function()
  local cased = keng.wordpiece(VOCAB, {lowercase = false})
  local uncased = keng.wordpiece(VOCAB, {lowercase = true})

  it("matches BertTokenizer ids, cased", function()
    for _, c in ipairs(golden_tok.cases) do
      assert.are.same(list(c.cased), cased:encode(c.text), c.text)
    end
  end)

  it("matches BertTokenizer ids, uncased (lowercase + strip accents)", function()
    for _, c in ipairs(golden_tok.cases) do
      assert.are.same(list(c.uncased), uncased:encode(c.text), c.text)
    end
  end)

  it("decodes as BertTokenizer does (texts without [UNK])", function()
    local n = 0
    for _, c in ipairs(golden_tok.cases) do
      local has_unk = false
      for _, id in ipairs(c.cased) do has_unk = has_unk or id == 1 end
      if not has_unk then
        assert.are.equal(c.decoded, cased:decode(list(c.cased)), c.text)
        n = n + 1
      end
    end
    assert.is_true(n >= 6)
    assert.are.equal("unaffable", cased:decode(keng.tensor({45, 46, 47}, {dtype = "i64"})))
  end)

  it("looks tokens up both ways", function()
    assert.are.equal(golden_tok.vocab_size, cased:vocab_size())
    assert.are.equal(1, cased:token_to_id("[UNK]"))
    assert.are.equal("##aff", cased:id_to_token(cased:token_to_id("##aff")))
    assert.is_nil(cased:token_to_id("nope"))
    assert.is_nil(cased:id_to_token(100))
    assert.is_nil(cased:id_to_token(-1))
  end)

  it("splits a word over 100 characters to [UNK] but not one of exactly 100", function()
    assert.are.same({1}, cased:encode(string.rep("x", 101)))
    assert.are.equal(100, #cased:encode(string.rep("x", 100)))
    local short = keng.wordpiece(VOCAB, {max_chars_per_word = 3})
    assert.are.same({1, 70, 71, 71}, short:encode("xxxx xxx"))
  end)

  it("keeps CJK together when asked not to split it", function()
    local t = keng.wordpiece(VOCAB, {tokenize_chinese_chars = false})
    assert.are.same({1}, t:encode("中文"))
    assert.are.same({63, 64}, cased:encode("中文"))
  end)

  it("raises on bad vocabularies and bad text", function()
    H.raises(function() keng.wordpiece(tmp .. "/absent.txt") end, "cannot open vocabulary")
    H.raises(function() keng.wordpiece(write("empty.txt", "")) end, "is empty")
    H.raises(function() keng.wordpiece(write("nounk.txt", "[PAD]\na\n")) end, "no unknown token '[UNK]'")
    H.raises(function() keng.wordpiece(write("utf8.txt", "[UNK]\na\xff\n")) end, "line 2 is not valid UTF-8")
    H.raises(function() keng.wordpiece(write("nul.txt", "[UNK]\na\0b\n")) end, "line 2 holds a NUL byte")
    H.raises(function() keng.wordpiece(write("blank.txt", "[UNK]\n\na\n")) end, "line 2 is empty")
    H.raises(function() cased:encode("ok \xc3\x28") end, "not valid UTF-8 at byte 4")
    H.raises(function() cased:decode({0, 100}) end, "id 100 at position 2 is outside the vocabulary [0, 100)")
    -- CRLF line endings are tolerated
    local crlf = keng.wordpiece(write("crlf.txt", "[UNK]\r\nhello\r\n"))
    assert.are.same({1}, crlf:encode("hello"))
    assert.are.same({0}, crlf:encode("hell"))
    assert.are.equal(1, crlf:token_to_id("hello"))
  end)
end)

describe("tokenizers.bert", function()
  local tok = tokenizers.bert(VOCAB, {lowercase = true})

  it("packs [CLS] text [SEP] [PAD]... with masks", function()
    local x = tok:encode_batch({"Hello world!", "the playing"}, {max_length = 8})
    assert.are.same({2, 8}, x.token_ids.shape)
    assert.are.equal("i64", x.token_ids.dtype)
    assert.are.equal("bool", x.padding_mask.dtype)
    assert.are.same({{2, 41, 43, 7, 3, 0, 0, 0}, {2, 18, 48, 49, 3, 0, 0, 0}}, x.token_ids:tolist())
    assert.are.same({{true, true, true, true, true, false, false, false},
                     {true, true, true, true, true, false, false, false}}, x.padding_mask:tolist())
    assert.are.same({{0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0}}, x.segment_ids:tolist())
    local l = tok:encode_batch({"hello", "the playing"}, {max_length = 8, padding = "longest"})
    assert.are.same({2, 5}, l.token_ids.shape)
  end)

  it("packs pairs with segment ids and trims round robin", function()
    local x = tok:encode_batch({{"hello world", "the play"}}, {max_length = 16, padding = "longest"})
    assert.are.same({{2, 41, 43, 3, 18, 48, 3}}, x.token_ids:tolist())
    assert.are.same({{0, 0, 0, 0, 1, 1, 1}}, x.segment_ids:tolist())
    -- 7 + 2 pieces into 6 - 3 specials = 3: two from the first, one from the second
    local t = tok:encode_batch({{"a a a a a a a", "the the"}}, {max_length = 6})
    assert.are.same({{2, 20, 20, 3, 18, 3}}, t.token_ids:tolist())
    H.raises(function() tok:encode_batch({"a a a a a a a"}, {max_length = 4, truncation = false}) end,
      "text 1 has 9 tokens with specials, more than max_length 4")
    local c = tok:encode_batch({"a a a a a a a"}, {max_length = 4})
    assert.are.same({{2, 20, 20, 3}}, c.token_ids:tolist())
  end)

  it("feeds the model", function()
    local m = bert.from_pretrained(FIX)
    m:eval()
    local out = m(tok:encode_batch({"hello world", "yes"}, {max_length = 6}))
    assert.are.same({2, 6, 32}, out.sequence_output.shape)
  end)
end)

describe("bert model", function()
  it("reproduces the Hugging Face BertModel outputs", function()
    local m = bert.from_pretrained(FIX)
    m:eval()
    assert.are.equal("gelu", m.config.activation)  -- config.json says hidden_act "gelu" (exact)
    local g = keng.load(FIX .. "/golden.safetensors")
    local out = m{token_ids = g.input_ids, segment_ids = g.token_type_ids, padding_mask = g.attention_mask}
    -- f32 throughout on both sides; 1e-4 relative covers summation-order differences
    H.close(out.sequence_output, g.last_hidden_state, 1e-4, "last_hidden_state")
    H.close(out.pooled_output, g.pooler_output, 1e-4, "pooler_output")
  end)

  it("masks padding: a padded row equals the same row alone", function()
    local m = bert.from_pretrained(FIX)
    m:eval()
    local ids = keng.tensor({{2, 28, 31, 32, 3, 0, 0}}, {dtype = "i64"})
    local mask = keng.tensor({{1, 1, 1, 1, 1, 0, 0}}, {dtype = "i64"})
    local padded = m{token_ids = ids, padding_mask = mask}.sequence_output:narrow(2, 1, 5)
    local alone = m{token_ids = ids:narrow(2, 1, 5)}.sequence_output
    H.close(padded, alone, 1e-5, "padded vs alone")
  end)

  it("counts bert_base_en exactly on the meta device", function()
    local b = bert.from_preset("bert_base_en", {device = "meta"})
    assert.are.equal(108310272, b:num_params())
    local c = bert.from_preset("bert_base_en", {device = "meta", num_classes = 2})
    assert.are.equal(108311810, c:num_params())
    assert.are.equal("meta", c.classifier.weight.device)
  end)

  it("counts bert_tiny as its sizes say", function()
    local b = bert.from_preset("bert_tiny", {device = "meta"})
    local C, F, V = 128, 512, 28996
    local layer = 4 * (C * C + C) + (C * F + F) + (F * C + C) + 4 * C
    assert.are.equal(V * C + 512 * C + 2 * C + 2 * C + 2 * layer + C * C + C, b:num_params())
    assert.are.equal("gelu_tanh", b.config.activation)
  end)

  it("maps Hugging Face names", function()
    assert.are.equal("layers.1.attention.query.weight", bert.hf_name("bert.encoder.layer.0.attention.self.query.weight"))
    assert.are.equal("layers.12.ffn_norm.bias", bert.hf_name("encoder.layer.11.output.LayerNorm.bias"))
    assert.are.equal("embeddings_norm.weight", bert.hf_name("bert.embeddings.LayerNorm.gamma"))
    assert.are.equal("pooler.weight", bert.hf_name("pooler.dense.weight"))
    assert.are.equal("classifier.bias", bert.hf_name("classifier.bias"))
    assert.is_nil(bert.hf_name("cls.predictions.bias"))
    assert.is_nil(bert.hf_name("embeddings.position_ids"))
  end)

  it("loads a BertForSequenceClassification-style checkpoint with its head", function()
    local sd = keng.load(FIX .. "/model.safetensors")
    local hf = {}
    for k, v in pairs(sd) do hf["bert." .. k] = v end
    hf["classifier.weight"] = keng.randn({3, 32})
    hf["classifier.bias"] = keng.zeros({3})
    assert(os.execute("mkdir -p " .. sh_quote(tmp .. "/cls")))
    keng.save(tmp .. "/cls/model.safetensors", hf)
    write("cls/config.json", read(FIX .. "/config.json"))
    local m = bert.from_pretrained(tmp .. "/cls", {num_classes = 3})
    H.close(m.classifier.weight, hf["classifier.weight"], 0, "head")
    H.close(m.backbone.pooler.weight, sd["pooler.dense.weight"], 0, "pooler")
    m:eval()
    local g = keng.load(FIX .. "/golden.safetensors")
    assert.are.same({2, 3}, m{token_ids = g.input_ids, padding_mask = g.attention_mask}.shape)
  end)

  it("trains the classifier one AdamW step with a finite loss", function()
    local train = require "keng.train"
    local optim = require "keng.optim"
    keng.manual_seed(0)
    local m = bert.from_preset("bert_tiny", {num_classes = 2})
    local B, T = 4, 16
    local ids = keng.randint(0, 28996, {B, T}, {dtype = "i64"})
    local x = {ids, keng.zeros({B, T}, {dtype = "i64"}), keng.ones({B, T}, {dtype = "bool"})}
    local y = keng.tensor({0, 1, 1, 0}, {dtype = "i64"})
    local before = m.classifier.weight:clone()
    local opt = optim.AdamW(m:parameters(), {lr = 1e-3, weight_decay = 0.004, beta1 = 0.9, beta2 = 0.999, eps = 1e-7})
    local h = train.fit(m, {x = x, y = y}, {loss = "cross_entropy", optimizer = opt, batch_size = B, epochs = 1, verbose = 0})
    local loss = h.history.loss[1]
    assert.is_true(loss == loss and loss > 0 and loss < 10, "loss " .. tostring(loss))
    assert.is_true((m.classifier.weight - before):abs():max():item() > 0)
  end)

  it("reads null config.json options as absent (the defaults)", function()
    local json = require "keng.json"
    local g = keng.load(FIX .. "/golden.safetensors")
    local function load(value)                                      -- value: json.null or nil
      local m = H.with_model_dir(FIX, function(j)
        for _, k in ipairs{"layer_norm_eps", "hidden_dropout_prob", "type_vocab_size", "hidden_act"} do
          j[k] = value
        end
      end, bert.from_pretrained)
      m:eval()
      return m.config, m{token_ids = g.input_ids, padding_mask = g.attention_mask}
    end
    local cfg_null, out_null = load(json.null)
    local cfg_absent, out_absent = load(nil)
    assert.are.same(cfg_absent, cfg_null)
    assert.are.equal(1e-12, cfg_null.eps)
    H.close(out_null.sequence_output, out_absent.sequence_output, 0, "sequence_output")
  end)

  it("raises clear errors", function()
    local e = H.raises(function() bert.from_preset("bert_huge") end, "unknown preset 'bert_huge' (valid: ")
    assert.truthy(e:find("bert_base_en", 1, true) and e:find("bert_tiny", 1, true))
    local m = bert.from_pretrained(FIX)
    H.raises(function() m{token_ids = keng.tensor({{2, 100, 3}}, {dtype = "i64"})} end,
      "token id 100 is outside the vocabulary [0, 100)")
    H.raises(function() m{token_ids = keng.tensor({{2, -1, 3}}, {dtype = "i64"})} end, "token id -1")
    H.raises(function() m{token_ids = keng.zeros({1, 65}, {dtype = "i64"})} end, "65 tokens exceed the 64 positions")
    H.raises(function() m{token_ids = keng.zeros({1, 4}, {dtype = "i64"}), padding_mask = keng.ones({1, 3})} end,
      "padding_mask [1,3] does not match token_ids [1,4]")
    -- a checkpoint with a mis-shaped and one with a missing tensor
    local sd = keng.load(FIX .. "/model.safetensors")
    local bad = {}
    for k, v in pairs(sd) do bad[k] = v end
    bad["encoder.layer.1.intermediate.dense.weight"] = keng.zeros({64, 31})
    assert(os.execute("mkdir -p " .. sh_quote(tmp .. "/bad")))
    keng.save(tmp .. "/bad/model.safetensors", bad)
    write("bad/config.json", read(FIX .. "/config.json"))
    H.raises(function() bert.from_pretrained(tmp .. "/bad") end,
      "'encoder.layer.1.intermediate.dense.weight' (our layers.2.ffn_in.weight) has shape [64,31], the model expects [64,32]")
    bad["encoder.layer.1.intermediate.dense.weight"] = nil
    keng.save(tmp .. "/bad/model.safetensors", bad)
    H.raises(function() bert.from_pretrained(tmp .. "/bad") end, "missing tensor(s) layers.2.ffn_in.weight")
    H.raises(function() bert.from_pretrained(tmp .. "/nowhere") end, "no config.json")
    H.raises(function() tokenizers.bert(tmp .. "/nounk.txt") end, "no unknown token")
  end)
end)
