-- model_dir_links_spec.lua — the files a loader opens by name in a model directory follow one
-- symlink rule (docs/security.md): a tokenizer file (tokenizer.json, tokenizer_config.json,
-- vocab.txt, tokenizer.model, vocab.json, merges.txt, ...) like a shard of a sharded index must
-- resolve inside the directory, or, in a Hugging Face cache snapshot
-- (<repo>/snapshots/<rev>/ and its subfolders, whose files link into <repo>/blobs/), inside the
-- repository's folder. A link elsewhere is refused with the path it resolves to.
local keng = require "keng"
local H = require "helper"
local T = require "keng.tokenizers"

local FIX = "tests/fixtures/"
local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local root = io.popen("pwd"):read("l")
local tmp

before_each(function()
  tmp = os.tmpname()
  os.remove(tmp)
  assert(os.execute("mkdir -p " .. q(tmp)))
end)
after_each(function() os.execute("rm -rf " .. q(tmp)) end)

local function sh(cmd) assert(os.execute(cmd), cmd) end

describe("symlinks in model directories", function()
  it("a tokenizer file linking out of the directory is refused by every loader", function()
    local d = tmp .. "/model"
    sh("mkdir -p " .. q(d) .. " && cp " .. FIX .. "bert/config.json " .. FIX .. "bert/model.safetensors " .. q(d))
    sh("ln -s " .. q(root .. "/" .. FIX .. "tf5/bert/tokenizer.json") .. " " .. q(d .. "/tokenizer.json"))
    local msg = "tokenizer.json resolves to '" .. root .. "/" .. FIX .. "tf5/bert/tokenizer.json', outside the model directory '"
    H.raises(function() T.from_dir(d) end, "tokenizers.from_dir: " .. d .. "/" .. msg)
    H.raises(function() require("models.bert").from_pretrained(d) end, msg)
    H.raises(function() T.find(d) end, "(a symlink leaving it is refused)")
    -- the causal LMs and CLIP's loader
    local m = tmp .. "/mistral"
    sh("mkdir -p " .. q(m) .. " && cp " .. FIX .. "mistral/config.json " .. FIX .. "mistral/model.safetensors " .. q(m))
    sh("ln -s " .. q(root .. "/" .. FIX .. "sentencepiece/bpe.model") .. " " .. q(m .. "/tokenizer.model"))
    H.raises(function() require("models.mistral").from_pretrained(m) end, "from_pretrained: " .. m .. "/tokenizer.model resolves to")
    local c = tmp .. "/clip"
    sh("mkdir -p " .. q(c) .. " && cp " .. FIX .. "clip/tokenizer/vocab.json " .. q(c))
    sh("ln -s " .. q(root .. "/" .. FIX .. "clip/tokenizer/merges.txt") .. " " .. q(c .. "/merges.txt"))
    H.raises(function() require("keng.clip_tokenize").load(c) end, "clip_tokenize.load: " .. c .. "/merges.txt resolves to")
  end)

  it("so are config.json and a whole weights file linking out (every family's from_pretrained)", function()
    local d = tmp .. "/model"
    sh("mkdir -p " .. q(d) .. " && cp " .. FIX .. "bert/model.safetensors " .. q(d))
    sh("ln -s " .. q(root .. "/" .. FIX .. "bert/config.json") .. " " .. q(d .. "/config.json"))
    H.raises(function() require("models.bert").from_pretrained(d) end,
      "bert.from_pretrained: " .. d .. "/config.json resolves to '" .. root .. "/" .. FIX .. "bert/config.json', outside")
    sh("rm " .. q(d .. "/config.json") .. " " .. q(d .. "/model.safetensors") .. " && cp " .. FIX .. "bert/config.json " .. q(d))
    sh("ln -s " .. q(root .. "/" .. FIX .. "bert/model.safetensors") .. " " .. q(d .. "/model.safetensors"))
    H.raises(function() require("models.bert").from_pretrained(d) end, "/model.safetensors resolves to '")
    for _, case in ipairs{{"mistral", "model.safetensors"}, {"sam", "model.safetensors"},
                          {"sd/unet", "diffusion_pytorch_model.safetensors"}, {"sd/vae", "config.json"}} do
      local m = tmp .. "/" .. case[1]:gsub("/", "_")
      sh("mkdir -p " .. q(m) .. " && cp " .. FIX .. case[1] .. "/* " .. q(m) .. " && rm " .. q(m .. "/" .. case[2]))
      sh("ln -s " .. q(root .. "/" .. FIX .. case[1] .. "/" .. case[2]) .. " " .. q(m .. "/" .. case[2]))
      local mod = require("models." .. case[1]:gsub("^sd/", ""))
      H.raises(function() mod.from_pretrained(m) end, "/" .. case[2] .. " resolves to '")
    end
  end)

  it("a link that stays inside, a linked directory, and a cache snapshot's links into blobs/ are followed", function()
    local d = tmp .. "/model"
    sh("mkdir -p " .. q(d .. "/store") .. " && cp " .. FIX .. "tf5/bert/tokenizer.json " .. q(d .. "/store/"))
    sh("ln -s store/tokenizer.json " .. q(d .. "/tokenizer.json"))
    assert.are.same({2, 3}, T.from_dir(d):encode(""))
    sh("ln -s " .. q(root .. "/" .. FIX .. "tf5/clip") .. " " .. q(tmp .. "/linked"))   -- the whole directory
    assert.is_truthy(T.from_dir(tmp .. "/linked"))
    -- models--org--sd/snapshots/<rev>/tokenizer/vocab.json -> ../../../blobs/<hash> (a diffusers subfolder)
    local repo = tmp .. "/hub/models--org--sd"
    local snap = repo .. "/snapshots/0123abc"
    sh("mkdir -p " .. q(repo .. "/blobs") .. " " .. q(snap .. "/tokenizer") .. " " .. q(snap .. "/vae"))
    sh("cp " .. FIX .. "clip/tokenizer/vocab.json " .. q(repo .. "/blobs/h1") .. " && cp " .. FIX ..
      "clip/tokenizer/merges.txt " .. q(repo .. "/blobs/h2"))
    sh("ln -s ../../../blobs/h1 " .. q(snap .. "/tokenizer/vocab.json") .. " && ln -s ../../../blobs/h2 " ..
      q(snap .. "/tokenizer/merges.txt"))
    local tok = require("keng.clip_tokenize").load(snap .. "/tokenizer")
    assert.are.same(require("keng.clip_tokenize").load(FIX .. "clip/tokenizer"):encode("a photo"), tok:encode("a photo"))
    -- and a sharded VAE in the snapshot's vae/ (its shards link into blobs/ too)
    local src = FIX .. "sd_sharded/vae"
    for name in io.popen("ls " .. src):lines() do
      sh("cp " .. q(src .. "/" .. name) .. " " .. q(repo .. "/blobs/" .. name) .. " && ln -s ../../../blobs/" .. name .. " " ..
        q(snap .. "/vae/" .. name))
    end
    assert.is_truthy(require("models.vae").from_pretrained(snap .. "/vae"))
    -- a link from the snapshot to another repository's blobs is still refused
    sh("mkdir -p " .. q(tmp .. "/hub/models--evil--x/blobs") .. " && cp " .. FIX .. "clip/tokenizer/vocab.json " ..
      q(tmp .. "/hub/models--evil--x/blobs/h1") .. " && rm " .. q(snap .. "/tokenizer/vocab.json") ..
      " && ln -s ../../../../models--evil--x/blobs/h1 " .. q(snap .. "/tokenizer/vocab.json"))
    H.raises(function() require("keng.clip_tokenize").load(snap .. "/tokenizer") end, "outside the model directory '" )
  end)

  it("keng.path_escapes names the resolved path and the directory it had to stay in", function()
    sh("mkdir -p " .. q(tmp .. "/a") .. " && echo x > " .. q(tmp .. "/f") .. " && ln -s ../f " .. q(tmp .. "/a/l"))
    local real, top = keng.path_escapes(tmp .. "/a", tmp .. "/a/l")
    assert.matches("/f$", real)
    assert.matches("/a$", top)
    assert.is_nil(keng.path_escapes(tmp .. "/a", tmp .. "/a/missing"))
    H.raises(function() keng.path_escapes(tmp) end, "bad argument #2 to 'path_escapes'")
  end)
end)
