-- options_spec.lua — no option is silently ignored: every options table in keng refuses a key it
-- does not know, naming the key and the valid ones, at the caller's line (keng.options); range
-- checks of counts and rates (fit epochs / batch_size, optimizer lr, non-leaf parameters).
local keng = require "keng"
local H = require "helper"
local nn = require "keng.nn"
local optim = require "keng.optim"
local train = require "keng.train"
local cbs = require "keng.callbacks"
local options = require "keng.options"

-- fn raises with every pattern in its message, blamed on this file (the user's line)
local function refuses(fn, ...)
  local err = H.raises(fn, (...))
  for i = 2, select("#", ...) do
    local p = select(i, ...)
    assert(err:find(p, 1, true), "error '" .. err .. "' does not contain '" .. p .. "'")
  end
  assert(err:find("options_spec.lua:", 1, true), "error not blamed on the caller's line: " .. err)
  return err
end

local function tiny()
  local m = nn.Linear(2, 3)
  local x, y = keng.randn({8, 2}), keng.tensor({0, 1, 2, 0, 1, 2, 0, 1}, {dtype = "i64"})
  return m, {x = x, y = y}
end

describe("keng.options", function()
  it("check names the unknown keys and the valid ones, sorted", function()
    local function f(o) local r = options.check("f", o, {"b", "a"}); return r end
    assert.are.same({}, f(nil))
    assert.are.same({a = 1}, f({a = 1}))
    refuses(function() f({c = 1}) end, "f: unknown option 'c' (valid: a, b)")  -- blames f's caller
    H.raises(function() f({d = 1, c = 2}) end, "f: unknown options 'c', 'd' (valid: a, b)")
    H.raises(function() f(3) end, "f: options must be a table, got number")
    H.raises(function() f({[1] = true}) end, "unknown option '1'")
  end)

  it("integer and number check counts and rates", function()
    assert.equal(3, options.integer("f", "n", 3.0, 0))
    H.raises(function() options.integer("f", "n", 2.5, 1) end, "f: n must be a whole number, got 2.5")
    H.raises(function() options.integer("f", "n", -1, 0) end, "f: n must be >= 0, got -1")
    H.raises(function() options.integer("f", "n", "3", 0) end, "whole number")
    H.raises(function() options.number("f", "x", math.huge) end, "f: x must be a finite number, got inf")
    H.raises(function() options.number("f", "x", 0 / 0) end, "finite number")
    H.raises(function() options.number("f", "x", -1, 0) end, "f: x must be >= 0, got -1")
  end)
end)

describe("fit / evaluate / predict options", function()
  it("fit refuses misspelt keys (epoch) and an initial_epoch past epochs", function()
    local m, data = tiny()
    refuses(function() train.fit(m, data, {loss = "cross_entropy", epoch = 3, verbose = 0}) end,
      "fit: unknown option 'epoch'", "epochs", "batch_size")
    refuses(function() train.fit(m, data, {loss = "cross_entropy", initial_epoch = 5, verbose = 0}) end,
      "fit: 5 epochs are already done (initial_epoch) but epochs = 1")
  end)

  it("fit checks counts and rates", function()
    local m, data = tiny()
    local function fit(o)
      o.loss, o.verbose = "cross_entropy", o.verbose or 0
      return train.fit(m, data, o)
    end
    refuses(function() fit({epochs = -1}) end, "fit: epochs must be >= 0, got -1")
    refuses(function() fit({epochs = 1.5}) end, "fit: epochs must be a whole number, got 1.5")
    refuses(function() fit({batch_size = 2.5}) end, "fit: batch_size must be a whole number, got 2.5")
    refuses(function() fit({batch_size = 0}) end, "fit: batch_size must be >= 1, got 0")
    refuses(function() fit({steps_per_epoch = 0}) end, "fit: steps_per_epoch must be >= 1")
    refuses(function() fit({lr = math.huge}) end, "fit: lr must be a finite number, got inf")
    refuses(function() fit({clip_norm = -1}) end, "fit: clip_norm must be >= 0")
    refuses(function() fit({verbose = 3}) end, "fit: verbose must be 0, 1, 2 or \"auto\"")
    local h = fit({epochs = 2.0, batch_size = 4})   -- integral floats are whole numbers
    assert.equal(2, #h.epoch)
  end)

  it("evaluate and predict refuse unknown keys", function()
    local m, data = tiny()
    refuses(function() train.evaluate(m, data, {loss = "cross_entropy", epochs = 1}) end,
      "evaluate: unknown option 'epochs'", "batch_size", "steps")
    refuses(function() train.predict(m, data.x, {batch = 4}) end, "predict: unknown option 'batch' (valid: batch_size, steps, verbose)")
    refuses(function() train.predict(m, data.x, {batch_size = 0.5}) end, "predict: batch_size must be a whole number")
  end)

  it("callbacks refuse unknown keys", function()
    refuses(function() cbs.EarlyStopping{patience = 2, restore = true} end, "EarlyStopping: unknown option 'restore'")
    refuses(function() cbs.ModelCheckpoint("/tmp/x.safetensors", {save_best = true}) end,
      "ModelCheckpoint: unknown option 'save_best'")
    refuses(function() cbs.TerminateOnNaN{verbos = 0} end, "TerminateOnNaN: unknown option 'verbos'")
    refuses(function() cbs.CSVLogger("/tmp/x.csv", {sep = ";"}) end, "CSVLogger: unknown option 'sep'")
    refuses(function() cbs.LossCurve("/tmp/x.svg", {name = "a"}) end, "LossCurve: unknown option 'name'")
    refuses(function() cbs.LearningRateScheduler(function(_, lr) return lr end, {quiet = true}) end,
      "LearningRateScheduler: unknown option 'quiet'")
  end)
end)

describe("optimizer options", function()
  it("refuse an infinite learning rate and other non-finite hyper-parameters", function()
    local p = keng.zeros({2}):requires_grad_()
    refuses(function() optim.AdamW({p}, {lr = math.huge}) end, "AdamW: lr must be finite, got inf")
    refuses(function() optim.SGD({p}, {lr = math.huge}) end, "SGD: lr must be finite")
    refuses(function() optim.Adam({p}, {weight_decay = math.huge}) end, "Adam: weight_decay must be finite")
    refuses(function() optim.AdamW({p}, {learning_rat = 1}) end, "AdamW: unknown option 'learning_rat'",
      "learning_rate", "schedule")
    local opt = optim.SGD({p}, {lr = 0.1})
    opt.lr = math.huge
    p.grad = keng.ones({2})
    refuses(function() opt:step() end, "SGD:step: lr must be a finite number >= 0, got inf")
    refuses(function() optim.schedules.cosine(1, 10, {warmup_steps = 2}) end,
      "schedules.cosine: unknown option 'warmup_steps' (valid: min_lr, warmup)")
  end)

  it("refuse a parameter that is not a leaf (its update would be lost)", function()
    local p = keng.zeros({2}):requires_grad_()
    local q = p * 2
    refuses(function() optim.AdamW({p, q}) end, "AdamW: params[2] is not a leaf tensor")
  end)
end)

describe("nn layer constructors", function()
  it("refuse unknown keys at the user's line", function()
    refuses(function() nn.Linear(2, 3, {biass = false}) end, "Linear: unknown option 'biass'", "bias, bias_init")
    refuses(function() nn.Embedding(5, 3, {padding_idx = 0}) end, "Embedding: unknown option 'padding_idx'")
    refuses(function() nn.LayerNorm(3, {epsilon = 1e-6}) end, "LayerNorm: unknown option 'epsilon'", "eps")
    refuses(function() nn.RMSNorm(3, {offset = true}) end, "RMSNorm: unknown option 'offset'", "unit_offset")
    refuses(function() nn.GroupNorm(1, 3, {eps = 1e-6, affin = false}) end, "GroupNorm: unknown option 'affin'")
    refuses(function() nn.Conv2d(1, 1, 3, {pad = 1}) end, "Conv2d: unknown option 'pad'", "padding")
    refuses(function() nn.ConvTranspose2d(1, 1, 3, {outpadding = 1}) end, "ConvTranspose2d: unknown option 'outpadding'")
    refuses(function() nn.MultiHeadAttention(4, 2, {kv_head = 1}) end, "MultiHeadAttention: unknown option 'kv_head'")
    refuses(function() nn.TransformerEncoderLayer(4, 2, 8, {pre_norm = true}) end,
      "TransformerEncoderLayer: unknown option 'pre_norm'", "norm_first")
    refuses(function() nn.GELU{approx = "tanh"} end, "GELU: unknown option 'approx'")
    refuses(function() nn.GELU("tan") end, "GELU: approximate must be \"none\" or \"tanh\"")
    local mha = nn.MultiHeadAttention(4, 2)
    refuses(function() mha(keng.zeros({1, 2, 4}), {masks = true}) end, "MultiHeadAttention:forward: unknown option 'masks'")
  end)

  it("an init option that was ignored before now takes effect (Linear/Embedding std)", function()
    keng.manual_seed(3)
    local l = nn.Linear(64, 64, {weight_init = "normal", std = 1.0})
    local sd = l.weight:float():pow(2):mean():sqrt():item()
    assert.truthy(sd > 0.8 and sd < 1.2, "std 1 ignored: " .. sd)
    local e = nn.Embedding(64, 64, {init = "normal", std = 1.0})
    sd = e.weight:float():pow(2):mean():sqrt():item()
    assert.truthy(sd > 0.8 and sd < 1.2, "std 1 ignored: " .. sd)
  end)
end)

describe("model constructors and pipelines", function()
  local bert = require "models.bert"
  local clip = require "models.clip"
  local sam = require "models.sam"
  local sd = require "models.stable_diffusion"
  local unet = require "models.unet"
  local vae = require "models.vae"

  it("from_preset / from_pretrained refuse unknown keys", function()
    refuses(function() bert.from_preset("bert_tiny", {device = "meta", num_labels = 2}) end,
      "bert.from_preset: unknown option 'num_labels'", "num_classes")
    refuses(function() bert.from_pretrained("tests/fixtures/bert", {torch_dtype = "f32"}) end,
      "bert.from_pretrained: unknown option 'torch_dtype'")
    refuses(function() clip.from_preset("sd_tiny_text", {device = "meta", precision = "bf16"}) end,
      "clip.from_preset: unknown option 'precision'")
    refuses(function() clip.from_pretrained("tests/fixtures/clip/text_encoder", {dtyp = "f32"}) end,
      "clip.from_pretrained: unknown option 'dtyp'")
    refuses(function() sam.from_preset("sam_tiny", {device = "meta", normalise = true}) end,
      "sam.from_preset: unknown option 'normalise'")
    refuses(function() sam.from_pretrained("tests/fixtures/sam", {weights = "x"}) end, "sam.from_pretrained: unknown option 'weights'")
    refuses(function() unet.from_preset("sd_tiny", {device = "meta", seed = 1}) end, "unet.from_preset: unknown option 'seed'")
    refuses(function() vae.from_preset("sd_tiny", {device = "meta", scaling_factor = 1}) end,
      "vae.from_preset: unknown option 'scaling_factor'")
    refuses(function() sd.from_preset("sd_tiny", {device = "meta", scheduler = "euler"}) end,
      "stable_diffusion.from_preset: unknown option 'scheduler'")
    refuses(function() sd.from_pretrained("tests/fixtures/sd", {safety_checker = false}) end,
      "stable_diffusion.from_pretrained: unknown option 'safety_checker'")
  end)

  it("text_to_image refuses image-to-image options (image, strength) instead of ignoring them", function()
    local pipe = sd.from_preset("sd_tiny", {seed = 0})
    local img = keng.zeros({1, 64, 64, 3}, {dtype = "u8"})
    refuses(function() pipe:text_to_image("a cat", {image = img, strength = 0.6, num_steps = 1}) end,
      "text_to_image: unknown options 'image', 'strength'", "guidance_scale", "negative_prompt")
    refuses(function() pipe("a cat", {num_step = 1}) end, "text_to_image: unknown option 'num_step'")
  end)

  it("SAM predict refuses unknown prompt keys and options", function()
    local m = sam.from_preset("sam_tiny", {seed = nil})
    local images = keng.zeros({1, 3, 256, 256})
    refuses(function() m:predict{images = images, point = {{10, 10}}} end, "sam: unknown input 'point'", "points")
    refuses(function() m:predict({images = images}, {multimask_output = false}) end,
      "sam:predict: unknown option 'multimask_output'")
  end)
end)

describe("model configs: keys that change the numbers and are not implemented", function()
  local bert = require "models.bert"
  local sam = require "models.sam"
  local unet = require "models.unet"
  local vae = require "models.vae"

  it("BERT refuses relative position embeddings and decoder settings", function()
    H.with_model_dir("tests/fixtures/bert", function(j) j.position_embedding_type = "relative_key" end, function(dir)
      refuses(function() bert.from_pretrained(dir) end,
        "config position_embedding_type = \"relative_key\" is not supported (keng implements position_embedding_type = \"absolute\" only)")
    end)
    H.with_model_dir("tests/fixtures/bert", function(j) j.is_decoder = true end, function(dir)
      refuses(function() bert.from_pretrained(dir) end, "config is_decoder = true is not supported")
    end)
  end)

  it("UNet and VAE refuse other activations, class embeddings and latent shifts", function()
    H.with_model_dir("tests/fixtures/sd/unet", function(j) j.act_fn = "gelu" end, function(dir)
      refuses(function() unet.from_pretrained(dir) end, "config act_fn = \"gelu\" is not supported")
    end)
    H.with_model_dir("tests/fixtures/sd/unet", function(j) j.class_embed_type = "timestep" end, function(dir)
      refuses(function() unet.from_pretrained(dir) end,
        "config class_embed_type = \"timestep\" is not supported (keng implements class_embed_type = absent (null) only)")
    end)
    H.with_model_dir("tests/fixtures/sd/unet", function(j) j.resnet_time_scale_shift = "scale_shift" end, function(dir)
      refuses(function() unet.from_pretrained(dir) end, "resnet_time_scale_shift")
    end)
    H.with_model_dir("tests/fixtures/sd/vae", function(j) j.shift_factor = 0.1159 end, function(dir)
      refuses(function() vae.from_pretrained(dir) end, "config shift_factor = 0.1159 is not supported")
    end)
  end)

  it("CLIP refuses keys it does not know, dropout, and other model types, as the other loaders", function()
    local clip = require "models.clip"
    H.with_model_dir("tests/fixtures/clip/text_encoder", function(j) j.position_embedding_type = "relative_key" end, function(dir)
      refuses(function() clip.from_pretrained(dir) end,
        "clip: config.json key 'position_embedding_type' is not implemented by keng's CLIP text model (it knows: ",
        "hidden_act", "layer_norm_eps")
    end)
    H.with_model_dir("tests/fixtures/clip/text_encoder", function(j) j.attention_dropout = 0.1 end, function(dir)
      refuses(function() clip.from_pretrained(dir) end,
        "clip: config.json: config attention_dropout = 0.1 is not supported (keng implements attention_dropout = 0 only)")
    end)
    H.with_model_dir("tests/fixtures/clip/text_encoder", function(j) j.model_type = "siglip_text_model" end, function(dir)
      refuses(function() clip.from_pretrained(dir) end, "clip: config.json model_type 'siglip_text_model' is not a CLIP text model")
    end)
    H.with_model_dir("tests/fixtures/clip/text_encoder", function(j) j.hidden_act = "relu" end, function(dir)
      refuses(function() clip.from_pretrained(dir) end, "clip: unsupported hidden_act 'relu'")
    end)
  end)

  it("SAM refuses other activations", function()
    H.with_model_dir("tests/fixtures/sam", function(j)
      j.vision_config = j.vision_config or {}
      j.vision_config.hidden_act = "relu"
    end, function(dir)
      refuses(function() sam.from_pretrained(dir) end, "sam.from_pretrained: vision_config: config hidden_act = \"relu\"")
    end)
  end)
end)

describe("keng.save / keng.load and keng.bench", function()
  it("save and load refuse an options argument they do not take", function()
    local p = os.tmpname()
    refuses(function() keng.load(p, {dtype = "bf16"}) end, "keng.load takes a path only; got a table as argument 2")
    refuses(function() keng.save(p, {a = keng.ones({1})}, {}, {atomic = false}) end,
      "keng.save takes (path, tensors, metadata); got a table as argument 4")
    os.remove(p)
  end)

  it("bench.run and run_diff refuse unknown options", function()
    local bench = require "keng.bench"
    refuses(function() bench.run(function() end, {step = 3}) end, "bench.run: unknown option 'step'", "steps, warmup")
    refuses(function() bench.run_diff(function() end, {repeat_count = 2}) end, "bench.run_diff: unknown option 'repeat_count'")
  end)
end)

describe("Module methods and keng.image", function()
  it("refuse unknown keys", function()
    local m = nn.Linear(2, 2)
    refuses(function() m:state_dict{keepvars = true} end, "state_dict: unknown option 'keepvars' (valid: keep_vars)")
    refuses(function() m:load_state_dict(m:state_dict(), {strict_mode = false}) end, "load_state_dict: unknown option 'strict_mode'")
    refuses(function() m:num_params{trainable_only = true} end, "num_params: unknown option 'trainable_only'")
    refuses(function() m:summary{max_depth = 1} end, "summary: unknown option 'max_depth'")
    refuses(function() m:buffer("b", keng.zeros({1}), {persist = false}) end, "buffer: unknown option 'persist'")
    refuses(function() require("keng.image").grid(keng.zeros({1, 2, 2, 3}, {dtype = "u8"}), {columns = 2}) end,
      "image.grid: unknown option 'columns'")
  end)
end)

describe("tokenizer bindings", function()
  it("keng.wordpiece refuses a misspelt option", function()
    refuses(function() keng.wordpiece("tests/fixtures/bert/vocab.txt", {lower_case = true}) end,
      "wordpiece: unknown option 'lower_case' (valid: lowercase, strip_accents")
    assert.truthy(keng.wordpiece("tests/fixtures/bert/vocab.txt", {lowercase = true, max_length = 8}))
  end)
end)

describe("engine bindings' option tables", function()
  it("creation, rms_norm, multinomial, var and topk refuse unknown keys", function()
    refuses(function() keng.zeros({2}, {dtyp = "f64"}) end, "unknown option 'dtyp' (valid: dtype, device, requires_grad)")
    refuses(function() keng.randn({2}, {seed = 1}) end, "unknown option 'seed'")
    refuses(function() keng.tensor({1, 2}, {requires_gradient = true}) end, "unknown option 'requires_gradient'")
    local x = keng.randn({2, 4})
    refuses(function() keng.rms_norm(x, nil, 1e-6, {offset = true}) end, "rms_norm: unknown option 'offset' (valid: unit_offset)")
    refuses(function() keng.multinomial(keng.ones({3}), 2, {replace = true}) end, "multinomial: unknown option 'replace'")
    refuses(function() x:var(2, false, {ddof = 0}) end, "var: unknown option 'ddof' (valid: correction, unbiased)")
    refuses(function() x:topk(2, {largest = false, stable = true}) end, "topk: unknown option 'stable' (valid: largest, sorted)")
    refuses(function() x:to{dtype = "f64", non_blocking = true} end, "to: unknown option 'non_blocking' (valid: dtype, device)")
    local y = keng.randn({2}):requires_grad_()
    refuses(function() (y * 2):sum():backward{retain = true} end, "backward: unknown option 'retain' (valid: gradient, retain_graph)")
  end)
end)

describe("engine bindings' option numbers", function()
  local q = keng.randn({1, 1, 2, 4})
  it("sdpa refuses an unknown key and a window that is not a whole number >= 0", function()
    H.raises(function() keng.scaled_dot_product_attention(q, q, q, {casual = true}) end,
      "unknown option 'casual' (valid: mask, causal, scale, window, rel_h, rel_w, layout)")
    H.raises(function() keng.scaled_dot_product_attention(q, q, q, {window = 0/0}) end, "option 'window' must be an integer")
    H.raises(function() keng.scaled_dot_product_attention(q, q, q, {window = -1}) end, "option 'window' must be an integer")
    H.raises(function() keng.scaled_dot_product_attention(q, q, q, {window = 2.5}) end, "option 'window' must be an integer")
  end)
  it("wordpiece refuses a max_chars_per_word past 32 bits", function()
    local dir = os.tmpname()
    local f = assert(io.open(dir, "w")); f:write("[UNK]\na\n"); f:close()
    H.raises(function() keng.wordpiece(dir, {max_chars_per_word = 2^40}) end, "option 'max_chars_per_word' must be an integer")
    os.remove(dir)
  end)
  it("set_num_threads refuses counts it would clamp", function()
    H.raises(function() keng.set_num_threads(0) end, "thread count must be in [1, 4096]")
  end)
end)
