-- save_pretrained_spec.lua — save_pretrained (scripts/models/hf_save.lua) for the decoder
-- families and BERT: save -> from_pretrained gives the same logits (whole and sharded, f32 and bf16),
-- Hugging Face names and config.json keys, the shard index, stale files of the other layout
-- removed, and the refusals (LoRA adapters, meta weights, bad sizes and options).
-- Loading by transformers was checked once with tests/fixtures/gen/check_save_pretrained.py.
-- Shape letters: B batch, T tokens.
local keng = require "keng"
local H = require "helper"
local json = require "keng.json"
local lora = require "keng.lora"
local hf_save = require "models.hf_save"

local IDS = keng.tensor({{2, 5, 9, 17, 3, 40, 41}, {2, 60, 7, 8, 1, 99, 12}}, {dtype = "i64"})

local tmpdir, exists = H.tmpname, H.exists
local function read_json(path) return H.read_json(path, {null_as_nil = true}) end

describe("save_pretrained", function()
  for _, fix in ipairs({"llama", "llama/bias", "qwen2", "qwen2/bf16", "mistral", "gemma"}) do
    it(fix .. ": save -> from_pretrained gives the same logits, whole and sharded", function()
      local fam = require("models." .. fix:match("^[^/]+"))
      local lm = fam.from_pretrained("tests/fixtures/" .. fix)
      local want = lm:logits(IDS)
      local d = tmpdir()
      lm:save_pretrained(d .. "/whole")
      lm:save_pretrained(d .. "/sharded", {max_shard_size = "40KB"})
      for _, layout in ipairs({"whole", "sharded"}) do
        local back = fam.from_pretrained(d .. "/" .. layout)
        assert.are.equal(lm.model.embed_tokens.weight.dtype, back.model.embed_tokens.weight.dtype)
        assert.are.equal(0, (back:logits(IDS):float() - want:float()):abs():max():item(), layout)
      end
      -- the file holds Hugging Face names, as the fixture does
      local orig = keng.load("tests/fixtures/" .. fix .. "/model.safetensors")
      local mine = keng.load(d .. "/whole")
      for k, t in pairs(mine) do
        assert.is_not_nil(orig[k], "not a name of the original: " .. k)
        assert.are.same(orig[k].shape, t.shape)
      end
      for k in pairs(orig) do
        if not k:find("rotary") then assert.is_not_nil(mine[k], "missing " .. k) end
      end
      os.execute("rm -rf '" .. d .. "'")
    end)
  end

  it("writes config.json keys transformers reads and a shard index with every tensor", function()
    local lm = require("models.llama").from_pretrained("tests/fixtures/llama")
    local d = tmpdir()
    lm:save_pretrained(d, {max_shard_size = "40KB"})
    local c = read_json(d .. "/config.json")
    assert.are.same({"LlamaForCausalLM"}, c.architectures)
    assert.are.equal("llama", c.model_type)
    assert.are.equal("float32", c.dtype)
    assert.are.equal(2, c.num_key_value_heads)
    assert.are.equal("llama3", c.rope_parameters.rope_type)
    assert.are.equal(64, c.rope_parameters.original_max_position_embeddings)
    assert.is_false(c.tie_word_embeddings)
    local idx = read_json(d .. "/model.safetensors.index.json")
    local n, total = 0, 0
    for k, file in pairs(idx.weight_map) do
      n = n + 1
      local t = keng.load(d .. "/" .. file)[k]
      assert.is_not_nil(t, k .. " not in " .. file)
      total = total + t:numel() * 4
    end
    assert.are.equal(21, n)
    assert.are.equal(total, idx.metadata.total_size)
    assert.is_false(exists(d .. "/model.safetensors"))
    -- saving whole into the same directory removes the index (a loader would pick it)
    lm:save_pretrained(d)
    assert.is_false(exists(d .. "/model.safetensors.index.json"))
    assert.is_true(exists(d .. "/model.safetensors"))
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("a LoRA fine-tune merged into the weights saves and loads back", function()
    local llama = require "models.llama"
    local lm = llama.from_pretrained("tests/fixtures/llama")
    lora.load_adapters(lm, "tests/fixtures/peft")
    local d = tmpdir()
    H.raises(function() lm:save_pretrained(d) end, "the model has LoRA adapters (")
    lora.merge(lm)
    local want = lm:logits(IDS)
    lm:save_pretrained(d)
    assert.are.equal(0, (llama.from_pretrained(d):logits(IDS) - want):abs():max():item())
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("bert: backbone (BertModel names) and classifier (bert. + classifier.) round-trip", function()
    local bert = require "models.bert"
    local ids = keng.tensor({{2, 5, 9, 17, 3}}, {dtype = "i64"})
    local x = {token_ids = ids, segment_ids = keng.zeros({1, 5}, {dtype = "i64"}),
               padding_mask = keng.ones({1, 5}, {dtype = "bool"})}
    local m = bert.from_pretrained("tests/fixtures/bert")
    local d = tmpdir()
    m:save_pretrained(d .. "/bb")
    local orig, mine = keng.load("tests/fixtures/bert/model.safetensors"), keng.load(d .. "/bb/model.safetensors")
    for k, t in pairs(mine) do
      assert.is_not_nil(orig[k], "not a name of the original: " .. k)
      assert.are.same(orig[k].shape, t.shape)
    end
    local back = bert.from_pretrained(d .. "/bb")
    m:eval(); back:eval()
    assert.are.equal(0, (m(x).sequence_output - back(x).sequence_output):abs():max():item())
    keng.manual_seed(3)
    local c = bert.from_preset("bert_tiny", {num_classes = 3})
    c:save_pretrained(d .. "/cls", {max_shard_size = "5MB"})
    local j = read_json(d .. "/cls/config.json")
    assert.are.same({"BertForSequenceClassification"}, j.architectures)
    assert.are.equal("gelu_pytorch_tanh", j.hidden_act)
    local idx = read_json(d .. "/cls/model.safetensors.index.json")
    assert.is_not_nil(idx.weight_map["bert.encoder.layer.1.attention.self.query.weight"])
    assert.is_not_nil(idx.weight_map["classifier.weight"])
    local c2 = bert.from_pretrained(d .. "/cls")
    c:eval(); c2:eval()
    assert.are.equal(3, c2.num_classes)
    assert.are.equal(0, (c(x) - c2(x)):abs():max():item())
    H.raises(function() c:save_pretrained(d, {shard = 1}) end, "bert:save_pretrained: unknown option 'shard'")
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("unet / vae: diffusers names and config back, whole and sharded, weights equal", function()
    for _, e in ipairs({{"unet", "UNet2DConditionModel"}, {"vae", "AutoencoderKL"}}) do
      local mod = require("models." .. e[1])
      local m = mod.from_pretrained("tests/fixtures/sd/" .. e[1])
      local d = tmpdir()
      m:save_pretrained(d .. "/whole")
      m:save_pretrained(d .. "/sharded", {max_shard_size = "100KB"})
      assert.is_true(exists(d .. "/whole/diffusion_pytorch_model.safetensors"))
      assert.is_true(exists(d .. "/sharded/diffusion_pytorch_model.safetensors.index.json"))
      assert.is_true(exists(d .. "/sharded/diffusion_pytorch_model-00001-of-00003.safetensors")
        or exists(d .. "/sharded/diffusion_pytorch_model-00001-of-00007.safetensors"))
      assert.are.equal(e[2], read_json(d .. "/whole/config.json")._class_name)
      local want = m:state_dict()
      for _, layout in ipairs({"whole", "sharded"}) do
        local got = mod.from_pretrained(d .. "/" .. layout):state_dict()
        for k, t in pairs(want) do assert.are.equal(0, (got[k] - t):abs():max():item(), k) end
      end
      H.raises(function() m:save_pretrained(d, {shards = 2}) end, e[2] .. ":save_pretrained: unknown option 'shards'")
      os.execute("rm -rf '" .. d .. "'")
    end
  end)

  it("refuses bad sizes, unknown options, meta weights and a model without a family", function()
    local llama = require "models.llama"
    local lm = llama.from_pretrained("tests/fixtures/llama")
    H.raises(function() lm:save_pretrained(tmpdir(), {max_shard_size = "5 parsecs"}) end,
      'save_pretrained: max_shard_size must be a positive byte count or a string such as "5GB"')
    H.raises(function() lm:save_pretrained(tmpdir(), {max_shard = "5GB"}) end, "unknown option 'max_shard'")
    H.raises(function() lm:save_pretrained(nil) end, "save_pretrained: dir must be a string, got nil")
    H.raises(function() llama.from_preset("llama3_2_1b", {device = "meta"}):save_pretrained(tmpdir()) end,
      "is on the meta device (no values to save)")
    local bare = require("models.causal_lm").CausalLM(lm.cfg)
    H.raises(function() bare:save_pretrained(tmpdir()) end, "the model has no Hugging Face family")
    assert.are.equal(5000000000, hf_save.parse_size("5GB", "t", 1))
    assert.are.equal(500 * 2 ^ 20, hf_save.parse_size("500MiB", "t", 1))
  end)
end)
