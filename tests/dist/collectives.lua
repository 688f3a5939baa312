-- Run by tests/lua/distributed_spec.lua as `mpirun -np 2 ... keng tests/dist/collectives.lua`:
-- every collective on every dtype against the values each rank can compute for itself. Prints
-- "rank R ok" at the end; any failed check raises (the job then exits non-zero).
local keng = require "keng"
local dist = require "keng.distributed"

local W = dist.init()
local R = dist.rank()
assert(W == 2, "run with 2 ranks, got " .. W)
assert(dist.available().mpi == true)

local function check(got, want, what)
  local g, w = got:double():tolist(), want:double():tolist()
  local function flat(t, out) out = out or {}
    for _, v in ipairs(t) do if type(v) == "table" then flat(v, out) else out[#out + 1] = v end end
    return out end
  g, w = flat(g), flat(w)
  assert(#g == #w, what .. ": " .. #g .. " values, want " .. #w)
  for i = 1, #g do
    if math.abs(g[i] - w[i]) > 1e-6 * math.max(1, math.abs(w[i])) then
      error(string.format("%s on rank %d: value %d is %.9g, want %.9g", what, R, i, g[i], w[i]))
    end
  end
end

-- rank r holds base * (r + 1) + r: sums, maxima and minima follow
local base = {{1, -2, 3}, {4, 5, -6}}
local function mine(dt, r)
  r = r or R
  return (keng.tensor(base, {dtype = "f64"}) * (r + 1) + r):to(dt)
end
for _, dt in ipairs({"f32", "f64", "bf16", "i32", "i64"}) do
  local a, b = mine(dt, 0):double(), mine(dt, 1):double()
  local sum = a + b
  local t = mine(dt)
  assert(rawequal(dist.all_reduce(t), t), "all_reduce returns its tensor")
  check(t, sum, "all_reduce sum " .. dt)
  check(dist.all_reduce(mine(dt), {op = "max"}), keng.maximum and keng.maximum(a, b) or b, "all_reduce max " .. dt)
  check(dist.all_reduce(mine(dt), {op = "min"}), a:lt(b):double() * a + a:ge(b):double() * b, "all_reduce min " .. dt)
  if dt ~= "i32" and dt ~= "i64" then check(dist.all_reduce(mine(dt), {op = "avg"}), sum / 2, "all_reduce avg " .. dt) end
  -- broadcast from root 1 (0-based): everyone ends with rank 1's values
  check(dist.broadcast(mine(dt), 1), b, "broadcast root 1 " .. dt)
  -- all_gather: a new dim 1 in rank order
  local g = dist.all_gather(mine(dt))
  assert(g.dtype == dt and table.concat(g.shape, ",") == "2,2,3", "all_gather shape " .. table.concat(g.shape, ","))
  check(g, keng.stack({a, b}, 1), "all_gather " .. dt)
  -- reduce_scatter: rank r gets row r + 1 of the sum
  local rs = dist.reduce_scatter(mine(dt))
  assert(rs.dtype == dt and table.concat(rs.shape, ",") == "1,3", "reduce_scatter shape")
  check(rs, sum:narrow(1, R + 1, 1), "reduce_scatter " .. dt)
end

-- a non-contiguous tensor: written back through its view
local m = mine("f32"):transpose(1, 2)
dist.all_reduce(m)
check(m, (mine("f64", 0) + mine("f64", 1)):transpose(1, 2), "all_reduce non-contiguous")

-- shape mismatch: both ranks raise, naming each rank's shape
local ok, err = pcall(dist.all_reduce, keng.zeros({R + 1, 2}))
assert(not ok and err:find("rank 0 f32 cpu[1,2], rank 1 f32 cpu[2,2]", 1, true), "mismatch message: " .. tostring(err))
ok, err = pcall(dist.broadcast, keng.zeros({2}), 2)
assert(not ok and err:find("root 2 is not a rank", 1, true), tostring(err))
ok, err = pcall(dist.all_reduce, keng.zeros({2}), {op = "prod"})
assert(not ok and err:find("unknown op 'prod'", 1, true), tostring(err))
ok, err = pcall(dist.all_reduce, keng.zeros({2}), {opp = "sum"})
assert(not ok and err:find("opp", 1, true), tostring(err))
ok, err = pcall(dist.reduce_scatter, keng.zeros({3}))
assert(not ok and err:find("multiple of the world size 2", 1, true), tostring(err))

dist.barrier()
print("rank " .. R .. " ok")
