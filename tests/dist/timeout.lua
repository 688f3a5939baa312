-- Run by tests/lua/distributed_spec.lua under `mpirun -np 2` with KENG_DIST_TIMEOUT=1: rank 1
-- never joins the all_reduce; rank 0's collective gives up and the job ends non-zero.
local keng = require "keng"
local dist = require "keng.distributed"
dist.init()
if dist.rank() == 1 then
  local t0 = keng.time()
  while keng.time() - t0 < 20 do end   -- busy elsewhere, not exited
end
dist.all_reduce(keng.ones({4}))
