-- common.lua — what the per-family benchmark files share: synthetic inputs (docs/benchmarks.md "Prompts/
-- text") and the three timed tasks (fit step, predict step, whole generate() call).
-- Shape letters: B batch, T tokens, V vocab.
local keng = require "keng"
local bench = require "keng.bench"
local train = require "keng.train"
local config = require "bench.config"

local common = {}

local function word_ids(family, vocab)
  local ids = config.token_ids[family]
  local out = {}
  for i, id in ipairs(ids.words) do out[i] = vocab and id % vocab or id end
  return out
end

-- BERT inputs: [CLS] + words + [SEP] filling all T positions; the n-th sample's words are the
-- n-th tuple of the product of the word list. Returns token_ids [B,T] i64.
function common.bert_tokens(B, T, vocab)
  local ids, words = config.token_ids.bert, word_ids("bert", vocab)
  local rows = {}
  for n = 1, B do
    local r = {ids.cls}
    for i, w in ipairs(config.tuple(n - 1, T - 2, #words)) do r[i + 1] = words[w] end
    r[T] = ids.sep
    rows[n] = r
  end
  return keng.tensor(rows, {dtype = "i64"})
end

-- LLM fit inputs: BOS + (T) words; x = first T tokens, y = the same shifted by one. [B,T] i64 each.
function common.lm_batch(family, B, T, vocab)
  local ids, words = config.token_ids[family], word_ids(family, vocab)
  local xs, ys = {}, {}
  for n = 1, B do
    local seq = {ids.bos}
    for i, w in ipairs(config.tuple(n - 1, T, #words)) do seq[i + 1] = words[w] end
    xs[n], ys[n] = {table.unpack(seq, 1, T)}, {table.unpack(seq, 2, T + 1)}
  end
  return keng.tensor(xs, {dtype = "i64"}), keng.tensor(ys, {dtype = "i64"})
end

-- generate prompts: BOS + the n-th 5-word tuple -> [B, 1 + nwords] i64
function common.lm_prompts(family, B, nwords, vocab)
  local ids, words = config.token_ids[family], word_ids(family, vocab)
  local rows = {}
  for n = 1, B do
    local r = {ids.bos}
    for i, w in ipairs(config.tuple(n - 1, nwords, #words)) do r[i + 1] = words[w] end
    rows[n] = r
  end
  return keng.tensor(rows, {dtype = "i64"})
end

-- the words of the n-th prompt as a string (for models whose generate() tokenizes text)
function common.prompt_text(n, nwords)
  local out = {}
  for i, w in ipairs(config.tuple(n - 1, nwords, #config.words)) do out[i] = config.words[w] end
  return table.concat(out, " ")
end

-- fit: keng.train.step (forward, loss, zero_grad, backward, step: what fit does per batch); the
-- first step is the untimed warm-up, then ctx.steps timed steps on the same batch. On the GPU
-- tier the step is captured into a keng.cuda.graph after the warm-up and the timed steps are
-- replays (bench.graphed; r.graph says whether they were, r.graph_error why not).
function common.time_fit(model, x, y, opt, loss_fn, ctx, items)
  model:train()
  local step, warmup, g = bench.graphed(function() return train.step(model, x, y, opt, loss_fn) end, ctx)
  local r = bench.run(step, {steps = ctx.steps, warmup = warmup, items = items, on_step = ctx.on_step,
                                profile = ctx.profile})
  r.graph, r.graph_error = g.graph, g.graph_error
  return r
end

-- predict: forward under no_grad in eval mode (CUDA Graph replays on the GPU tier, as fit)
function common.time_predict(model, x, ctx, items)
  model:eval()
  return keng.no_grad(function()
    local step, warmup, g = bench.graphed(function() return model(x) end, ctx)
    local r = bench.run(step, {steps = ctx.steps, warmup = warmup, items = items, on_step = ctx.on_step,
                                profile = ctx.profile})
    r.graph, r.graph_error = g.graph, g.graph_error
    return r
  end)
end

-- generate: one untimed call, then (time of 1 + steps calls - time of 1 call) / steps, ctx.repeats
-- times (config.diff_repeats)
function common.time_generate(lm, prompts, gen_opts, ctx, items)
  lm:eval()
  local o = {progress = false}                     -- the runner draws the row's own progress
  for k, v in pairs(gen_opts) do o[k] = v end
  gen_opts = o
  return keng.no_grad(function()
    return bench.run_diff(function(k)
      for _ = 1, k do lm:generate(prompts, gen_opts) end
    end, {short = 1, steps = ctx.steps, repeats = ctx.repeats, items = items, on_step = ctx.on_step,
                                profile = ctx.profile})
  end)
end

-- causal-LM loss: CE over [B*T, V] logits (the model dtype; f32 math inside) against [B*T] targets
function common.lm_loss(logits, y)
  local V = logits.shape[#logits.shape]
  return keng.cross_entropy(logits:reshape{-1, V}, y:reshape{-1})
end

return common
