-- keng.chat_template — chat prompts in the turn formats of the families keng ships, chosen by
-- the `chat_template` string of a checkpoint's tokenizer_config.json (Hugging Face's Jinja
-- templates are not run: each known template is recognised and rendered by a Lua function that
-- gives the same string; tests/lua/generate_spec.lua checks them against transformers).
--
--   local CT = require "keng.chat_template"
--   CT.attach(tok, dir)                      -- reads dir/tokenizer_config.json (if any)
--   tok:apply_chat_template({{role = "user", content = "Hi"}}, {add_generation_prompt = true})
--     --> "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
--   CT.render("gemma", messages, opts)       -- by format name, no tokenizer
--
-- Formats: "gemma" (Gemma 1 / 2 instruct: <start_of_turn>user|model ... <end_of_turn>, no system
-- role), "gemma3" (Gemma 3: the same turns, a first system message put before the first user
-- turn's text), "mistral" (Mistral 7B Instruct v0.1 / v0.2: [INST] ... [/INST], the answer
-- followed by EOS, no system role) and "mistral_v3" (Mistral 7B Instruct v0.3: [INST] ...[/INST],
-- " " + the trimmed answer + EOS, a first system message put in the last user turn when the
-- conversation ends with one; its tool messages are not supported). A template that is none of
-- them raises, naming its first characters.
local CT = {}

-- the known templates, exactly as the checkpoints' tokenizer_config.json carries them
CT.TEMPLATES = {
  gemma = "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}",
  mistral = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}",
  -- google/gemma-3-*-it
  gemma3 = [==[{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
]==],
  -- mistralai/Mistral-7B-Instruct-v0.3 (tokenizer v3; Mixtral 8x22B Instruct carries it too)
  mistral_v3 = [==[{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
]==],
}

local OPTIONS = {add_generation_prompt = true, tokenize = true, template = true}

local function fail(level, fmt, ...) error("apply_chat_template: " .. string.format(fmt, ...), level + 1) end

-- a template as compared: whitespace at the ends dropped, and the escape \n written as a newline
-- (Jinja reads the two alike inside its strings, and copies of a template differ there)
local function canonical(t) return (t:match("^%s*(.-)%s*$"):gsub("\\n", "\n")) end
local KNOWN = {}
for name, t in pairs(CT.TEMPLATES) do KNOWN[canonical(t)] = name end

-- the format name of a template string, or nil
function CT.format_of(template)
  if type(template) ~= "string" then return nil end
  return KNOWN[canonical(template)]
end

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

-- both formats: user first, then user / assistant alternating
local function alternate(messages, level)
  for i, m in ipairs(messages) do
    if (m.role == "user") ~= (i % 2 == 1) then
      fail(level + 1, "conversation roles must alternate user/assistant/user/assistant/... (message %d is '%s')", i, tostring(m.role))
    end
  end
end

local RENDER = {}

function RENDER.gemma(messages, o, tokens, level)
  if messages[1] and messages[1].role == "system" then fail(level, "the gemma chat format has no system role") end
  local out = {tokens.bos}
  alternate(messages, level + 1)
  for _, m in ipairs(messages) do
    local role = m.role == "assistant" and "model" or m.role
    out[#out + 1] = "<start_of_turn>" .. role .. "\n" .. trim(m.content) .. "<end_of_turn>\n"
  end
  if o.add_generation_prompt then out[#out + 1] = "<start_of_turn>model\n" end
  return table.concat(out)
end

-- Gemma 3: a first system message's text + "\n\n" starts the first turn's (untrimmed)
function RENDER.gemma3(messages, o, tokens, level)
  local prefix, first = "", 1
  if messages[1].role == "system" then prefix, first = messages[1].content .. "\n\n", 2 end
  local out = {tokens.bos}
  for i = first, #messages do
    local m, n = messages[i], i - first + 1
    if (m.role == "user") ~= (n % 2 == 1) then
      fail(level, "conversation roles must alternate user/assistant/user/assistant/... (message %d is '%s')", i, m.role)
    end
    local role = m.role == "assistant" and "model" or m.role
    local text = (n == 1 and prefix or "") .. trim(m.content)
    out[#out + 1] = "<start_of_turn>" .. role .. "\n" .. text .. "<end_of_turn>\n"
  end
  if o.add_generation_prompt then out[#out + 1] = "<start_of_turn>model\n" end
  return table.concat(out)
end

-- Mistral v0.3: the system message joins the last message when that is a user turn (else it is
-- dropped, as the template does); no generation prompt (the [/INST] is one)
function RENDER.mistral_v3(messages, _, tokens, level)
  local sys, first = nil, 1
  if messages[1].role == "system" then sys, first = messages[1].content, 2 end
  for i = first, #messages do
    local m = messages[i]
    if m.role ~= "user" and m.role ~= "assistant" then
      fail(level, "the mistral_v3 chat format takes user and assistant messages after an optional first system " ..
        "message (message %d is '%s'; tool messages are not supported)", i, m.role)
    end
    if (m.role == "user") ~= ((i - first) % 2 == 0) then
      fail(level, "after the optional system message, conversation roles must alternate " ..
        "user/assistant/user/assistant/... (message %d is '%s')", i, m.role)
    end
  end
  local out = {tokens.bos}
  for i = first, #messages do
    local m = messages[i]
    if m.role == "user" then
      local sp = (i == #messages and sys) and sys .. "\n\n" or ""
      out[#out + 1] = "[INST] " .. sp .. m.content .. "[/INST]"
    else
      out[#out + 1] = " " .. trim(m.content) .. tokens.eos
    end
  end
  return table.concat(out)
end

function RENDER.mistral(messages, _, tokens, level)
  local out = {tokens.bos}
  for i, m in ipairs(messages) do
    if (m.role == "user") ~= (i % 2 == 1) then alternate(messages, level + 1) end
    if m.role == "user" then
      out[#out + 1] = "[INST] " .. m.content .. " [/INST]"
    elseif m.role == "assistant" then
      out[#out + 1] = m.content .. tokens.eos
    else
      fail(level, "the mistral chat format has only user and assistant roles (message %d is '%s')", i, tostring(m.role))
    end
  end
  return table.concat(out)
end

local function check_messages(messages, level)
  if type(messages) ~= "table" or #messages == 0 then fail(level + 1, "messages must be a non-empty list of {role =, content =}") end
  for i, m in ipairs(messages) do
    if type(m) ~= "table" or type(m.role) ~= "string" or type(m.content) ~= "string" then
      fail(level + 1, "message %d must be {role = <string>, content = <string>}", i)
    end
  end
end

-- render(format_or_template, messages, opts, tokens) -> string. tokens: {bos =, eos =} strings
-- (default Gemma's "<bos>"/"<eos>" or Mistral's "<s>"/"</s>")
function CT.render(which, messages, opts, tokens, level)
  level = level or 2
  opts = opts or {}
  for k in pairs(opts) do
    if not OPTIONS[k] then fail(level, "unknown option '%s' (valid: add_generation_prompt, template, tokenize)", tostring(k)) end
  end
  local name = RENDER[which] and which or CT.format_of(which)
  if not name then
    if type(which) ~= "string" then
      fail(level, "no chat template (the tokenizer has none; pass {template = \"gemma\" | \"gemma3\" | " ..
        "\"mistral\" | \"mistral_v3\"})")
    end
    fail(level, "unknown chat template '%s...' (known: the Gemma 1 / 2 and 3 and Mistral 7B Instruct v0.1 / v0.2 " ..
      "and v0.3 templates)", which:sub(1, 60))
  end
  check_messages(messages, level + 1)
  local defaults = name:find("^gemma") and {bos = "<bos>", eos = "<eos>"} or {bos = "<s>", eos = "</s>"}
  tokens = tokens or {}
  return RENDER[name](messages, opts, {bos = tokens.bos or defaults.bos, eos = tokens.eos or defaults.eos}, level + 1), name
end

-- the ids of a rendered prompt: the BOS / EOS strings become their ids, the rest is encoded
-- without BOS (SentencePiece keeps user-defined pieces such as <start_of_turn> whole)
local function tokenize(tok, text, tokens)
  local ids, i = {}, 1
  local specials = {{tokens.bos, tok.bos_id}, {tokens.eos, tok.eos_id}}
  while i <= #text do
    local at, which = nil, nil
    for _, s in ipairs(specials) do
      local j = s[1] and s[1] ~= "" and text:find(s[1], i, true)
      if j and (not at or j < at) then at, which = j, s end
    end
    local stop = at and at - 1 or #text
    if stop >= i then
      local part = tok:encode(text:sub(i, stop), {add_bos = false})
      for _, id in ipairs(part) do ids[#ids + 1] = id end
    end
    if not at then break end
    ids[#ids + 1] = which[2]
    i = at + #which[1]
  end
  return ids
end

-- apply(tok, messages, {add_generation_prompt = false, tokenize = false, template = name})
-- -> the prompt string (or its ids with tokenize = true) in tok.chat_template's format
function CT.apply(tok, messages, opts)
  opts = opts or {}
  local which = opts.template or tok.chat_template
  local tokens = {bos = tok.bos_token, eos = tok.eos_token}
  local text, name = CT.render(which, messages, opts, tokens, 3)
  if not opts.tokenize then return text end
  local defaults = name:find("^gemma") and {bos = "<bos>", eos = "<eos>"} or {bos = "<s>", eos = "</s>"}
  return tokenize(tok, text, {bos = tokens.bos or defaults.bos, eos = tokens.eos or defaults.eos})
end

-- attach(tok, dir) -> tok with chat_template, bos_token and eos_token from dir's
-- tokenizer_config.json (when present; a malformed one raises "chat_template.attach: <path>:
-- <JSON error>"). An unknown template is kept: it raises when used.
-- transformers 5 saves the template as dir/chat_template.jinja instead; that file wins, as it
-- does in transformers.
function CT.attach(tok, dir)
  if type(tok) ~= "table" then return tok end
  local jinja = io.open(dir .. "/chat_template.jinja", "rb")
  if jinja then
    local text, err = jinja:read("a")
    jinja:close()
    if not text then error(string.format("chat_template.attach: %s/chat_template.jinja: %s", dir, tostring(err)), 2) end
    tok.chat_template = text
  end
  -- absent: nothing to attach; malformed: raises naming the file (never silently skipped)
  local j = require("keng.util").read_json(dir .. "/tokenizer_config.json", "chat_template.attach", 2)
  if not j then return tok end
  local function str(v) return type(v) == "string" and v or (type(v) == "table" and type(v.content) == "string" and v.content) or nil end
  if type(j.chat_template) == "string" and not jinja then tok.chat_template = j.chat_template end
  tok.bos_token, tok.eos_token = str(j.bos_token) or tok.bos_token, str(j.eos_token) or tok.eos_token
  return tok
end

return CT
