-- peft_spec.lua — keng.lora's PEFT adapters: load_adapters of a directory written by
-- peft.save_pretrained on the tiny Llama (tests/fixtures/peft, tests/fixtures/gen/gen_peft.py)
-- gives peft's logits, and merge gives merge_and_unload's; save_adapters writes peft's names,
-- shapes, values and config; keng-initialised adapters (scale 1) round-trip; config keys keng
-- does not implement, stray tensors and mismatched scales are refused by name.
-- Shape letters: B batch, T tokens, V vocabulary, r rank.
local keng = require "keng"
local H = require "helper"
local json = require "keng.json"
local lora = require "keng.lora"
local llama = require "models.llama"

local BASE, PEFT = "tests/fixtures/llama", "tests/fixtures/peft"
local gold = keng.load(PEFT .. "/golden.safetensors")

local function rel_err(a, b) return (a - b):abs():max():item() / b:abs():max():item() end

local tmpdir = H.tmpname
local function read_json(path) return H.read_json(path, {null_as_nil = true}) end

-- a copy of the fixture directory with adapter_config.json as edit(j) leaves it
local function edited_peft(edit)
  local d = tmpdir()
  assert(os.execute("mkdir -p '" .. d .. "' && cp " .. PEFT .. "/adapter_model.safetensors '" .. d .. "/'"))
  local j = json.decode(io.open(PEFT .. "/adapter_config.json"):read("a"))
  edit(j)
  local f = assert(io.open(d .. "/adapter_config.json", "wb"))
  f:write(json.encode(j))
  f:close()
  return d
end

describe("PEFT adapters", function()
  it("load_adapters(dir) on the base model gives peft's logits; merge gives merge_and_unload's", function()
    local lm = llama.from_pretrained(BASE)
    assert.is_true(rel_err(lm:logits(gold.input_ids), gold.base_logits) < 1e-5)
    lora.load_adapters(lm, PEFT)
    assert.are.equal(6, #lora.adapted_layers(lm))
    local y = lm:logits(gold.input_ids)
    assert.is_true(rel_err(y, gold.logits) < 1e-5, "adapted logits differ from peft's")
    assert.is_true(rel_err(y, gold.base_logits) > 0.05)        -- the adapters matter
    -- lora_alpha / r = 8 / 4: the scale keng applies
    assert.are.equal(2, rawget(lora.adapted_layers(lm)[1][2], "lora_scale"))
    lora.merge(lm)
    assert.is_true(rel_err(lm:logits(gold.input_ids), gold.merged_logits) < 1e-5)
  end)

  it("save_adapters writes peft's names, shapes, values and config", function()
    local lm = llama.from_pretrained(BASE)
    lora.load_adapters(lm, PEFT)
    local d = tmpdir()
    lora.save_adapters(lm, d, {format = "peft", base_model = "tests/fixtures/llama"})
    local mine, theirs = keng.load(d .. "/adapter_model.safetensors"), keng.load(PEFT .. "/adapter_model.safetensors")
    local n = 0
    for k, t in pairs(theirs) do
      n = n + 1
      assert.is_not_nil(mine[k], "missing " .. k)
      assert.are.same(t.shape, mine[k].shape)
      assert.are.same(t:tolist(), mine[k]:tolist())
    end
    for k in pairs(mine) do assert.is_not_nil(theirs[k], "unexpected " .. k) end
    assert.are.equal(12, n)
    assert.is_not_nil(mine["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"])
    local a, b = read_json(d .. "/adapter_config.json"), read_json(PEFT .. "/adapter_config.json")
    for _, k in ipairs({"peft_type", "r", "lora_alpha", "bias", "use_dora", "use_rslora", "task_type",
                        "base_model_name_or_path"}) do
      assert.are.same(b[k], a[k], k)
    end
    table.sort(b.target_modules)
    assert.are.same(b.target_modules, a.target_modules)
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("adapters trained in keng (scale 1) round-trip through the PEFT format", function()
    keng.manual_seed(4)
    local lm = llama.from_pretrained(BASE)
    lora.enable(lm, {rank = 2, targets = {"query", "value", "gate_proj"}, per_head = false})
    keng.no_grad(function()
      for _, e in ipairs(lora.adapted_layers(lm)) do e[2].lora_b:copy_(keng.randn(e[2].lora_b.shape) * 0.3) end
    end)
    local want = lm:logits(gold.input_ids)
    local d = tmpdir()
    lora.save_adapters(lm, d)
    local cfg = read_json(d .. "/adapter_config.json")
    assert.are.equal(2, cfg.r)
    assert.are.equal(2, cfg.lora_alpha)                         -- Keras's scale 1 is alpha = r
    assert.are.same({"gate_proj", "q_proj", "v_proj"}, cfg.target_modules)
    local t = keng.load(d .. "/adapter_model.safetensors")
    assert.are.same({2, 32}, t["base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"].shape)
    assert.are.same({32, 2}, t["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"].shape)
    local fresh = llama.from_pretrained(BASE)
    lora.load_adapters(fresh, d)
    assert.are.equal(0, (fresh:logits(gold.input_ids) - want):abs():max():item())
    -- keng's own format in the same directory layout
    local k = tmpdir()
    lora.save_adapters(lm, k, {format = "keng"})
    assert.is_not_nil(keng.load(k .. "/adapter_model.safetensors")["model.layers.1.self_attn.query.lora_a"])
    local again = llama.from_pretrained(BASE)
    lora.enable(again, {rank = 2, targets = {"query", "value", "gate_proj"}, per_head = false})
    lora.load_adapters(again, k)
    assert.are.equal(0, (again:logits(gold.input_ids) - want):abs():max():item())
    os.execute("rm -rf '" .. d .. "' '" .. k .. "'")
  end)

  it("refuses config keys it does not implement, stray tensors, other scales and bad options", function()
    local lm = llama.from_pretrained(BASE)
    for key, v in pairs({use_dora = true, use_rslora = true, bias = "all", modules_to_save = {"lm_head"},
                         layers_to_transform = {0}}) do
      local d = edited_peft(function(j) j[key] = v end)
      H.raises(function() lora.load_adapters(lm, d) end,
        "adapter_config.json sets " .. key .. " = ")
      os.execute("rm -rf '" .. d .. "'")
    end
    local d = edited_peft(function(j) j.rank_pattern = {q_proj = 8} end)
    H.raises(function() lora.load_adapters(lm, d) end,
      "model.layers.0.self_attn.q_proj has lora_A [4,32] and lora_B [64,4] but adapter_config.json gives rank 8")
    os.execute("rm -rf '" .. d .. "'")
    d = edited_peft(function(j) j.alpha_pattern = {["layers%.0.*q_proj"] = 8} end)
    H.raises(function() lora.load_adapters(lm, d) end,
      "alpha_pattern key 'layers%.0.*q_proj' is a regular expression; keng matches plain module names only")
    os.execute("rm -rf '" .. d .. "'")
    d = edited_peft(function(j) j.peft_type = "IA3" end)
    H.raises(function() lora.load_adapters(lm, d) end, "peft_type is IA3; only LORA adapters are implemented")
    os.execute("rm -rf '" .. d .. "'")
    -- a tensor for a module the model lacks
    d = edited_peft(function() end)
    local t = keng.load(d .. "/adapter_model.safetensors")
    local extra = {}
    for k, v in pairs(t) do extra[k] = v end
    extra["base_model.model.model.layers.0.mlp.nope.lora_A.weight"] = t["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"]
    extra["base_model.model.model.layers.0.mlp.nope.lora_B.weight"] = t["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"]
    keng.save(d .. "/adapter_model.safetensors", extra)
    H.raises(function() lora.load_adapters(llama.from_pretrained(BASE), d) end,
      "the adapters are for model.layers.0.mlp.nope (keng model.layers.1.mlp.nope), which is not a Linear layer")
    t["base_model.model.model.layers.0.mlp.down_proj.lora_magnitude_vector"] = keng.ones({32})
    keng.save(d .. "/adapter_model.safetensors", t)
    H.raises(function() lora.load_adapters(llama.from_pretrained(BASE), d) end,
      "tensor 'base_model.model.model.layers.0.mlp.down_proj.lora_magnitude_vector' is not a LoRA A/B weight")
    os.execute("rm -rf '" .. d .. "'")
    -- adapters already there with another scale
    local m = llama.from_pretrained(BASE)
    lora.enable(m, {rank = 4, targets = {"query", "value", "down_proj"}, per_head = false})
    H.raises(function() lora.load_adapters(m, PEFT) end, "has scale 1 in the model but lora_alpha / r = 2")
    H.raises(function() lora.save_adapters(m, tmpdir(), {format = "hf"}) end, 'format must be "peft" or "keng", got hf')
    H.raises(function() lora.save_adapters(m, tmpdir(), {fromat = "peft"}) end, "unknown option 'fromat'")
    H.raises(function() lora.enable(llama.from_pretrained(BASE), {rank = 2, target = {"query"}}) end,
      "unknown option 'target'")
  end)

  it("Keras's per-head adapters and mixed ranks/alphas round-trip (rank n·r, rank_pattern, alpha_pattern)", function()
    keng.manual_seed(6)
    local m = llama.from_pretrained(BASE)
    lora.enable(m, {rank = 2, targets = {"query", "value"}})              -- per head (the default)
    lora.enable(m, {rank = 3, alpha = 6, targets = {"down_proj"}})
    keng.no_grad(function()
      for _, e in ipairs(lora.adapted_layers(m)) do e[2].lora_b:copy_(keng.randn(e[2].lora_b.shape) * 0.3) end
    end)
    local want = m:logits(gold.input_ids)
    local d = tmpdir()
    lora.save_adapters(m, d)
    local cfg = read_json(d .. "/adapter_config.json")
    assert.are.equal(8, cfg.r)                                       -- query: 4 heads x rank 2
    assert.are.equal(8, cfg.lora_alpha)                              -- scale 1
    assert.are.equal(4, cfg.rank_pattern["model.layers.0.self_attn.v_proj"])   -- 2 KV heads x 2
    assert.are.equal(3, cfg.rank_pattern["model.layers.1.mlp.down_proj"])
    assert.are.equal(6, cfg.alpha_pattern["model.layers.1.mlp.down_proj"])
    local t = keng.load(d .. "/adapter_model.safetensors")
    assert.are.same({64, 8}, t["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"].shape)
    local fresh = llama.from_pretrained(BASE)
    lora.load_adapters(fresh, d)
    assert.is_true(rel_err(fresh:logits(gold.input_ids), want) < 1e-6)
    assert.are.equal(2, rawget(fresh.model.layers[1].mlp.down_proj, "lora_scale"))
    os.execute("rm -rf '" .. d .. "'")
  end)

end)
