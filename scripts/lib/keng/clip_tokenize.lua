-- keng.clip_tokenize — CLIP prompts to the fixed-length id batches the text encoder reads, on top
-- of the C tokenizer keng.clip_tokenizer (engine/io/clip_bpe.c).
--
--   local ct = require "keng.clip_tokenize"
--   local tok = ct.load("sd/tokenizer")                    -- vocab.json, merges.txt, pad from the config
--   local tok = ct.load("vocab.json", "merges.txt", {pad_id = 49407})
--   tok:encode_batch({"a cat", "a dog"})                    -- i64 [B, 77]: BOS ids EOS pad pad ...
--   ct.encode_batch(raw, texts, {max_length = 77, pad_id = raw.eos_id})   -- raw = keng.clip_tokenizer(...)
--
-- Rows are <|startoftext|> ids <|endoftext|> then pad ids, as transformers' CLIPTokenizer with
-- padding="max_length", truncation=True: a prompt over max_length - 2 ids keeps its first ones and
-- warns on stderr (the words dropped are printed, as diffusers' pipelines do). SD v1 pads with
-- <|endoftext|>; SD v2's tokenizer pads with "!" (id 0): the pad comes from the tokenizer config.
local keng = require "keng"

local M = {}


-- encode_batch(tok, texts, {max_length=77, pad_id=tok.eos_id}) -> i64 [B, max_length]
-- tok: a keng.clip_tokenizer; texts: a string or a list of strings
local function check_opts(opts, known, who)
  for k in pairs(opts or {}) do
    if not known[k] then
      local names = {}
      for n in pairs(known) do names[#names + 1] = n end
      table.sort(names)
      error(string.format("%s: unknown option '%s' (valid: %s)", who, tostring(k), table.concat(names, ", ")), 3)
    end
  end
  return opts or {}
end

function M.encode_batch(tok, texts, opts)
  opts = check_opts(opts, {max_length = true, pad_id = true}, "clip_tokenize.encode_batch")
  if type(texts) == "string" then texts = {texts} end
  if type(texts) ~= "table" or #texts == 0 then
    error("clip_tokenize: texts must be a string or a non-empty list of strings", 2)
  end
  local T = opts.max_length or 77
  if math.type(T) ~= "integer" or T < 2 then error("clip_tokenize: max_length must be an integer >= 2", 2) end
  local pad = opts.pad_id or tok.eos_id
  local rows = {}
  for b, text in ipairs(texts) do
    if type(text) ~= "string" then error(string.format("clip_tokenize: texts[%d] is a %s, not a string", b, type(text)), 2) end
    local ids = tok:encode(text)
    if #ids > T - 2 then
      local dropped = {}
      for i = T - 1, #ids do dropped[#dropped + 1] = ids[i] end
      io.stderr:write(string.format(
        "clip_tokenize: warning: prompt %d has %d tokens; CLIP reads %d, so it was truncated, dropping: %q\n",
        b, #ids, T - 2, tok:decode(dropped)))
    end
    local row = {tok.bos_id}
    for i = 1, math.min(#ids, T - 2) do row[#row + 1] = ids[i] end
    row[#row + 1] = tok.eos_id
    while #row < T do row[#row + 1] = pad end
    rows[b] = row
  end
  return keng.tensor(rows, {dtype = "i64"})
end

local Tokenizer = {}
Tokenizer.__index = Tokenizer

function Tokenizer:encode(text) return self.raw:encode(text) end
function Tokenizer:decode(ids) return self.raw:decode(ids) end
function Tokenizer:vocab_size() return self.raw:vocab_size() end
function Tokenizer:token_to_id(s) return self.raw:token_to_id(s) end
function Tokenizer:id_to_token(id) return self.raw:id_to_token(id) end
function Tokenizer:encode_batch(texts, opts)
  opts = check_opts(opts, {max_length = true, pad_id = true}, "encode_batch")
  return M.encode_batch(self.raw, texts, {max_length = opts.max_length or self.max_length,
                                          pad_id = opts.pad_id or self.pad_id})
end

-- the pad token of a tokenizer directory (special_tokens_map.json's, else tokenizer_config.json's:
-- the map wins, as transformers reads them) and tokenizer_config.json's model_max_length
-- (an absent file is skipped, a malformed one raises naming it)
local function pad_token(dir, level)
  local pad, maxlen
  for _, name in ipairs{"/special_tokens_map.json", "/tokenizer_config.json"} do
    local j = require("keng.util").read_json(dir .. name, "clip_tokenize.load", level + 1)
    if j then
      local p = j.pad_token
      if type(p) == "table" then p = p.content end
      if type(p) == "string" and not pad then pad = p end
      if type(j.model_max_length) == "number" then maxlen = j.model_max_length end
    end
  end
  return pad, maxlen
end

-- the surface of keng.clip_tokenizer over a tokenizer.json (keng.tokenizers.from_file): ids
-- without the post-processor's <|startoftext|> / <|endoftext|>, which encode_batch adds
local function json_raw(path)
  local tok = require("keng.tokenizers").from_file(path)
  local raw = {bos_id = tok:token_to_id("<|startoftext|>"), eos_id = tok:token_to_id("<|endoftext|>")}
  if not raw.bos_id or not raw.eos_id then error("clip_tokenize: " .. path .. " has no <|startoftext|> / <|endoftext|>", 0) end
  function raw.encode(_, text) return tok:encode(text, {add_special_tokens = false}) end
  function raw.decode(_, ids) return tok:decode(ids) end
  function raw.vocab_size() return tok:vocab_size() end
  function raw.token_to_id(_, s) return tok:token_to_id(s) end
  function raw.id_to_token(_, id) return tok:id_to_token(id) end
  return raw
end

-- load(dir) or load(vocab_json, merges_txt), opts {pad_id=, max_length=77} -> a tokenizer with
-- encode, decode, vocab_size, token_to_id, id_to_token, encode_batch, and fields bos_id, eos_id,
-- pad_id, max_length, raw (the keng.clip_tokenizer). A dir with a tokenizer.json (transformers 5)
-- is read through keng.tokenizers.from_file instead.
function M.load(path, merges, opts)
  if type(merges) == "table" then merges, opts = nil, merges end
  opts = check_opts(opts, {max_length = true, pad_id = true}, "clip_tokenize.load")
  local vocab, pad_name, max_len, dir = path, nil, nil, nil
  local files = {["vocab.json"] = path, ["merges.txt"] = merges}
  if not merges then
    dir = path
    files = require("keng.tokenizers").dir_files(dir, "clip_tokenize.load", 2)  -- no symlink out of dir
    vocab, merges = path .. "/vocab.json", path .. "/merges.txt"
    pad_name, max_len = pad_token(path, 2)
  end
  local ok, raw
  if files["tokenizer.json"] then   -- transformers 5 saves only tokenizer.json
    ok, raw = pcall(json_raw, files["tokenizer.json"])
  else
    ok, raw = pcall(keng.clip_tokenizer, vocab, merges)
  end
  if not ok then error(tostring(raw), 2) end
  local pad_id = opts.pad_id
  if not pad_id and pad_name then
    pad_id = raw:token_to_id(pad_name)
    if not pad_id then error("clip_tokenize: the pad token '" .. pad_name .. "' of " .. path .. " is not in the vocabulary", 2) end
  end
  if max_len and max_len > 1e6 then max_len = nil end  -- transformers' "no limit" sentinel
  return setmetatable({raw = raw, bos_id = raw.bos_id, eos_id = raw.eos_id, pad_id = pad_id or raw.eos_id,
                       max_length = opts.max_length or max_len or 77, files = files}, Tokenizer)
end

return M
