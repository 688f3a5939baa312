-- distributed_spec.lua — keng.distributed: world size 1 in this process (no launcher), and the
-- 2-rank scripts of tests/dist/ under mpirun (Open MPI, shared memory only; root allowed for CI
-- containers).
local keng = require "keng"
local dist = require "keng.distributed"
local H = require "helper"

local sh_quote, run_capture, root = H.sh_quote, H.run, H.root
local KENG = H.keng_bin()

-- Open MPI's runtime keeps process-lifetime allocations, some in plugins it dlcloses (LeakSanitizer
-- sees "<unknown module>", so no suppression can name them): the ranks of a sanitizer build run
-- without leak detection; keng's own leaks are checked by every other spec and tests/sanitize.
local ASAN_RANKS = "ASAN_OPTIONS=" .. sh_quote((os.getenv("ASAN_OPTIONS") or "") .. ":detect_leaks=0")

local function mpirun(script, env)
  local cmd = "cd " .. sh_quote(root) .. " && " .. (env or "") .. " " .. ASAN_RANKS .. " OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " ..
    "OMPI_MCA_btl=self,vader OMPI_MCA_rmaps_base_oversubscribe=1 timeout 60 mpirun -np 2" ..
    " --oversubscribe --allow-run-as-root " .. sh_quote(KENG) .. " " .. script .. " 2>&1"
  return run_capture(cmd)
end

describe("keng.distributed, world size 1 (no mpirun)", function()
  it("is rank 0 of 1 without starting MPI", function()
    assert.are.equal(1, dist.init())
    assert.are.equal(0, dist.rank())
    assert.are.equal(1, dist.world_size())
    assert.are.equal(0, dist.local_rank())
    assert.is_false(dist.available().mpi)
    dist.barrier()
  end)

  it("collectives leave the values and return their tensor", function()
    local t = keng.tensor({1.5, -2, 3})
    assert.are.equal(t, dist.all_reduce(t, {op = "avg"}))
    assert.are.same({1.5, -2, 3}, t:tolist())
    assert.are.same({1.5, -2, 3}, dist.broadcast(t, 0):tolist())
    assert.are.same({{1.5, -2, 3}}, dist.all_gather(t):tolist())
    assert.are.same({1, 2}, dist.reduce_scatter(keng.tensor({1, 2}, {dtype = "i32"})):tolist())
  end)

  it("cuda tensors go through NCCL even alone (runs where a GPU exists)", function()
    if not keng.cuda.is_available() then return end
    assert.is_true(dist.available().nccl)
    for _, dt in ipairs({"f32", "bf16", "i64"}) do
      local t = keng.tensor({{1, -2, 3}, {4, 5, 6}}, {dtype = dt, device = "cuda"})
      assert.are.equal(t, dist.all_reduce(t, {op = "max"}))
      assert.are.same({{1, -2, 3}, {4, 5, 6}}, t:cpu():tolist())
      assert.are.same({{1, -2, 3}, {4, 5, 6}}, dist.broadcast(t:transpose(1, 2), 0):transpose(1, 2):cpu():tolist())
      assert.are.same({{{1, -2, 3}, {4, 5, 6}}}, dist.all_gather(t):cpu():tolist())
      assert.are.same({{1, -2, 3}, {4, 5, 6}}, dist.reduce_scatter(t):cpu():tolist())
    end
  end)

  it("refuses bad arguments naming them", function()
    local function err(f, ...) local ok, e = pcall(f, ...); assert.is_false(ok); return e end
    assert.truthy(err(dist.broadcast, keng.zeros({2}), 1):find("root 1 is not a rank (world size 1", 1, true))
    assert.truthy(err(dist.all_reduce, keng.zeros({2}), {op = "prod"}):find("unknown op 'prod' (valid: avg, max, min, sum)", 1, true))
    assert.truthy(err(dist.all_reduce, keng.zeros({2}), {ops = "sum"}):find("ops", 1, true))
    assert.truthy(err(dist.all_reduce, keng.zeros({2}, {dtype = "i64"}), {op = "avg"}):find('op "avg" needs a float tensor, got i64', 1, true))
    assert.truthy(err(dist.all_reduce, keng.zeros({2}, {dtype = "bool"})):find("bool tensors cannot be reduced", 1, true))
    assert.truthy(err(dist.data_parallel, {}):find("model must be a keng.nn module", 1, true))
    local nn = require "keng.nn"
    assert.truthy(err(dist.data_parallel, nn.Linear(2, 2), {bucket = 1}):find("bucket", 1, true))
    local huge = keng.zeros({1}, {dtype = "u8"}):expand({2 ^ 31})      -- a view: nothing allocated
    assert.truthy(err(dist.broadcast, huge, 0):find("broadcast: u8 [2147483648] is over 2^31 - 1 bytes", 1, true))
    local w = keng.zeros({2}, {requires_grad = true})
    assert.truthy(err(dist.all_reduce, w):find("all_reduce", 1, true))
  end)

  it("data_parallel runs the model; fit{distributed = true} equals a plain fit", function()
    local nn, train = require "keng.nn", require "keng.train"
    local function one(distributed)
      keng.manual_seed(3)
      local m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
      local x = keng.randn({10, 4})
      local h = train.fit(m, {x = x, y = x:sum(2, true)}, {loss = "mse", optimizer = "sgd", lr = 0.05,
        epochs = 2, batch_size = 4, verbose = 0, distributed = distributed})
      return m, h
    end
    local m1, h1 = one(nil)
    local m2, h2 = one(true)
    for i, p in ipairs(m1:parameters()) do
      assert.is_true((p - m2:parameters()[i]):abs():max():item() < 1e-6)
    end
    assert.are.same(h1.steps, h2.steps)
    local dp = dist.data_parallel(m1)
    assert.are.equal(dp, dist.data_parallel(dp))
    local x = keng.randn({3, 4})
    assert.are.same(m1(x):tolist(), keng.no_grad(function() return dp(x) end):tolist())
    assert.is_nil(next(dist._armed))
    -- a backward after a training forward leaves grads synced (world size 1: unchanged) and disarms
    local l = dp(x):sum()
    assert.truthy(dist._armed[dp])
    l:backward()
    assert.is_nil(dist._armed[dp])
    assert.truthy(m1:parameters()[1].grad)
    local ok, e = pcall(function() local s = dp(x):sum(); s:backward({retain = true}) end)
    assert.is_false(ok)
    assert.truthy(e:find("distributed_spec.lua:%d+: backward: unknown option 'retain'"), e)
    local a, b = m1:state_dict(), dp:state_dict()     -- the model's names, no "module." prefix
    for k, v in pairs(a) do assert.are.same(v:tolist(), b[k]:tolist()) end
    for k in pairs(b) do assert.truthy(a[k], k) end
  end)
end)

describe("backward's grad-ready hook", function()
  local nn = require "keng.nn"
  local C = keng._distributed

  it("reports each watched leaf once, as soon as its grad is final, last layer first", function()
    keng.manual_seed(2)
    local m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    local ps = m:parameters()                                        -- w1 b1 w2 b2 w3 b3
    local x = keng.randn({5, 3})
    local want = {}
    local l = (m(x) * m(x)):sum()                                    -- every layer used twice
    l:backward({retain_graph = true})
    for i, p in ipairs(ps) do want[i] = p.grad:clone(); p.grad = nil end
    local seen, at = {}, {}
    C.backward_hooked(l, nil, false, ps, function(i)
      assert.is_nil(seen[i], "reported twice")
      seen[i] = true
      at[#at + 1] = i
      assert.are.same(want[i]:tolist(), ps[i].grad:tolist())       -- final when reported
    end)
    assert.are.equal(6, #at)
    local pos = {}
    for k, i in ipairs(at) do pos[i] = k end
    assert.is_true(math.max(pos[5], pos[6]) < math.min(pos[3], pos[4]), table.concat(at, " "))
    assert.is_true(math.max(pos[3], pos[4]) < math.min(pos[1], pos[2]), table.concat(at, " "))
  end)

  it("ignores leaves it does not watch, reports a leaf root, and stops on the hook's error", function()
    local a, b = keng.randn({3}):requires_grad_(), keng.randn({3}):requires_grad_()
    local got = {}
    C.backward_hooked((a * b):sum(), nil, false, {b}, function(i) got[#got + 1] = i end)
    assert.are.same({1}, got)
    got = {}
    C.backward_hooked(a, keng.ones({3}), false, {a}, function(i) got[#got + 1] = i end)
    assert.are.same({1}, got)
    local ok, e = pcall(C.backward_hooked, (a * b):sum(), nil, false, {a, b}, function() error("hook says no") end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find("hook says no"), e)
  end)

  it("data_parallel at world size 1 starts its buckets inside backward", function()
    keng.manual_seed(4)
    local m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    local dp = dist.data_parallel(m, {bucket_mb = 1e-9})
    dp(keng.randn({2, 3})):sum():backward()
    assert.are.same({buckets = 4, started_in_backward = 4}, dp.last_sync)
    local w = C.all_reduce_start(keng.ones({3}), {op = "avg"})
    assert.is_true(w:test())
    assert.are.same({1, 1, 1}, w:wait():tolist())
    assert.truthy(select(2, pcall(w.wait, w)):find("already waited"))
  end)
end)

describe("keng.tensor_parallel in one process", function()
  local tp = require "keng.tensor_parallel"
  local mistral = require "models.mistral"
  local function small(over)
    local cfg = mistral.config("mistral_tiny")
    cfg.vocab, cfg.layers, cfg.qkv_bias, cfg.o_bias = 64, 1, true, true
    for k, v in pairs(over or {}) do cfg[k] = v end
    keng.manual_seed(5)
    return mistral.build(cfg)
  end
  local function err(f) local ok, e = pcall(f); assert.is_false(ok); return e end

  it("keeps rank r's heads of q/k/v and gate/up, and the matching input columns of o/down", function()
    local lm = small()
    local a, mlp = lm.model.layers[1].self_attn, lm.model.layers[1].mlp  -- H 8, Hkv 2, D 32, F 768
    local q, k, qb, o, ob, up, down = a.query.weight:clone(), a.key.weight:clone(), a.query.bias:clone(),
      a.output.weight:clone(), a.output.bias:clone(), mlp.up_proj.weight:clone(), mlp.down_proj.weight:clone()
    assert.are.equal(lm, tp.shard(lm, 1, 2))                           -- rank 1 of 2, no communication
    a, mlp = lm.model.layers[1].self_attn, lm.model.layers[1].mlp
    assert.are.same({4, 1}, {a.heads, a.kv_heads})
    assert.are.same(q:narrow(1, 129, 128):tolist(), a.query.weight:tolist())   -- query heads 5..8
    assert.are.same(qb:narrow(1, 129, 128):tolist(), a.query.bias:tolist())
    assert.are.same(k:narrow(1, 33, 32):tolist(), a.key.weight:tolist())       -- kv head 2
    assert.are.same(up:narrow(1, 385, 384):tolist(), mlp.up_proj.weight:tolist())
    assert.are.equal("RowParallelLinear", a.output.__name)
    assert.are.same(o:narrow(2, 129, 128):tolist(), a.output.weight:tolist())
    assert.are.same(ob:tolist(), a.output.bias:tolist())                       -- replicated, added once
    assert.are.same(down:narrow(2, 385, 384):tolist(), mlp.down_proj.weight:tolist())
    assert.are.same({3, 1, 7, 32}, lm:new_cache(3, 7)[1].k.shape)              -- the rank's kv heads
    assert.is_false(a.query.weight.requires_grad)                              -- inference only
    assert.truthy(err(function() lm:save_pretrained("/nonexistent") end):find("holds 1/2 of its weights", 1, true))
  end)

  it("at world size 1 is the same model", function()
    local ids = keng.tensor({{3, 9, 1, 40}}, {dtype = "i64"})
    local lm = small()
    local want = keng.no_grad(function() return lm:logits(ids) end)
    local greedy = lm:generate({{3, 9}}, {max_new_tokens = 5})[1]
    assert.are.equal(lm, dist.tensor_parallel(lm))
    assert.is_true((lm:logits(ids) - want):abs():max():item() < 1e-6)
    assert.are.same(greedy, lm:generate({{3, 9}}, {max_new_tokens = 5})[1])
  end)

  it("holds about half a 7B model per rank at 2 ranks (meta: shapes only)", function()
    local lm = mistral.from_preset("mistral_7b_en", {dtype = "bf16", device = "meta"})
    local s0, t0 = tp.parameter_bytes(lm)
    tp.shard(lm, 0, 2)
    local s1, t1 = tp.parameter_bytes(lm)
    assert.are.equal(s0, 2 * s1)
    assert.are.equal(t0 - s1, t1)
    assert.is_true(t1 / t0 < 0.52, tostring(t1 / t0))                         -- 6.99 of 13.49 GiB
  end)

  it("sets up its devices (a cuda device's NCCL communicator) when made and moved, not at a collective", function()
    local C = keng._distributed
    local real, seen = C.setup, {}
    C.setup = function(d) seen[#seen + 1] = d; return real(d) end
    local ok, e = pcall(function()
      local lm = small()
      dist.tensor_parallel(lm)
      assert.are.same({"cpu"}, seen)                                  -- one call per device
      assert.are.equal(lm, lm:to("f64"))                              -- moved: its device again
      assert.are.same({"cpu", "cpu"}, seen)
      assert.are.equal("f64", lm.model.layers[1].self_attn.output.weight.dtype)
      dist.data_parallel(require("keng.nn").Linear(2, 2))
      assert.are.same({"cpu", "cpu", "cpu"}, seen)
    end)
    C.setup = real
    assert(ok, e)
    dist.setup("cpu")
    dist.setup("meta")
    assert.truthy(err(function() dist.setup("tpu") end):find("unknown device 'tpu'", 1, true))
    if not dist.available().nccl then
      assert.truthy(err(function() dist.setup("cuda:0") end):find(
        "distributed_spec.lua:%d+: setup: cuda tensors need NCCL, and this keng was built without it"))
    elseif keng.cuda.is_available() then                              -- a communicator of one, then used
      dist.setup("cuda")
      local t = keng.tensor({1, 2}, {device = "cuda"})
      assert.are.same({1, 2}, dist.all_reduce(t):cpu():tolist())
    end
  end)

  it("refuses what it cannot split, naming it", function()
    local lora = require "keng.lora"
    assert.truthy(err(function() tp.shard(small({kv_heads = 1}), 0, 2) end):find(
      "distributed_spec.lua:%d+: tensor_parallel: num_key_value_heads 1 must be a multiple of the world size 2"))
    assert.truthy(err(function() tp.shard(small({heads = 6, kv_heads = 3, ffn = 765}), 0, 2) end):find(
      "num_key_value_heads 3 and intermediate_size 765 must be a multiple of the world size 2", 1, true))
    local lm = small()
    lora.enable(lm, {targets = {"value"}, rank = 2})
    assert.truthy(err(function() tp.shard(lm, 0, 2) end):find(
      "distributed_spec.lua:%d+: tensor_parallel: layer 1 self_attn.value is a Linear with LoRA adapters"))
    lm = small():quantize("int8")
    assert.truthy(err(function() tp.shard(lm, 0, 2) end):find("self_attn.query is a quantized Linear", 1, true))
    assert.truthy(err(function() dist.tensor_parallel(require("keng.nn").Linear(2, 2)) end):find(
      "distributed_spec.lua:%d+: tensor_parallel: a causal LM %(Gemma, Mistral, Llama, Qwen 2%) expected, got Linear"))
    lm = tp.shard(small(), 0, 1)
    assert.truthy(err(function() dist.tensor_parallel(lm) end):find("the model is already sharded", 1, true))
    assert.truthy(err(function() mistral.from_pretrained("tests/fixtures/mistral", {tensor_parallel = 2}) end):find(
      "distributed_spec.lua:%d+: mistral.from_pretrained: tensor_parallel must be true or false, got 2"))
    assert.truthy(err(function() mistral.from_pretrained("/nonexistent", {tensor_paralel = true}) end):find(
      "unknown option 'tensor_paralel' (valid: device, dtype, tensor_parallel)", 1, true))
  end)
end)

describe("keng.distributed's backends", function()
  it("available() says which this keng was built with", function()
    local a = dist.available()
    assert.are.equal("boolean", type(a.mpi_built))
    assert.are.equal("boolean", type(a.nccl))
    if a.mpi_built then return end
    -- built without MPI: a launched rank refuses to run alone as rank 0 of 1
    local out, code = run_capture("OMPI_COMM_WORLD_SIZE=2 " .. sh_quote(KENG) ..
      [[ -e 'require("keng.distributed").init()' 2>&1]])
    assert.are_not.equal(0, code, out)
    assert.truthy(out:find("(command line):1: distributed.init: this process was started by an MPI launcher, but this keng was " ..
      "built without MPI", 1, true), out)
  end)
end)

-- (a keng built without MPI (cmake -DKENG_MPI=OFF) runs world size 1 only: the block above)
;(dist.available().mpi_built and describe or function() end)("keng.distributed, 2 ranks under mpirun", function()
  local have = os.execute("command -v mpirun >/dev/null 2>&1")

  it("every collective on every dtype, broadcast from rank 1, gather order, errors", function()
    assert.is_true(have, "mpirun not found (make setup installs openmpi-bin)")
    local out, code = mpirun("tests/dist/collectives.lua")
    assert.are.equal(0, code, out)
    assert.truthy(out:find("rank 0 ok", 1, true), out)
    assert.truthy(out:find("rank 1 ok", 1, true), out)
  end)

  it("data-parallel fit over 2 ranks gives the one-process weights", function()
    local out, code = mpirun("tests/dist/dp_fit.lua")
    assert.are.equal(0, code, out)
    assert.truthy(out:find("rank 1 ok", 1, true), out)
    local maxd = tonumber(out:match("max weight diff (%S+)"))
    assert.is_true(maxd ~= nil and maxd < 1e-5, out)
    assert.truthy(out:find("list batches: max weight diff", 1, true), out)
    local _, bars = out:gsub("Epoch 1/1 %-", "")
    assert.are.equal(1, bars, out)                  -- rank 0 prints, rank 1 is silent
  end)

  it("starts every bucket's all-reduce inside backward; the grads are the global batch's", function()
    local out, code = mpirun("tests/dist/dp_overlap.lua")
    assert.are.equal(0, code, out)
    assert.truthy(out:find("overlap 6/6"), out)
  end)

  it("tensor-parallel gemma_tiny and mistral_tiny give one rank's logits and tokens", function()
    local dir = H.tmpdir()
    local out, code = mpirun("tests/dist/tp_generate.lua " .. sh_quote(dir))
    os.execute("rm -rf " .. sh_quote(dir))
    assert.are.equal(0, code, out)
    for r = 0, 1 do
      for _, name in ipairs({"gemma_tiny", "mistral_tiny"}) do
        assert.truthy(out:find("rank " .. r .. " " .. name .. ": logits max diff", 1, true), out)
      end
      assert.truthy(out:find("rank " .. r .. " biases: logits max diff", 1, true), out)
      for _, f in ipairs({"llama", "qwen2", "mistral"}) do
        assert.truthy(out:find("rank " .. r .. " fixture " .. f .. ": logits max diff", 1, true), out)
      end
      assert.truthy(out:find("rank " .. r .. " bad head counts raise", 1, true), out)
      assert.truthy(out:find("rank " .. r .. " from_pretrained: logits max diff", 1, true), out)
      assert.truthy(out:find("rank " .. r .. " ok", 1, true), out)
    end
  end)

  it("scripts/bench/dist_scaling.lua times BERT fit at 1 and 2 ranks", function()
    local out_json = H.tmpname(".json")
    local out, code = run_capture("cd " .. sh_quote(root) .. " && " .. ASAN_RANKS ..
      " OMPI_MCA_btl=self,vader timeout 120 " .. sh_quote(KENG) ..
      " scripts/bench/dist_scaling.lua --steps 1 --warmup 0 --json " .. sh_quote(out_json) .. " 2>&1")
    assert.are.equal(0, code, out)
    assert.truthy(out:find("2 ranks: +[%d.]+ ms/step +[%d.]+ samples/s +speedup [%d.]+x +scaling efficiency %d+%%"), out)
    local r = H.read_json(out_json)
    os.remove(out_json)
    assert.are.same({2, 32, "bert_tiny", 1}, {r.ranks, r.global_batch, r.preset, r.buckets_started_in_backward})
    assert.is_true(r.ms_1 > 0 and r.ms_n > 0 and r.cpu_ms_1 > 0 and r.cpu_ms_n > 0, out)
    assert.is_true(math.abs(r.efficiency - r.ms_1 / r.ms_n / 2) < 1e-9)
  end)

  it("dist_scaling.lua stops on an argument it does not know, naming it", function()
    for args, named in pairs({["--stepz 3"] = "--stepz", ["--steps 3 extra"] = "extra"}) do
      local out, code = run_capture("cd " .. sh_quote(root) .. " && " .. sh_quote(KENG) ..
        " scripts/bench/dist_scaling.lua " .. args .. " 2>&1")
      assert.are_not.equal(0, code, out)
      assert.truthy(out:find("dist_scaling: unknown argument '" .. named .. "'", 1, true), out)
    end
  end)

  it("keng --nproc N starts N ranks through mpirun; a rank's error fails the launch", function()
    local run = "cd " .. sh_quote(root) .. " && " .. ASAN_RANKS .. " OMPI_MCA_btl=self,vader timeout 60 " .. sh_quote(KENG)
    local out, code = run_capture(run .. [[ --nproc 2 -e 'local d = require "keng.distributed"; d.init()
      print("rank " .. d.rank() .. " of " .. d.world_size())' 2>&1]])
    assert.are.equal(0, code, out)
    assert.truthy(out:find("rank 0 of 2"), out)
    assert.truthy(out:find("rank 1 of 2"), out)
    out, code = run_capture(run .. [[ --nproc 2 -e 'local d = require "keng.distributed"; d.init()
      if d.rank() == 1 then error("rank one fails") end d.barrier()' 2>&1]])
    assert.are_not.equal(0, code, out)
    assert.truthy(out:find("rank one fails"), out)
    for _, bad in ipairs({"0", "2x", "-1", ""}) do
      out, code = run_capture(run .. " --nproc " .. sh_quote(bad) .. " -e 'print(1)' 2>&1")
      assert.are.equal(1, code, out)
      assert.truthy(out:find("--nproc needs a number of ranks from 1 to 4096", 1, true), out)
    end
    out, code = run_capture(run .. " --nproc 2>&1")
    assert.truthy(out:find("got nothing", 1, true), out)
    out, code = run_capture(run .. " --nproc 1 --nproc 1 -e 'print(1)' 2>&1")
    assert.are.equal(1, code, out)
    assert.truthy(out:find("--nproc inside an MPI job", 1, true), out)
  end)

  it("a collective that waits longer than KENG_DIST_TIMEOUT raises on the waiting rank", function()
    local t0 = keng.time()
    local out, code = mpirun("tests/dist/timeout.lua", "KENG_DIST_TIMEOUT=1")
    assert.are_not.equal(0, code, out)
    assert.truthy(out:find("all_reduce: rank 0 waited 1 s for the other ranks (KENG_DIST_TIMEOUT)", 1, true), out)
    assert.is_true(keng.time() - t0 < 15, "the job was not ended by the timeout")
  end)

  it("a rank that raises ends the whole job non-zero, naming the rank", function()
    local f = os.tmpname()
    local h = assert(io.open(f, "w"))
    h:write([[local dist = require "keng.distributed"; dist.init()
      if dist.rank() == 1 then error("boom on purpose") end
      dist.barrier()]])
    h:close()
    local out, code = mpirun(f)
    os.remove(f)
    assert.are_not.equal(0, code, out)
    assert.truthy(out:find("boom on purpose", 1, true), out)
    assert.truthy(out:find("rank 1 exited with status 1", 1, true), out)
  end)
end)
