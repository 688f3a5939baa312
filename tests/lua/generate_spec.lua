-- generate_spec.lua — keng.generate (scripts/lib/keng/generate.lua): options refused by name
-- and range, the device-resident decode step (no tensor built from Lua values per token, one
-- read-back per sync_every tokens, the same ids for every sync_every), streaming, and the
-- generation features against transformers' generate and LogitsProcessors (fixtures in
-- tests/fixtures/generate, written by tests/fixtures/gen/gen_generate.py).
-- Shape letters: B rows, V vocabulary.
local keng = require "keng"
local H = require "helper"
local gemma = require "models.gemma"
local mistral = require "models.mistral"
local generate = require "keng.generate"

local FIX = "tests/fixtures/"
local FAMILIES = {gemma = gemma, mistral = mistral}

local function lm_of(name) return FAMILIES[name].from_pretrained(FIX .. name) end

describe("generate options", function()
  local lm = lm_of("gemma")

  it("refuse unknown keys, naming the key and the valid ones", function()
    local e = H.raises(function() lm:generate({{2, 5}}, {max_len = 5}) end, "unknown option 'max_len'")
    assert.is_truthy(e:find("max_new_tokens", 1, true))
    assert.is_truthy(e:find("num_beams", 1, true))
    H.raises(function() lm:generate({{2, 5}}, {do_sample = true}) end, "unknown option 'do_sample'")
    -- the error points at the caller's line
    assert.is_truthy(e:find("generate_spec.lua", 1, true), e)
  end)

  it("refuse values out of range or of the wrong type", function()
    local p = {{2, 5}}
    H.raises(function() lm:generate(p, {max_length = 4.5}) end, "max_length must be an integer, got 4.5")
    H.raises(function() lm:generate(p, {max_length = 0}) end, "max_length must be >= 1")
    H.raises(function() lm:generate(p, {max_new_tokens = 0}) end, "max_new_tokens must be >= 1")
    H.raises(function() lm:generate(p, {min_new_tokens = -1}) end, "min_new_tokens must be >= 0")
    H.raises(function() lm:generate(p, {temperature = 0 / 0}) end, "temperature must be a number, got")
    H.raises(function() lm:generate(p, {temperature = 0}) end, "temperature must be in (0")
    H.raises(function() lm:generate(p, {top_k = -1}) end, "top_k must be >= 0")
    H.raises(function() lm:generate(p, {top_k = 2.5}) end, "top_k must be an integer")
    H.raises(function() lm:generate(p, {top_p = 1.5}) end, "top_p must be in [0")
    H.raises(function() lm:generate(p, {min_p = -0.1}) end, "min_p must be in [0")
    H.raises(function() lm:generate(p, {repetition_penalty = 0}) end, "repetition_penalty must be in (0")
    H.raises(function() lm:generate(p, {num_beams = 0}) end, "num_beams must be >= 1")
    H.raises(function() lm:generate(p, {early_stopping = "yes"}) end, "early_stopping must be true, false or \"never\"")
    H.raises(function() lm:generate(p, {on_token = 3}) end, "on_token must be a function")
    H.raises(function() lm:generate(p, {stop_token_ids = {1, 500}}) end, "stop_token_ids[2] = 500")
    H.raises(function() lm:generate(p, {stop_strings = {"x"}}) end, "stop_strings need a tokenizer")
    H.raises(function() lm:generate(p, {sampler = "greedy", temperature = 0.5}) end, "sampler 'greedy' takes no temperature")
    H.raises(function() lm:generate(p, {num_return_sequences = 2}) end, "num_return_sequences (2) must be <= num_beams (1)")
    H.raises(function() lm:generate(p, {graph = true}) end, "graph = true needs a CUDA device")
    H.raises(function() lm:generate(p, 5) end, "options must be a table")
    H.raises(function() lm:generate(p, {decode = "yes"}) end, "decode must be true or false")
    H.raises(function() lm:generate(p, {sync_every = 0}) end, "sync_every must be >= 1")
    H.raises(function() lm:generate(p, {num_beams = 2, temperature = 0.5}) end, "num_beams > 1 with sampling")
    H.raises(function() lm:generate(p, {num_beams = 2, on_token = print}) end, "on_token cannot stream beam search")
  end)

  it("top_p = 0 is greedy (the best token always stays)", function()
    local g = lm:generate({{2, 17, 90}}, {max_new_tokens = 12})
    for _, seed in ipairs({1, 2, 3}) do
      assert.are.same(g, lm:generate({{2, 17, 90}}, {max_new_tokens = 12, top_p = 0, seed = seed}))
    end
  end)

  it("top_k = 0 and top_p = 1 switch the filter off, as in transformers", function()
    local base = lm:generate({{2, 17, 90}}, {max_new_tokens = 12, temperature = 1.3, seed = 5})
    assert.are.same(base, lm:generate({{2, 17, 90}}, {max_new_tokens = 12, temperature = 1.3, top_k = 0, seed = 5}))
    assert.are.same(base, lm:generate({{2, 17, 90}}, {max_new_tokens = 12, temperature = 1.3, top_p = 1, seed = 5}))
  end)

  it("a sampling option alone samples (it is not ignored)", function()
    local g = lm:generate({{2, 17, 90}}, {max_new_tokens = 16, stop_token_ids = {}})
    local s = lm:generate({{2, 17, 90}}, {max_new_tokens = 16, stop_token_ids = {}, temperature = 5, seed = 1})
    assert.are_not.same(g, s)
  end)
end)

describe("the decode step", function()
  -- counts keng.tensor calls (tensors from Lua values) and host reads during fn
  local function counting(fn)
    local mt = getmetatable(keng.zeros({1})).methods
    local n = {sync = 0, lua = 0}
    local saved = {item = mt.item, tolist = mt.tolist, cpu = mt.cpu, tensor = keng.tensor}
    for _, k in ipairs({"item", "tolist", "cpu"}) do
      mt[k] = function(...) n.sync = n.sync + 1; return saved[k](...) end
    end
    keng.tensor = function(...) n.lua = n.lua + 1; return saved.tensor(...) end
    local ok, e = pcall(fn)
    mt.item, mt.tolist, mt.cpu, keng.tensor = saved.item, saved.tolist, saved.cpu, saved.tensor
    assert(ok, e)
    return n
  end

  it("builds no tensor from Lua values per token and reads back once per sync_every tokens", function()
    for _, name in ipairs({"gemma", "mistral"}) do
      local lm = lm_of(name)
      local prompts = {{2, 5, 6}, {2, 9, 10, 11, 12, 13, 14, 15, 16, 17}}   -- padded; longer than the window
      local function run(n) return lm:generate(prompts, {max_new_tokens = n, stop_token_ids = {}}) end
      local a, b = counting(function() run(8) end), counting(function() run(40) end)
      assert.are.equal(a.lua, b.lua, name .. ": tensors from Lua values grow with the length")
      assert.are.equal(4, b.sync - a.sync, name .. ": read-backs for 32 more tokens")
    end
  end)

  it("gives the same ids whatever sync_every is, and with the fixed-shape (CUDA Graph) step", function()
    for _, name in ipairs({"gemma", "mistral"}) do
      local lm = lm_of(name)
      local prompts = {{2, 5, 6}, {2, 9, 10, 11, 12, 13, 14, 15, 16, 17}, {2}}
      local want = lm:generate(prompts, {max_length = 30, sync_every = 1})
      for _, k in ipairs({2, 3, 8, 100}) do
        assert.are.same(want, lm:generate(prompts, {max_length = 30, sync_every = k}), name .. " sync_every " .. k)
      end
      generate.fixed_shape = true
      local ok, got = pcall(lm.generate, lm, prompts, {max_length = 30})
      local ok2, sampled = pcall(lm.generate, lm, prompts, {max_length = 30, temperature = 0.9, seed = 2})
      generate.fixed_shape = false
      assert(ok, got)
      assert(ok2, sampled)
      assert.are.same(want, got, name .. " fixed shape")
      assert.are.same(lm:generate(prompts, {max_length = 30, temperature = 0.9, seed = 2}), sampled, name .. " sampled, fixed shape")
    end
  end)

  it("refills a kept decode state in place: calls of the same shape give fresh results", function()
    for _, name in ipairs({"gemma", "mistral"}) do
      local lm = lm_of(name)
      local a = {{2, 5, 6}, {2, 9, 10, 11, 12, 13, 14, 15, 16, 17}}
      local b = {{2, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {2, 30}}     -- same B and L, other padding
      local c = {{2, 3}}                                            -- another shape
      local want = {lm:generate(a, {max_length = 28}), lm:generate(b, {max_length = 28}), lm:generate(c, {max_length = 28})}
      generate.fixed_shape, generate.keep_state = true, true
      local ok, got = pcall(function()
        local r = {lm:generate(a, {max_length = 28}), lm:generate(b, {max_length = 28})}
        local state = rawget(lm, "_decode_state")
        r[3] = lm:generate(c, {max_length = 28})
        assert(rawget(lm, "_decode_state") ~= state, "a new shape replaces the kept state")
        r[4] = lm:generate(c, {max_length = 28})
        return r
      end)
      generate.fixed_shape, generate.keep_state = false, false
      assert(ok, got)
      assert.are.same(want[1], got[1], name .. " first call")
      assert.are.same(want[2], got[2], name .. " second call, same state")
      assert.are.same(want[3], got[3], name .. " new shape")
      assert.are.same(want[3], got[4], name .. " new shape again")
      generate.release(lm)
      assert.is_nil(rawget(lm, "_decode_state"))
    end
  end)

  it("refreshes the kept fused weights ([q; k; v], [gate; up]) when the weights change between calls", function()
    for _, name in ipairs({"gemma", "mistral"}) do
      local lm = lm_of(name)
      local a = {{2, 5, 6}, {2, 9, 10, 11, 12, 13, 14, 15, 16, 17}}
      generate.keep_state = true
      local ok, got = pcall(function()
        local first = lm:generate(a, {max_length = 20})
        keng.no_grad(function()
          for _, layer in ipairs(lm.model.layers) do
            layer.mlp.up_proj.weight:mul_(-3)
            layer.self_attn.key.weight:mul_(2)
          end
        end)
        return {first, lm:generate(a, {max_length = 20})}
      end)
      generate.keep_state = false
      generate.release(lm)
      assert(ok, got)
      assert.are.same(lm:generate(a, {max_length = 20}), got[2], name .. ": the changed weights are used")
      assert.are_not.same(got[1], got[2], name .. ": the change matters")
    end
  end)

  it("wires the CUDA Graph path: one graph per shape, made once, called per step, kept across calls", function()
    for _, name in ipairs({"gemma", "mistral"}) do
      local lm = lm_of(name)
      local a = {{2, 5, 6}, {2, 9, 10, 11, 12, 13, 14, 15, 16, 17}}
      local b = {{2, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {2, 30, 31}}  -- the same B and L as a
      local want = {lm:generate(a, {max_length = 28}), lm:generate(b, {max_length = 28}),
                    lm:generate(a, {max_length = 28, repetition_penalty = 1.3})}
      local made, calls = 0, 0
      generate.fake_graph = function(fn, opts)                      -- as keng.cuda.graph, eagerly
        made = made + 1
        assert(opts.warmup == 2)
        return function(...) calls = calls + 1; assert(select("#", ...) == 0); return fn() end
      end
      local ok, got = pcall(function()
        return {lm:generate(a, {max_length = 28}), lm:generate(b, {max_length = 28}),
                lm:generate(a, {max_length = 28, repetition_penalty = 1.3})}
      end)
      generate.fake_graph = nil
      generate.release(lm)
      assert(ok, got)
      assert.are.same(want, got, name)
      assert.are.equal(2, made, name .. ": graphs made (one kept for the shape, one for the processor run)")
      assert.is_true(calls >= 20, name .. ": " .. calls .. " graph calls")
    end
  end)

  it("captures a sampling step too: the graph's run draws what the eager run of the seed draws", function()
    for _, name in ipairs({"gemma", "mistral"}) do
      local lm = lm_of(name)
      local a = {{2, 5, 6}, {2, 9, 10, 11, 12, 13, 14, 15, 16, 17}}
      local opts = {max_length = 28, temperature = 1.5, top_k = 40, top_p = 0.95, min_p = 0.01,
                    repetition_penalty = 1.2, seed = 7}
      local want = lm:generate(a, opts)
      local made, calls = 0, 0
      generate.fake_graph = function(fn, gopts)
        made = made + 1
        assert(gopts.warmup == 2)
        return function() calls = calls + 1; return fn() end
      end
      local ok, got = pcall(function() return {lm:generate(a, opts), lm:generate(a, opts)} end)
      generate.fake_graph = nil
      generate.release(lm)
      assert(ok, got)
      assert.are.same(want, got[1], name)
      assert.are.same(want, got[2], name .. " again (a sampling graph is not kept: one per call)")
      assert.are.equal(2, made, name .. ": graphs made")
      assert.is_true(calls >= 20, name .. ": " .. calls .. " graph calls")
      assert.are_not.same(want, lm:generate(a, {max_length = 28, temperature = 1.5, top_k = 40, top_p = 0.95,
        min_p = 0.01, repetition_penalty = 1.2, seed = 8}), name .. ": the seed matters")
    end
  end)

  it("streams every generated token once, in order, through on_token", function()
    local lm = lm_of("gemma")
    local seen = {}
    local out = lm:generate({{2, 17, 90, 33, 5}, {2, 64, 7}}, {max_length = 24, on_token = function(row, id, piece)
      seen[row] = seen[row] or {}
      seen[row][#seen[row] + 1] = id
      assert.is_nil(piece)                                          -- no tokenizer: no text
    end})
    assert.are.same({table.unpack(out[1], 6)}, seen[1])
    assert.are.same({table.unpack(out[2], 4)}, seen[2])
  end)

  it("gives each text piece of a tokenizer's decode as it goes", function()
    if not keng.sentencepiece then return pending("keng.sentencepiece is not present") end
    keng.manual_seed(1)
    local sp = keng.sentencepiece(FIX .. "sentencepiece/bpe_gemma.model")
    local cfg = gemma.config("gemma_tiny")
    cfg.vocab, cfg.layers = sp:vocab_size(), 1
    local lm = gemma.build(cfg)
    lm.tokenizer = sp
    local pieces = {}
    local ids, texts = lm:generate({"I you get"}, {max_new_tokens = 10, stop_token_ids = {},
      on_token = function(_, _, piece) pieces[#pieces + 1] = piece end})
    local prompt_text = sp:decode(sp:encode("I you get", {add_bos = true}))
    assert.are.equal(10, #pieces)
    assert.are.equal(texts[1], prompt_text .. table.concat(pieces))
    -- a stop string ends the row at the token that completes it
    local gen = sp:decode({table.unpack(ids[1], #ids[1] - 9)})
    local target = gen:sub(#gen // 2, #gen // 2 + 1)                -- spans a token boundary or not
    assert.are.equal(2, #target, gen)
    local cut = lm:generate({"I you get"}, {max_new_tokens = 10, stop_token_ids = {}, stop_strings = {target}})
    local first = #ids[1] - 9                                       -- the first generated id
    assert.is_true(#cut[1] < #ids[1], "the stop string did not stop the row")
    assert.are.same({table.unpack(ids[1], 1, #cut[1])}, cut[1])     -- the same ids up to there
    -- the row's text (prompt included, as transformers) has the stop string, completed by the
    -- last token: without it, no occurrence ends past the prompt
    local pt = sp:decode({table.unpack(cut[1], 1, first - 1)})
    assert.is_truthy(sp:decode(cut[1]):find(target, math.max(1, #pt - #target + 2), true))
    assert.is_falsy(sp:decode({table.unpack(cut[1], 1, #cut[1] - 1)}):find(target, math.max(1, #pt - #target + 2), true),
      "the row went past the token that completed the stop string")
  end)

  it("max_new_tokens gives every row that many tokens; max_length counts the prompt", function()
    local lm = lm_of("mistral")
    local out = lm:generate({{2, 5, 6}, {2, 9, 10, 11, 12}}, {max_new_tokens = 7, stop_token_ids = {}})
    assert.are.equal(10, #out[1])
    assert.are.equal(12, #out[2])
    out = lm:generate({{2, 5, 6}, {2, 9, 10, 11, 12}}, {max_length = 7, stop_token_ids = {}})
    assert.are.equal(7, #out[1])
    assert.are.equal(7, #out[2])
    -- a prompt as long as max_length comes back alone while the other rows go on (greedy, beams)
    out = lm:generate({{2, 5, 6, 7}, {2, 9}}, {max_length = 4, stop_token_ids = {}})
    assert.are.same({2, 5, 6, 7}, out[1])
    assert.are.equal(4, #out[2])
    out = lm:generate({{2, 5, 6, 7}, {2, 9}}, {max_length = 4, stop_token_ids = {}, num_beams = 2})
    assert.are.same({2, 5, 6, 7}, out[1])
    assert.are.equal(4, #out[2])
    -- both given: max_new_tokens wins, as in transformers
    out = lm:generate({{2, 5, 6}}, {max_length = 4, max_new_tokens = 6, stop_token_ids = {}})
    assert.are.equal(9, #out[1])
  end)
end)

describe("against transformers", function()
  local read = H.read_json
  local cases = read(FIX .. "generate/cases.json")
  local models = {}

  it("generate gives transformers' ids (greedy, max_new_tokens, stop ids, min_new_tokens, repetition penalty, beam search)", function()
    assert.is_true(#cases >= 20)
    for _, c in ipairs(cases) do
      models[c.family] = models[c.family] or lm_of(c.family)
      local out = models[c.family]:generate(c.prompts, c.opts)      -- the prompts as one batch
      assert.are.same(c.want, out, c.name)
    end
  end)

  it("the logits processors give transformers' scores", function()
    local t = keng.load(FIX .. "generate/processors.safetensors")
    local meta = read(FIX .. "generate/processors.json")
    local n = 0
    for name, spec in pairs(meta.specs) do
      local opts = {}
      for k, v in pairs(spec) do opts[k] = v end
      opts.stop_token_ids = meta.stop_token_ids
      local y = generate.process_logits(t.logits, opts, {input_ids = t.input_ids, generated = meta.generated})
      local want = t[name]
      -- the same tokens removed, the same scores for the rest
      assert.are.same(want:eq(-math.huge):tolist(), y:eq(-math.huge):tolist(), name .. ": removed tokens")
      local finite = want:gt(-math.huge)
      H.close(keng.where(finite, y, 0.0), keng.where(finite, want, 0.0), 1e-5, name)
      n = n + 1
    end
    assert.are.equal(8, n)
  end)

  it("sampling draws from the processed distribution (seeded, reproducible)", function()
    local t = keng.load(FIX .. "generate/processors.safetensors")
    local opts = {temperature = 0.7, top_k = 20, top_p = 0.9, min_p = 0.05}
    local row = t.logits:narrow(1, 1, 1)                            -- [1, V]
    local p = generate.process_logits(row, opts):softmax(-1):view{-1}:tolist()
    local M = 20000
    local o = generate.check({cfg = {vocab = 128}}, opts, 1)
    keng.manual_seed(11)
    local vals, ids = generate.warp(row:expand{M, 128}:contiguous(), o)
    local draws = keng.multinomial(vals:softmax(-1), 1)
    draws = ids:gather(2, draws):view{-1}:tolist()
    local count = {}
    for _, id in ipairs(draws) do count[id] = (count[id] or 0) + 1 end
    for id, c in pairs(count) do assert.is_true(p[id + 1] > 0, "drew removed token " .. id) end
    for v = 1, 128 do                                               -- 5 standard deviations
      local e = p[v] * M
      assert.is_true(math.abs((count[v - 1] or 0) - e) <= 5 * math.sqrt(e * (1 - p[v])) + 1,
        string.format("token %d: %d draws, expected %.1f", v - 1, count[v - 1] or 0, e))
    end
  end)

  it("num_return_sequences samples n rows per prompt, a prompt's rows together", function()
    local lm = lm_of("gemma")
    local out = lm:generate({{2, 17, 90}, {2, 64}}, {max_new_tokens = 8, temperature = 2, seed = 3,
      num_return_sequences = 3, stop_token_ids = {}})
    assert.are.equal(6, #out)
    for i = 1, 3 do assert.are.same({2, 17, 90}, {table.unpack(out[i], 1, 3)}) end
    for i = 4, 6 do assert.are.same({2, 64}, {table.unpack(out[i], 1, 2)}) end
    assert.are_not.same(out[1], out[2])
    assert.are.same(out, lm:generate({{2, 17, 90}, {2, 64}}, {max_new_tokens = 8, temperature = 2, seed = 3,
      num_return_sequences = 3, stop_token_ids = {}}))
  end)
end)

-- the CUDA Graph path: whenever CUDA is available (tests/gpu/run.sh runs this spec and
-- scripts/bench/generate_graph.lua on the GPU machine); pending elsewhere
describe("on CUDA", function()
  it("captures the greedy decode step and replays it: the same ids as eager and as the CPU", function()
    if not (keng.cuda and keng.cuda.is_available and keng.cuda.is_available()) then
      return pending("CUDA is not available")
    end
    for _, name in ipairs({"gemma", "mistral"}) do
      local lm = lm_of(name)
      local prompts = {{2, 5, 6}, {2, 9, 10, 11, 12, 13, 14, 15, 16, 17}, {2}}
      local want = lm:generate(prompts, {max_length = 30})
      lm:to("cuda")
      assert.are.same(want, lm:generate(prompts, {max_length = 30, graph = false}), name .. " eager")
      assert.are.same(want, lm:generate(prompts, {max_length = 30, graph = true}), name .. " graph")
      assert.are.same(want, lm:generate(prompts, {max_length = 30, graph = true, sync_every = 1}), name .. " graph, k = 1")
    end
  end)

  it("captures a sampling step: a replayed run draws what the eager run of the same seed draws", function()
    if not (keng.cuda and keng.cuda.is_available and keng.cuda.is_available()) then
      return pending("CUDA is not available")
    end
    for _, name in ipairs({"gemma", "mistral"}) do
      local lm = lm_of(name)
      local prompts = {{2, 5, 6}, {2, 9, 10, 11, 12, 13, 14, 15, 16, 17}, {2}}
      local opts = {max_length = 30, temperature = 1.5, top_k = 40, top_p = 0.95, seed = 4}
      lm:to("cuda")
      opts.graph = false
      local eager = lm:generate(prompts, opts)
      opts.graph = true
      assert.are.same(eager, lm:generate(prompts, opts), name .. " sampled, graph")
      opts.sync_every = 1
      assert.are.same(eager, lm:generate(prompts, opts), name .. " sampled, graph, k = 1")
    end
  end)
end)

describe("chat templates", function()
  local json = require "keng.json"
  local CT = require "keng.chat_template"
  local chat = H.read_json(FIX .. "generate/chat.json")

  it("recognise the checkpoints' templates and render transformers' apply_chat_template strings", function()
    local formats = {}
    for name, template in pairs(chat.templates) do
      assert.are.equal(name, CT.format_of(template))
      formats[#formats + 1] = name
    end
    assert.are.equal(4, #formats)                                   -- gemma, gemma3, mistral, mistral_v3
    assert.is_true(#chat.cases >= 72)
    local raised = 0
    for i, c in ipairs(chat.cases) do
      local gemma_like = c.format:find("^gemma") ~= nil
      local tok = {chat_template = chat.templates[c.format], bos_token = gemma_like and "<bos>" or "<s>",
                   eos_token = gemma_like and "<eos>" or "</s>"}
      local ok, got = pcall(CT.apply, tok, c.messages, {add_generation_prompt = c.add_generation_prompt})
      if c.raises then                                              -- transformers' template raised too
        assert.is_false(ok, "case " .. i .. " " .. c.format .. " renders what transformers refuses")
        assert.is_truthy(tostring(got):find("apply_chat_template: ", 1, true), got)
        raised = raised + 1
      else
        assert(ok, got)
        assert.are.equal(c.want, got, "case " .. i .. " " .. c.format)
      end
    end
    assert.is_true(raised >= 10)
  end)

  it("recognise a template whose strings hold newlines where the checkpoint has \\n escapes", function()
    local t = chat.templates.gemma3:gsub("\\n", "\n")
    assert.are_not.equal(chat.templates.gemma3, t)
    assert.are.equal("gemma3", CT.format_of("  " .. t .. "\n"))
    assert.are.equal("mistral_v3", CT.format_of((chat.templates.mistral_v3:gsub("\\n", "\n"))))
    assert.is_nil(CT.format_of(chat.templates.gemma3:gsub("model", "assistant")))
  end)

  it("raise on an unknown template (naming it), a system turn, roles out of order, unknown options", function()
    local tok = {chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"}
    H.raises(function() CT.apply(tok, {{role = "user", content = "x"}}) end,
      "unknown chat template '{% for m in messages %}")
    H.raises(function() CT.apply({}, {{role = "user", content = "x"}}) end, "no chat template")
    local g = {chat_template = chat.templates.gemma}
    H.raises(function() CT.apply(g, {{role = "system", content = "x"}, {role = "user", content = "y"}}) end,
      "no system role")
    H.raises(function() CT.apply(g, {{role = "assistant", content = "x"}}) end, "roles must alternate")
    H.raises(function() CT.apply({chat_template = chat.templates.mistral}, {{role = "user", content = "a"},
      {role = "tool", content = "b"}}) end, "only user and assistant roles (message 2 is 'tool')")
    H.raises(function() CT.apply(g, {{role = "user", content = "x"}}, {add_generation = true}) end,
      "unknown option 'add_generation'")
    H.raises(function() CT.apply(g, {{role = "user"}}) end, "message 1 must be {role = <string>, content = <string>}")
    local m3 = {chat_template = chat.templates.mistral_v3}
    H.raises(function() CT.apply(m3, {{role = "user", content = "a"}, {role = "tool", content = "b"}}) end,
      "message 2 is 'tool'; tool messages are not supported")
    H.raises(function() CT.apply(m3, {{role = "system", content = "s"}, {role = "assistant", content = "b"}}) end,
      "after the optional system message, conversation roles must alternate")
    H.raises(function() CT.apply({chat_template = chat.templates.gemma3}, {{role = "system", content = "s"},
      {role = "assistant", content = "b"}}) end, "roles must alternate user/assistant/user/assistant/... (message 2")
    H.raises(function() CT.apply(tok, {{role = "user", content = "x"}}) end, "Mistral 7B Instruct v0.1 / v0.2 and v0.3")
  end)

  it("from_pretrained attaches tokenizer_config.json's template; tokenize = true gives ids", function()
    if not keng.sentencepiece then return pending("keng.sentencepiece is not present") end
    local lm = H.with_model_dir(FIX .. "gemma", function() end, function(dir)
      H.copy_files({["tokenizer.model"] = FIX .. "sentencepiece/bpe_gemma.model"}, dir)
      H.write(dir .. "/tokenizer_config.json",
        json.encode({chat_template = chat.templates.gemma, bos_token = "<bos>", eos_token = "<eos>"}))
      return gemma.from_pretrained(dir)
    end)
    local tok = lm.tokenizer
    local msgs = {{role = "user", content = "I you get"}}
    local text = tok:apply_chat_template(msgs, {add_generation_prompt = true})
    assert.are.equal("<bos><start_of_turn>user\nI you get<end_of_turn>\n<start_of_turn>model\n", text)
    local ids = tok:apply_chat_template(msgs, {add_generation_prompt = true, tokenize = true})
    assert.are.equal(tok.bos_id, ids[1])
    local rest = tok:encode(text:sub(#"<bos>" + 1), {add_bos = false})
    assert.are.same(rest, {table.unpack(ids, 2)})
    assert.are.equal(tok.sp:piece_to_id("<start_of_turn>"), ids[2])  -- a user-defined piece, whole
  end)
end)

describe("examples/chat.lua", function()
  it("chats through a pipe in --demo mode (streams, keeps the history, /reset, ends at EOF)", function()
    if not keng.sentencepiece then return pending("keng.sentencepiece is not present") end
    local out = H.run("printf 'hello\\nhow are you\\n/reset\\nbye\\n' | " .. H.sh_quote(H.keng_bin()) ..
      " examples/chat.lua --demo --max-new-tokens 5 2>&1; echo \"rc=$?\"")
    assert.is_truthy(out:find("rc=0", 1, true), out)
    local _, turns = out:gsub("model> ", "")
    assert.are.equal(3, turns, out)
  end)
end)

describe("the decode step without fused weights", function()
  it("(LoRA adapters on query / value) picks the full-sequence argmax at every step", function()
    local ok, lora = pcall(require, "keng.lora")
    if not ok then return pending("keng.lora is not present") end
    local lm = lm_of("mistral")
    lora.enable(lm, {rank = 2, targets = {"query", "value"}})
    keng.manual_seed(4)
    for _, p in ipairs(lm:parameters()) do                          -- non-zero adapters
      if p.requires_grad then keng.no_grad(function() p:copy_(keng.randn(p.shape) * 0.3) end) end
    end
    assert.is_falsy(lm.model.layers[1].self_attn:fused_qkv())
    local prompt = {2, 40, 41, 42, 43, 44, 45, 46, 47, 48}            -- longer than the window 8
    local out = lm:generate({prompt, {2, 7}}, {max_length = 20, stop_token_ids = {}})[1]
    for t = #prompt, #out - 1 do
      local next_id = lm:logits(keng.tensor({{table.unpack(out, 1, t)}})):select(2, t):argmax(-1):item()
      assert.are.equal(next_id, out[t + 1], "step " .. t)
    end
  end)
end)

describe("stop_strings against transformers", function()
  it("stops where transformers' StopStringCriteria stops (greedy, a tiny Gemma over a real tokenizer)", function()
    if not keng.sentencepiece then return pending("keng.sentencepiece is not present") end
    local cases = H.read_json(FIX .. "generate/stop_strings.json")
    local lm = gemma.from_pretrained(FIX .. "generate/stop_gemma")
    assert.is_true(#cases >= 6)
    for i, c in ipairs(cases) do
      local full = lm:generate({c.prompt}, {max_new_tokens = 16, stop_token_ids = {}})[1]
      assert.are.same(c.full, full, "case " .. i .. ": greedy")
      local got = lm:generate({c.prompt}, {max_new_tokens = 16, stop_token_ids = {}, stop_strings = c.stop_strings})[1]
      assert.are.same(c.want, got, "case " .. i .. " stop " .. c.stop_strings[1])
    end
  end)
end)

describe("the flat decode step (CausalLM:decode_plan)", function()
  -- two decode steps through the plan and through the modules (plan off), from one prefill
  local function both(lm)
    local B, P = 2, 5
    local ids = keng.tensor({{2, 11, 12, 13, 14}, {2, 21, 22, 23, 24}}, {dtype = "i64"})
    local function run(plan)
      local fused = lm:decode_weights()
      if not plan then fused.plan = false end
      local caches = lm:new_cache(B, P + 2)
      keng.no_grad(function() lm:prefill(ids, keng.arange(P), nil, caches, false) end)
      local out = {}
      for s = 1, 2 do
        local col = keng.tensor({P + s - 1}, {dtype = "i64"})
        local pos = keng.tensor({{P + s - 1}, {P + s - 1}}, {dtype = "i64"})
        local mask = keng.zeros({B, 1, 1, P + s})
        out[s] = keng.no_grad(function()
          return lm:decode(keng.tensor({{30 + s}, {40 + s}}, {dtype = "i64"}), pos, mask, col, caches, fused, false, P + s)
        end)
      end
      return out, fused
    end
    local a, fused = run(true)
    assert.is_truthy(fused.plan, "the plan is used")
    local b = run(false)
    for s = 1, 2 do H.close(a[s], b[s], 0, "step " .. s) end
  end

  it("gives the module path's logits bit for bit (Gemma: GeGLU, tied head; Mistral: SwiGLU)", function()
    for _, name in ipairs({"gemma", "mistral"}) do
      local lm = lm_of(name)
      both(lm)
      lm:to("bf16")
      both(lm)
    end
  end)

  it("is not used where a module is not plain (a LoRA adapter, an MLP with biases)", function()
    local lm = lm_of("mistral")
    assert.is_truthy(lm:decode_plan(lm:decode_weights()))
    rawset(lm.model.layers[2].mlp.down_proj, "forward", function(self, x) return x end)
    assert.is_false(lm:decode_plan(lm:decode_weights()))
  end)
end)

describe("deferred device index checks (keng.cuda.defer_checks)", function()
  it("are on for the whole call (eager steps, beam search) and restored after it, also after an error", function()
    local calls, state, saved = {}, false, generate.defer_checks
    generate.defer_checks = function(on, dev)
      calls[#calls + 1] = tostring(on) .. "@" .. dev
      local was = state
      state = on
      return was
    end
    local lm = lm_of("mistral")
    local seen = {}
    local ok1, e1 = pcall(function()
      lm:generate({{2, 5, 6}}, {max_new_tokens = 3, graph = false, on_token = function() seen[#seen + 1] = state end})
      lm:generate({{2, 5, 6}}, {max_new_tokens = 3, num_beams = 2})
    end)
    local ok2, e2 = pcall(lm.generate, lm, {{2, 5}}, {max_new_tokens = 3, on_token = function() error("stop here") end})
    generate.defer_checks = saved
    assert(ok1, e1)
    assert.is_false(ok2)
    assert.is_truthy(tostring(e2):find("stop here", 1, true))
    assert.are.same({true, true, true}, seen)
    assert.are.same({"true@cpu", "false@cpu", "true@cpu", "false@cpu", "true@cpu", "false@cpu"}, calls)
  end)

  it("on CUDA: a bad id raises at the next read-back, not at the op (pending elsewhere)", function()
    if not (keng.cuda and keng.cuda.is_available and keng.cuda.is_available()) then
      return pending("CUDA is not available")
    end
    local w = keng.randn({10, 4}, {device = "cuda"})
    local was = keng.cuda.defer_checks(true, "cuda")
    local ok, y = pcall(keng.embedding, keng.tensor({{1, 12}}, {dtype = "i64", device = "cuda"}), w)
    keng.cuda.defer_checks(was, "cuda")
    assert(ok, y)                                                   -- no sync, no error yet
    H.raises(function() y:tolist() end, "out of range in a replayed CUDA graph or under keng.cuda.defer_checks")
    assert.are.equal(4, #keng.embedding(keng.tensor({{1}}, {dtype = "i64", device = "cuda"}), w):tolist()[1][1])
    H.raises(function() keng.embedding(keng.tensor({{12}}, {dtype = "i64", device = "cuda"}), w) end, "embedding")
    H.raises(function() keng.cuda.defer_checks(true, "cuda:99") end, "cuda.defer_checks: cuda:99 is not available")
  end)

  it("do nothing off CUDA and refuse a non-boolean", function()
    assert.is_false(keng.cuda.defer_checks(true, "cpu"))
    assert.is_false(keng.cuda.defer_checks(false, "cpu"))
    H.raises(function() keng.cuda.defer_checks(1) end, "keng.cuda.defer_checks: on must be true or false, got number")
  end)
end)
