-- timing.lua — the one timer of the tests/lab micro-benchmarks (peer: timing.py): median process
-- CPU time (os.clock) of `runs` calls after one warm-up call, a full collection before each.
-- CPU time counts every thread, so the benches run with KENG_NUM_THREADS=1.
local M = {}

function M.median(xs)
  table.sort(xs)
  return xs[(#xs + 1) // 2]
end

-- returns a function time(fn) -> median seconds over `runs` calls; clock defaults to os.clock
-- (process CPU time), keng.time gives wall-clock seconds (multi-threaded runs)
function M.timer(runs, clock)
  clock = clock or os.clock
  return function(fn)
    fn()
    local ts = {}
    for i = 1, runs do
      collectgarbage()
      local t0 = clock()
      fn()
      ts[i] = clock() - t0
    end
    return M.median(ts)
  end
end

return M
