-- generate_capture_spec.lua — which decode steps keng.generate captures as a CUDA Graph: a RoPE
-- whose frequencies follow the largest position (dynamic NTK, longrope) reads the positions on
-- the host every step (models/causal_lm.lua rope_options), which a capture refuses ("cannot read
-- cuda memory on the host while a CUDA graph is being captured"), so such a model decodes
-- eagerly, and graph = true on it raises. The capture itself is stood in for by
-- generate.fake_graph (as in generate_spec.lua), so this runs without a GPU.
local H = require "helper"
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
    it("decodes a " .. typ .. " RoPE model eagerly (its step reads the positions on the host)", function()
      local lm = gemma.from_pretrained("tests/fixtures/gemma")
      local D = lm.cfg.head_dim
      local short, long = {}, {}
      for i = 1, D // 2 do short[i], long[i] = 1, 1.5 end
      lm.cfg.rope = typ == "dynamic" and {type = "dynamic", base = 10000, max_pos = 8, factor = 2}
        or {type = "longrope", base = 10000, max_pos = 64, original_max_position_embeddings = 8,
            short_factor = short, long_factor = long}
      assert.is_true(generate.rope_per_length(lm))
      local want = lm:generate(prompts, {max_length = 20})
      local got, made = with_fake_graph(function() return lm:generate(prompts, {max_length = 20}) end)
      generate.release(lm)
      assert.are.equal(0, made)
      assert.are.same(want, got)
      H.raises(function() lm:generate(prompts, {max_length = 20, graph = true}) end,
        "graph = true: this model's RoPE (" .. typ .. ") recomputes its frequencies from the positions every step")
    end)
  end
end)
