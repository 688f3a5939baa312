-- llm.lua — the Gemma and Mistral rows (BENCH_SPEC), shared by gemma.lua and mistral.lua:
--   fit:      LoRA rank 4 on query and value of every layer (everything else frozen), causal-LM
--             CE with f32 logits, AdamW with Keras defaults, weights and compute in the row dtype
--             (bf16 as Keras ran it); x = BOS + 127 words, y = x shifted by one. [B, T] i64.
--   generate: lm:generate(prompts [B, 6], {max_length = 50, sampler = "greedy"}); prompts are BOS
--             + the n-th 5-word tuple. EOS does not stop a row (stop_token_ids = {}), so every
--             call decodes exactly max_length - 6 tokens whatever the random weights predict.
-- Shape letters: B batch, T tokens, V vocab.
local keng = require "keng"
local optim = require "keng.optim"
local lora = require "keng.lora"
local bench = require "keng.bench"
local common = require "bench.common"
local config = require "bench.config"
local roofline = require "bench.roofline"

local M = {}

function M.run(row, ctx)
  local family = require(row.module)
  local size = row[ctx.tier]
  local B = row.batch
  keng.manual_seed(0)
  local lm = family.from_preset(size.preset, {dtype = ctx.dtype, device = ctx.device})
  local vocab = lm.cfg.vocab
  local info = {preset = size.preset, shapes = {}}
  local r
  if row.task == "fit" then
    lora.enable(lm, {rank = row.lora.rank, targets = row.lora.targets})
    local T = size.seq
    local x, y = common.lm_batch(row.family, B, T, vocab)
    x, y = x:to(ctx.device), y:to(ctx.device)                       -- [B, T] each
    local trainable = {}
    for _, p in ipairs(lm:parameters()) do if p.requires_grad then trainable[#trainable + 1] = p end end
    local opt = optim.AdamW(trainable)
    info.shapes = {x = {B, T}, y = {B, T}, logits = {B, T, vocab}}
    local model = lm
    if bench.graphable(ctx) then
      -- the same logits as lm(x) without its host-side id check (ids:max():item() cannot run
      -- inside a CUDA Graph capture; x is built valid above)
      local pos = keng.arange(T, {device = ctx.device})                -- [T]
      model = setmetatable({train = function() lm:train() end},
        {__call = function(_, ids) return lm:head(lm:hidden(ids, {positions = pos})) end})
    end
    r = common.time_fit(model, x, y, opt, common.lm_loss, ctx, B * T)
  else
    local prompts = common.lm_prompts(row.family, B, size.prompt_words, vocab):to(ctx.device)  -- [B, 6]
    local gen = {max_length = size.max_length, sampler = "greedy", stop_token_ids = {}}
    info.shapes = {prompts = prompts.shape, output = {B, size.max_length}}
    info.max_length = size.max_length
    r = common.time_generate(lm, prompts, gen, ctx, B * (size.max_length - prompts.shape[2]))
  end
  info.params, info.trainable = common.count_params(lm)
  if row.task == "generate" then  -- the memory roofline: bytes one call reads (bench/roofline.lua)
    local elem = ({bf16 = 2, f16 = 2, f32 = 4})[ctx.dtype] or 4
    info.bytes_per_step, info.weight_bytes = roofline.decode_bytes(lm.cfg, info.params, B, info.shapes.prompts[2], size.max_length, elem)
  end
  for k, v in pairs(info) do r[k] = v end
  return r
end

return M
