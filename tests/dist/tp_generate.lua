-- Run by tests/lua/distributed_spec.lua as `mpirun -np 2 ... keng tests/dist/tp_generate.lua DIR`
-- (DIR an empty directory): tensor-parallel gemma_tiny and mistral_tiny against the whole model,
-- which every rank also builds (the same seed) and runs alone. Prints one line per check and
-- "rank R ok"; any failed check raises (the job then exits non-zero).
local keng = require "keng"
local dist = require "keng.distributed"
local tp = require "keng.tensor_parallel"

local W = dist.init()
local R = dist.rank()
assert(W == 2, "run with 2 ranks, got " .. W)

local function maxdiff(a, b) return (a:float() - b:float()):abs():max():item() end
local function same_list(a, b) return table.concat(a, " ") == table.concat(b, " ") end

-- the ranks agree on a list of ids: rank 0's broadcast equals this rank's
local function agreed(ids)
  local t = keng.tensor(ids, {dtype = "i64"})
  return same_list(dist.broadcast(t:clone(), 0):tolist(), ids)
end

local prompt = {{2, 5, 9, 100, 7}, {2, 31, 8}}                      -- two rows: a padded batch
for _, case in ipairs({{"models.gemma", "gemma_tiny"}, {"models.mistral", "mistral_tiny"}}) do
  local F, name = require(case[1]), case[2]
  keng.manual_seed(11)
  local lm = F.from_preset(name)                                    -- the whole model, on every rank
  local ids = keng.tensor({{2, 5, 9, 100, 7, 31, 4, 77}}, {dtype = "i64"})
  local want = keng.no_grad(function() return lm:logits(ids) end)
  local greedy = lm:generate(prompt, {max_new_tokens = 8})
  local sampled = lm:generate(prompt, {max_new_tokens = 8, temperature = 0.9, top_k = 40, seed = 5})
  local full_sharded = tp.parameter_bytes(lm)

  collectgarbage(); collectgarbage()
  local before = keng.memory_stats().allocated
  dist.tensor_parallel(lm)
  local freed = before - keng.memory_stats().allocated              -- the other rank's half, at once
  assert(freed >= full_sharded / 2,
    string.format("%s: sharding freed %d bytes, want %d", name, freed, full_sharded // 2))
  local d = maxdiff(lm:logits(ids), want)
  assert(d < 1e-4, string.format("%s logits differ from one rank's by %g", name, d))
  local g = lm:generate(prompt, {max_new_tokens = 8})
  local s = lm:generate(prompt, {max_new_tokens = 8, temperature = 0.9, top_k = 40, seed = 5})
  for b = 1, #prompt do
    assert(same_list(g[b], greedy[b]), name .. " greedy row " .. b .. ": " .. table.concat(g[b], " ") ..
      " vs one rank's " .. table.concat(greedy[b], " "))
    assert(same_list(s[b], sampled[b]), name .. " sampled row " .. b .. ": " .. table.concat(s[b], " ") ..
      " vs one rank's " .. table.concat(sampled[b], " "))
    assert(agreed(g[b]) and agreed(s[b]), name .. ": the ranks generated different tokens")
  end
  local sharded = tp.parameter_bytes(lm)
  assert(sharded * 2 == full_sharded,
    string.format("%s: %d sharded bytes on a rank, %d whole", name, sharded, full_sharded))
  local a = lm.model.layers[1].self_attn
  print(string.format("rank %d %s: logits max diff %.3g, greedy and sampled tokens equal, heads %d/%d, " ..
    "sharded params %d of %d bytes, %d bytes freed", R, name, d, a.heads, a.kv_heads, sharded, full_sharded, freed))
end

local mistral = require "models.mistral"

-- biases on every projection (Qwen 2's q/k/v, attention_bias, mlp_bias): the column-parallel
-- ones split, the row-parallel ones added once after the sum
do
  local cfg = mistral.config("mistral_tiny")
  cfg.vocab, cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias = 500, true, true, true
  keng.manual_seed(13)
  local lm = mistral.build(cfg)
  keng.no_grad(function()
    for _, e in ipairs(lm:named_parameter_list()) do
      if e[1]:find("bias$") then e[2]:copy_(keng.randn(e[2].shape) * 0.5) end           -- zeros by default
    end
  end)
  local ids = keng.tensor({{1, 40, 9, 100, 7, 31}}, {dtype = "i64"})
  local want = keng.no_grad(function() return lm:logits(ids) end)
  local greedy = lm:generate({{1, 40, 9}}, {max_new_tokens = 6})[1]
  dist.tensor_parallel(lm)
  local d = maxdiff(lm:logits(ids), want)
  assert(d < 1e-4, "biased logits differ by " .. d)
  assert(same_list(lm:generate({{1, 40, 9}}, {max_new_tokens = 6})[1], greedy), "biased greedy tokens")
  print(string.format("rank %d biases: logits max diff %.3g", R, d))
end

-- the transformers-made checkpoints of tests/fixtures (Llama, Qwen 2 with q/k/v biases,
-- Mistral): sharded loads give the whole model's logits and tokens; Gemma's (one kv head) raises
for _, f in ipairs({"llama", "qwen2", "mistral"}) do
  local F = require("models." .. f)
  local dir = "tests/fixtures/" .. f
  local whole = F.from_pretrained(dir)
  local ids = keng.tensor({{1, 40, 9, 100, 7, 31}}, {dtype = "i64"})
  local want = keng.no_grad(function() return whole:logits(ids) end)
  local tokens = whole:generate({{1, 40, 9}}, {max_new_tokens = 6})[1]
  local lm = F.from_pretrained(dir, {tensor_parallel = true})
  local d = maxdiff(lm:logits(ids), want)
  assert(d < 1e-4, f .. " fixture logits differ by " .. d)
  assert(same_list(lm:generate({{1, 40, 9}}, {max_new_tokens = 6})[1], tokens), f .. " fixture greedy tokens")
  print(string.format("rank %d fixture %s: logits max diff %.3g", R, f, d))
end
do
  local gemma = require "models.gemma"
  local ok, err = pcall(function() gemma.from_pretrained("tests/fixtures/gemma", {tensor_parallel = true}) end)
  assert(not ok and err:find("tp_generate.lua:%d+: tensor_parallel: num_key_value_heads 1 must be a multiple of " ..
    "the world size 2"),
    "gemma fixture: " .. tostring(err))
end

-- head counts that do not divide: every rank raises the same message
for _, bad in ipairs({{heads = 8, kv_heads = 1, want = "num_key_value_heads 1 must be a multiple of the world size 2"},
                      {heads = 3, kv_heads = 3, want = "num_attention_heads 3 and num_key_value_heads 3 must"}}) do
  local cfg = mistral.config("mistral_tiny")
  cfg.heads, cfg.kv_heads, cfg.layers, cfg.vocab = bad.heads, bad.kv_heads, 1, 64
  local lm = mistral.build(cfg)
  local ok, err = pcall(function() dist.tensor_parallel(lm) end)
  assert(not ok and err:find(bad.want, 1, true), "bad heads message: " .. tostring(err))
  assert(err:find("tp_generate.lua:%d+:"), "names the caller's line: " .. err)
end
print("rank " .. R .. " bad head counts raise")

-- from_pretrained{tensor_parallel = true}: this rank's blocks only, read from the checkpoint.
-- mistral_tiny with a vocabulary of 1000, so that the sharded projections are most of the model
-- and a load that allocated the whole of it would show in the peak
local dir = assert(arg[1], "usage: tp_generate.lua DIR")
keng.manual_seed(12)
local cfg = mistral.config("mistral_tiny")
cfg.vocab = 1000
local whole = mistral.build(cfg)
if R == 0 then whole:save_pretrained(dir) end
dist.barrier()
local ids = keng.tensor({{1, 40, 9, 100, 7, 31}}, {dtype = "i64"})
local want = keng.no_grad(function() return whole:logits(ids) end)
local want_tokens = whole:generate({{1, 40, 9}}, {max_new_tokens = 6})[1]
local _, whole_bytes = tp.parameter_bytes(whole)
whole = nil
collectgarbage(); collectgarbage()
local base = keng.memory_stats().allocated
keng.reset_peak_memory_stats()
local lm = mistral.from_pretrained(dir, {tensor_parallel = true})
local peak = keng.memory_stats().peak - base
local sharded, total = tp.parameter_bytes(lm)
assert(rawget(lm, "tensor_parallel").world_size == 2)
local d = maxdiff(lm:logits(ids), want)
assert(d < 1e-4, "from_pretrained tensor_parallel logits differ by " .. d)
assert(same_list(lm:generate({{1, 40, 9}}, {max_new_tokens = 6})[1], want_tokens), "from_pretrained greedy tokens")
-- the rank holds the whole model less the other rank's half of the projections, and loading
-- allocated little more (the whole model would be another `sharded` bytes)
assert(whole_bytes - total == sharded and peak < total + sharded / 4,
  string.format("peak %d bytes while loading %d bytes of parameters (whole model %d)", peak, total, whole_bytes))
print(string.format("rank %d from_pretrained: logits max diff %.3g; parameters %d bytes (whole model %d, " ..
  "sharded projections %d); load peak %d bytes", R, d, total, whole_bytes, sharded, peak))
local ok, err = pcall(lm.save_pretrained, lm, dir .. "/again")
assert(not ok and err:find("holds 1/2 of its weights", 1, true), tostring(err))

dist.barrier()
print("rank " .. R .. " ok")
