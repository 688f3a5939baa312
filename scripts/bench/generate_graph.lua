-- generate_graph.lua — the GPU check of keng.generate's captured decode step: decode_qkv on cuda
-- against the cpu, greedy ids on
-- cuda (eager and CUDA Graph replay, several sync_every) equal the CPU's on the Gemma and
-- Mistral fixtures, then ms per decode token, eager vs graph, for gemma_tiny / mistral_tiny
-- (bf16, batch 1 and 32) and, with a size argument, the 2B / 7B presets (random weights).
-- Exits 1 on a mismatch; skips without CUDA. For tests/gpu/run.sh:
--   "$build/keng" scripts/bench/generate_graph.lua [tiny|7b]
local keng = require "keng"

if not (keng.cuda and keng.cuda.is_available and keng.cuda.is_available()) then
  print("generate_graph.lua: skipped — keng.cuda.is_available() is false")
  return
end
local size = arg and arg[1] or "tiny"
local failed = 0
local function check(name, fn)
  local ok, err = pcall(fn)
  print(string.format("%-52s %s", name, ok and "ok" or ("FAIL " .. tostring(err))))
  if not ok then failed = failed + 1 end
end

check("decode_qkv: cuda == cpu (f32, bf16; D 64, 128, 256)", function()
  for _, dt in ipairs({"f32", "bf16"}) do
    for _, D in ipairs({64, 128, 256}) do
      local B, T, H, Hkv, L = 3, 1, 8, 2, 40
      local qkv = keng.randn({B, T, (H + 2 * Hkv) * D}):to(dt)
      local pos, col = keng.tensor({{5}, {17}, {39}}), keng.tensor({33})
      local ck, cv = keng.randn({B, Hkv, L, D}):to(dt), keng.randn({B, Hkv, L, D}):to(dt)
      local gk, gv = ck:to("cuda"), cv:to("cuda")
      local o = {heads = H, kv_heads = Hkv}
      local q = keng.decode_qkv(qkv, pos, ck, cv, col, o)
      local gq = keng.decode_qkv(qkv:to("cuda"), pos:to("cuda"), gk, gv, col:to("cuda"), o)
      for _, pair in ipairs({{q, gq}, {ck, gk}, {cv, gv}}) do
        local d = (pair[1]:double() - pair[2]:cpu():double()):abs():max():item()
        assert(d <= (dt == "bf16" and 1e-2 or 1e-5), string.format("%s D=%d: max |cpu - cuda| = %g", dt, D, d))
      end
    end
  end
end)

for _, name in ipairs({"gemma", "mistral"}) do
  check(name .. " fixture: cuda eager / graph ids == cpu", function()
    local lm = require("models." .. name).from_pretrained("tests/fixtures/" .. name)
    local prompts = {{2, 5, 6}, {2, 9, 10, 11, 12, 13, 14, 15, 16, 17}, {2}}
    local want = lm:generate(prompts, {max_length = 30})
    lm:to("cuda")
    for _, o in ipairs({{graph = false}, {graph = true}, {graph = true, sync_every = 1}, {graph = true, sync_every = 64}}) do
      o.max_length = 30
      local got = lm:generate(prompts, o)
      for b = 1, #want do
        assert(table.concat(want[b], ",") == table.concat(got[b], ","),
          string.format("graph=%s sync_every=%s row %d: %s vs cpu %s", tostring(o.graph), tostring(o.sync_every), b,
            table.concat(got[b], ","), table.concat(want[b], ",")))
      end
    end
  end)
end

-- ms per decode token: (t(N2) - t(N1)) / (N2 - N1), best of 3
local presets = size == "7b" and {{"models.gemma", "gemma_7b_en"}, {"models.mistral", "mistral_7b_en"}}
  or size == "2b" and {{"models.gemma", "gemma_2b_en"}}
  or {{"models.gemma", "gemma_tiny"}, {"models.mistral", "mistral_tiny"}}
local P, N1, N2 = 6, 8, 50
print(string.format("%-14s %3s %12s %12s %7s", "model", "B", "eager ms/tok", "graph ms/tok", "ratio"))
for _, spec in ipairs(presets) do
  keng.manual_seed(0)
  local lm = require(spec[1]).from_preset(spec[2], {dtype = "bf16", device = "cuda"})
  for _, B in ipairs({1, 32}) do
    local prompts = {}
    for b = 1, B do
      prompts[b] = {2}
      for j = 2, P do prompts[b][j] = 100 + (b * 7 + j * 13) % 900 end
    end
    local function per_token(graph)
      local function t(n)
        local best = math.huge
        for _ = 1, 3 do
          keng.synchronize()
          local t0 = keng.time()
          lm:generate(prompts, {max_new_tokens = n, stop_token_ids = {}, graph = graph})
          keng.synchronize()
          best = math.min(best, keng.time() - t0)
        end
        return best
      end
      t(4)
      return (t(N2) - t(N1)) / (N2 - N1) * 1000
    end
    local e, g = per_token(false), per_token(true)
    print(string.format("%-14s %3d %12.3f %12.3f %7.2f", spec[2], B, e, g, e / g))
  end
  lm = nil
  collectgarbage()
  if keng.empty_cache then keng.empty_cache() end
end
if failed > 0 then
  print(failed .. " generate graph check(s) failed")
  os.exit(1)
end
