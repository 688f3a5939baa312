-- generate_capture_spec.lua — keng.generate captures every causal LM's decode step as a CUDA
-- Graph, including a RoPE whose frequencies follow the largest position (dynamic NTK, longrope):
-- the decode step derives them on the device from the positions (models/causal_lm.lua
-- decode_rope_options), never reading them on the host, which a capture would refuse. The capture
-- itself is stood in for by generate.fake_graph (as in generate_spec.lua), so this runs without a
-- GPU; llama_spec.lua counts the step's read-backs.
local gemma = require "models.gemma"
local generate = require "keng.generate"

describe("generate's CUDA Graph capture", function()
  local prompts = {{2, 5, 6}, {2, 9, 10, 11, 12, 13, 14, 15, 16, 17}}

  local function with_fake_graph(fn)
    local made = 0
    generate.fake_graph = function(step)                           -- as keng.cuda.graph, eagerly
      made = made + 1
      return function() return step() end
    end
    local ok, got = pcall(fn)
    generate.fake_graph = nil
    assert(ok, got)
    return got, made
  end

  it("captures a plain-RoPE model's step", function()
    local lm = gemma.from_pretrained("tests/fixtures/gemma")
    local _, made = with_fake_graph(function() return lm:generate(prompts, {max_length = 20}) end)
    generate.release(lm)
    assert.are.equal(1, made)
  end)

  for _, typ in ipairs({"dynamic", "longrope"}) do
    it("captures a " .. typ .. " RoPE model's step, with the eager step's tokens", function()
      local lm = gemma.from_pretrained("tests/fixtures/gemma")
      local D = lm.cfg.head_dim
      local short, long = {}, {}
      for i = 1, D // 2 do short[i], long[i] = 1, 1.5 end
      lm.cfg.rope = typ == "dynamic" and {type = "dynamic", base = 10000, max_pos = 8, factor = 2}
        or {type = "longrope", base = 10000, max_pos = 64, original_max_position_embeddings = 8,
            short_factor = short, long_factor = long}
      assert.is_true(require("models.rope").depends_on_length(lm.cfg.rope))
      local want = lm:generate(prompts, {max_length = 20})
      local got, made = with_fake_graph(function() return lm:generate(prompts, {max_length = 20}) end)
      generate.release(lm)
      assert.are.equal(1, made)
      assert.are.same(want, got)
    end)
  end
end)
