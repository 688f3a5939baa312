-- config.lua — every row of the Keras 3 benchmark table (docs/benchmarks.md) as data.
-- A row is added by adding an entry to `rows`; scripts/bench/all.lua runs them in this order,
-- each through the bench file that `runners` names for its family, which builds the model from
-- `module` (a file under scripts/models/) and times `task` ("fit", "predict", "generate").
-- docs/adding_a_bench_row.md walks through adding one.
--
-- Fields: id (stable key in JSON), name (as the Keras table writes it), family, module, task,
-- batch, dtype (what Keras ran: f32 or bf16), keras (published ms/step on an A100 40GB:
-- k2 = Keras 2 TF, tf / jax / torch = Keras 3 backends, best = Keras 3 best; nil = NA),
-- gpu / cpu (tier sizes: preset name and input sizes).
local config = {}

-- the synthetic text of docs/benchmarks.md: the n-th prompt is the n-th tuple of the cartesian product
-- of this list ("I I I I I", "I I I I you", ...)
config.words = {"I", "you", "get", "take", "it", "of", "for", "from", "can", "not", "do", "use", "would", "yes"}

-- Token ids standing for the words. No tokenizer file ships with the tiny presets, so each word
-- gets one fixed id (the same ids are used by the PyTorch peer); special ids follow the
-- conventions of each family (bert-base-cased [CLS] 101 / [SEP] 102, Gemma BOS 2, Mistral BOS 1).
config.token_ids = {
  bert = {cls = 101, sep = 102, words = {146, 1128, 1243, 1321, 1122, 1104, 1111, 1121, 1169, 1136, 1202, 1329, 1156, 4208}},
  gemma = {bos = 2, words = {235285, 692, 947, 1987, 665, 576, 604, 774, 798, 780, 749, 1281, 1134, 3276}},
  mistral = {bos = 1, words = {315, 368, 625, 1388, 378, 302, 354, 477, 541, 459, 511, 938, 682, 5081}},
}
-- the CPU-tier vocabularies are 32000 (LLMs), so ids above that are folded into range there
config.cpu_vocab = {bert = 28996, gemma = 32000, mistral = 32000}

-- the n-th (0-based) tuple of length len of the cartesian product of a list of k items:
-- n written in base k, most significant digit first; returns 1-based item positions
function config.tuple(n, len, k)
  local out = {}
  for i = len, 1, -1 do
    out[i] = n % k + 1
    n = n // k
  end
  return out
end

-- family -> the bench module whose run(row, ctx) times its rows (scripts/bench/<file>.lua); the
-- LLM families share one
config.runners = {
  sam = "bench.sam",
  stable_diffusion = "bench.stable_diffusion",
  bert = "bench.bert",
  gemma = "bench.llm",
  mistral = "bench.llm",
}

local LLM_PROMPT_WORDS = 5

config.rows = {
  {id = "sam_fit", name = "SegmentAnything fit", family = "sam", module = "models.sam", task = "fit",
   batch = 1, dtype = "f32", keras = {k2 = 386.93, tf = 355.25, jax = 361.69, torch = 1388.87, best = 355.25},
   gpu = {preset = "sam_huge_sa1b", image = 1024, target = {64, 64, 256}},
   cpu = {preset = "sam_tiny", image = 256, target = {16, 16, 256}}},
  {id = "sam_predict", name = "SegmentAnything predict", family = "sam", module = "models.sam", task = "predict",
   batch = 4, dtype = "f32", keras = {k2 = 1859.27, tf = 438.50, jax = 376.34, torch = 1720.96, best = 376.34},
   gpu = {preset = "sam_huge_sa1b", image = 1024, points = {{500, 375}, {250, 375}}, labels = {1, 2}},
   cpu = {preset = "sam_tiny", image = 256, points = {{125, 93.75}, {62.5, 93.75}}, labels = {1, 2}}},
  {id = "sd_fit", name = "StableDiffusion fit", family = "stable_diffusion", module = "models.stable_diffusion",
   task = "fit", batch = 8, dtype = "f32",
   keras = {k2 = 1023.21, tf = 392.24, jax = 391.21, torch = 823.44, best = 391.21},
   gpu = {preset = "stable_diffusion_v1", image = 512, target = {64, 64, 8}},
   cpu = {preset = "sd_tiny", image = 128, target = {16, 16, 8}}},
  {id = "sd_predict", name = "StableDiffusion predict", family = "stable_diffusion",
   module = "models.stable_diffusion", task = "predict", batch = 13, dtype = "f32",
   keras = {k2 = 649.71, tf = 616.04, jax = 627.27, torch = 1337.17, best = 616.04},
   gpu = {preset = "stable_diffusion_v1", image = 512, guidance = 7.5},
   cpu = {preset = "sd_tiny", image = 128, guidance = 7.5},
   prompt = "a photograph of an astronaut riding a horse"},
  {id = "bert_fit", name = "BERT fit", family = "bert", module = "models.bert", task = "fit", batch = 32,
   dtype = "f32", keras = {k2 = 486.00, tf = 214.49, jax = 222.37, torch = 808.68, best = 214.49},
   gpu = {preset = "bert_base_en", seq = 512}, cpu = {preset = "bert_tiny", seq = 128},
   num_classes = 2, optimizer = {lr = 1e-3, weight_decay = 0.004, beta1 = 0.9, beta2 = 0.999, eps = 1e-7}},
  {id = "bert_predict", name = "BERT predict", family = "bert", module = "models.bert", task = "predict",
   batch = 256, dtype = "f32", keras = {k2 = 470.12, tf = 466.01, jax = 418.72, torch = 1865.98, best = 418.72},
   gpu = {preset = "bert_base_en", seq = 512}, cpu = {preset = "bert_tiny", seq = 128}, num_classes = 2},
  {id = "gemma_fit", name = "Gemma fit", family = "gemma", module = "models.gemma", task = "fit", batch = 8,
   dtype = "bf16", keras = {tf = 232.52, jax = 273.67, torch = 525.15, best = 232.52},
   gpu = {preset = "gemma_7b_en", seq = 128}, cpu = {preset = "gemma_tiny", seq = 128},
   lora = {rank = 4, targets = {"query", "value"}}},
  {id = "gemma_generate_32", name = "Gemma generate", family = "gemma", module = "models.gemma",
   task = "generate", batch = 32, dtype = "bf16",
   keras = {tf = 1134.91, jax = 1128.21, torch = 7952.67, best = 1128.21},
   gpu = {preset = "gemma_7b_en", max_length = 50, prompt_words = LLM_PROMPT_WORDS},
   cpu = {preset = "gemma_tiny", max_length = 50, prompt_words = LLM_PROMPT_WORDS}},
  {id = "gemma_generate_1", name = "Gemma generate", family = "gemma", module = "models.gemma",
   task = "generate", batch = 1, dtype = "bf16",
   keras = {tf = 758.57, jax = 703.46, torch = 7649.40, best = 703.46},
   gpu = {preset = "gemma_7b_en", max_length = 50, prompt_words = LLM_PROMPT_WORDS},
   cpu = {preset = "gemma_tiny", max_length = 50, prompt_words = LLM_PROMPT_WORDS}},
  {id = "mistral_fit", name = "Mistral fit", family = "mistral", module = "models.mistral", task = "fit",
   batch = 8, dtype = "bf16", keras = {tf = 185.92, jax = 213.22, torch = 452.12, best = 185.92},
   gpu = {preset = "mistral_7b_en", seq = 128}, cpu = {preset = "mistral_tiny", seq = 128},
   lora = {rank = 4, targets = {"query", "value"}}},
  {id = "mistral_generate_32", name = "Mistral generate", family = "mistral", module = "models.mistral",
   task = "generate", batch = 32, dtype = "bf16",
   keras = {tf = 966.06, jax = 957.25, torch = 10932.59, best = 957.25},
   gpu = {preset = "mistral_7b_en", max_length = 50, prompt_words = LLM_PROMPT_WORDS},
   cpu = {preset = "mistral_tiny", max_length = 50, prompt_words = LLM_PROMPT_WORDS}},
  {id = "mistral_generate_1", name = "Mistral generate", family = "mistral", module = "models.mistral",
   task = "generate", batch = 1, dtype = "bf16",
   keras = {tf = 743.28, jax = 679.30, torch = 11054.67, best = 679.30},
   gpu = {preset = "mistral_7b_en", max_length = 50, prompt_words = LLM_PROMPT_WORDS},
   cpu = {preset = "mistral_tiny", max_length = 50, prompt_words = LLM_PROMPT_WORDS}},
}

-- default timed steps per tier (the warm-up step comes on top and is not timed)
config.default_steps = {gpu = 100, cpu = 10}

-- repeats of a difference-rule row (generate, SD predict), whose mean is reported: one
-- difference of two runs on a shared 2-core machine moved by 20-40% from run to run
config.diff_repeats = {gpu = 1, cpu = 3}

-- dense peak TFLOP/s of known GPUs {f32 (non-tensor-core), tf32 (f32 on TF32 tensor cores, the
-- peak of f32 rows under --tf32; V100 has none), bf16 tensor core}
config.gpu_peaks = {
  {match = "H200", f32 = 67, tf32 = 494.7, bf16 = 989},
  {match = "H100 PCIe", f32 = 51, tf32 = 378, bf16 = 756},
  {match = "H100", f32 = 67, tf32 = 494.7, bf16 = 989},
  {match = "A100", f32 = 19.5, tf32 = 156, bf16 = 312},
  {match = "L40S", f32 = 91.6, tf32 = 183, bf16 = 362},
  {match = "L4", f32 = 30.3, tf32 = 60, bf16 = 121},
  {match = "A10", f32 = 31.2, tf32 = 62.5, bf16 = 125},
  {match = "V100", f32 = 15.7, bf16 = 125},
  {match = "4090", f32 = 82.6, tf32 = 82.6, bf16 = 165},
}

return config
