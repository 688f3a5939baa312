-- examples/chat.lua — a streaming chat in the terminal on a Hugging Face checkpoint directory
-- (config.json, safetensors, tokenizer.model, tokenizer_config.json with a Gemma or Mistral
-- instruct chat_template): each answer is printed token by token as generate decides it.
--   keng examples/chat.lua path/to/gemma-2b-it [--dtype bf16] [--device cuda] [--max-new-tokens 256]
--                          [--temperature 0.7] [--top-p 0.9] [--template gemma|gemma3|mistral|mistral_v3]
--   keng examples/chat.lua --demo        # random tiny Gemma + the test tokenizer (gibberish)
-- Type a message and Enter; /reset forgets the conversation, /quit (or end of input) leaves.
local keng = require "keng"

local function usage(msg)
  io.stderr:write((msg and msg .. "\n" or "") ..
    "usage: keng examples/chat.lua <checkpoint dir> | --demo [--dtype f32|bf16] [--device cpu|cuda]\n" ..
    "       [--max-new-tokens N] [--temperature T] [--top-p P] [--template gemma|gemma3|mistral|mistral_v3]\n")
  os.exit(2)
end

local o = {dtype = "f32", device = "cpu", max_new = 256}
local dir
local i = 1
while arg[i] do
  local a = arg[i]
  local function value() i = i + 1; return arg[i] or usage(a .. " needs a value") end
  if a == "--demo" then o.demo = true
  elseif a == "--dtype" then o.dtype = value()
  elseif a == "--device" then o.device = value()
  elseif a == "--max-new-tokens" then o.max_new = math.tointeger(tonumber(value())) or usage("--max-new-tokens: an integer")
  elseif a == "--temperature" then o.temperature = tonumber(value()) or usage("--temperature: a number")
  elseif a == "--top-p" then o.top_p = tonumber(value()) or usage("--top-p: a number")
  elseif a == "--template" then o.template = value()
  elseif a:sub(1, 2) == "--" then usage("unknown option " .. a)
  else dir = a end
  i = i + 1
end

local lm, family
if o.demo then
  local gemma = require "models.gemma"
  keng.manual_seed(0)
  local tok = require("keng.tokenizers").sentencepiece("tests/fixtures/sentencepiece/bpe_gemma.model")
  local cfg = gemma.config("gemma_tiny")
  cfg.vocab, cfg.layers = tok:vocab_size(), 1
  lm, family = gemma.build(cfg, {dtype = o.dtype, device = o.device}), "gemma"
  lm.tokenizer = tok
  o.temperature = o.temperature or 1                                -- random weights: sample
else
  if not dir then usage() end
  local cfg = require("models.common").read_config(dir, "chat", 1)  -- errors name the file
  family = cfg.model_type
  local ok, mod = pcall(require, "models." .. tostring(family))
  if not ok then usage("unsupported model_type " .. tostring(family)) end
  lm = mod.from_pretrained(dir, {dtype = o.dtype, device = o.device})
end
local tok = lm.tokenizer or usage("the checkpoint has no tokenizer.model")
local template = o.template or (not tok.chat_template and family) or nil

-- stop at EOS and at the end of the model's turn (Gemma's <end_of_turn>)
local stops = {lm.cfg.eos_id}
local eot = tok.sp and tok.sp:piece_to_id("<end_of_turn>")
if eot and eot >= 0 and eot ~= tok.sp:piece_to_id("<unk>") then stops[#stops + 1] = eot end

local messages = {}
while true do
  io.write("you> ")
  io.flush()
  local line = io.read("l")
  if not line or line == "/quit" then break end
  if line == "/reset" then
    messages = {}
  elseif line:match("%S") then
    messages[#messages + 1] = {role = "user", content = line}
    local ids = tok:apply_chat_template(messages, {add_generation_prompt = true, tokenize = true, template = template})
    io.write("model> ")
    local opts = {max_new_tokens = o.max_new, stop_token_ids = stops, temperature = o.temperature, top_p = o.top_p,
                  on_token = function(_, id, piece)
                    for _, s in ipairs(stops) do if id == s then return end end
                    io.write(piece or "")
                    io.flush()
                  end}
    local out = lm:generate({ids}, opts)[1]
    local reply = {table.unpack(out, #ids + 1)}
    for _, s in ipairs(stops) do if reply[#reply] == s then reply[#reply] = nil end end
    io.write("\n")
    messages[#messages + 1] = {role = "assistant", content = tok:decode(reply)}
  end
end
