-- keng.tokenizers — the Lua front of the C tokenizers: text in, model input tables out.
--
--   local tokenizers = require "keng.tokenizers"
--   local tok = tokenizers.bert("vocab.txt", {lowercase = false})
--   tok:encode("Hello world!")           -- {ids} 0-based, no special tokens
--   tok:decode(ids)                       -- text
--   tok:encode_batch({"a b", {"first", "second"}}, {max_length = 128})
--     -> {token_ids = i64 [B, T], segment_ids = i64 [B, T], padding_mask = bool [B, T]}
--
-- BERT inputs follow keras-hub's BertPreprocessor: [CLS] a [SEP] (b [SEP]), segment 0 for the
-- first text and its specials and 1 for the second, [PAD] after, pairs trimmed round robin.
-- Shape letters: B batch, T tokens.
local keng = require "keng"

local tokenizers = {}

---------------------------------------------------------------------------------------------
-- BERT (WordPiece, engine/io/wordpiece.c)

local Bert = {}
Bert.__index = Bert

-- tokenizers.bert(vocab_path, {lowercase=false, strip_accents=, tokenize_chinese_chars=true,
-- max_length=512}) -> a tokenizer; the vocabulary must hold [CLS], [SEP], [PAD] and [UNK]
function tokenizers.bert(vocab_path, opts)
  opts = opts or {}
  if type(vocab_path) ~= "string" then error("tokenizers.bert: vocab_path must be a string", 2) end
  local ok, wp = pcall(keng.wordpiece, vocab_path, opts)
  if not ok then error(tostring(wp), 2) end
  local self = setmetatable({wordpiece = wp, max_length = opts.max_length or 512}, Bert)
  for _, s in ipairs{"[CLS]", "[SEP]", "[PAD]"} do
    if not wp:token_to_id(s) then error(string.format("tokenizers.bert: %s has no %s token", vocab_path, s), 2) end
  end
  self.cls_id, self.sep_id, self.pad_id = wp:token_to_id("[CLS]"), wp:token_to_id("[SEP]"), wp:token_to_id("[PAD]")
  self.unk_id, self.mask_id = wp:token_to_id("[UNK]"), wp:token_to_id("[MASK]")
  return self
end

function Bert:encode(text) return self.wordpiece:encode(text) end
function Bert:decode(ids) return self.wordpiece:decode(ids) end
function Bert:vocab_size() return self.wordpiece:vocab_size() end
function Bert:token_to_id(s) return self.wordpiece:token_to_id(s) end
function Bert:id_to_token(id) return self.wordpiece:id_to_token(id) end

-- keeps at most budget ids over the segments, handing them out one per segment in turn
local function round_robin(segs, budget)
  local keep = {}
  for i = 1, #segs do keep[i] = 0 end
  local progress = true
  while budget > 0 and progress do
    progress = false
    for i, s in ipairs(segs) do
      if budget > 0 and keep[i] < #s then keep[i], budget, progress = keep[i] + 1, budget - 1, true end
    end
  end
  local out = {}
  for i, s in ipairs(segs) do out[i] = table.move(s, 1, keep[i], 1, {}) end
  return out
end

-- encode_batch(texts, {max_length=, padding=true|"longest", truncation=true}) -> inputs table.
-- Each element of texts is a string or a pair {a, b}. padding=true pads every row to max_length
-- (as keras-hub does), "longest" to the longest row.
function Bert:encode_batch(texts, opts)
  opts = opts or {}
  if type(texts) == "string" then texts = {texts} end
  if type(texts) ~= "table" or #texts == 0 then error("encode_batch: a non-empty list of texts expected", 2) end
  local T = opts.max_length or self.max_length
  local truncation = opts.truncation ~= false
  local rows, longest = {}, 0
  for b, t in ipairs(texts) do
    local parts = type(t) == "table" and t or {t}
    local segs = {}
    for i, p in ipairs(parts) do
      if type(p) ~= "string" then error(string.format("encode_batch: text %d part %d is a %s", b, i, type(p)), 2) end
      segs[i] = self.wordpiece:encode(p)
    end
    local n = 0
    for _, s in ipairs(segs) do n = n + #s end
    local budget = T - 1 - #segs  -- [CLS] and one [SEP] per segment
    if budget < 0 then error(string.format("encode_batch: max_length %d leaves no room for the special tokens", T), 2) end
    if n > budget then
      if not truncation then
        error(string.format("encode_batch: text %d has %d tokens with specials, more than max_length %d",
          b, n + 1 + #segs, T), 2)
      end
      segs = round_robin(segs, budget)
    end
    local ids, types = {self.cls_id}, {0}
    for i, s in ipairs(segs) do
      for _, id in ipairs(s) do ids[#ids + 1], types[#types + 1] = id, i - 1 end
      ids[#ids + 1], types[#types + 1] = self.sep_id, i - 1
    end
    types[1] = 0
    rows[b] = {ids, types}
    longest = math.max(longest, #ids)
  end
  local width = opts.padding == "longest" and longest or T
  local ids, segs, mask = {}, {}, {}
  for b, r in ipairs(rows) do
    local i_row, s_row, m_row = {}, {}, {}
    for j = 1, width do
      local real = j <= #r[1]
      i_row[j], s_row[j], m_row[j] = real and r[1][j] or self.pad_id, real and r[2][j] or 0, real and 1 or 0
    end
    ids[b], segs[b], mask[b] = i_row, s_row, m_row
  end
  return {token_ids = keng.tensor(ids, {dtype = "i64"}), segment_ids = keng.tensor(segs, {dtype = "i64"}),
          padding_mask = keng.tensor(mask, {dtype = "i64"}):ne(0)}
end

Bert.__call = function(self, texts, opts) return self:encode_batch(texts, opts) end

tokenizers.Bert = Bert

---------------------------------------------------------------------------------------------
-- SentencePiece (engine/io/sentencepiece.c): Gemma, Mistral

local SentencePiece = {}
SentencePiece.__index = SentencePiece

-- tokenizers.sentencepiece(model_path) -> a tokenizer over a tokenizer.model file
function tokenizers.sentencepiece(model_path)
  if type(model_path) ~= "string" then error("tokenizers.sentencepiece: model_path must be a string", 2) end
  local ok, sp = pcall(keng.sentencepiece, model_path)
  if not ok then error(tostring(sp), 2) end
  return setmetatable({sp = sp, bos_id = sp.bos_id, eos_id = sp.eos_id,
                       pad_id = (sp.pad_id and sp.pad_id >= 0) and sp.pad_id or 0}, SentencePiece)
end

function SentencePiece:encode(text, opts) return self.sp:encode(text, opts) end
function SentencePiece:decode(ids) return self.sp:decode(ids) end
function SentencePiece:vocab_size() return self.sp:vocab_size() end
-- chat prompts in the checkpoint's format (keng.chat_template; chat_template set by from_pretrained)
function SentencePiece:apply_chat_template(messages, opts) return require("keng.chat_template").apply(self, messages, opts) end

-- encode_batch(texts, {max_length=, padding=true|"longest", truncation=true, add_bos=true,
-- add_eos=false, side="right"|"left"}) -> {token_ids = i64 [B, T], padding_mask = bool [B, T]}.
-- Truncation keeps the first tokens; left padding is what batched generation wants.
function SentencePiece:encode_batch(texts, opts)
  opts = opts or {}
  if type(texts) == "string" then texts = {texts} end
  if type(texts) ~= "table" or #texts == 0 then error("encode_batch: a non-empty list of texts expected", 2) end
  local add = {add_bos = opts.add_bos ~= false, add_eos = opts.add_eos == true}
  local rows, longest = {}, 0
  for b, t in ipairs(texts) do
    if type(t) ~= "string" then error(string.format("encode_batch: text %d is a %s", b, type(t)), 2) end
    rows[b] = self.sp:encode(t, add)
    longest = math.max(longest, #rows[b])
  end
  local T = opts.max_length or longest
  if opts.padding == "longest" then T = math.min(T, longest) end
  local ids, mask = {}, {}
  for b, r in ipairs(rows) do
    if #r > T then
      if opts.truncation == false then
        error(string.format("encode_batch: text %d has %d tokens, more than max_length %d", b, #r, T), 2)
      end
      r = table.move(r, 1, T, 1, {})
    end
    local pad = T - #r
    local i_row, m_row = {}, {}
    for j = 1, T do
      local k = opts.side == "left" and j - pad or j
      local real = k >= 1 and k <= #r
      i_row[j], m_row[j] = real and r[k] or self.pad_id, real and 1 or 0
    end
    ids[b], mask[b] = i_row, m_row
  end
  return {token_ids = keng.tensor(ids, {dtype = "i64"}), padding_mask = keng.tensor(mask, {dtype = "i64"}):ne(0)}
end

-- pack(texts, {seq_len=128, add_bos=true, add_eos=true}) -> i64 [N, seq_len]: the texts' ids,
-- each wrapped in BOS/EOS, laid end to end and cut into rows (the last partial row is dropped),
-- as packed causal-LM training data is made
function SentencePiece:pack(texts, opts)
  opts = opts or {}
  local L = opts.seq_len or 128
  local stream = {}
  for _, t in ipairs(texts) do
    for _, id in ipairs(self.sp:encode(t, {add_bos = opts.add_bos ~= false, add_eos = opts.add_eos ~= false})) do
      stream[#stream + 1] = id
    end
  end
  local n = #stream // L
  if n == 0 then error(string.format("pack: %d tokens do not fill one row of %d", #stream, L), 2) end
  return keng.tensor(table.move(stream, 1, n * L, 1, {}), {dtype = "i64"}):reshape{n, L}
end

SentencePiece.__call = function(self, texts, opts) return self:encode_batch(texts, opts) end
tokenizers.SentencePiece = SentencePiece

return tokenizers
