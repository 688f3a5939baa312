-- busy_drop.lua — how soon the adaptive thread count (engine/core/threads.c) reacts: runs 192x192
-- matmuls for 1 s and prints the ms from the first op until the count first dropped below 2, and
-- how many of the ops ran at 2 threads. Run it beside a busy loop of keng's priority:
--   setsid bash -c '(while :; do :; done) & l=$!; sleep 0.2; keng scripts/bench/busy_drop.lua; kill $l'
-- On an idle machine it prints "never" (the count stays at the maximum).
local a = keng.randn({192, 192})
local function now_ms() local p = io.popen("date +%s%N") local t = p:read("n") p:close() return t / 1e6 end
a:matmul(a) -- the first op starts the measuring
local t0, drop = now_ms(), nil
local at2, n = 0, 0
while true do
  for _ = 1, 20 do
    if keng.thread_policy().current >= 2 then at2 = at2 + 1 end
    n = n + 1
    a:matmul(a)
  end
  local t = now_ms() - t0
  if not drop and keng.thread_policy().current < 2 then drop = t end
  if t > 1000 then break end
end
io.write(string.format("first drop at %s ms; %d of %d ops at 2 or more threads\n",
  drop and string.format("%.0f", drop) or "never", at2, n))
