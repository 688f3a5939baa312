-- json_spec.lua — keng.json.decode, the engine's strict reader (engine/io/json.c) as Lua sees it:
-- the values Python's json.loads reads from the same texts (tests/fixtures/json/cases.json,
-- written by tests/fixtures/gen/gen_json.py), integers vs floats, [] vs {}, null, and the
-- decisions where keng is stricter than Python (duplicate keys, lone surrogates, overflow), each
-- refused with the line, column and byte; a real diffusers config holding -Infinity.
local H = require "helper"
local json = require "keng.json"
local common = require "models.common"

local FIX = "tests/fixtures/json"

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

-- check(v, want, where): v is the Lua value of gen_json.py's typed value `want`
local function check(v, want, where)
  if want.int then
    local n = math.tointeger(tonumber(want.int))
    if n and tostring(n) == want.int then
      assert(math.type(v) == "integer" and v == n, where .. ": want integer " .. want.int .. ", got " .. tostring(v))
    else -- beyond 64 bits: the nearest float, as Lua's tonumber reads the digits
      assert(math.type(v) == "float" and v == tonumber(want.int), where .. ": want float " .. want.int)
    end
  elseif want.float then
    local f = ({nan = 0 / 0, inf = math.huge, ["-inf"] = -math.huge})[want.float] or tonumber(want.float)
    assert(math.type(v) == "float", where .. ": want a float, got " .. math.type(v) .. " " .. tostring(v))
    if f ~= f then assert(v ~= v, where .. ": want nan")
    else
      assert(v == f and 1 / v == 1 / f, where .. ": want " .. want.float .. ", got " .. string.format("%.17g", v))
    end
  elseif want.str then assert.are.equal(want.str, v, where)
  elseif want.bool ~= nil then assert.are.equal(want.bool, v, where)
  elseif want.null then assert.are.equal(json.null, v, where)
  elseif want.array then
    assert.are.equal(json.array_mt, getmetatable(v), where .. ": an array")
    assert.are.equal(#want.array, #v, where)
    for i, w in ipairs(want.array) do check(v[i], w, where .. "[" .. i .. "]") end
  else
    assert.are.equal("table", type(v), where)
    assert.is_nil(getmetatable(v), where .. ": an object")
    local n = 0
    for k, w in pairs(want.object) do n = n + 1; check(v[k], w, where .. "." .. k) end
    for _ in pairs(v) do n = n - 1 end
    assert.are.equal(0, n, where .. ": member count")
  end
end

describe("keng.json.decode", function()
  it("reads what Python's json.loads reads from the same texts", function()
    local cases = json.decode(read(FIX .. "/cases.json"))
    assert.is_true(#cases >= 8)
    for i, c in ipairs(cases) do check(json.decode(c.text), c.value, "case " .. i) end
  end)

  it("keeps integers as integers and everything else as floats", function()
    local v = json.decode('[3, -3, 3.0, 3e0, -0, 9223372036854775807, 9223372036854775808]')
    assert.are.same({"integer", "integer", "float", "float", "integer", "integer", "float"},
      {math.type(v[1]), math.type(v[2]), math.type(v[3]), math.type(v[4]), math.type(v[5]), math.type(v[6]),
       math.type(v[7])})
    assert.are.equal(math.maxinteger, v[6])
  end)

  it("tells [] from {}", function()
    local v = json.decode('{"a": [], "o": {}}')
    assert.are.equal(json.array_mt, getmetatable(v.a))
    assert.is_nil(getmetatable(v.o))
    assert.are.equal('{"a":[],"o":{}}', json.encode(v))
  end)

  it("reads null as json.null, or with null_as_nil as absent (arrays close up)", function()
    local text = '{"w": null, "v": {"d": null, "n": 2}, "ids": [1, null, 2], "a": 1}'
    local kept = json.decode(text)
    assert.are.equal(json.null, kept.w)
    assert.are.equal(json.null, kept.v.d)
    assert.are.equal(3, #kept.ids)
    assert.are.same({v = {n = 2}, ids = {1, 2}, a = 1}, json.decode(text, {null_as_nil = true}))
    assert.is_nil(json.decode(" null ", {null_as_nil = true}))
    assert.are.equal(json.null, json.decode("null"))
  end)

  it("decodes surrogate pairs and refuses lone surrogates", function()
    assert.are.equal("\u{1F600}", json.decode('"\\ud83d\\ude00"'))
    assert.are.equal("\xF0\x9F\x98\x80", json.decode('"\\uD83D\\uDE00"'))
    H.raises(function() json.decode('"\\ud83d"') end, "high surrogate not followed by a low one")
    H.raises(function() json.decode('"\\ud83dx"') end, "high surrogate not followed by a low one")
    H.raises(function() json.decode('"\\ud83d\\u0041"') end, "high surrogate not followed by a low one")
    H.raises(function() json.decode('"a\\ude00"') end, "json: invalid JSON at line 1, column 3 (byte 3): lone low surrogate")
  end)

  it("refuses duplicate keys, naming the key where it repeats", function()
    H.raises(function() json.decode('{"a": 1,\n  "b": {"x": 1, "y": 2, "x": 3}}') end,
      'json: invalid JSON at line 2, column 25 (byte 34): duplicate key "x"')
    H.raises(function() json.decode('{"a": 1, "a": 1}') end, 'duplicate key "a"')
    assert.are.same({a = {a = 1}}, json.decode('{"a": {"a": 1}}'))  -- one key per object
  end)

  it("refuses numbers beyond a double's range instead of reading infinity", function()
    H.raises(function() json.decode('{"x": 1e400}') end,
      "json: invalid JSON at line 1, column 7 (byte 7): number 1e400 is out of the range of a double")
    H.raises(function() json.decode('[-1.5e309]') end, "number -1.5e309 is out of the range of a double")
    assert.are.equal(0.0, json.decode("1e-400"))  -- underflow reads as 0, as in Python
  end)

  it("accepts Python's NaN, Infinity and -Infinity, and nothing else of the kind", function()
    local v = json.decode('{"a": NaN, "b": Infinity, "c": -Infinity}')
    assert.is_true(v.a ~= v.a)
    assert.are.equal(math.huge, v.b)
    assert.are.equal(-math.huge, v.c)
    for _, bad in ipairs{"nan", "inf", "-NaN", "+Infinity", "Inf", "infinity", "-Inf"} do
      H.raises(function() json.decode(bad) end, "json: invalid JSON at line 1")
    end
  end)

  it("refuses invalid UTF-8, control characters, deep nesting and trailing text", function()
    H.raises(function() json.decode('"\xff"') end, "invalid UTF-8 in a string")
    H.raises(function() json.decode('"\xc0\xaf"') end, "invalid UTF-8 in a string")  -- overlong '/'
    H.raises(function() json.decode('"a\tb"') end, "control character 0x09 inside a string")
    H.raises(function() json.decode(string.rep("[", 65) .. string.rep("]", 65)) end, "nested deeper than 64 levels")
    json.decode(string.rep("[", 64) .. string.rep("]", 64))
    H.raises(function() json.decode('{} x') end, "json: invalid JSON at line 1, column 4 (byte 4): trailing characters")
    H.raises(function() json.decode('\n\n  @') end, "json: invalid JSON at line 3, column 3 (byte 5): unexpected character '@'")
    H.raises(function() json.decode("") end, "unexpected end of input")
  end)

  it("checks its arguments", function()
    H.raises(function() json.decode(nil) end, "json.decode: expected a string, got nil")
    H.raises(function() json.decode("{}", {null_as_nill = true}) end,
      "json.decode: unknown option 'null_as_nill' (valid: null_as_nil)")
    -- the error blames the caller's line
    H.raises(function() json.decode("[") end, "json_spec.lua:")
  end)
end)

describe("config files through models.common.read_json", function()
  it("name the file and the position on malformed JSON", function()
    local path = os.tmpname()
    local f = assert(io.open(path, "wb"))
    f:write('{\n  "hidden_size": 8,\n  "hidden_size": 16\n}\n')
    f:close()
    H.raises(function() common.read_json(path, "llama.from_pretrained", 1) end,
      "llama.from_pretrained: " .. path .. ': json: invalid JSON at line 3, column 3 (byte 25): duplicate key "hidden_size"')
    os.remove(path)
  end)

  it("read diffusers' -Infinity (DPMSolverMultistepScheduler's lambda_min_clipped)", function()
    local j = common.read_json(FIX .. "/dpm/scheduler_config.json", "json_spec", 1)
    assert.are.equal(-math.huge, j.lambda_min_clipped)
    assert.is_nil(j.variance_type)  -- null reads as absent
    local s = require("models.schedulers").from_diffusers_config(j)
    s:set_timesteps(4)
    assert.are.equal(4, #s.timesteps)
  end)
end)

describe("other JSON files", function()
  it("tokenizers.from_dir names tokenizer_config.json and the position", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p '" .. dir .. "'"))
    local f = assert(io.open(dir .. "/tokenizer_config.json", "wb"))
    f:write('{"model_max_length": 1e400}')
    f:close()
    local ok, err = pcall(require("keng.tokenizers").from_dir, dir)
    os.execute("rm -rf '" .. dir .. "'")
    assert.is_false(ok)
    assert.truthy(err:find("tokenizers.from_dir: " .. dir .. "/tokenizer_config.json: json: invalid JSON at line 1, " ..
      "column 22 (byte 22): number 1e400 is out of the range of a double", 1, true), err)
  end)

  -- an optional JSON file that is there but broken raises naming it and the JSON error; an
  -- absent one is skipped (keng.util.read_json, the one reader of optional JSON files)
  local function dir_with(files)
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p '" .. dir .. "'"))
    for name, text in pairs(files) do
      local f = assert(io.open(dir .. "/" .. name, "wb"))
      f:write(text)
      f:close()
    end
    return dir
  end
  local function raises_in(dir, fn, want)
    local ok, err = pcall(fn)
    os.execute("rm -rf '" .. dir .. "'")
    assert.is_false(ok)
    assert.truthy(err:find(want, 1, true), err)
  end
  local BROKEN = '{"pad_token": "<|endoftext|>",}'
  local WHY = ": json: invalid JSON at line 1, column 31"

  it("chat_template.attach names a malformed tokenizer_config.json; an absent one is skipped", function()
    local CT = require "keng.chat_template"
    local dir = dir_with({})
    assert.are.same({x = 1}, CT.attach({x = 1}, dir))
    os.execute("rm -rf '" .. dir .. "'")
    dir = dir_with({["tokenizer_config.json"] = BROKEN})
    raises_in(dir, function() CT.attach({}, dir) end, "chat_template.attach: " .. dir .. "/tokenizer_config.json" .. WHY)
    dir = dir_with({})                                                -- a chat_template.jinja that cannot be read
    assert(os.execute("mkdir '" .. dir .. "/chat_template.jinja'"))
    raises_in(dir, function() CT.attach({}, dir) end, "chat_template.attach: " .. dir .. "/chat_template.jinja: Is a directory")
    dir = dir_with({["tokenizer_config.json"] = "[1, 2]"})
    raises_in(dir, function() CT.attach({}, dir) end, "chat_template.attach: " .. dir .. "/tokenizer_config.json: not a JSON object")
  end)

  it("the CLIP tokenizer's pad-token lookup and from_dir name a malformed special_tokens_map.json", function()
    local vocab = require("keng.util").read_file("tests/fixtures/clip/tokenizer/vocab.json")
    local merges = require("keng.util").read_file("tests/fixtures/clip/tokenizer/merges.txt")
    for _, name in ipairs{"special_tokens_map.json", "tokenizer_config.json"} do
      local dir = dir_with({["vocab.json"] = vocab, ["merges.txt"] = merges, [name] = BROKEN})
      raises_in(dir, function() require("keng.clip_tokenize").load(dir) end, "clip_tokenize.load: " .. dir .. "/" .. name .. WHY)
    end
    local dir = dir_with({["vocab.json"] = vocab, ["merges.txt"] = merges, ["special_tokens_map.json"] = BROKEN})
    raises_in(dir, function() require("keng.tokenizers").from_dir(dir) end,
      "tokenizers.from_dir: " .. dir .. "/special_tokens_map.json" .. WHY)
  end)
end)

describe("keng.json.encode", function()
  it("writes floats that read back exactly and stay floats, integers as integers", function()
    local v = {0.1, 1 / 3, 2.0, -0.0, 1e20, 5e-324, 1.7976931348623157e308, 10000.0, 3, -7, math.maxinteger}
    for _, c in ipairs{{0.1, "0.1"}, {2.0, "2.0"}, {-0.0, "-0.0"}, {1e20, "1e+20"}, {3, "3"}, {0.5, "0.5"}} do
      assert.are.equal(c[2], json.encode(c[1]))
    end
    local text = json.encode(v)
    local back = json.decode(text)
    for i, x in ipairs(v) do
      assert.are.equal(math.type(x), math.type(back[i]), "type of " .. i)
      assert.is_true(x == back[i] and 1 / x == 1 / back[i], "value of " .. i .. ": " .. tostring(back[i]))
    end
  end)

  it("writes NaN and infinities as Python's json.dumps does, and reads them back", function()
    assert.are.equal("[NaN,Infinity,-Infinity]", json.encode({0 / 0, math.huge, -math.huge}))
    local back = json.decode(json.encode({lambda_min_clipped = -math.huge}))
    assert.are.equal(-math.huge, back.lambda_min_clipped)
  end)
end)
