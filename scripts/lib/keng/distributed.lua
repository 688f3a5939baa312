-- keng.distributed — several processes, one model: MPI (Open MPI) for processes and cpu tensors,
-- NCCL for cuda tensors. Launch with `mpirun -np 2 keng train.lua` (or `srun keng ...`); a plain
-- `keng train.lua` is world size 1 and every collective is a no-op. See docs/distributed.md.
--
--   local dist = require "keng.distributed"
--   dist.init(); dist.rank(), dist.world_size()                -- 0-based rank
--   dist.all_reduce(t, {op = "avg"})                            -- in place, returns t
--   local dp = dist.data_parallel(model)                        -- params broadcast from rank 0
--   local loss = loss_fn(dp(x_shard), y_shard); loss:backward() -- grads now averaged over ranks
local keng = require "keng"
local Module = require "keng.nn.module"
local options = require "keng.options"
local util = require "keng.util"

local C = keng._distributed
local dist = {}

for _, name in ipairs({"rank", "world_size", "local_rank", "barrier", "available", "all_reduce", "broadcast",
                       "all_gather", "reduce_scatter"}) do
  dist[name] = C[name]
end

-- init() -> world size (idempotent; the collectives and data_parallel call it too)
function dist.init() return C.init() end

------------------------------------------------------------------------------------------------
-- data parallel

local DataParallel = Module:extend("DataParallel")
dist.DataParallel = DataParallel

local DP_OPTS = {"bucket_mb"}

-- DataParallel(model, {bucket_mb = 25}): the model's parameters are broadcast from rank 0 now;
-- a forward in training mode arms the wrapper, and the next tensor backward leaves every
-- trainable parameter's grad averaged over the ranks (see sync_grads).
function DataParallel:init(model, opts)
  opts = options.check("data_parallel", opts, DP_OPTS, 4)
  if not Module.is_module(model) then
    error("data_parallel: model must be a keng.nn module (got " .. type(model) .. ")", 4)
  end
  if opts.bucket_mb ~= nil then options.number("data_parallel", "bucket_mb", opts.bucket_mb, 0, 4) end
  C.init()
  self.module = model
  rawset(self, "bucket_bytes", math.floor((opts.bucket_mb or 25) * 1024 * 1024))
  keng.no_grad(function()
    for _, p in ipairs(model:parameters()) do C.broadcast(p, 0) end
    for _, b in ipairs(model:buffers()) do C.broadcast(b, 0) end
  end)
end

function DataParallel:forward(...)
  local out = self.module(...)
  -- armed only by a forward that builds a tape (training mode, grad on)
  if self.training and keng.is_grad_enabled() then dist._armed[self] = true end
  return out
end

-- the wrapped model's names, so checkpoints load into an unwrapped model
function DataParallel:state_dict(opts) return self.module:state_dict(opts) end
function DataParallel:load_state_dict(...) return self.module:load_state_dict(...) end

-- sync_grads(weight): every trainable parameter's grad <- sum over ranks of weight * grad
-- (weight 1 / world_size by default: the mean). A parameter without a grad counts as zeros, so
-- every rank runs the same collectives. Grads go in buckets of about bucket_mb, in reverse
-- registration order (the order backward finishes them), one flat all-reduce per bucket.
function DataParallel:sync_grads(weight)
  dist._armed[self] = nil
  weight = weight or 1 / C.world_size()
  local params = {}
  for _, p in ipairs(self.module:parameters()) do if p.requires_grad then params[#params + 1] = p end end
  keng.no_grad(function()
    local bucket, bytes, dtype, device = {}, 0, nil, nil
    local function flush()
      if #bucket == 0 then return end
      local flat = {}
      for i, p in ipairs(bucket) do flat[i] = p.grad:reshape({-1}) end
      local buf = #flat == 1 and flat[1]:clone() or keng.cat(flat, 1)
      if weight ~= 1 then buf:mul_(weight) end
      C.all_reduce(buf, {op = "sum"})
      local at = 1
      for _, p in ipairs(bucket) do
        local n = p:numel()
        p.grad:copy_(buf:narrow(1, at, n):reshape(p.shape))
        at = at + n
      end
      bucket, bytes = {}, 0
    end
    for i = #params, 1, -1 do
      local p = params[i]
      if p.grad == nil then p.grad = keng.zeros_like(p) end
      local g = p.grad
      if g.dtype ~= dtype or tostring(g.device) ~= device then flush() end
      dtype, device = g.dtype, tostring(g.device)
      bucket[#bucket + 1] = p
      bytes = bytes + util.nbytes(g)
      if bytes >= self.bucket_bytes then flush() end
    end
    flush()
  end)
end

-- wrappers whose forward ran since their last sync (weak: a dropped wrapper is forgotten)
dist._armed = setmetatable({}, {__mode = "k"})

-- the hook point: tensor:backward() runs the engine's backward, then syncs the armed wrappers
local methods = getmetatable(keng.tensor({0})).methods
local raw_backward = methods.backward
methods.backward = function(...)
  local ok, err = pcall(raw_backward, ...)
  if not ok then
    for dp in pairs(dist._armed) do dist._armed[dp] = nil end  -- a failed backward syncs nothing
    -- blame the caller's line (the engine's message would name this wrapper's)
    if type(err) == "string" then err = err:gsub("^[^\n]-distributed%.lua:%d+: ", "") end
    error(err, 2)
  end
  local list = {}
  for dp in pairs(dist._armed) do list[#list + 1] = dp end
  for _, dp in ipairs(list) do dp:sync_grads(rawget(dp, "_next_weight")); rawset(dp, "_next_weight", nil) end
  return err  -- backward's own result
end

-- data_parallel(model, opts) -> a DataParallel module (model itself when already wrapped)
function dist.data_parallel(model, opts)
  if getmetatable(model) == DataParallel then return model end
  return DataParallel(model, opts)
end

------------------------------------------------------------------------------------------------
-- sharding a batch

-- the rows of a batch that rank r takes: r + 1, r + 1 + W, ... (1-based), as an i64 index
function dist.shard_rows(n)
  local r, w = C.rank(), C.world_size()
  if r >= n then return keng.zeros({0}, {dtype = "i64"}) end
  return keng.arange(r, n, w)
end

return dist
