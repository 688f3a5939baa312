-- tf5_dirs_spec.lua — every family's from_pretrained finds the tokenizer of a directory saved by
-- transformers 5, which writes only tokenizer.json + tokenizer_config.json, and its ids are
-- transformers' (AutoTokenizer on the same directory). The weights are the families' fixtures;
-- the tokenizer directories are tests/fixtures/tf5/* (gen_tf5_dirs.py) and
-- tests/fixtures/tokenizer_json/tf5_* (gen_tokenizer_json.py).
local keng = require "keng"
local json = require "keng.json"

local FIX = "tests/fixtures/"

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local function read(p)
  local f = assert(io.open(p, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

-- dir(files) -> a fresh directory holding copies of files ({dest name = source path}, dest may
-- name a subdirectory); removed by cleanup()
local made = {}
local function dir(files)
  local d = os.tmpname()
  os.remove(d)
  made[#made + 1] = d
  for dest, src in pairs(files) do
    local sub = dest:match("^(.*)/[^/]+$")
    assert(os.execute("mkdir -p " .. q(d .. (sub and "/" .. sub or "")) .. " && cp " .. q(src) .. " " .. q(d .. "/" .. dest)))
  end
  return d
end
local function cleanup()
  for _, d in ipairs(made) do os.execute("rm -rf " .. q(d)) end
  made = {}
end

local function golden(path) return json.decode(read(path .. "/golden.json")) end
local function list(t) local o = {} for i, v in ipairs(t) do o[i] = v end return o end

-- only-tokenizer-json files of tokenizer directory tdir, plus the model files of mdir
local function tf5_model_dir(mdir, tdir, weights)
  return dir({["config.json"] = mdir .. "/config.json", [weights or "model.safetensors"] = mdir .. "/" .. (weights or "model.safetensors"),
              ["tokenizer.json"] = tdir .. "/tokenizer.json", ["tokenizer_config.json"] = tdir .. "/tokenizer_config.json"})
end

local function same_ids(tok, g)
  for i, t in ipairs(g.texts) do assert.are.same(list(g.ids[i]), tok:encode(t), t) end
end

describe("transformers-5 tokenizer directories", function()
  after_each(cleanup)

  it("bert: from_pretrained takes tokenizer.json; ids and padded pairs as transformers", function()
    local bert = require "models.bert"
    local T = FIX .. "tf5/bert"
    local g = golden(T)
    local m = bert.from_pretrained(tf5_model_dir(FIX .. "bert", T))
    assert.are.equal(getmetatable(require("keng.tokenizers").from_file(T .. "/tokenizer.json")), getmetatable(m.tokenizer))
    same_ids(m.tokenizer, g)
    local pairs_ = {}
    for i = 1, 4 do pairs_[i] = {g.texts[i], g.texts[i + 4]} end
    local b = m.tokenizer:encode_batch(pairs_, {max_length = 16})
    assert.are.same(g.padded.input_ids, b.token_ids:tolist())
    assert.are.same(g.padded.token_type_ids, b.segment_ids:tolist())
    assert.are.same(g.padded.attention_mask, b.padding_mask:long():tolist())
    local out = m(b)                                                -- the ids fit the model
    assert.are.same({4, 16, 32}, out.sequence_output.shape)
  end)

  it("bert: tokenizer.json wins over vocab.txt; vocab.txt alone gives the WordPiece tokenizer", function()
    local bert = require "models.bert"
    local tokenizers = require "keng.tokenizers"
    local both = tf5_model_dir(FIX .. "bert", FIX .. "tf5/bert")
    assert(os.execute("cp " .. q(FIX .. "bert/vocab.txt") .. " " .. q(both .. "/vocab.txt")))
    assert.are.equal(tokenizers.Json, getmetatable(bert.from_pretrained(both).tokenizer))
    assert.are.equal(tokenizers.Bert, getmetatable(bert.from_pretrained(FIX .. "bert").tokenizer))
    local none = dir({["config.json"] = FIX .. "bert/config.json", ["model.safetensors"] = FIX .. "bert/model.safetensors"})
    assert.is_nil(bert.from_pretrained(none).tokenizer)
  end)

  for _, case in ipairs{{"mistral", FIX .. "tf5/mistral"}, {"gemma", FIX .. "tokenizer_json/tf5_gemma"},
                        {"llama", FIX .. "tokenizer_json/tf5_llama"}, {"qwen2", FIX .. "tokenizer_json/tf5_qwen2"}} do
    local family, T = case[1], case[2]
    it(family .. ": from_pretrained takes tokenizer.json; ids, bos/eos/pad as transformers", function()
      local g = golden(T)
      local lm = require("models." .. family).from_pretrained(tf5_model_dir(FIX .. family, T))
      assert.is_truthy(lm.tokenizer, family .. " loaded no tokenizer")
      same_ids(lm.tokenizer, g)
      for _, k in ipairs{"bos", "eos", "pad"} do
        if g.special[k] ~= nil and g.special[k] ~= json.null then assert.are.equal(g.special[k], lm.tokenizer[k .. "_id"], k) end
      end
    end)
  end

  it("mistral: the chat template transformers 5 saves as chat_template.jinja is the tokenizer's", function()
    local T = FIX .. "tf5/mistral_chat"
    local g = golden(T)
    local d = tf5_model_dir(FIX .. "mistral", T)
    assert(os.execute("cp " .. T .. "/chat_template.jinja " .. d .. "/"))
    local lm = require("models.mistral").from_pretrained(d)
    local msgs = {}
    for i, m in ipairs(g.chat.messages) do msgs[i] = {role = m.role, content = m.content} end
    assert.are.equal(g.chat.text, lm.tokenizer:apply_chat_template(msgs))
    assert.are.same(list(g.chat.ids), lm.tokenizer:apply_chat_template(msgs, {tokenize = true}))
  end)

  it("special_tokens_map.json names special tokens and wins over tokenizer_config.json, as in transformers", function()
    local T = FIX .. "tf5/special_map"
    local tok = require("keng.tokenizers").from_dir(T)
    local g = golden(T)
    assert.are.same({g.special.bos, g.special.eos, g.special.pad}, {tok.bos_id, tok.eos_id, tok.pad_id})
  end)

  it("stable diffusion: a tokenizer/ with only tokenizer.json pads prompts as CLIPTokenizer", function()
    local sd = require "models.stable_diffusion"
    local T = FIX .. "tf5/clip"
    local g = golden(T)
    local d = dir({["unet/config.json"] = FIX .. "sd/unet/config.json",
      ["unet/diffusion_pytorch_model.safetensors"] = FIX .. "sd/unet/diffusion_pytorch_model.safetensors",
      ["vae/config.json"] = FIX .. "sd/vae/config.json",
      ["vae/diffusion_pytorch_model.safetensors"] = FIX .. "sd/vae/diffusion_pytorch_model.safetensors",
      ["text_encoder/config.json"] = FIX .. "clip/text_encoder/config.json",
      ["text_encoder/model.safetensors"] = FIX .. "clip/text_encoder/model.safetensors",
      ["tokenizer/tokenizer.json"] = T .. "/tokenizer.json", ["tokenizer/tokenizer_config.json"] = T .. "/tokenizer_config.json"})
    local pipe = sd.from_pretrained(d)
    local prompts = {}
    for i = 1, #g.padded do prompts[i] = g.texts[i] end
    local ids
    local old = io.stderr
    io.stderr = {write = function() end}                            -- the long prompt's truncation warning
    local ok, err = pcall(function() ids = pipe.tokenizer:encode_batch(prompts) end)
    io.stderr = old
    assert(ok, err)
    assert.are.same(g.padded, ids:tolist())
    assert.are.equal(g.special.pad, pipe.tokenizer.pad_id)
  end)
end)
