-- gemma.lua — the Gemma rows (fit with LoRA, generate 32 and 1); see llm.lua.
return require "bench.llm"
