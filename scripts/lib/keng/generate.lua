-- keng.generate — the generation loop every causal LM uses (Gemma, Mistral, later families),
-- with Hugging Face `generate` semantics for the options it takes (docs/models.md).
--
--   local generate = require "keng.generate"
--   generate.generate(lm, prompts, opts)        -- what lm:generate(prompts, opts) calls
--
-- The model supplies: lm.cfg {vocab, eos_id, pad_id, window}, lm.tokenizer (optional),
-- lm.add_bos, lm:check_ids, lm:param_device(), lm:param_dtype(), lm:new_cache(B, L),
-- lm:decode_weights(), lm:prefill(ids, positions, mask, caches, raw) and lm:decode(ids,
-- positions, mask, col, caches, fused, raw, keys) (models/causal_lm.lua).
--
-- The decode step stays on the device: a KV cache of the full length L written in place (by
-- keng.decode_qkv) at a column held in a device tensor, positions and the padding / causal /
-- window mask edited on the device from that column, the next ids chosen on the device and
-- copied into the step's input and into an id buffer. Lua reads that buffer back every
-- `sync_every` tokens (default 8; every token with on_token, which streams) and stops the rows
-- that met a stop id, a stop string or their length there (later ids of a stopped row are
-- dropped). So a step builds no tensor from Lua values and waits for nothing. Eagerly it attends
-- to the filled columns only; on CUDA the step (greedy or sampling) attends to all L (one shape
-- for every token), is captured once with keng.cuda.graph and replayed (the embedding's id check
-- is then deferred to the next read-back). Beam search (num_beams > 1) orders the beams on the host each
-- step (one read-back per token).
--
-- Shape letters: B rows (prompts × num_return_sequences), P padded prompt length, N new tokens,
-- L cache length (P + N), V vocabulary, K beams.
local keng = require "keng"

local G = {}

-- the options generate takes (docs/lua_api.md), sorted for the error message
G.OPTIONS = {"decode", "early_stopping", "graph", "length_penalty", "max_length", "max_new_tokens",
  "min_new_tokens", "min_p", "num_beams", "num_return_sequences", "on_token", "progress", "repetition_penalty",
  "sampler", "seed", "stop_strings", "stop_token_ids", "sync_every", "temperature", "top_k", "top_p"}
local KNOWN = {}
for _, k in ipairs(G.OPTIONS) do KNOWN[k] = true end

local SAMPLERS = {greedy = true, temperature = true, top_k = true, top_p = true}

-- true: the eager decode step also attends over all L cache columns, as the captured CUDA Graph
-- step does (the specs run that fixed-shape step on the CPU with it)
G.fixed_shape = false
-- true: keep the decode state on the model between calls on the CPU too, as a greedy CUDA
-- generate does for its captured step (the specs check the in-place refill with it)
G.keep_state = false
-- whether lm's RoPE follows the largest position (dynamic NTK, longrope): its step reads the
-- positions on the host (models/causal_lm.lua rope_options), which a CUDA Graph capture refuses,
-- so such models decode eagerly
function G.rope_per_length(lm)
  local r = type(lm.cfg) == "table" and lm.cfg.rope
  return r and require("models.rope").depends_on_length(r) or false
end

-- a function(fn, opts) standing in for keng.cuda.graph: the CPU specs run the capture wiring
-- (the greedy step called without a key count, the graph and state kept for the next call)
G.fake_graph = nil

local function fail(level, fmt, ...) error("generate: " .. string.format(fmt, ...), level + 1) end

local function is_int(v) return math.type(v) == "integer" or (type(v) == "number" and v == math.floor(v) and v == v and math.abs(v) < 2^53) end

-- an integer option >= lo, or nil
local function int_opt(opts, key, lo, level)
  local v = opts[key]
  if v == nil then return nil end
  if type(v) ~= "number" or not is_int(v) then fail(level + 1, "%s must be an integer, got %s", key, tostring(v)) end
  if v < lo then fail(level + 1, "%s must be >= %d, got %d", key, lo, math.tointeger(v)) end
  return math.tointeger(v)
end

-- a number option in [lo, hi] (NaN refused), or nil
local function num_opt(opts, key, lo, hi, level, lo_open)
  local v = opts[key]
  if v == nil then return nil end
  if type(v) ~= "number" or v ~= v then fail(level + 1, "%s must be a number, got %s", key, tostring(v)) end
  if v < lo or v > hi or (lo_open and v == lo) then
    fail(level + 1, "%s must be in %s%s, %s], got %s", key, lo_open and "(" or "[", tostring(lo), tostring(hi), tostring(v))
  end
  return v
end

-- check(lm, opts, level) -> o: every option validated, defaults filled in, the sampling decided
function G.check(lm, opts, level)
  opts = opts or {}
  if type(opts) ~= "table" then fail(level, "options must be a table, got %s", type(opts)) end
  for k in pairs(opts) do
    if not KNOWN[k] then
      fail(level, "unknown option '%s' (valid: %s)", tostring(k), table.concat(G.OPTIONS, ", "))
    end
  end
  local o = {}
  o.max_length = int_opt(opts, "max_length", 1, level)
  o.max_new_tokens = int_opt(opts, "max_new_tokens", 1, level)
  if not o.max_length and not o.max_new_tokens then o.max_length = 50 end
  o.min_new_tokens = int_opt(opts, "min_new_tokens", 0, level) or 0
  o.num_beams = int_opt(opts, "num_beams", 1, level) or 1
  o.num_return_sequences = int_opt(opts, "num_return_sequences", 1, level) or 1
  o.sync_every = int_opt(opts, "sync_every", 1, level) or 8
  o.seed = int_opt(opts, "seed", -math.maxinteger, level)
  o.top_k = int_opt(opts, "top_k", 0, level)
  if o.top_k == 0 then o.top_k = nil end                            -- 0: no top-k, as transformers
  o.top_p = num_opt(opts, "top_p", 0, 1, level)
  if o.top_p == 1 then o.top_p = nil end
  o.min_p = num_opt(opts, "min_p", 0, 1, level)
  o.temperature = num_opt(opts, "temperature", 0, math.huge, level, true)
  o.repetition_penalty = num_opt(opts, "repetition_penalty", 0, math.huge, level, true)
  if o.repetition_penalty == 1 then o.repetition_penalty = nil end
  o.length_penalty = num_opt(opts, "length_penalty", -math.huge, math.huge, level) or 1
  local es = opts.early_stopping
  if es ~= nil and type(es) ~= "boolean" and es ~= "never" then
    fail(level, "early_stopping must be true, false or \"never\", got %s", tostring(es))
  end
  o.early_stopping = es or false
  if opts.on_token ~= nil and type(opts.on_token) ~= "function" then
    fail(level, "on_token must be a function(row, id, text_piece), got %s", type(opts.on_token))
  end
  if opts.decode ~= nil and type(opts.decode) ~= "boolean" then fail(level, "decode must be true or false") end
  o.on_token, o.decode = opts.on_token, opts.decode
  if opts.progress ~= nil and type(opts.progress) ~= "boolean" then
    fail(level, "progress must be true, false or nil (on when stderr is a terminal), got %s", type(opts.progress))
  end
  o.progress = opts.progress
  if opts.graph ~= nil and type(opts.graph) ~= "boolean" then fail(level, "graph must be true or false") end
  o.graph = opts.graph
  if o.graph and G.rope_per_length(lm) then
    fail(level, "graph = true: this model's RoPE (%s) recomputes its frequencies from the positions every step, "
      .. "which a CUDA Graph cannot capture (leave graph out: it decodes eagerly)", lm.cfg.rope.type)
  end
  if o.graph and not tostring(lm.param_device and lm:param_device() or ""):find("^cuda") then
    fail(level, "graph = true needs a CUDA device (the model is on %s)", tostring(lm.param_device and lm:param_device()))
  end

  -- stop ids: the model's EOS unless given; a single id or a list
  local stops = opts.stop_token_ids
  if stops == nil then stops = lm.cfg.eos_id and {lm.cfg.eos_id} or {}
  elseif type(stops) == "number" then stops = {stops} end
  if type(stops) ~= "table" then fail(level, "stop_token_ids must be a list of ids, got %s", type(stops)) end
  o.stop_ids, o.stop = {}, {}
  for i, id in ipairs(stops) do
    if math.type(id) ~= "integer" or id < 0 or id >= lm.cfg.vocab then
      fail(level, "stop_token_ids[%d] = %s is not an id of the vocabulary (0 .. %d)", i, tostring(id), lm.cfg.vocab - 1)
    end
    o.stop_ids[#o.stop_ids + 1], o.stop[id] = id, true
  end
  local ss = opts.stop_strings
  if type(ss) == "string" then ss = {ss} end
  if ss ~= nil then
    if type(ss) ~= "table" then fail(level, "stop_strings must be a string or a list of strings") end
    for i, s in ipairs(ss) do
      if type(s) ~= "string" or s == "" then fail(level, "stop_strings[%d] must be a non-empty string", i) end
    end
    if not lm.tokenizer then fail(level, "stop_strings need a tokenizer (lm.tokenizer)") end
    if #ss > 0 then o.stop_strings = ss end
  end

  -- sampling: a sampler name, or any sampling option, chooses it; greedy refuses them
  local sampler = opts.sampler
  if sampler ~= nil and not SAMPLERS[sampler] then
    fail(level, "unknown sampler '%s' (greedy, temperature, top_k or top_p)", tostring(sampler))
  end
  local given = {}
  for _, k in ipairs({"temperature", "top_k", "top_p", "min_p"}) do
    if opts[k] ~= nil then given[#given + 1] = k end
  end
  if sampler == "greedy" and #given > 0 then
    fail(level, "sampler 'greedy' takes no %s (leave out sampler to sample)", table.concat(given, ", "))
  end
  o.sample = sampler ~= "greedy" and (sampler ~= nil or #given > 0)
  if sampler == "top_k" and opts.top_k == nil then o.top_k = 50 end
  if sampler == "top_p" and opts.top_p == nil then o.top_p = 0.9 end
  o.temperature = o.temperature or 1
  if o.num_beams > 1 then
    if o.sample then fail(level, "num_beams > 1 with sampling is not supported (beam search is deterministic)") end
    if o.on_token then fail(level, "on_token cannot stream beam search (the best beam is known at the end)") end
    if o.stop_strings then fail(level, "stop_strings are not supported with num_beams > 1") end
    if o.graph then fail(level, "graph = true: beam search runs eagerly (its caches are reordered each step)") end
  end
  if o.num_return_sequences > 1 and not o.sample and o.num_return_sequences > o.num_beams then
    fail(level, "num_return_sequences (%d) must be <= num_beams (%d) without sampling: greedy rows would be copies",
      o.num_return_sequences, o.num_beams)
  end
  return o
end

-- prompt_rows(lm, prompts, level) -> list of id lists, and whether they came as text
function G.prompt_rows(lm, prompts, level)
  if type(prompts) == "string" then prompts = {prompts} end
  if keng.is_tensor(prompts) then
    local t = lm:check_ids(prompts, level + 1)
    return t:tolist(), false
  end
  if type(prompts) ~= "table" or #prompts == 0 then
    fail(level, "prompts must be a string, a list of strings, a list of id lists or an i64 tensor")
  end
  local rows, text = {}, type(prompts[1]) == "string"
  for i, p in ipairs(prompts) do
    if type(p) == "string" then
      if not lm.tokenizer then
        fail(level, "string prompts need a tokenizer (from_pretrained with tokenizer.model, or set lm.tokenizer)")
      end
      local tok = lm.tokenizer                                      -- BOS first, as HF and Keras do
      local bos = lm.add_bos and (tok.bos_id == nil or tok.bos_id >= 0)
      local ids = tok:encode(p, {add_bos = bos})
      if keng.is_tensor(ids) then ids = ids:view{-1}:tolist() end
      rows[i] = ids
    elseif keng.is_tensor(p) then
      rows[i] = p:view{-1}:tolist()
    elseif type(p) == "table" then
      rows[i] = p
    else
      fail(level, "prompt %d is a %s", i, type(p))
    end
    if #rows[i] == 0 then fail(level, "prompt %d is empty", i) end
    for _, id in ipairs(rows[i]) do
      if math.type(id) ~= "integer" or id < 0 or id >= lm.cfg.vocab then
        fail(level, "token id %s in prompt %d is out of range for vocabulary size %d", tostring(id), i, lm.cfg.vocab)
      end
    end
  end
  return rows, text
end

---------------------------------------------------------------------------------------------
-- logits processors (transformers' order: repetition penalty, min new tokens, then the
-- sampling warpers temperature, top-k, top-p, min-p). All run on the device; f32 [B, V] in.

-- repetition_penalty (CTRL, Keskar et al. 2019): a logit of a token already in the row is
-- divided by p when positive, multiplied by p when negative. counts [B, V] > 0 marks them.
function G.repetition_penalty(logits, counts, p)
  local pen = keng.where(logits:lt(0), logits * p, logits / p)
  return keng.where(counts:gt(0), pen, logits)
end

-- min_new_tokens: the stop ids cannot be chosen while `generated < min`; bias [V] holds -inf at
-- the stop ids, on (a bool [1] device tensor) says whether the rule is still in force
function G.min_new_tokens(logits, bias, on)
  return keng.where(on, logits + bias, logits)
end

-- warp(logits [B, V] f32, o) -> logits [B, K], ids [B, K] or nil (the vocabulary ids kept when
-- top-k narrowed the columns): temperature -> top_k -> top_p -> min_p; removed tokens are -inf
function G.warp(logits, o)
  if o.temperature ~= 1 then logits = logits / o.temperature end
  local ids
  if o.top_k then logits, ids = logits:topk(math.min(o.top_k, logits.shape[2]), -1) end
  if o.top_p then
    local vals, idx = logits:topk(logits.shape[2], -1)              -- sorted, descending
    local p = vals:softmax(-1)
    local before = p:cumsum(-1) - p                                 -- mass ranked above each token
    -- the top token has exactly 0 above it, so it always stays (top_p = 0 is greedy)
    local keep = before:lt(o.top_p > 0 and o.top_p or 1e-38)
    logits = keng.where(keep, vals, -math.huge)
    ids = ids and ids:gather(2, idx) or idx
  end
  if o.min_p then                                                   -- the top token always stays
    local p = logits:softmax(-1)
    local top = p:max(-1):view{-1, 1}                               -- [B, 1]
    logits = keng.where(p:lt(top * o.min_p), -math.huge, logits)
  end
  return logits, ids
end

-- process(logits, o, st) -> logits [B, V] after the processors that do not sample
local function process(logits, o, st)
  if o.repetition_penalty then logits = G.repetition_penalty(logits, st.counts, o.repetition_penalty) end
  if st.min_bias then logits = G.min_new_tokens(logits, st.min_bias, st.min_on) end
  return logits
end

-- choose(logits [B, V], o, st) -> next ids [B] i64 on the device
local function choose(logits, o, st)
  logits = process(logits, o, st)
  if not o.sample then return logits:argmax(-1) end
  local ids
  logits, ids = G.warp(logits, o)
  local j = keng.multinomial(logits:softmax(-1), 1)                 -- [B, 1]
  if ids then j = ids:gather(2, j) end
  return j:view{-1}
end

-- process_logits(logits [B, V] f32, opts, {input_ids = i64 [B, T], generated = n}) -> [B, V]:
-- the scores sampling draws from (softmax of them), -inf where a rule removed a token, as
-- transformers' LogitsProcessorList of the same options. opts: generate's sampling options
-- (repetition_penalty, min_new_tokens with stop_token_ids, temperature, top_k, top_p, min_p);
-- input_ids: the tokens so far (repetition penalty); generated: how many of them are new.
function G.process_logits(logits, opts, ctx)
  ctx = ctx or {}
  local B, V = logits.shape[1], logits.shape[2]
  local o = G.check({cfg = {vocab = V}}, opts, 2)
  local st = {}
  if o.repetition_penalty then
    st.counts = keng.zeros({B, V}, {device = logits.device})
    local ids = ctx.input_ids
    st.counts:scatter_add_(2, ids, keng.ones(ids.shape, {device = logits.device}))
  end
  if o.min_new_tokens > 0 and #o.stop_ids > 0 then
    local bias = keng.zeros({V}, {device = logits.device})
    for _, id in ipairs(o.stop_ids) do bias:narrow(1, id + 1, 1):fill_(-math.huge) end
    st.min_bias = bias
    st.min_on = keng.tensor({(ctx.generated or 0) < o.min_new_tokens}, {dtype = "bool", device = logits.device})
  end
  local y = process(logits:float(), o, st)
  if not o.sample then return y end
  local vals, ids = G.warp(y, o)
  if not ids then return vals end
  local full, seen = keng.zeros({B, V}, {device = y.device}), keng.zeros({B, V}, {device = y.device})
  full:scatter_add_(2, ids, vals)                                    -- the kept columns back in place
  seen:scatter_add_(2, ids, keng.ones(ids.shape, {device = y.device}))
  return keng.where(seen:gt(0), full, -math.huge)
end

---------------------------------------------------------------------------------------------
-- masks derived on the device (bool; a where() is the logical and)

local function band(a, b) return keng.where(a, b, a) end

-- prefill mask [B, 1, P, P] for left-padded rows: query t of row b sees key j when the key is
-- not padding, not in the future and inside the window; a padding query sees itself only (no
-- softmax row is empty)
local function prefill_mask(pads, P, window, dev)
  local q = keng.arange(P, {device = dev}):view{1, P, 1}            -- [1, P, 1] query column
  local j = keng.arange(P, {device = dev}):view{1, 1, P}            -- [1, 1, P] key column
  local pad = pads:view{-1, 1, 1}                                   -- [B, 1, 1]
  local ok = band(j:le(q), j:ge(pad))
  if window then ok = band(ok, (q - j):lt(window)) end
  ok = keng.where(q:lt(pad), j:eq(q), ok)                           -- [B, P, P]
  return ok:unsqueeze(2)                                            -- [B, 1, P, P]
end

---------------------------------------------------------------------------------------------
-- the sampling / greedy loop

-- per-row text bookkeeping for on_token pieces and stop strings
local function text_of(tok, ids)
  local s = tok:decode(ids)
  return type(s) == "table" and s[1] or s
end

-- open(lm, rows, N, raw) -> dec: the prompts (left-padded to P) prefilled into a KV cache of
-- L = P + N columns, and the fixed-shape decode state. dec.logits [B, V] after the prompt;
-- dec.feed [B, 1] the ids the next dec.step() feeds; dec.col i64 [1] the column they go to;
-- dec.step() -> logits [B, V]; dec.reorder(idx) picks cache rows (beam search).
local function open(lm, rows, N, raw, reuse)
  local cfg, dev = lm.cfg, lm:param_device()
  local B, P = #rows, 0
  for _, r in ipairs(rows) do P = math.max(P, #r) end
  local L = P + N                                                   -- the last id is never fed
  local pad_id = cfg.pad_id or 0
  local ids, pos, pads, any_pad = {}, {}, {}, false                 -- left-padded prompt [B, P]
  for b, r in ipairs(rows) do
    local pad = P - #r
    ids[b], pos[b], pads[b] = {}, {}, {pad}
    any_pad = any_pad or pad > 0
    for j = 1, P do
      ids[b][j] = j > pad and r[j - pad] or pad_id
      pos[b][j] = math.max(0, j - 1 - pad)
    end
  end
  local i64 = {dtype = "i64", device = dev}
  local fused = lm:decode_weights()
  local W = cfg.window and cfg.window < L and cfg.window or nil     -- a window as long as the cache is none
  local flags = {}
  for i, f in ipairs(fused) do flags[i] = f and "1" or "0" end
  local key = table.concat({B, L, W or 0, raw and 1 or 0, lm:param_dtype(), dev, table.concat(flags)}, ":")
  -- reuse: the tensors a captured step reads (cache, mask, counters, ids) are kept on the model
  -- and refilled in place, so the next call of the same shape replays the same CUDA Graph
  local dec = reuse and rawget(lm, "_decode_state")
  if dec and dec.key == key then
    for i, f in ipairs(dec.fused) do if f then f:copy_(fused[i]) end end  -- weights may have changed
  else
    dec = {key = key, B = B, L = L, dev = dev, i64 = i64, caches = lm:new_cache(B, L), fused = fused}
    if reuse then rawset(lm, "_decode_state", dec) end
  end
  dec.P = P
  local caches, off, BIG = dec.caches, W or 0, 1e30
  dec.pads, dec.ids = keng.tensor(pads, i64), keng.tensor(ids, i64)  -- [B, 1], [B, P]

  -- prefill: the whole prompt in one pass (causal when no row is padded)
  local mask = any_pad and prefill_mask(dec.pads, P, cfg.window, dev) or nil
  dec.logits = lm:prefill(dec.ids, keng.tensor(pos, i64), mask, caches, raw)  -- [B, V]

  -- The step's additive mask [B, 1, 1, W + L] (0 = visible, -BIG = not) gains the column fed
  -- and, with a window W, loses the one W behind it: two entries of one index_add_ (cache
  -- column c sits at W + c, so c - W never goes negative; -BIG + BIG is exactly 0).
  local c = keng.arange(off + L, i64):view{1, off + L} - off        -- [1, W + L] cache column
  local vis = band(c:ge(dec.pads), c:lt(P))                         -- what the last prompt token sees
  if W then vis = band(vis, c:gt(P - 1 - W)) end
  local amask = keng.where(vis, 0.0, -BIG):view{B, 1, 1, off + L}   -- f32
  -- counters [pos_1 .. pos_B, W + col, col]: the rows' positions, the mask entries to edit,
  -- the cache column being fed; one add_ moves them all
  local ctr = {}
  for b = 1, B do ctr[b] = P - pads[b][1] end
  ctr[B + 1], ctr[B + 2] = off + P, P
  if dec.amask then                                                 -- kept: refill in place
    dec.amask:copy_(amask)
    dec.ctr:copy_(keng.tensor(ctr, i64))
    dec.buf:zero_()
    return dec
  end
  dec.amask, dec.ctr = amask, keng.tensor(ctr, i64)
  local edits = keng.tensor(W and {BIG, -BIG} or {BIG}, {device = dev}):view{1, 1, 1, -1}
    :expand{B, 1, 1, W and 2 or 1}:contiguous()
  local view = W and amask:narrow(4, off + 1, L) or amask           -- [B, 1, 1, L]
  local ctr_t, inc = dec.ctr, keng.ones({B + 2}, i64)
  local positions = ctr_t:narrow(1, 1, B):view{B, 1}                -- [B, 1]
  local edit_at = ctr_t:narrow(1, B + 1, W and 2 or 1)
  dec.col = ctr_t:narrow(1, B + 2, 1)                               -- [1]
  dec.feed = keng.zeros({B, 1}, i64)                                -- the step's input ids
  dec.buf = keng.zeros({B, L}, i64)                                 -- ids by the column they are fed at

  -- step(S) -> logits [B, V]: feeds dec.feed at column col attending to the first S columns
  -- (S = col + 1, known to the host without reading the device), or to all L when S is nil (the
  -- fixed shape a CUDA Graph replays; eagerly the shorter keys save the unfilled columns' work)
  function dec.step(S)
    amask:index_add_(4, edit_at, edits)
    local m = S and view:narrow(4, 1, S) or view
    local lg = lm:decode(dec.feed, positions, m, dec.col, caches, dec.fused, raw, S)  -- [B, V]
    ctr_t:add_(inc)
    return lg
  end
  function dec.reorder(idx)                                         -- idx i64 [B]: new row b = old idx[b]
    for _, kv in ipairs(caches) do kv.k, kv.v = kv.k:index_select(1, idx), kv.v:index_select(1, idx) end
  end
  return dec
end

-- release(lm): frees the decode state (KV cache, CUDA Graph) a greedy CUDA generate keeps on the
-- model for its next call of the same shape
function G.release(lm) rawset(lm, "_decode_state", nil) end

-- processor state: the repetition counts [B, V] and the min_new_tokens bias [V]
local function processors(lm, o, dec)
  local st, cfg, dev = {}, lm.cfg, dec.dev
  if o.repetition_penalty then                                      -- the prompt's tokens count
    st.counts = keng.zeros({dec.B, cfg.vocab}, {device = dev})
    local real = keng.arange(dec.P, dec.i64):view{1, dec.P}:ge(dec.pads):float()  -- [B, P] 1 = not padding
    st.counts:scatter_add_(2, dec.ids, real)
    st.one = keng.ones({dec.B, 1}, {device = dev})
  end
  if o.min_new_tokens > 0 and #o.stop_ids > 0 then
    st.min_bias = keng.zeros({cfg.vocab}, {device = dev})           -- [V], -inf at the stop ids
    for _, id in ipairs(o.stop_ids) do st.min_bias:narrow(1, id + 1, 1):fill_(-math.huge) end
  end
  return st
end

local function loop(lm, rows, o, budget)
  local B, N = #rows, 0
  for b = 1, B do N = math.max(N, budget[b]) end
  local out = {}
  for b, r in ipairs(rows) do out[b] = {table.unpack(r)} end
  if N == 0 then return out end
  local raw = not o.sample and not o.repetition_penalty and o.min_new_tokens == 0  -- argmax of model-dtype logits
  -- on CUDA the step is captured on its 3rd call and replayed after. A sampling step captures
  -- too: multinomial reads its Philox position from device memory that each replay rewrites (the
  -- first replay draws what the capture reserved, later ones fresh positions), so a replayed run
  -- draws what the eager run of the same seed draws. Without processors or sampling the captured
  -- step and its state are kept for the next call.
  local capture = o.graph ~= false and not G.rope_per_length(lm)
    and (lm:param_device():find("^cuda") ~= nil or G.fake_graph ~= nil)
  local dec = open(lm, rows, N, raw, (capture or G.keep_state) and raw)
  local st = processors(lm, o, dec)
  local P, col, feed, buf = dec.P, dec.col, dec.feed, dec.buf

  -- record(logits): choose the next ids (to be fed at column col), keep them, feed them
  local function record(lg)
    if st.min_bias then st.min_on = col:lt(P + o.min_new_tokens) end
    local nxt = choose(lg, o, st):view{B, 1}                        -- [B, 1]
    buf:index_add_(2, col, nxt)
    feed:copy_(nxt)
    if st.counts then st.counts:scatter_add_(2, feed, st.one) end
  end
  -- decode step s: feeds token s at column P + s - 1, attending to P + s columns (all L when
  -- captured: every shape fixed by (B, L))
  local function eager(s) record(dec.step(s and not G.fixed_shape and P + s or nil)) end
  local step = eager
  if capture then
    local g = dec.graph or (G.fake_graph or keng.cuda.graph)(function() eager() end, {warmup = 2, device = dec.dev})
    if raw then dec.graph = g end                                   -- kept with the state (open)
    step = function() g() end
  end

  record(dec.logits)
  local done, left, read = {}, B, 0                                 -- read: ids read back so far
  for b = 1, B do                                                   -- a prompt as long as max_length
    if budget[b] == 0 then done[b], left = true, left - 1 end
  end
  local texts, full = {}, {}                                        -- per row: generated / whole text so far
  local tok = lm.tokenizer
  local function take(upto)                                         -- read ids read+1 .. upto
    local chunk = buf:narrow(2, P + read + 1, upto - read):tolist() -- the one sync
    for s = read + 1, upto do
      for b = 1, B do
        if not done[b] then
          local id = chunk[b][s - read]
          local r = out[b]
          r[#r + 1] = id
          local piece
          if tok and o.on_token then                                -- the row's new text
            local before = texts[b] or ""
            local now = text_of(tok, {table.unpack(r, #rows[b] + 1)})
            piece = now:sub(1, #before) == before and now:sub(#before + 1) or now
            texts[b] = now
          end
          if o.stop_strings then                                    -- as transformers: the text of the
            local before = full[b] or text_of(tok, rows[b])         -- whole row (prompt included) ends
            local now = text_of(tok, r)                             -- with a stop string completed by
            full[b] = now                                           -- this token
            for _, ss in ipairs(o.stop_strings) do
              local at = now:find(ss, math.max(1, #before - #ss + 2), true)
              if at and at + #ss - 1 > #before then done[b] = true end
            end
          end
          if o.on_token then o.on_token(b, id, piece) end
          if o.stop[id] or #r - #rows[b] >= budget[b] then done[b] = true end
          if done[b] then left = left - 1 end
        end
      end
    end
    read = upto
  end
  local every = o.on_token and 1 or o.sync_every
  -- a token bar on stderr (a terminal only, unless progress = true), drawn at each read-back
  local bar = require("keng.progress").task("generate", N, {enabled = o.progress, unit = "tok"})
  local function rate(s) return string.format("%.1f tok/s", B * s / math.max(keng.time() - bar.start, 1e-9)) end
  for s = 1, N do
    if s - read >= every or s == N then
      take(s)
      bar:update(s, rate(s))
      if left == 0 then break end
    end
    if s < N then step(s) end
  end
  bar:finish(rate(read))
  return out
end

---------------------------------------------------------------------------------------------
-- beam search, as transformers' _beam_search (v5): per prompt K running beams and K finished
-- hypotheses; each step takes the top max(2, 1 + #stop ids)·K continuations over all beams;
-- those that stop (a stop id, or the length) and rank in the top K enter the finished set with
-- score sum(log p) / new_tokens ^ length_penalty; the best K that do not stop run on.
-- early_stopping: true stops a prompt when K hypotheses are finished; false when the best
-- running beam, scored at its current length, cannot beat the worst finished one; "never" the
-- same at the longest possible length when length_penalty > 0. The step runs eagerly with one
-- read-back per token (the host orders the beams); the caches are reordered by index_select.

local NEG = -1.0e9
local function f32(x) return (string.unpack("f", string.pack("f", x))) end  -- round as torch's f32

function G.beam_search(lm, rows, o, budget)
  local K, n, R = o.num_beams, o.num_return_sequences, #rows
  local brows, N = {}, 0
  for r, row in ipairs(rows) do
    N = math.max(N, budget[r])
    for _ = 1, K do brows[#brows + 1] = row end
  end
  local out = {}
  if N == 0 then
    for _, row in ipairs(rows) do for _ = 1, n do out[#out + 1] = {table.unpack(row)} end end
    return out
  end
  local dec = open(lm, brows, N, false)
  local st = processors(lm, o, dec)
  local V = lm.cfg.vocab
  local keep = math.max(2, 1 + #o.stop_ids) * K
  local running, fin, heur, active = {}, {}, {}, {}
  for r = 1, R do
    running[r], fin[r], heur[r], active[r] = {}, {}, true, true
    for k = 1, K do
      running[r][k] = {score = k == 1 and 0 or NEG, toks = {}}
      fin[r][k] = {score = NEG, toks = {}, done = false}
    end
  end
  local lp_pen, es = o.length_penalty, o.early_stopping
  local logits = dec.logits
  local bar = require("keng.progress").task("beam search", N, {enabled = o.progress, unit = "tok"})
  for s = 1, N do                                                   -- s: the new token's number
    local scores = {}
    for r = 1, R do for k = 1, K do scores[#scores + 1] = {running[r][k].score} end end
    local lp = logits:log_softmax(-1)                               -- [R·K, V]
    if st.min_bias then st.min_on = keng.tensor({s - 1 < o.min_new_tokens}, {dtype = "bool", device = dec.dev}) end
    lp = process(lp, o, st) + keng.tensor(scores, {device = dec.dev})
    local vals, idx = lp:view{R, K * V}:topk(keep, -1)
    vals, idx = vals:tolist(), idx:tolist()                         -- the one read-back per token
    local src, nxt = {}, {}
    for r = 1, R do
      local cands = {}
      for c = 1, keep do
        local beam, id = idx[r][c] // V + 1, idx[r][c] % V
        local toks = {table.unpack(running[r][beam].toks)}
        toks[#toks + 1] = id
        cands[c] = {lp = vals[r][c], beam = beam, id = id, toks = toks,
                    hit = o.stop[id] or s >= budget[r]}
      end
      -- the best K that did not stop run on (stopped ones sink by 1e9)
      local order = {}
      for c = 1, keep do order[c] = {v = f32(cands[c].lp + (cands[c].hit and NEG or 0)), c = c} end
      table.sort(order, function(a, b) if a.v ~= b.v then return a.v > b.v end return a.c < b.c end)
      local nrun = {}
      for k = 1, K do
        local cd = cands[order[k].c]
        nrun[k] = {score = order[k].v, toks = cd.toks}
        src[#src + 1] = (r - 1) * K + cd.beam - 1
        nxt[#nxt + 1] = {cd.id}
      end
      -- the finished set: the old K and the new top-K stoppers, best K kept
      local full = true
      for k = 1, K do full = full and fin[r][k].done end
      local merged = {}
      for k = 1, K do merged[k] = {v = fin[r][k].score, h = fin[r][k], i = k} end
      local denom = s ^ lp_pen
      for c = 1, keep do
        local cd = cands[c]
        local just = cd.hit and c <= K
        local v = f32(cd.lp / denom)
        if full and es == true then v = f32(v + NEG) end
        if not heur[r] then v = f32(v + NEG) end
        if not just then v = f32(v + NEG) end
        merged[#merged + 1] = {v = v, h = {score = v, toks = cd.toks, done = just}, i = K + c}
      end
      table.sort(merged, function(a, b) if a.v ~= b.v then return a.v > b.v end return a.i < b.i end)
      for k = 1, K do fin[r][k] = {score = merged[k].v, toks = merged[k].h.toks, done = merged[k].h.done} end
      running[r] = nrun
      -- can the running beams still do better?
      local all_done, worst = true, math.huge
      for k = 1, K do all_done = all_done and fin[r][k].done; worst = math.min(worst, fin[r][k].score) end
      local best_len = (es == "never" and lp_pen > 0) and budget[r] or s
      local best = f32(nrun[1].score / best_len ^ lp_pen)
      heur[r] = heur[r] and (not all_done or best > worst)
      local all_hit = true
      for c = 1, keep do all_hit = all_hit and cands[c].hit end
      active[r] = heur[r] and not (all_done and es == true) and not all_hit and s < budget[r]
      if not active[r] then heur[r] = false end                    -- nothing more enters its finished set
    end
    local any = false
    for r = 1, R do any = any or active[r] end
    bar:update(s)
    if not any or s == N then break end
    local idx_t = keng.tensor(src, dec.i64)
    dec.reorder(idx_t)
    if st.counts then st.counts = st.counts:index_select(1, idx_t) end
    dec.feed:copy_(keng.tensor(nxt, dec.i64))
    if st.counts then st.counts:scatter_add_(2, dec.feed, st.one) end
    logits = dec.step(dec.P + s)
  end
  bar:finish()
  for r, row in ipairs(rows) do
    for k = 1, n do
      local t = {table.unpack(row)}
      for i, id in ipairs(fin[r][k].toks) do
        if i <= budget[r] then t[#t + 1] = id end                   -- budget 0: the prompt alone
      end
      out[#out + 1] = t
    end
  end
  return out
end

---------------------------------------------------------------------------------------------
-- generate

-- generate(lm, prompts, opts, level) -> list of id lists (prompt + generated, the stop id
-- included), and the decoded strings when the model has a tokenizer and the prompts were text
-- (or opts.decode). With num_return_sequences n: n lists per prompt, a prompt's lists together.
function G.generate(lm, prompts, opts, level)
  level = level or 2
  local o = G.check(lm, opts, level + 1)
  local rows, text = G.prompt_rows(lm, prompts, level + 1)
  local budget = {}                                                 -- new tokens per row
  for i, r in ipairs(rows) do
    if o.max_new_tokens then
      budget[i] = o.max_new_tokens
    else
      if #r > o.max_length then fail(level, "prompt %d has %d tokens, more than max_length %d", i, #r, o.max_length) end
      budget[i] = o.max_length - #r
    end
  end
  if o.seed then keng.manual_seed(o.seed) end
  local was_training = lm.training
  lm:eval()
  local ok, out = pcall(keng.no_grad, function()
    if o.num_beams > 1 then return G.beam_search(lm, rows, o, budget) end
    local n = o.num_return_sequences
    if n == 1 then return loop(lm, rows, o, budget) end
    local rr, bb = {}, {}
    for i, r in ipairs(rows) do
      for _ = 1, n do rr[#rr + 1], bb[#bb + 1] = r, budget[i] end
    end
    return loop(lm, rr, o, bb)
  end)
  if was_training then lm:train() end
  if not ok then error(out, 0) end
  if lm.tokenizer and (text or o.decode) then
    local strs = {}
    for b, r in ipairs(out) do strs[b] = lm.tokenizer:decode(r) end
    return out, strs
  end
  return out
end

return G
