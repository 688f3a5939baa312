-- Run by tests/lua/distributed_spec.lua under `mpirun -np 2`: data_parallel with one-parameter
-- buckets starts each bucket's all-reduce while backward still runs (the grad-ready hook), and
-- the grads it leaves are the one-process grads of the global batch. Prints "overlap a/b".
local keng = require "keng"
local nn = require "keng.nn"
local dist = require "keng.distributed"

dist.init()
local R, W = dist.rank(), dist.world_size()
keng.manual_seed(3)
local x, y = keng.randn({8, 5}), keng.randn({8, 2})
local function model()
  keng.manual_seed(1 + R)                                           -- rank 0's weights are broadcast
  return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 6), nn.Tanh(), nn.Linear(6, 2))
end

local m = model()
local dp = dist.data_parallel(m, {bucket_mb = 1e-9})                -- every parameter its own bucket
local rows = dist.shard_rows(8)
local loss = ((dp(x:index_select(1, rows)) - y:index_select(1, rows)) ^ 2):sum() / 8 * W
loss:backward()
local s = dp.last_sync
assert(s.buckets == 6, "buckets " .. tostring(s.buckets))
-- the first layer's parameters are final only when backward's last node has run, and the hook
-- fires after it, still inside backward: every bucket starts before backward returns
assert(s.started_in_backward == s.buckets, "started in backward " .. s.started_in_backward .. " of " .. s.buckets)

-- the averaged grads equal one process's grads of the whole batch (rank 0's weights)
local ref = model()
keng.no_grad(function() for i, p in ipairs(ref:parameters()) do p:copy_(m:parameters()[i]) end end)
local full = ((ref(x) - y) ^ 2):sum() / 8
full:backward()
local maxd = 0
for i, p in ipairs(m:parameters()) do maxd = math.max(maxd, (p.grad - ref:parameters()[i].grad):abs():max():item()) end
assert(maxd < 1e-6, "grads differ from the global batch's by " .. maxd)
if R == 0 then print(string.format("overlap %d/%d max grad diff %.3g", s.started_in_backward, s.buckets, maxd)) end
