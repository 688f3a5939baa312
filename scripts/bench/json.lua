-- bench.json is keng.json (kept so older scripts keep working)
return require "keng.json"
