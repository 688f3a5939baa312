-- argmax_bench.lua — argmax over a [32, 32000] bf16 tensor (a batch-32 greedy decode step's pick
-- over the logits), 1 thread, process CPU us per call: best of 5 loops of 300 calls (not a test).
-- A/B: run it with the two builds' keng binaries, alternated.
--   keng tests/lab/argmax_bench.lua
local keng = keng or require "keng"
keng.set_num_threads(1)
keng.manual_seed(0)
local x = keng.randn({32, 32000}):to("bf16")
local n = 300
for _ = 1, 20 do x:argmax(-1) end
local best = math.huge
for _ = 1, 5 do
  local c0 = os.clock()
  for _ = 1, n do x:argmax(-1) end
  best = math.min(best, (os.clock() - c0) / n)
end
print(string.format("argmax bf16 [32,32000] 1 thread: %.1f us/call (process CPU, best of 5 x %d)", best * 1e6, n))
