-- keng.tensor_parallel — Megatron-LM tensor parallelism for the causal LMs (Gemma, Mistral, Llama,
-- Qwen 2: models/causal_lm.lua), so that a model too big for one device generates over W ranks.
-- Each rank keeps 1/W of every attention and MLP projection:
--   column-parallel (a block of output rows): q/k/v (the rank's query heads and the key/value heads
--     they read), gate/up (a block of FFN columns) — no communication;
--   row-parallel (the matching block of input columns): o_proj, down_proj — each rank's product is
--     a partial sum, and one all-reduce (sum) per projection makes the full output on every rank.
-- Replicated on every rank: the embedding, the norms and the LM head (and the biases of the
-- row-parallel projections, added once after the sum). The KV cache holds the rank's heads only.
-- Inference only (logits, generate): the parameters are frozen. docs/distributed.md.
--
--   local tp = require "keng.tensor_parallel"
--   tp.tensor_parallel(lm)                                  -- in place; every rank the same weights
--   gemma.from_pretrained(dir, {tensor_parallel = true})   -- reads this rank's shards only
local keng = require "keng"
local Module = require "keng.nn.module"
local util = require "keng.util"

local C = keng._distributed
local M = {}

-- the projections each decoder block splits, as {submodule, projection}
local COLUMN = {{"self_attn", "query"}, {"self_attn", "key"}, {"self_attn", "value"}, {"mlp", "gate_proj"},
                {"mlp", "up_proj"}}
local ROW = {{"self_attn", "output"}, {"mlp", "down_proj"}}

-- the r-th (0-based) of W equal blocks of t along dim, in storage of its own (a view would keep
-- the whole tensor alive: the point is to hold 1/W of it)
local function block(t, dim, r, W)
  local n = t.shape[dim] // W
  return keng.no_grad(function() return t:detach():narrow(dim, r * n + 1, n):clone() end)
end

------------------------------------------------------------------------------------------------
-- the row-parallel projection

local RowParallelLinear = Module:extend("RowParallelLinear")
M.RowParallelLinear = RowParallelLinear

-- RowParallelLinear(weight [O, I/W], bias [O] or nil): y = Σ over ranks (x · weightᵀ) + bias
function RowParallelLinear:init(weight, bias)
  self.in_features, self.out_features = weight.shape[2], weight.shape[1]
  self:param("weight", weight, nil, {requires_grad = false})
  if bias then self:param("bias", bias, nil, {requires_grad = false}) end
end

function RowParallelLinear:forward(x)                               -- x [..., I/W] -> [..., O]
  local w = self.weight
  if x.dtype ~= w.dtype then x = x:to(w.dtype) end
  local y = C.all_reduce(keng.linear(x, w), {op = "sum"})           -- the ranks' partial products summed
  if self.bias then y = y + self.bias end                           -- once, not once per rank
  return y
end

function RowParallelLinear:extra_repr()
  return string.format("%d -> %d, row-parallel%s", self.in_features, self.out_features,
    self.bias and "" or ", bias=false")
end

------------------------------------------------------------------------------------------------
-- sharding a CausalLM

local function is_causal_lm(m)
  return Module.is_module(m) and type(rawget(m, "cfg")) == "table" and m.model ~= nil and m.model.layers ~= nil
end

-- the projection at `where` must be a plain float Linear (not LoRA, not quantized)
local function plain_linear(m, where, level)
  local what = m.__name ~= "Linear" and "a " .. tostring(m.__name)
    or m.weight_scale ~= nil and "a quantized Linear"
    or rawget(m, "forward") and "a Linear with LoRA adapters"
    or not keng.is_tensor(m.weight) and "a Linear without weight"
  if what then
    error(string.format("tensor_parallel: %s is %s, not a plain Linear (shard the float model first)", where, what),
      level)
  end
  return m
end

-- (each function's `level` counts from its own frame, as error's does)

-- check(cfg, W, level): every rank keeps whole heads and a whole block of FFN columns
function M.check(cfg, W, level)
  local bad = {}
  for _, e in ipairs({{"num_attention_heads", cfg.heads}, {"num_key_value_heads", cfg.kv_heads},
                      {"intermediate_size", cfg.ffn}}) do
    if e[2] % W ~= 0 then bad[#bad + 1] = e[1] .. " " .. e[2] end
  end
  if #bad > 0 then
    error(string.format("tensor_parallel: %s must be a multiple of the world size %d (each rank keeps " ..
      "whole heads and an equal block of the FFN)", table.concat(bad, " and "), W), level)
  end
end

-- the KV cache of this rank's heads: per layer {k =, v =} [B, Hkv / W, L, D]
local function new_cache(self, B, L)
  local cfg, o = self.cfg, {dtype = self:param_dtype(), device = self:param_device()}
  local caches = {}
  for i, layer in ipairs(self.model.layers) do
    local shape = {B, layer.self_attn.kv_heads, L, cfg.head_dim}
    caches[i] = {k = keng.zeros(shape, o), v = keng.zeros(shape, o)}
  end
  return caches
end

-- shard(lm, rank, world, level): lm in place -> lm holding rank's blocks (no communication; meta
-- tensors stay meta, which is how from_pretrained builds a shard without the whole model)
function M.shard(lm, rank, W, level)
  level = level or 2
  if not is_causal_lm(lm) then
    error("tensor_parallel: a causal LM (Gemma, Mistral, Llama, Qwen 2) expected, got " ..
      (Module.is_module(lm) and lm.__name or type(lm)), level)
  end
  if rawget(lm, "tensor_parallel") then error("tensor_parallel: the model is already sharded", level) end
  M.check(lm.cfg, W, level + 1)
  local CausalLM = getmetatable(lm)
  for i, layer in ipairs(lm.model.layers) do                        -- every check before any change
    for _, list in ipairs({COLUMN, ROW}) do
      for _, p in ipairs(list) do
        plain_linear(layer[p[1]][p[2]], string.format("layer %d %s.%s", i, p[1], p[2]), level + 1)
      end
    end
  end
  for _, layer in ipairs(lm.model.layers) do
    for _, p in ipairs(COLUMN) do
      local m = layer[p[1]][p[2]]
      m.weight = block(m.weight, 1, rank, W)                         -- [O/W, I]: this rank's output rows
      if m.bias then m.bias = block(m.bias, 1, rank, W) end
      m.out_features = m.weight.shape[1]
      if m.einsum_heads then m.einsum_heads = m.einsum_heads // W end
    end
    for _, p in ipairs(ROW) do
      local m = layer[p[1]][p[2]]
      layer[p[1]][p[2]] = RowParallelLinear(block(m.weight, 2, rank, W), m.bias and m.bias:detach())  -- [O, I/W]
    end
    local a = layer.self_attn
    a.heads, a.kv_heads = a.heads // W, a.kv_heads // W
  end
  lm:freeze()                                                       -- inference only
  rawset(lm, "tensor_parallel", {rank = rank, world_size = W})
  rawset(lm, "new_cache", new_cache)
  -- rank 0's logits on every rank: the replicated parts may round differently per rank (thread
  -- counts), and generate must pick the same token everywhere (greedy and sampling alike)
  rawset(lm, "head", function(self, ...)
    local y = CausalLM.head(self, ...)
    if W > 1 then C.broadcast(y, 0) end
    return y
  end)
  -- moved to a device (cuda:local_rank), the model makes that device's communicator then, so that
  -- its first all-reduce is not what makes it (inside a CUDA graph capture it cannot be made)
  rawset(lm, "to", function(self, ...)
    CausalLM.to(self, ...)
    require("keng.distributed").setup(self)
    return self
  end)
  rawset(lm, "save_pretrained", function()
    error("save_pretrained: a tensor-parallel model holds 1/" .. W .. " of its weights; save the unsharded model", 2)
  end)
  return lm
end

-- tensor_parallel(lm) -> lm, sharded in place over the job's ranks (keng.distributed). Every
-- rank must hold the same weights (the same checkpoint, or the same seed).
function M.tensor_parallel(lm, level)
  C.init()
  local m = M.shard(lm, C.rank(), C.world_size(), (level or 2) + 1)
  require("keng.distributed").setup(m)                              -- its devices' communicators now
  collectgarbage()                                                  -- the other ranks' blocks go now
  collectgarbage()
  return m                                                          -- no tail call: level counts this frame
end

------------------------------------------------------------------------------------------------
-- loading only this rank's shards

-- which dim of a checkpoint tensor (keng name) is split: 1 for column-parallel weights and
-- biases, 2 for row-parallel weights; nil: replicated
local function split_dim(name)
  local proj, what = name:match("^model%.layers%.%d+%.[%w_]+%.([%w_]+)%.(%w+)$")
  if not proj then return nil end
  if proj == "query" or proj == "key" or proj == "value" or proj == "gate_proj" or proj == "up_proj" then return 1 end
  if (proj == "output" or proj == "down_proj") and what == "weight" then return 2 end
  return nil
end
M.split_dim = split_dim

-- from_pretrained(F, dir, cfg, j, opts, who, level) -> a CausalLM of family F holding this rank's
-- shards: built on the meta device (nothing allocated), sharded, then each sharded tensor is
-- copied out of the memory-mapped checkpoint as its block alone (models/causal_lm.lua's
-- from_pretrained calls this for {tensor_parallel = true})
function M.from_pretrained(F, dir, cfg, j, opts, who, level)
  level = level + 1
  if opts.tensor_parallel ~= true then
    error(string.format("%s: tensor_parallel must be true or false, got %s", who, tostring(opts.tensor_parallel)),
      level)
  end
  local common, causal_lm = require "models.common", require "models.causal_lm"
  C.init()
  local rank, W = C.rank(), C.world_size()
  M.check(cfg, W, level + 1)
  local tensors = common.load_tensors(dir, who, level)
  local dtype = common.model_dtype(opts, j, tensors, who, level)
  local lm = F.build(cfg, {dtype = dtype, device = "meta"})
  M.shard(lm, rank, W, level + 1)
  local sd = {}
  for name, t in pairs(tensors) do
    if name:find("weight_scale$") then
      error(who .. ": tensor_parallel does not load quantized checkpoints (" .. name .. ")", level)
    end
    local k = causal_lm.hf_to_keng(name)
    if k == "lm_head.weight" and cfg.tie then k = nil end
    if k then
      -- a block of its own for a sharded tensor; a replicated one copied out of the mapped file
      -- too (unless the dtype conversion copies it), so that the model owns its memory
      local d = split_dim(k)
      sd[k] = d and block(t, d, rank, W) or (t.dtype == dtype and t:clone() or t)
    end
  end
  local ok, e = pcall(lm.load_state_dict, lm, sd)
  if not ok then error(tostring(e):gsub("^[^:]*:%d+: ", ""), level) end
  if opts.device and opts.device ~= "cpu" then lm:to(opts.device) end       -- (and sets the device up)
  lm:freeze()
  rawset(lm, "tokenizer", causal_lm.load_tokenizer(dir))
  return lm
end

-- parameter_bytes(lm) -> bytes of the sharded projections' parameters, bytes of all parameters
-- (tied counted once): what a rank holds
function M.parameter_bytes(lm)
  local sharded, total = 0, 0
  for _, e in ipairs(lm:named_parameter_list()) do
    local n = util.nbytes(e[2])
    total = total + n
    if split_dim(e[1]) then sharded = sharded + n end
  end
  return sharded, total
end

return M
