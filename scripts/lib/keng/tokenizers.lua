-- keng.tokenizers — the Lua front of the C tokenizers: text in, model input tables out.
--
--   local tokenizers = require "keng.tokenizers"
--   local tok = tokenizers.bert("vocab.txt", {lowercase = false})
--   tok:encode("Hello world!")           -- {ids} 0-based, no special tokens
--   tok:decode(ids)                       -- text
--   tok:encode_batch({"a b", {"first", "second"}}, {max_length = 128})
--     -> {token_ids = i64 [B, T], segment_ids = i64 [B, T], padding_mask = bool [B, T]}
--   local tok = tokenizers.from_dir("checkpoint")       -- tokenizer.json, else the legacy files
--   local tok = tokenizers.from_file("tokenizer.json")  -- any Hugging Face tokenizers pipeline
--   tok:encode("Hello", {add_special_tokens = true}); tok:decode(ids, {skip_special_tokens = false})
--
-- BERT inputs follow keras-hub's BertPreprocessor: [CLS] a [SEP] (b [SEP]), segment 0 for the
-- first text and its specials and 1 for the second, [PAD] after, pairs trimmed round robin.
-- Shape letters: B batch, T tokens.
local keng = require "keng"

local tokenizers = {}

-- raises naming the keys of opts that are not in known (a set), listing the valid ones
local function check_opts(opts, known, who, level)
  if opts == nil then return {} end
  if type(opts) ~= "table" then error(string.format("%s: options must be a table, not a %s", who, type(opts)), level + 1) end
  for k in pairs(opts) do
    if not known[k] then
      local names = {}
      for n in pairs(known) do names[#names + 1] = n end
      table.sort(names)
      error(string.format("%s: unknown option '%s' (valid: %s)", who, tostring(k), table.concat(names, ", ")), level + 1)
    end
  end
  return opts
end


---------------------------------------------------------------------------------------------
-- BERT (WordPiece, engine/io/wordpiece.c)

local Bert = {}
Bert.__index = Bert

-- tokenizers.bert(vocab_path, {lowercase=false, strip_accents=, tokenize_chinese_chars=true,
-- max_length=512}) -> a tokenizer; the vocabulary must hold [CLS], [SEP], [PAD] and [UNK]
function tokenizers.bert(vocab_path, opts)
  opts = check_opts(opts, {lowercase = true, strip_accents = true, tokenize_chinese_chars = true, max_length = true,
    max_chars_per_word = true, split_special_tokens = true, unk_token = true}, "tokenizers.bert", 2)
  if type(vocab_path) ~= "string" then error("tokenizers.bert: vocab_path must be a string", 2) end
  local ok, wp = pcall(keng.wordpiece, vocab_path, opts)
  if not ok then error(tostring(wp), 2) end
  local self = setmetatable({wordpiece = wp, max_length = opts.max_length or 512, files = {["vocab.txt"] = vocab_path},
    lowercase = opts.lowercase == true, strip_accents = opts.strip_accents,
    tokenize_chinese_chars = opts.tokenize_chinese_chars ~= false}, Bert)
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
  opts = check_opts(opts, {max_length = true, padding = true, truncation = true}, "encode_batch", 2)
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
  return setmetatable({sp = sp, bos_id = sp.bos_id, eos_id = sp.eos_id, files = {["tokenizer.model"] = model_path},
                       pad_id = (sp.pad_id and sp.pad_id >= 0) and sp.pad_id or 0}, SentencePiece)
end

function SentencePiece:encode(text, opts)
  check_opts(opts, {add_bos = true, add_eos = true}, "encode", 2)
  return self.sp:encode(text, opts)
end
function SentencePiece:decode(ids) return self.sp:decode(ids) end
function SentencePiece:vocab_size() return self.sp:vocab_size() end
-- chat prompts in the checkpoint's format (keng.chat_template; chat_template set by from_pretrained)
function SentencePiece:apply_chat_template(messages, opts) return require("keng.chat_template").apply(self, messages, opts) end

-- encode_batch(texts, {max_length=, padding=true|"longest", truncation=true, add_bos=true,
-- add_eos=false, side="right"|"left"}) -> {token_ids = i64 [B, T], padding_mask = bool [B, T]}.
-- Truncation keeps the first tokens; left padding is what batched generation wants.
function SentencePiece:encode_batch(texts, opts)
  opts = check_opts(opts, {max_length = true, padding = true, truncation = true, add_bos = true, add_eos = true,
    side = true}, "encode_batch", 2)
  if opts.side ~= nil and opts.side ~= "left" and opts.side ~= "right" then
    error("encode_batch: side must be \"left\" or \"right\"", 2)
  end
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
  opts = check_opts(opts, {seq_len = true, add_bos = true, add_eos = true}, "pack", 2)
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

---------------------------------------------------------------------------------------------
-- tokenizer.json (engine/io/tokenizer_json*.c): any Hugging Face `tokenizers` pipeline

local Json = {}
Json.__index = Json


-- a token of tokenizer_config.json: a string or {content = ...}
local function token_name(v)
  if type(v) == "table" then v = v.content end
  return type(v) == "string" and v or nil
end

-- tokenizers.from_file(path, {bos_token=, eos_token=, pad_token=, max_length=}) -> a tokenizer
-- over a tokenizer.json. The named tokens give bos_id / eos_id / pad_id (-1 when absent; pad
-- falls back to eos, then 0) for encode's add_bos / add_eos, encode_batch and pack.
function tokenizers.from_file(path, opts)
  opts = check_opts(opts, {bos_token = true, eos_token = true, pad_token = true, max_length = true},
    "tokenizers.from_file", 2)
  if type(path) ~= "string" then error("tokenizers.from_file: path must be a string", 2) end
  local ok, raw = pcall(keng.tokenizer_json, path)
  if not ok then error(tostring(raw), 2) end
  local self = setmetatable({raw = raw, path = path, max_length = opts.max_length, model_type = raw.model_type,
    files = {["tokenizer.json"] = path},
    named = {bos = opts.bos_token, eos = opts.eos_token, pad = opts.pad_token}}, Json)   -- as given (save_pretrained)
  for _, k in ipairs{"bos", "eos", "pad"} do
    local name = opts[k .. "_token"]
    local id = name and raw:token_to_id(name)
    if name and not id then error(string.format("tokenizers.from_file: %s_token '%s' is not in %s", k, name, path), 2) end
    self[k .. "_id"] = id or -1
  end
  if self.pad_id < 0 then self.pad_id = self.eos_id >= 0 and self.eos_id or 0 end
  return self
end

-- encode(text, {add_special_tokens = true}) -> {ids} (0-based), as tokenizers' Tokenizer.encode.
-- {add_bos =, add_eos =} instead (the SentencePiece surface): the ids without the
-- post-processor, with bos_id / eos_id around them.
function Json:encode(text, opts)
  opts = check_opts(opts, {add_special_tokens = true, add_bos = true, add_eos = true}, "encode", 2)
  if type(text) ~= "string" then error(string.format("encode: text must be a string, not a %s", type(text)), 2) end
  local ok, ids = pcall(self.raw.encode, self.raw, text)
  if not ok then error(tostring(ids), 2) end
  if opts.add_bos ~= nil or opts.add_eos ~= nil then
    if opts.add_special_tokens ~= nil then error("encode: add_special_tokens and add_bos/add_eos exclude each other", 2) end
    for _, k in ipairs{"bos", "eos"} do
      if opts["add_" .. k] and self[k .. "_id"] < 0 then
        error(string.format("encode: add_%s, but %s names no %s token", k, self.path, k), 2)
      end
    end
    if opts.add_bos then table.insert(ids, 1, self.bos_id) end
    if opts.add_eos then ids[#ids + 1] = self.eos_id end
    return ids
  end
  return (self.raw:post_process(ids, nil, opts.add_special_tokens ~= false))
end

-- decode(ids, {skip_special_tokens = false}) -> string; ids: a list or a 1-D integer tensor
function Json:decode(ids, opts)
  opts = check_opts(opts, {skip_special_tokens = true}, "decode", 2)
  local ok, s = pcall(self.raw.decode, self.raw, ids, opts.skip_special_tokens == true)
  if not ok then error(tostring(s), 2) end
  return s
end

function Json:vocab_size() return self.raw:vocab_size() end
-- chat prompts in the checkpoint's format (keng.chat_template; tok.chat_template from
-- tokenizer_config.json or chat_template.jinja, set by from_pretrained). tokenize = true encodes
-- the rendered prompt whole, without the post-processor, as transformers does: the file's added
-- tokens (BOS, EOS) split it, and Metaspace's prefix goes only at its start.
function Json:apply_chat_template(messages, opts)
  local CT = require "keng.chat_template"
  if type(opts) ~= "table" or not opts.tokenize then return CT.apply(self, messages, opts) end
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.tokenize = nil
  return self:encode(CT.apply(self, messages, o), {add_special_tokens = false})
end
function Json:token_to_id(s) return self.raw:token_to_id(s) end
function Json:id_to_token(id) return self.raw:id_to_token(id) end

-- encode_batch(texts, {max_length=, padding=true|"longest", truncation=true, side="right"|"left",
-- add_special_tokens=true}) -> {token_ids = i64 [B, T], segment_ids = i64 [B, T] (the
-- post-processor's type ids), padding_mask = bool [B, T]}. Each text is a string or a pair {a, b};
-- T is max_length when given (padding="longest": the longest row, at most max_length), else the
-- longest row; a row over max_length (else the tokenizer's max_length, from model_max_length) is
-- cut (the longer segment of a pair first, as tokenizers' longest_first) leaving room for the
-- special tokens, or raises with truncation=false.
function Json:encode_batch(texts, opts)
  opts = check_opts(opts, {max_length = true, padding = true, truncation = true, side = true, add_special_tokens = true},
    "encode_batch", 2)
  if type(texts) == "string" then texts = {texts} end
  if type(texts) ~= "table" or #texts == 0 then error("encode_batch: a non-empty list of texts expected", 2) end
  if opts.side ~= nil and opts.side ~= "left" and opts.side ~= "right" then
    error("encode_batch: side must be \"left\" or \"right\"", 2)
  end
  local add = opts.add_special_tokens ~= false
  local maxlen = opts.max_length or self.max_length
  local rows, longest = {}, 0
  for b, t in ipairs(texts) do
    local parts = type(t) == "table" and t or {t}
    if #parts < 1 or #parts > 2 then error(string.format("encode_batch: text %d must be a string or a pair", b), 2) end
    local segs = {}
    for i, p in ipairs(parts) do
      if type(p) ~= "string" then error(string.format("encode_batch: text %d part %d is a %s", b, i, type(p)), 2) end
      local ok, ids = pcall(self.raw.encode, self.raw, p)
      if not ok then error(tostring(ids), 2) end
      segs[i] = ids
    end
    if maxlen then
      local budget = maxlen - (add and self.raw:num_special(#segs == 2) or 0)
      local n = #segs[1] + (segs[2] and #segs[2] or 0)
      if n > budget then
        if opts.truncation == false then
          error(string.format("encode_batch: text %d has %d tokens with specials, more than max_length %d", b,
            n + maxlen - budget, maxlen), 2)
        end
        if budget < 0 then error(string.format("encode_batch: max_length %d leaves no room for the special tokens", maxlen), 2) end
        while #segs[1] + (segs[2] and #segs[2] or 0) > budget do   -- longest first
          local s = (segs[2] and #segs[2] > #segs[1]) and segs[2] or segs[1]
          s[#s] = nil
        end
      end
    end
    local ids, types = self.raw:post_process(segs[1], segs[2], add)
    rows[b] = {ids, types}
    longest = math.max(longest, #ids)
  end
  local T = opts.max_length or longest  -- the config's model_max_length only truncates
  if opts.padding == "longest" then T = math.min(T, longest) end
  local ids, segs, mask = {}, {}, {}
  for b, r in ipairs(rows) do
    local pad = T - #r[1]
    local i_row, s_row, m_row = {}, {}, {}
    for j = 1, T do
      local k = opts.side == "left" and j - pad or j
      local real = k >= 1 and k <= #r[1]
      i_row[j], s_row[j], m_row[j] = real and r[1][k] or self.pad_id, real and r[2][k] or 0, real and 1 or 0
    end
    ids[b], segs[b], mask[b] = i_row, s_row, m_row
  end
  return {token_ids = keng.tensor(ids, {dtype = "i64"}), segment_ids = keng.tensor(segs, {dtype = "i64"}),
          padding_mask = keng.tensor(mask, {dtype = "i64"}):ne(0)}
end

-- pack(texts, {seq_len=128, add_bos=true, add_eos=true}) -> i64 [N, seq_len], as SentencePiece:pack
function Json:pack(texts, opts)
  opts = check_opts(opts, {seq_len = true, add_bos = true, add_eos = true}, "pack", 2)
  local L = opts.seq_len or 128
  local add = {add_bos = opts.add_bos ~= false and self.bos_id >= 0, add_eos = opts.add_eos ~= false and self.eos_id >= 0}
  local stream = {}
  for _, t in ipairs(texts) do
    for _, id in ipairs(self:encode(t, add)) do stream[#stream + 1] = id end
  end
  local n = #stream // L
  if n == 0 then error(string.format("pack: %d tokens do not fill one row of %d", #stream, L), 2) end
  return keng.tensor(table.move(stream, 1, n * L, 1, {}), {dtype = "i64"}):reshape{n, L}
end

Json.__call = function(self, texts, opts) return self:encode_batch(texts, opts) end
Json.__tostring = function(self) return string.format("tokenizers.Json(%s, %s)", self.path, tostring(self.raw)) end
tokenizers.Json = Json

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- the files of a Hugging Face tokenizer directory (what from_dir reads and save_pretrained
-- copies): transformers 5 writes the first two, transformers 4 and older checkpoints the others
tokenizers.FILES = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
  "chat_template.jinja", "chat_template.json", "vocab.txt", "tokenizer.model", "vocab.json", "merges.txt"}

-- dir_files(dir, who, level) -> {name = path} of the FILES present in dir. A file that is a
-- symlink resolving outside dir (or, in a Hugging Face cache snapshot, outside the repository's
-- folder) is refused, as the shards of a sharded index are (docs/security.md).
function tokenizers.dir_files(dir, who, level)
  local files = {}
  for _, name in ipairs(tokenizers.FILES) do
    local path = dir .. "/" .. name
    if exists(path) then
      local real, root = keng.path_escapes(dir, path)
      if real then
        error(string.format("%s: %s resolves to '%s', outside the model directory '%s' (a symlink leaving it is refused)",
          who, path, real, root), level + 1)
      end
      files[name] = path
    end
  end
  return files
end

-- tokenizers.from_dir(dir, opts) -> the tokenizer of a Hugging Face directory: tokenizer.json when
-- present (bos/eos/pad tokens and model_max_length from tokenizer_config.json), else vocab.txt
-- (tokenizers.bert, do_lower_case from the config), tokenizer.model (tokenizers.sentencepiece),
-- vocab.json + merges.txt (CLIP, keng.clip_tokenize). opts: max_length.
function tokenizers.from_dir(dir, opts)
  opts = check_opts(opts, {max_length = true}, "tokenizers.from_dir", 2)
  if type(dir) ~= "string" then error("tokenizers.from_dir: dir must be a string", 2) end
  local files = tokenizers.dir_files(dir, "tokenizers.from_dir", 2)
  local cfg = {}
  local read_json = require("keng.util").read_json                -- malformed: raises naming the file
  cfg = files["tokenizer_config.json"] and read_json(files["tokenizer_config.json"], "tokenizers.from_dir", 2) or cfg
  -- special_tokens_map.json (transformers 4 wrote it) names the special tokens too, and wins over
  -- tokenizer_config.json, as transformers reads the two
  local map = files["special_tokens_map.json"] and read_json(files["special_tokens_map.json"], "tokenizers.from_dir", 2)
  if map then
    for _, k in ipairs{"bos_token", "eos_token", "pad_token", "unk_token"} do
      if token_name(map[k]) then cfg[k] = map[k] end
    end
  end
  local maxlen = opts.max_length
  if not maxlen and math.type(cfg.model_max_length) == "integer" and cfg.model_max_length < 1e6 then maxlen = cfg.model_max_length end
  local ok, tok
  if files["tokenizer.json"] then
    ok, tok = pcall(tokenizers.from_file, files["tokenizer.json"], {bos_token = token_name(cfg.bos_token),
      eos_token = token_name(cfg.eos_token), pad_token = token_name(cfg.pad_token), max_length = maxlen})
  elseif files["vocab.txt"] then
    ok, tok = pcall(tokenizers.bert, files["vocab.txt"], {lowercase = cfg.do_lower_case == true, max_length = maxlen})
  elseif files["tokenizer.model"] then
    ok, tok = pcall(tokenizers.sentencepiece, files["tokenizer.model"])
  elseif files["vocab.json"] and files["merges.txt"] then
    ok, tok = pcall(require("keng.clip_tokenize").load, dir, maxlen and {max_length = maxlen} or nil)
  else
    error("tokenizers.from_dir: " .. dir .. " has no tokenizer.json, vocab.txt, tokenizer.model or vocab.json + merges.txt", 2)
  end
  if not ok then error(tostring(tok), 2) end
  tok.files = files                                               -- what save_pretrained copies
  return tok
end

-- tokenizers.find(dir, opts) -> from_dir(dir, opts), or nil when dir holds none of its files
-- (what model loaders call: a broken tokenizer file still raises)
function tokenizers.find(dir, opts)
  for _, f in ipairs{"/tokenizer.json", "/vocab.txt", "/tokenizer.model", "/vocab.json"} do
    if exists(dir .. f) then
      local ok, tok = pcall(tokenizers.from_dir, dir, opts)
      if not ok then error(tostring(tok), 2) end
      return tok
    end
  end
  return nil
end

return tokenizers
