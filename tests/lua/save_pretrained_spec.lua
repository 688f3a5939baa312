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

-- what the reference libraries write (tests/fixtures/gen/gen_save_lists.py): file names (shards
-- as <base>-NNNNN-of-NNNNN), tensor names per folder, config keys
local LISTS = read_json("tests/fixtures/save_lists.json")
-- keys keng leaves out: the libraries' version stamps and bookkeeping; the rest of what keng
-- leaves out must be null in the reference (the libraries read an absent key as its null default)
local BOOKKEEPING = {transformers_version = true, _diffusers_version = true, _name_or_path = true, is_local = true,
  local_files_only = true}

local function walk(dir)                                            -- relative paths of dir's files
  local out = {}
  local p = io.popen("cd '" .. dir .. "' && find . -type f | sort")
  for line in p:lines() do out[#out + 1] = line:gsub("^%./", "") end
  p:close()
  return out
end

-- same_layout(dir, case): dir's files, tensor names and config keys are those of LISTS[case]
local function same_layout(dir, case)
  local ref = LISTS[case]
  local files, tensors = {}, {}
  for _, rel in ipairs(walk(dir)) do
    local name = rel:gsub("%-%d%d%d%d%d%-of%-%d%d%d%d%d%.safetensors$", "-NNNNN-of-NNNNN.safetensors")
    files[name] = true
    local sub = rel:match("^(.*)/[^/]+$") or "."
    if rel:find("%.safetensors$") then
      for k in pairs(keng.load(dir .. "/" .. rel)) do
        tensors[sub] = tensors[sub] or {}
        table.insert(tensors[sub], k)
      end
    elseif rel:find("%.json$") then
      local keys, j = {}, read_json(dir .. "/" .. rel)
      for k in pairs(j) do
        keys[k] = true
        assert.is_truthy(#ref.json_keys[rel] > 0 and table.concat(ref.json_keys[rel], " "):find(k, 1, true),
          case .. ": " .. rel .. " has a key the reference does not write: " .. k)
      end
      local nulls = {}
      for _, k in ipairs(ref.json_nulls[rel]) do nulls[k] = true end
      for _, k in ipairs(ref.json_keys[rel]) do
        assert.is_true(keys[k] or nulls[k] or BOOKKEEPING[k] or false, case .. ": " .. rel .. " lacks " .. k)
      end
    end
  end
  local list = {}
  for f in pairs(files) do list[#list + 1] = f end
  table.sort(list)
  assert.are.same(ref.files, list, case .. ": files")
  for sub, names in pairs(tensors) do table.sort(names) end
  assert.are.same(ref.tensors, tensors, case .. ": tensor names")
end

local function same_state(a, b, what)
  local sa, sb = a:state_dict(), b:state_dict()
  local n = 0
  for k, t in pairs(sa) do
    assert.is_not_nil(sb[k], what .. ": " .. k .. " missing after the round trip")
    assert.are.equal(t.dtype, sb[k].dtype, k)
    assert.are.equal(0, (t:double() - sb[k]:double()):abs():max():item(), what .. ": " .. k)
    n = n + 1
  end
  for k in pairs(sb) do assert.is_not_nil(sa[k], what .. ": extra " .. k) end
  return n
end

local cp_dir = H.copy_files

local FIX = "tests/fixtures/"
local function sd_source(d)                                          -- the SD fixture with a transformers-5 tokenizer/
  return cp_dir({["unet/config.json"] = FIX .. "sd/unet/config.json",
    ["unet/diffusion_pytorch_model.safetensors"] = FIX .. "sd/unet/diffusion_pytorch_model.safetensors",
    ["vae/config.json"] = FIX .. "sd/vae/config.json",
    ["vae/diffusion_pytorch_model.safetensors"] = FIX .. "sd/vae/diffusion_pytorch_model.safetensors",
    ["scheduler/scheduler_config.json"] = FIX .. "sd/scheduler/scheduler_config.json",
    ["text_encoder/config.json"] = FIX .. "clip/text_encoder/config.json",
    ["text_encoder/model.safetensors"] = FIX .. "clip/text_encoder/model.safetensors",
    ["tokenizer/tokenizer.json"] = FIX .. "tf5/clip/tokenizer.json",
    ["tokenizer/tokenizer_config.json"] = FIX .. "tf5/clip/tokenizer_config.json"}, d)
end

describe("save_pretrained of CLIP, SAM and a Stable Diffusion pipeline", function()
  it("clip: transformers' file and tensor names and config keys, whole and sharded; exact round trip", function()
    local clip = require "models.clip"
    local m = clip.from_pretrained(FIX .. "clip/text_encoder")
    local d = tmpdir()
    m:save_pretrained(d .. "/whole")
    m:save_pretrained(d .. "/sharded", {max_shard_size = "50KB"})
    same_layout(d .. "/whole", "clip")
    same_layout(d .. "/sharded", "clip_sharded")
    local ids = keng.tensor({{766, 5, 9, 300, 767}}, {dtype = "i64"})
    for _, layout in ipairs{"whole", "sharded"} do
      local back = clip.from_pretrained(d .. "/" .. layout)
      assert.is_true(same_state(m, back, layout) > 30)
      assert.are.equal(0, (back(ids) - m(ids)):abs():max():item())
    end
    assert.are.same({767, 766, 767}, {read_json(d .. "/whole/config.json").eos_token_id,
      read_json(d .. "/whole/config.json").bos_token_id, read_json(d .. "/whole/config.json").pad_token_id})
    -- a preset (no config.json to start from) writes CLIPTextConfig's token ids and loads back
    keng.manual_seed(1)
    local p = clip.from_preset("sd_tiny_text")
    p:save_pretrained(d .. "/preset")
    local j = read_json(d .. "/preset/config.json")
    assert.are.same({49406, 49407, 1}, {j.bos_token_id, j.eos_token_id, j.pad_token_id})
    same_state(p, clip.from_pretrained(d .. "/preset"), "preset")
    H.raises(function() m:save_pretrained(d, {shard = 1}) end, "CLIPTextModel:save_pretrained: unknown option 'shard'")
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("sam: transformers' names (the tied Gaussian as shared_image_embedding), whole and sharded; exact round trip", function()
    local sam = require "models.sam"
    local m = sam.from_pretrained(FIX .. "sam")
    local d = tmpdir()
    m:save_pretrained(d .. "/whole")
    m:save_pretrained(d .. "/sharded", {max_shard_size = "100KB"})
    same_layout(d .. "/whole", "sam")
    same_layout(d .. "/sharded", "sam_sharded")
    for _, layout in ipairs{"whole", "sharded"} do
      assert.is_true(same_state(m, sam.from_pretrained(d .. "/" .. layout), layout) > 100)
    end
    keng.manual_seed(2)
    local p = sam.from_preset("sam_tiny")
    p:save_pretrained(d .. "/preset")                               -- config.json built from the preset's config
    assert.are.same({"SamModel"}, read_json(d .. "/preset/config.json").architectures)
    local back = sam.from_pretrained(d .. "/preset")
    same_state(p, back, "preset")
    local want = {}
    for k, v in pairs(p.cfg) do want[k] = v end
    for _, k in ipairs{"qkv_bias", "abs_pos", "rel_pos"} do if want[k] == nil then want[k] = true end end  -- nil: on
    assert.are.same(want, back.cfg)
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("stable diffusion: diffusers' layout (model_index.json, 5 folders), whole and sharded; exact round trip", function()
    local sd = require "models.stable_diffusion"
    local d = tmpdir()
    local pipe = sd.from_pretrained(sd_source(d .. "/src"))
    pipe:save_pretrained(d .. "/whole")
    pipe:save_pretrained(d .. "/sharded", {max_shard_size = "100KB"})
    same_layout(d .. "/whole", "sd")
    same_layout(d .. "/sharded", "sd_sharded")
    local index = read_json(d .. "/whole/model_index.json")
    local want = {}
    for k, v in pairs(LISTS.model_index) do if not BOOKKEEPING[k] then want[k] = v end end
    assert.are.same(want, index)
    local src_sched = read_json(d .. "/src/scheduler/scheduler_config.json")
    for _, layout in ipairs{"whole", "sharded"} do
      local back = sd.from_pretrained(d .. "/" .. layout)
      for _, part in ipairs{"unet", "vae", "text_encoder"} do same_state(pipe[part], back[part], layout .. " " .. part) end
      local P = {"a photograph of an astronaut riding a horse", "hello"}
      assert.are.same(pipe.tokenizer:encode_batch(P):tolist(), back.tokenizer:encode_batch(P):tolist())
      assert.are.equal(0, (back:encode_prompt(P) - pipe:encode_prompt(P)):abs():max():item())
      assert.are.same(pipe.scheduler.config, back.scheduler.config)
      local sched = read_json(d .. "/" .. layout .. "/scheduler/scheduler_config.json")
      for k, v in pairs(src_sched) do if not BOOKKEEPING[k] then assert.are.same(v, sched[k], k) end end
    end
    -- the tokenizer files are the ones it was loaded from, byte for byte
    for _, f in ipairs{"tokenizer.json", "tokenizer_config.json"} do
      local a, b = io.open(d .. "/src/tokenizer/" .. f, "rb"), io.open(d .. "/whole/tokenizer/" .. f, "rb")
      assert.are.equal(a:read("a"), b:read("a"), f)
      a:close() b:close()
    end
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("stable diffusion: another scheduler class and a vocab.json + merges.txt tokenizer", function()
    local sd = require "models.stable_diffusion"
    local S = require "models.schedulers"
    local d = tmpdir()
    local pipe = sd.from_pretrained(sd_source(d .. "/src"))
    -- DPM-Solver++ 2M Karras: its class, use_karras_sigmas, and lambda_min_clipped = -inf written
    -- as diffusers writes it (-Infinity; JSON has no infinities, Python's json module reads it)
    pipe.scheduler = S.new("dpmpp_2m_karras")
    pipe:save_pretrained(d .. "/dpm")
    local f = assert(io.open(d .. "/dpm/scheduler/scheduler_config.json", "rb"))
    local text = f:read("a")
    f:close()
    assert.is_truthy(text:find('"_class_name": "DPMSolverMultistepScheduler"', 1, true))
    assert.is_truthy(text:find('"use_karras_sigmas": true', 1, true))
    assert.is_truthy(text:find('"lambda_min_clipped": -Infinity', 1, true))
    assert.are.same({"diffusers", "DPMSolverMultistepScheduler"}, read_json(d .. "/dpm/model_index.json").scheduler)
    if pcall(json.decode, "[-Infinity]") then                       -- keng's reader takes it (the C reader does)
      assert.are.equal("dpmpp_2m_karras", sd.from_pretrained(d .. "/dpm").scheduler.name)
    end
    pipe.scheduler = S.new("euler")
    rawset(pipe, "tokenizer", require("models.clip").tokenizer(FIX .. "clip/tokenizer"))
    pipe:save_pretrained(d .. "/out")
    assert.are.equal("EulerDiscreteScheduler", read_json(d .. "/out/scheduler/scheduler_config.json")._class_name)
    assert.is_true(exists(d .. "/out/tokenizer/vocab.json") and exists(d .. "/out/tokenizer/merges.txt"))
    assert.is_false(exists(d .. "/out/tokenizer/tokenizer.json"))
    local tc = read_json(d .. "/out/tokenizer/tokenizer_config.json")   -- written as transformers would
    assert.are.same({"CLIPTokenizer", "<|startoftext|>", "<|endoftext|>", "<|endoftext|>", 77},
      {tc.tokenizer_class, tc.bos_token, tc.eos_token, tc.pad_token, tc.model_max_length})
    local back = sd.from_pretrained(d .. "/out")
    assert.are.equal("euler", back.scheduler.name)
    assert.are.same(pipe.scheduler.config, back.scheduler.config)
    assert.are.same(pipe.tokenizer:encode_batch({"a cat"}):tolist(), back.tokenizer:encode_batch({"a cat"}):tolist())
    -- saving again with the tokenizer.json one replaces vocab.json + merges.txt
    rawset(pipe, "tokenizer", sd.from_pretrained(d .. "/src").tokenizer)
    pipe:save_pretrained(d .. "/out")
    assert.is_false(exists(d .. "/out/tokenizer/vocab.json"))
    assert.is_true(exists(d .. "/out/tokenizer/tokenizer.json"))
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("stable diffusion: a preset with a tokenizer directory saves, the text encoder's ids from the tokenizer", function()
    local sd = require "models.stable_diffusion"
    local pipe = sd.from_preset("sd_tiny", {seed = 3, tokenizer = FIX .. "clip/tokenizer"})
    local d = tmpdir()
    pipe:save_pretrained(d)
    local j = read_json(d .. "/text_encoder/config.json")
    assert.are.same({766, 767, 767}, {j.bos_token_id, j.eos_token_id, j.pad_token_id})
    local back = sd.from_pretrained(d)
    for _, part in ipairs{"unet", "vae", "text_encoder"} do same_state(pipe[part], back[part], part) end
    assert.are.same(pipe.scheduler.config, back.scheduler.config)
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("stable diffusion: refuses a pipeline whose tokenizer has no files, and unknown options", function()
    local sd = require "models.stable_diffusion"
    local pipe = sd.from_preset("sd_tiny", {seed = 1})
    H.raises(function() pipe:save_pretrained(tmpdir()) end,
      "StableDiffusionPipeline:save_pretrained: the pipeline's tokenizer has no files to save")
    H.raises(function() pipe:save_pretrained(tmpdir(), {shards = 2}) end,
      "StableDiffusionPipeline:save_pretrained: unknown option 'shards'")
  end)
end)

describe("save_pretrained writes the tokenizer", function()
  it("causal LMs: the tokenizer.json + tokenizer_config.json loaded, byte for byte; ids back", function()
    local d = tmpdir()
    local src = cp_dir({["config.json"] = FIX .. "mistral/config.json", ["model.safetensors"] = FIX .. "mistral/model.safetensors",
      ["tokenizer.json"] = FIX .. "tf5/mistral/tokenizer.json", ["tokenizer_config.json"] = FIX .. "tf5/mistral/tokenizer_config.json"},
      d .. "/src")
    local mistral = require "models.mistral"
    local lm = mistral.from_pretrained(src)
    assert(os.execute("mkdir -p '" .. d .. "/out' && echo stale > '" .. d .. "/out/tokenizer.model'"))
    lm:save_pretrained(d .. "/out")
    assert.is_false(exists(d .. "/out/tokenizer.model"))               -- a stale file of another kind is removed
    for _, f in ipairs{"tokenizer.json", "tokenizer_config.json"} do
      local a, b = io.open(src .. "/" .. f, "rb"), io.open(d .. "/out/" .. f, "rb")
      assert.are.equal(a:read("a"), b:read("a"), f)
      a:close() b:close()
    end
    local back = mistral.from_pretrained(d .. "/out")
    assert.are.same(lm.tokenizer:encode("Hello world, the of"), back.tokenizer:encode("Hello world, the of"))
    -- a tokenizer without files is refused before anything is written
    rawset(lm, "tokenizer", {encode = function() return {} end})
    H.raises(function() lm:save_pretrained(d .. "/none") end, "save_pretrained: the model's tokenizer has no files to save")
    assert.is_false(exists(d .. "/none/config.json"))
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("causal LMs: a tokenizer.model gets a tokenizer_config.json naming its special pieces", function()
    local d = tmpdir()
    local src = cp_dir({["config.json"] = FIX .. "gemma/config.json", ["model.safetensors"] = FIX .. "gemma/model.safetensors",
      ["tokenizer.model"] = FIX .. "sentencepiece/bpe_gemma.model"}, d .. "/src")
    local gemma = require "models.gemma"
    local lm = gemma.from_pretrained(src)
    lm:save_pretrained(d .. "/out")
    assert.is_true(exists(d .. "/out/tokenizer.model"))
    local tc = read_json(d .. "/out/tokenizer_config.json")
    assert.are.equal("GemmaTokenizer", tc.tokenizer_class)
    assert.are.equal(lm.tokenizer.sp:id_to_piece(lm.tokenizer.bos_id), tc.bos_token)
    local back = gemma.from_pretrained(d .. "/out")
    assert.are.same(lm.tokenizer:encode("a b c", {add_bos = true}), back.tokenizer:encode("a b c", {add_bos = true}))
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("a tokenizer.json read alone gets a tokenizer_config.json naming only the tokens it was given", function()
    local T = require "keng.tokenizers"
    local tok = T.from_file(FIX .. "tf5/mistral/tokenizer.json", {bos_token = "<s>", eos_token = "</s>"})
    local d = tmpdir()
    hf_save.save_tokenizer(tok, d, "LlamaTokenizer", "t", 1)
    local tc = read_json(d .. "/tokenizer_config.json")
    assert.are.same({tokenizer_class = "LlamaTokenizer", backend = "tokenizers", bos_token = "<s>", eos_token = "</s>"}, tc)
    local back = T.from_dir(d)
    assert.are.same({tok.bos_id, tok.eos_id}, {back.bos_id, back.eos_id})
    assert.are.same(tok:encode("Hello world"), back:encode("Hello world"))
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("bert: vocab.txt as loaded plus a BertTokenizer tokenizer_config.json with its casing", function()
    local bert = require "models.bert"
    local m = bert.from_pretrained(FIX .. "bert")
    local d = tmpdir()
    m:save_pretrained(d)
    local tc = read_json(d .. "/tokenizer_config.json")
    assert.are.same({"BertTokenizer", false, "[CLS]", "[PAD]"}, {tc.tokenizer_class, tc.do_lower_case, tc.cls_token, tc.pad_token})
    local back = bert.from_pretrained(d)
    local T = {"Hello world! unaffable", "caf\u{e9}"}
    assert.are.same(m.tokenizer:encode_batch(T).token_ids:tolist(), back.tokenizer:encode_batch(T).token_ids:tolist())
    assert.are.same(m.tokenizer:encode(T[1]), back.tokenizer:encode(T[1]))
    os.execute("rm -rf '" .. d .. "'")
  end)
end)
