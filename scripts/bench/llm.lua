-- llm.lua — the Gemma and Mistral rows (docs/benchmarks.md; config.runners sends both families here):
--   fit:      LoRA rank 4 on query and value of every layer (everything else frozen), causal-LM
--             CE with f32 logits, AdamW with Keras defaults, weights and compute in the row dtype
--             (bf16 as Keras ran it); x = BOS + 127 words, y = x shifted by one. [B, T] i64.
--   generate: lm:generate(prompts [B, 6], {max_length = 50, sampler = "greedy"}); prompts are BOS
--             + the n-th 5-word tuple. EOS does not stop a row (stop_token_ids = {}), so every
--             call decodes exactly max_length - 6 tokens whatever the random weights predict.
--             A row with `quantize` (all.lua --quantize) runs keng.quantize(lm, "int8" | "int4")
--             first; generate rows report ms_per_token and weight_bytes_per_token.
-- Shape letters: B batch, T tokens, V vocab.
local keng = require "keng"
local optim = require "keng.optim"
local lora = require "keng.lora"
local bench = require "keng.bench"
local common = require "bench.common"
local config = require "bench.config"
local roofline = require "bench.roofline"
local util = require "keng.util"

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
    local input = x
    if bench.graphable(ctx) then
      -- lm(x, opts) without the host-side id check (ids:max():item() cannot run inside a CUDA
      -- Graph capture; x is built valid above) and with positions made before the capture
      input = {x, {check_ids = false, position_ids = keng.arange(T, {device = ctx.device})}}  -- [T]
    end
    r = common.time_fit(lm, input, y, opt, common.lm_loss, ctx, B * T)
  else
    if row.quantize then keng.quantize(lm, row.quantize) end          -- --quantize: int8 / int4 weights
    local prompts = common.lm_prompts(row.family, B, size.prompt_words, vocab):to(ctx.device)  -- [B, 6]
    local gen = {max_length = size.max_length, sampler = "greedy", stop_token_ids = {}}
    info.shapes = {prompts = prompts.shape, output = {B, size.max_length}}
    info.max_length = size.max_length
    r = common.time_generate(lm, prompts, gen, ctx, B * (size.max_length - prompts.shape[2]))
    -- per decoded token: ms, and the weight bytes a decode step reads (every state-dict tensor
    -- once, the embedding only as a tied head), shared by the B rows of the batch
    local steps = size.max_length - prompts.shape[2]
    r.ms_per_token = r.mean_ms / (B * steps)
    local bytes, tied = 0, lm.cfg.tie
    for name, t in pairs(lm:state_dict()) do
      if tied or name ~= "model.embed_tokens.weight" then bytes = bytes + util.nbytes(t) end
    end
    r.weight_bytes_per_token = bytes / B
    r.quantize = row.quantize
    if row.quantize then r.tflops = nil end  -- the FLOP counter does not count linear_q8 / linear_q4
  end
  info.params, info.trainable = lm:num_params(), lm:num_params{trainable = true}
  if row.task == "generate" then  -- the memory roofline: bytes one call reads (bench/roofline.lua)
    local elem = ({bf16 = 2, f16 = 2, f32 = 4})[ctx.dtype] or 4
    local P = info.shapes.prompts[2]
    local bytes, weights = roofline.decode_bytes(lm.cfg, info.params, B, P, size.max_length, elem)
    if row.quantize then  -- the quantized weights' own bytes (codes + scales), not params x elem
      local q = r.weight_bytes_per_token * B
      bytes, weights = bytes + (size.max_length - P) * (q - weights), q
    end
    info.bytes_per_step, info.weight_bytes = bytes, weights
  end
  for k, v in pairs(info) do r[k] = v end
  return r
end

return M
