-- tokenizers_spec.lua — keng.tokenizers' SentencePiece front: batches with padding, truncation
-- and packing, checked against the C tokenizer's own ids
local keng = require "keng"
local tokenizers = require "keng.tokenizers"
local H = require "helper"

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local MODEL = here .. "/../fixtures/sentencepiece/bpe.model"

describe("tokenizers.sentencepiece", function()
  local tok = tokenizers.sentencepiece(MODEL)
  local sp = keng.sentencepiece(MODEL)
  local texts = {"Hello world", "I you get take it of for from can not do use would yes", "x"}

  it("pads right by default and left on request, with BOS first", function()
    local b = tok:encode_batch(texts)
    local lens = {}
    for i, t in ipairs(texts) do lens[i] = #sp:encode(t, {add_bos = true}) end
    local T = math.max(table.unpack(lens))
    assert.are.same({3, T}, b.token_ids.shape)
    for i, t in ipairs(texts) do
      local want = sp:encode(t, {add_bos = true})
      assert.are.equal(sp.bos_id, want[1])
      H.close(b.token_ids[i]:narrow(1, 1, #want), want, 0, "row " .. i)
      assert.are.equal(#want, b.padding_mask[i]:long():sum():item())
    end
    local l = tok:encode_batch(texts, {side = "left"})
    for i, t in ipairs(texts) do
      local want = sp:encode(t, {add_bos = true})
      H.close(l.token_ids[i]:narrow(1, T - #want + 1, #want), want, 0, "left row " .. i)
      assert.is_false(l.padding_mask[i][1]:item() and #want < T)
    end
  end)

  it("truncates to max_length or raises when truncation is off", function()
    local b = tok:encode_batch(texts, {max_length = 4, padding = true})
    assert.are.same({3, 4}, b.token_ids.shape)
    H.close(b.token_ids[2], table.move(sp:encode(texts[2], {add_bos = true}), 1, 4, 1, {}), 0)
    H.raises(function() tok:encode_batch(texts, {max_length = 4, truncation = false}) end, "more than max_length 4")
  end)

  it("packs BOS text EOS streams into full rows", function()
    local stream = {}
    for _, t in ipairs(texts) do
      for _, id in ipairs(sp:encode(t, {add_bos = true, add_eos = true})) do stream[#stream + 1] = id end
    end
    local p = tok:pack(texts, {seq_len = 5})
    local n = #stream // 5
    assert.are.same({n, 5}, p.shape)
    H.close(p:reshape{-1}, table.move(stream, 1, n * 5, 1, {}), 0)
    H.raises(function() tok:pack({"x"}, {seq_len = 1000}) end, "do not fill one row of 1000")
  end)
end)
