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
function dist.init()
  local ok, n = pcall(C.init)
  if not ok then error((tostring(n):gsub("^[^\n]-%.lua:%d+: ", "")), 2) end   -- at the caller's line
  return n
end

-- setup(device or module): ready for collectives on the device (each device of the module's
-- parameters) now. A cuda device's NCCL communicator is made here, not by the first collective,
-- which may be inside a CUDA graph capture where it cannot be made. A collective: every rank calls
-- it, each with its own device. data_parallel and tensor_parallel call it when set up.
function dist.setup(what)
  local ok, e = pcall(function()
    C.init()
    if not Module.is_module(what) then return C.setup(tostring(what)) end
    local seen = {}
    for _, p in ipairs(what:parameters()) do
      local d = tostring(p.device)
      if not seen[d] then seen[d] = true; C.setup(d) end
    end
  end)
  if not ok then error((tostring(e):gsub("^[^\n]-%.lua:%d+: ", "")), 2) end   -- at the caller's line
end

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
  dist.setup(model)                                                 -- before any graph capture
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

-- buckets(): the trainable parameters in reverse registration order (the order backward
-- finishes them), cut into buckets of about bucket_mb of one dtype and device each.
-- -> params, bucket_of (params[i]'s bucket), sizes (parameters per bucket)
function DataParallel:buckets()
  local params = {}
  for _, p in ipairs(self.module:parameters()) do if p.requires_grad then params[#params + 1] = p end end
  local rev, bucket_of, sizes = {}, {}, {}
  local bytes, key = 0, nil
  for i = #params, 1, -1 do
    local p = params[i]
    local k = p.dtype .. "@" .. tostring(p.device)
    if #sizes == 0 or k ~= key or bytes >= self.bucket_bytes then sizes[#sizes + 1], bytes = 0, 0 end
    key = k
    rev[#rev + 1] = p
    bucket_of[#rev] = #sizes
    sizes[#sizes] = sizes[#sizes] + 1
    bytes = bytes + util.nbytes(p)
  end
  return rev, bucket_of, sizes
end

-- a syncer for one backward: ready(i) when params[i]'s grad is final; a bucket whose grads are
-- all final starts its all-reduce (buckets start in bucket order on every rank, as MPI needs);
-- finish() starts what is left (a parameter without a grad counts as zeros, so every rank runs
-- the same collectives), waits for all and writes the averaged grads back.
function DataParallel:syncer(weight)
  weight = weight or 1 / C.world_size()
  local params, bucket_of, sizes = self:buckets()
  local left, first = {}, {}                                       -- grads still pending; first param
  for b, n in ipairs(sizes) do left[b] = n end
  for i = #params, 1, -1 do first[bucket_of[i]] = i end
  local works, started, in_backward = {}, 0, 0
  local function start(b)
    local flat = {}
    for i = first[b], first[b] + sizes[b] - 1 do
      local p = params[i]
      if p.grad == nil then p.grad = keng.zeros_like(p) end
      flat[#flat + 1] = p.grad:reshape({-1})
    end
    local buf = #flat == 1 and flat[1]:clone() or keng.cat(flat, 1)
    if weight ~= 1 then buf:mul_(weight) end
    works[b] = {buf = buf, work = C.all_reduce_start(buf, {op = "sum"})}
    started = b
  end
  local s = {}
  function s.ready(i)
    local b = bucket_of[i]
    left[b] = left[b] - 1
    keng.no_grad(function()
      while started < #sizes and left[started + 1] == 0 do
        start(started + 1)
        in_backward = in_backward + 1
      end
      for b2 = 1, started do works[b2].work:test() end            -- lets MPI progress
    end)
  end
  function s.finish()
    keng.no_grad(function()
      while started < #sizes do start(started + 1) end
      for b = 1, #sizes do
        local buf = works[b].work:wait()
        local at = 1
        for i = first[b], first[b] + sizes[b] - 1 do
          local p = params[i]
          local n = p:numel()
          p.grad:copy_(buf:narrow(1, at, n):reshape(p.shape))
          at = at + n
        end
      end
    end)
    -- overlap evidence: how many buckets started while backward still ran
    rawset(self, "last_sync", {buckets = #sizes, started_in_backward = in_backward})
  end
  s.params = params
  return s
end

-- sync_grads(weight): every trainable parameter's grad <- sum over ranks of weight * grad
-- (weight 1 / world_size by default: the mean), all buckets after backward. A tensor backward
-- after an armed forward does the same, starting each bucket as soon as its grads are final.
function DataParallel:sync_grads(weight)
  dist._armed[self] = nil
  self:syncer(weight).finish()
end

-- wrappers whose forward ran since their last sync (weak: a dropped wrapper is forgotten)
dist._armed = setmetatable({}, {__mode = "k"})

-- the hook point: tensor:backward() runs the engine's backward; with one armed wrapper each
-- bucket's all-reduce starts as soon as its grads are final (overlapping the rest of backward),
-- several armed wrappers sync after it
local methods = getmetatable(keng.tensor({0})).methods
local raw_backward = methods.backward
local function is_tensor(v) return getmetatable(v) == getmetatable(keng.tensor({0})) end
methods.backward = function(t, g, retain, ...)
  local list = {}
  for dp in pairs(dist._armed) do list[#list + 1] = dp end
  local ok, err
  if #list == 1 and select("#", ...) == 0 then
    local dp = list[1]
    if type(g) == "table" and not is_tensor(g) then
      local o = options.check("backward", g, {"gradient", "retain_graph"})
      g, retain = o.gradient, o.retain_graph
    end
    local syncer = dp:syncer(rawget(dp, "_next_weight"))
    ok, err = pcall(C.backward_hooked, t, g, retain, syncer.params, syncer.ready)
    if ok then
      dist._armed[dp] = nil
      rawset(dp, "_next_weight", nil)
      ok, err = pcall(syncer.finish)
    end
  else
    ok, err = pcall(raw_backward, t, g, retain, ...)
  end
  if not ok then
    for dp in pairs(dist._armed) do dist._armed[dp] = nil end  -- a failed backward syncs nothing
    -- blame the caller's line (the engine's message would name this wrapper's)
    if type(err) == "string" then err = err:gsub("^[^\n]-distributed%.lua:%d+: ", "") end
    error(err, 2)
  end
  if #list ~= 1 then
    for _, dp in ipairs(list) do dp:sync_grads(rawget(dp, "_next_weight")); rawset(dp, "_next_weight", nil) end
  end
end

-- data_parallel(model, opts) -> a DataParallel module (model itself when already wrapped)
function dist.data_parallel(model, opts)
  if getmetatable(model) == DataParallel then return model end
  return DataParallel(model, opts)
end

------------------------------------------------------------------------------------------------
-- tensor parallel (keng.tensor_parallel): a causal LM's attention and MLP split over the ranks

-- tensor_parallel(lm) -> lm sharded in place (Megatron-LM column/row-parallel projections)
function dist.tensor_parallel(lm)
  local m = require("keng.tensor_parallel").tensor_parallel(lm, 3)
  return m                                                          -- no tail call: level 3 is the caller
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
