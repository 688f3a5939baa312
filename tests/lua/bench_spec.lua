-- bench_spec.lua — the benchmark suite: keng.bench statistics and timing rules, keng.image PNG
-- files and drawing, the JSON reader/writer, and a CI smoke run of
-- `keng scripts/bench/all.lua --steps 2 --only bert --out <tmp>` as a child process whose JSON
-- is checked against the schema; every row of config.lua must have its model file and a bench
-- file with a run(row, ctx) entry point, so that no row prints "not implemented".
local keng = require "keng"
local H = require "helper"

local root = debug.getinfo(1, "S").source:match("^@(.*)/tests/lua/bench_spec.lua$") or "."
package.path = root .. "/scripts/?.lua;" .. package.path
local bench = require "keng.bench"
local image = require "keng.image"
local json = require "keng.json"
local config = require "bench.config"

local sh_quote = H.sh_quote
local tmp = H.tmpdir()

describe("keng.bench statistics", function()
  it("timer: one warm-up call, then the median and the fastest of runs calls on the given clock", function()
    local now, calls = 0, 0
    local clock = function() return now end
    local dts = {0, 5, 1, 3, 2}                                       -- warm-up, then 4 timed calls
    local time = bench.timer(4, clock)
    local med, min = time(function() calls = calls + 1; now = now + dts[calls] end)
    assert.are.equal(5, calls)
    assert.are.equal(2.5, med)                                        -- median of {5, 1, 3, 2}
    assert.are.equal(1, min)
  end)


  it("computes mean, median, min, max and sample stddev", function()
    local s = bench.stats({4, 1, 3, 2})
    assert.are.equal(4, s.n)
    H.close(s.mean, 2.5)
    H.close(s.median, 2.5)
    assert.are.equal(1, s.min)
    assert.are.equal(4, s.max)
    H.close(s.stddev, math.sqrt(5 / 3), 1e-12)                      -- sum of squares 5, n - 1 = 3
    local odd = bench.stats({7, 1, 5})
    assert.are.equal(5, odd.median)
    assert.are.equal(0, bench.stats({3}).stddev)
  end)

  it("rejects an empty sample and bad steps", function()
    H.raises(function() bench.stats({}) end, "empty sample")
    H.raises(function() bench.run(function() end, {steps = 0}) end, "steps must be >= 1")
    H.raises(function() bench.run(42) end, "expected a function")
  end)

  it("excludes the warm-up calls from the clock and counts FLOPs of timed steps only", function()
    local calls = {}
    local a, b = keng.randn({16, 32}), keng.randn({32, 8})
    local r = bench.run(function(i)
      calls[#calls + 1] = i
      if i < 0 then
        local t0 = keng.time()
        while keng.time() - t0 < 0.05 do end                         -- a slow "compile" step
      end
      return a:matmul(b)
    end, {steps = 3, warmup = 2, items = 16})
    assert.are.same({-1, -2, 1, 2, 3}, calls)
    assert.are.equal(3, r.steps)
    assert.are.equal(3, #r.times_ms)
    assert.is_true(r.mean_ms < 50, "warm-up leaked into the timed steps: " .. r.mean_ms)
    assert.is_true(r.min_ms <= r.median_ms and r.median_ms <= r.max_ms)
    assert.are.equal(2 * 16 * 32 * 8, r.flops_per_step)              -- matmul FLOPs per step
    assert.is_true(r.items_per_s > 0)
  end)

  -- on a simulated clock (fn(k) takes exactly 10 ms fixed + 2 ms per call), so the rule is
  -- checked exactly however loaded the machine is (a busy-wait on the wall clock was not)
  it("applies the difference rule for generate: (t(long) - t(short)) / (long - short)", function()
    local seen, now = {}, 0
    local clock = function() return now end
    local r = bench.run_diff(function(k)
      seen[#seen + 1] = k
      now = now + 0.010 + 0.002 * k
    end, {short = 1, steps = 5, clock = clock})
    assert.are.same({1, 1, 6}, seen)                                  -- untimed, short, long
    assert.are.equal(5, r.steps)
    H.close(r.mean_ms, 2, 1e-9)                                       -- (22 - 12) ms / 5 calls
    H.close(r.raw[1].short_ms, 12, 1e-9)
    H.close(r.raw[1].long_ms, 22, 1e-9)
    -- repeats: one value per repeat; short = 2, long = 4 given
    seen = {}
    r = bench.run_diff(function(k) seen[#seen + 1] = k; now = now + 0.010 + 0.002 * k end,
      {short = 2, long = 4, repeats = 3, clock = clock})
    assert.are.same({2, 2, 4, 2, 4, 2, 4}, seen)
    assert.are.equal(3, #r.times_ms)
    for _, ms in ipairs(r.times_ms) do H.close(ms, 2, 1e-9) end
    -- and the default clock is the wall clock: a real workload gives a time >= 0
    r = bench.run_diff(function(k) for _ = 1, k do keng.ones({64}):sum() end end, {short = 1, steps = 3})
    assert.is_true(r.mean_ms >= 0)
  end)

  -- a fake model whose generate takes 30 ms + 4 ms per new token (the CPU clock twice that), the
  -- second repeat 1 ms per token slower: the rule (long - short) / (tokens - 1), best repeat
  it("decode_per_token: the difference of two greedy generates per token, best of the repeats", function()
    local now, cpu, calls, slow = 0, 0, {}, 0
    local lm = {generate = function(_, prompts, o)
      assert.are.same({1, 3}, prompts.shape)
      assert.are.same({"greedy", 0}, {o.sampler, #o.stop_token_ids})
      calls[#calls + 1] = o.max_new_tokens
      if #calls == 4 then slow = 0.001 end                          -- the second repeat's long call
      now = now + 0.030 + (0.004 + slow) * o.max_new_tokens
      cpu = cpu + 0.060 + 0.008 * o.max_new_tokens
      slow = 0
    end}
    local wall, c = bench.decode_per_token(lm, keng.ones({1, 3}), {tokens = 9, repeats = 2,
      clock = function() return now end, cpu_clock = function() return cpu end})
    assert.are.same({2, 9, 1, 9, 1}, calls)                          -- warm-up, then long/short pairs
    H.close(wall, 0.004, 1e-12)
    H.close(c, 0.008, 1e-12)
    H.raises(function() bench.decode_per_token(lm, keng.ones({1, 3}), {tokens = 1}) end,
      "bench.decode_per_token: tokens must be >= 2, got 1")
    H.raises(function() bench.decode_per_token(lm, keng.ones({1, 3}), {repeat_ = 2}) end,
      "bench.decode_per_token: unknown option 'repeat_'")
  end)

  it("the decode rows share decode_per_token, and the llama.cpp rows one GGUF maker", function()
    -- keng_to_gguf.sh: keng's checkpoint, a stand-in tokenizer, llama.cpp's converter
    local helper = root .. "/scripts/bench/peers/keng_to_gguf.sh"
    assert.is_true(os.execute("bash -n " .. H.sh_quote(helper)) == true)
    for _, f in ipairs({"scripts/bench/quant.sh", "scripts/bench/peers/llama_cpp.sh"}) do
      local src = assert(io.open(root .. "/" .. f)):read("a")
      assert.truthy(src:find('"$ROOT/scripts/bench/peers/keng_to_gguf.sh" ', 1, true), f)
      assert.is_nil(src:find("sentencepiece_model_pb2", 1, true), f .. " keeps its own tokenizer writer")
      assert.is_nil(src:find("python3 \"$SRC/convert_hf_to_gguf.py\"", 1, true), f .. " keeps its own convert")
    end
    for _, f in ipairs({"scripts/bench/decode.lua", "tests/lab/quant_1b.lua"}) do
      local src = assert(io.open(root .. "/" .. f)):read("a")
      assert.truthy(src:find("bench\").decode_per_token(", 1, true), f)
      assert.is_nil(src:find("max_new_tokens = n", 1, true), f .. " keeps its own timing loop")
    end
  end)
end)

describe("keng.image PNG", function()
  it("round-trips RGB and gray pixels exactly", function()
    keng.manual_seed(3)
    local rgb = keng.randint(0, 256, {7, 5, 3}):to("u8")
    local path = tmp .. "/rgb.png"
    image.write_png(path, rgb)
    local back = image.read_png(path)
    assert.are.same({7, 5, 3}, back.shape)
    assert.are.equal("u8", back.dtype)
    assert.are.same(rgb:long():tolist(), back:long():tolist())
    local gray = keng.randint(0, 256, {4, 9, 1}):to("u8")
    image.write_png(tmp .. "/gray.png", gray)
    local g = image.read_png(tmp .. "/gray.png")
    assert.are.same({4, 9, 1}, g.shape)
    assert.are.same(gray:long():tolist(), g:long():tolist())
  end)

  it("writes a non-contiguous view as the pixels it shows", function()
    local base = keng.randint(0, 256, {6, 4, 3}):to("u8")
    local view = base:transpose(1, 2)                                 -- [4, 6, 3], strided
    image.write_png(tmp .. "/view.png", view)
    assert.are.same(view:long():tolist(), image.read_png(tmp .. "/view.png"):long():tolist())
  end)

  it("raises cleanly on missing, corrupt and truncated files and on bad tensors", function()
    H.raises(function() image.read_png(tmp .. "/nope.png") end, "png_read: " .. tmp .. "/nope.png")
    local f = assert(io.open(tmp .. "/bad.png", "wb"))
    f:write("\137PNG\r\n\26\n" .. string.rep("x", 40))
    f:close()
    H.raises(function() image.read_png(tmp .. "/bad.png") end, "png_read")
    -- a real PNG cut in half
    image.write_png(tmp .. "/full.png", keng.randint(0, 256, {32, 32, 3}):to("u8"))
    local whole = assert(io.open(tmp .. "/full.png", "rb")):read("a")
    f = assert(io.open(tmp .. "/half.png", "wb"))
    f:write(whole:sub(1, #whole // 2))
    f:close()
    H.raises(function() image.read_png(tmp .. "/half.png") end, "png_read")
    H.raises(function() image.write_png(tmp .. "/f.png", keng.zeros({2, 2, 3})) end, "expected u8")
    H.raises(function() image.write_png(tmp .. "/f.png", keng.zeros({2, 2, 5}, {dtype = "u8"})) end, "C in 1..4")
  end)

  it("fills clipped rectangles and draws text", function()
    local img = image.new(10, 12, {0, 0, 0})
    image.fill_rect(img, 11, 9, 5, 5, {10, 20, 30})                  -- runs off the corner
    assert.are.same({10, 20, 30}, img[10][12]:long():tolist())
    assert.are.same({10, 20, 30}, img[9][11]:long():tolist())
    assert.are.same({0, 0, 0}, img[8][11]:long():tolist())
    assert.are.equal(4 * 60, img:long():sum():item())                 -- 2x2 pixels coloured
    local t = image.new(9, 8, {0}, 1)
    image.text(t, 1, 1, "1", {255})
    -- "1": rows 04 0C 04 04 04 04 0E -> 1+2+1+1+1+1+3 = 10 pixels
    assert.are.equal(10 * 255, t:long():sum():item())
  end)
end)

describe("bench json", function()
  it("round-trips nested values and rejects malformed input", function()
    local v = {a = 1, b = {1.5, 2, "x\"y"}, c = {d = true, e = json.array()}}
    local back = json.decode(json.encode(v, {indent = "  "}))
    assert.are.equal(1, back.a)
    assert.are.same({1.5, 2, "x\"y"}, {back.b[1], back.b[2], back.b[3]})
    assert.is_true(back.c.d)
    assert.are.equal(0, #back.c.e)
    H.raises(function() json.decode("{\"a\": }") end, "json:")
    H.raises(function() json.decode("[1, 2") end, "json:")
  end)
end)

describe("benchmark config", function()
  it("holds the 12 rows of docs/benchmarks.md with both tiers", function()
    assert.are.equal(12, #config.rows)
    local ids = {}
    for _, r in ipairs(config.rows) do
      assert.is_nil(ids[r.id], "duplicate id " .. r.id)
      ids[r.id] = true
      assert.is_truthy(r.cpu and r.cpu.preset, r.id)
      assert.is_truthy(r.gpu and r.gpu.preset, r.id)
      assert.is_truthy(r.keras.best, r.id)
    end
    assert.are.same({3, 4, 6}, config.tuple(2 * 14 * 14 + 3 * 14 + 5, 3, 14))   -- base-14 digits + 1
  end)

  it("has a model file and a bench file with run(row, ctx) for every row", function()
    local spath = root .. "/scripts/?.lua;" .. root .. "/scripts/lib/?.lua"
    local families = {}
    for _, r in ipairs(config.rows) do
      assert.is_truthy(package.searchpath(r.module, spath), r.id .. ": no " .. r.module .. " (would print 'not implemented')")
      local fam = config.runners[r.family]
      assert.is_truthy(fam, r.id .. ": config.runners has no entry for family " .. r.family)
      assert.is_truthy(package.searchpath(fam, spath), r.id .. ": no " .. fam:gsub("%.", "/") .. ".lua")
      local m = require(fam)
      assert.are.equal("function", type(m.run), fam .. ".run")
      families[r.family] = true
    end
    for _, f in ipairs({"sam", "stable_diffusion", "bert", "gemma", "mistral"}) do
      assert.is_true(families[f], "config.lua has no " .. f .. " row")
    end
  end)

  it("keeps the SAM and SD rows' CPU-tier inputs of docs/benchmarks.md", function()
    local sam_cpu, sd_cpu
    for _, r in ipairs(config.rows) do
      if r.id == "sam_predict" then sam_cpu = r.cpu end
      if r.id == "sd_predict" then sd_cpu = r end
    end
    -- docs/benchmarks.md: points [[500, 375], [250, 375]] at 1024, scaled to 256; labels {1, 2}
    assert.are.same({{125, 93.75}, {62.5, 93.75}}, sam_cpu.points)
    assert.are.same({1, 2}, sam_cpu.labels)
    assert.are.equal("a photograph of an astronaut riding a horse", sd_cpu.prompt)
    assert.are.equal(13, sd_cpu.batch)
  end)
end)

describe("SAM and SD bench files (in process, shrunken rows)", function()
  -- the real rows take seconds per step on two cores; these run the same code at batch 1 and
  -- small images, one timed step, and check what each row reports
  local ctx = {tier = "cpu", steps = 1, dtype = "f32", device = "cpu"}
  local function row_of(id, over)
    for _, r in ipairs(config.rows) do
      if r.id == id then
        local c = {}
        for k, v in pairs(r) do c[k] = v end
        local cpu = {}
        for k, v in pairs(r.cpu) do cpu[k] = v end
        for k, v in pairs(over.cpu or {}) do cpu[k] = v end
        c.cpu, c.batch = cpu, over.batch or r.batch
        return c
      end
    end
  end

  it("SAM fit trains every encoder weight against an NCHW target; predict gives 4 masks + IoU", function()
    local sam = require "bench.sam"
    local r = sam.run(row_of("sam_fit", {}), ctx)
    assert.are.same({1, 3, 256, 256}, r.shapes.images)
    assert.are.same({1, 256, 16, 16}, r.shapes.target)
    assert.are.equal(r.params, r.trainable)
    assert.are.equal(1, r.steps)
    assert.is_true(r.mean_ms > 0 and r.flops_per_step > 0)
    local p = sam.run(row_of("sam_predict", {batch = 1}), ctx)
    assert.are.same({1, 4, 64, 64}, p.shapes.masks)
    assert.are.same({1, 4}, p.shapes.iou_pred)
    assert.is_true(p.params > r.params)
  end)

  it("SD fit trains the VAE encoder to 8 channels; predict applies the difference rule", function()
    local sd = require "bench.stable_diffusion"
    local r = sd.run(row_of("sd_fit", {batch = 1, cpu = {image = 32, target = {4, 4, 8}}}), ctx)
    assert.are.same({1, 8, 4, 4}, r.shapes.target)
    assert.are.equal(r.params, r.trainable)
    local p = sd.run(row_of("sd_predict", {batch = 1, cpu = {image = 64}}), ctx)
    assert.are.same({1, 64, 64, 3}, p.shapes.images)
    assert.are.same({1, 4, 8, 8}, p.shapes.latents)
    assert.are.equal(2, p.short)
    assert.are.equal(3, p.long)                                       -- (t(2 + 1) - t(2)) / 1
    assert.are.equal("(t(3 steps) - t(2 steps)) / 1", p.rule)
    assert.are.equal(1, #p.raw)
  end)
end)

describe("all.lua smoke (child process)", function()
  local KENG = H.keng_bin()

  it("runs --steps 2 --only bert --profile 3 --tf32 and writes a JSON that follows the schema", function()
    assert.is_truthy(KENG, "no keng binary found (set KENG_BIN)")
    local out_dir = tmp .. "/results"
    local cmd = string.format(
      "cd %s && KENG_PROGRESS=0 %s scripts/bench/all.lua --steps 2 --only bert --profile 3 --tf32 --out %s 2>&1",
      sh_quote(root), sh_quote(KENG), sh_quote(out_dir))
    local p = io.popen(cmd)
    local out = p:read("a")
    local _, _, code = p:close()
    local p2 = io.popen("ls " .. sh_quote(out_dir) .. "/*-cpu.json 2>/dev/null")
    local file = p2:read("a"):gsub("%s+$", "")
    p2:close()
    assert.is_truthy(file ~= "", "no JSON written; output:\n" .. out)
    local doc = json.decode(assert(io.open(file)):read("a"))
    assert.are.equal("keng-bench/1", doc.schema)
    assert.are.equal("cpu", doc.tier)
    assert.are.equal(2, doc.steps)
    assert.is_string(doc.commit)
    assert.is_string(doc.device)
    assert.is_number(doc.threads)
    assert.are.equal(keng.version, doc.keng_version)
    assert.are.equal(true, doc.tf32)                                     -- --tf32 lands in the JSON
    assert.is_truthy(out:find("· TF32 on", 1, true), out)               -- and in the header line
    assert.are.equal(2, #doc.rows)
    for _, r in ipairs(doc.rows) do
      for _, k in ipairs({"id", "row", "task", "dtype", "tier", "device", "status", "preset"}) do
        assert.is_string(r[k], "row field " .. k)
      end
      assert.is_number(r.batch)
      assert.are.equal("f32", r.dtype)
      if r.status == "ok" then
        for _, k in ipairs({"mean_ms", "median_ms", "min_ms", "stddev_ms", "steps", "tflops", "threads", "peak_memory_bytes"}) do
          assert.is_number(r[k], r.id .. " field " .. k)
        end
        assert.are.equal(2, r.steps)
        assert.are.equal(2, #r.times_ms)
        -- the roofline (bench/roofline.lua): BERT's batched GEMMs are compute-bound, bytes not counted
        assert.are.equal("compute", r.bound, r.id)
        assert.is_number(r.pct_roofline, r.id)
        assert.is_number(r.flops_performed_per_step, r.id)
        assert.truthy(r.bound_basis:find("bytes not counted", 1, true), r.id)
        assert.is_true(r.min_ms <= r.mean_ms)
        assert.is_table(r.shapes.token_ids)
        -- the per-step profile: BERT's linear layers are in it, its lines carry shapes (which op
        -- costs most depends on the build: an ASan build makes reductions the costliest)
        assert.is_true(#r.profile.ops > 3 and #r.profile.entries > 3, r.id .. " profile")
        local linear
        for _, o in ipairs(r.profile.ops) do if o.op == "linear" then linear = o end end
        assert.is_true(linear and linear.calls >= 1 and linear.ms > 0 and linear.flops > 0, r.id .. " linear")
        assert.is_true(r.profile.total_ms > 0 and r.profile.total_ms <= r.max_ms * 1.01, r.id .. " profile total")
        assert.is_truthy(r.profile.entries[1].line:find("%]"), r.profile.entries[1].line)
      else
        assert.is_nil(r.mean_ms)
      end
      assert.are.equal("ok", r.status, r.id .. ": " .. tostring(r.reason))   -- never "not implemented"
    end
    assert.is_falsy(out:find("not implemented", 1, true), out)
    assert.is_truthy(out:find("(all ops)", 1, true), out)                 -- --profile printed
    assert.are.equal(0, code, out)
    assert.is_truthy(io.open((file:gsub("%.json$", ".md"))), "no Markdown file")
    local png = image.read_png((file:gsub("%.json$", ".png")))
    assert.are.equal(3, png.shape[3])
  end)

  it("records TF32 off by default on the cpu tier (on only for the gpu tier or --tf32)", function()
    assert.is_truthy(KENG, "no keng binary found")
    for i, flag in ipairs({""}) do
      local out_dir = tmp .. "/tf32-" .. i
      local p = io.popen(string.format(
        "cd %s && KENG_PROGRESS=0 %s scripts/bench/all.lua --tier cpu --steps 1 --only bert_predict %s --out %s 2>&1",
        sh_quote(root), sh_quote(KENG), flag, sh_quote(out_dir)))
      local out = p:read("a")
      local _, _, code = p:close()
      assert.are.equal(0, code, out)
      local p2 = io.popen("ls " .. sh_quote(out_dir) .. "/*-cpu.json 2>/dev/null")
      local file = p2:read("a"):gsub("%s+$", "")
      p2:close()
      local doc = json.decode(assert(io.open(file), out):read("a"))
      assert.are.equal(false, doc.tf32, flag)
      assert.is_truthy(out:find("· TF32 off", 1, true), out)
      assert.is_false(keng.backends.allow_tf32)
    end
  end)

  it("stops on a corrupt cpu-peak cache, naming the file and the JSON error (never measured over silently)", function()
    assert.is_truthy(KENG, "no keng binary found")
    local out_dir = tmp .. "/badcache"
    assert(os.execute("mkdir -p " .. sh_quote(out_dir)))
    H.write(out_dir .. "/cpu-peak.json", "{\"x\": 1,}")
    local out, code = H.run(string.format(
      "cd %s && KENG_PROGRESS=0 %s scripts/bench/all.lua --tier cpu --steps 1 --only bert_predict --out %s 2>&1",
      sh_quote(root), sh_quote(KENG), sh_quote(out_dir)))
    assert.are.equal(2, code, out)
    assert.is_truthy(out:find("all.lua: cpu-peak cache: " .. out_dir .. "/cpu-peak.json: json: invalid JSON at line 1", 1, true), out)
    assert.is_truthy(out:find("(delete the file to measure the peaks again)", 1, true), out)
  end)

  it("--quantize int8 adds a quantized twin after each generate row, with ms and weight bytes per token", function()
    assert.is_truthy(KENG, "no keng binary found")
    local out_dir = tmp .. "/quant"
    local p = io.popen(string.format(
      "cd %s && KENG_PROGRESS=0 %s scripts/bench/all.lua --tier cpu --steps 1 --only mistral_generate_1 --quantize int8 --out %s 2>&1",
      sh_quote(root), sh_quote(KENG), sh_quote(out_dir)))
    local out = p:read("a")
    local _, _, code = p:close()
    assert.are.equal(0, code, out)
    local p2 = io.popen("ls " .. sh_quote(out_dir) .. "/*-cpu.json 2>/dev/null")
    local file = p2:read("a"):gsub("%s+$", "")
    p2:close()
    local doc = json.decode(assert(io.open(file), out):read("a"))
    assert.are.equal("int8", doc.quantize)
    assert.are.equal(2, #doc.rows)
    local plain, q = doc.rows[1], doc.rows[2]
    assert.are.equal("mistral_generate_1", plain.id)
    assert.are.equal("mistral_generate_1_int8", q.id)
    assert.are.equal("int8", q.quantize)
    assert.is_nil(plain.quantize)
    for _, r in ipairs{plain, q} do
      assert.are.equal("ok", r.status, r.reason)
      assert.is_true(r.ms_per_token > 0 and r.weight_bytes_per_token > 0)
    end
    -- int8 Linears (the untied head included) read about half the bf16 bytes
    local ratio = q.weight_bytes_per_token / plain.weight_bytes_per_token
    assert.is_true(ratio > 0.45 and ratio < 0.6, tostring(ratio))
    assert.is_truthy(out:find("bf16 + int8", 1, true), out)
    assert.is_truthy(out:find("MB weights/token", 1, true), out)
  end)

  it("rejects a bad option with exit status 2", function()
    assert.is_truthy(KENG, "no keng binary found")
    local p = io.popen(string.format("cd %s && %s scripts/bench/all.lua --tier tpu 2>&1", sh_quote(root), sh_quote(KENG)))
    local out = p:read("a")
    local _, _, code = p:close()
    assert.are.equal(2, code)
    assert.is_truthy(out:find("--tier must be cpu or gpu", 1, true), out)
    p = io.popen(string.format("cd %s && %s scripts/bench/all.lua --quantize int3 2>&1", sh_quote(root), sh_quote(KENG)))
    out = p:read("a")
    assert.are.equal(2, select(3, p:close()))
    assert.is_truthy(out:find("--quantize must be int8 or int4", 1, true), out)
    p = io.popen(string.format("cd %s && %s scripts/bench/all.lua --profile 0 2>&1", sh_quote(root), sh_quote(KENG)))
    out = p:read("a")
    _, _, code = p:close()
    assert.are.equal(2, code)
    assert.is_truthy(out:find("--profile must be a positive integer", 1, true), out)
    p = io.popen(string.format("cd %s && %s scripts/bench/all.lua --tf32=1 2>&1", sh_quote(root), sh_quote(KENG)))
    out = p:read("a")
    _, _, code = p:close()
    assert.are.equal(2, code)
    assert.is_truthy(out:find("--tf32 and --no-tf32 take no value", 1, true), out)
  end)
end)
