-- counting_output.lua — busted output handler: the usual terminal output, then the plain
-- closing line "N passed, N failed" that CI reads.
return function(options)
  local busted = require "busted"
  local base = os.getenv("KENG_BUSTED_STYLE") or "plainTerminal"
  local handler = require("busted.outputHandlers." .. base)(options)
  busted.subscribe({"suite", "end"}, function()
    io.write(string.format("\n%d passed, %d failed\n", handler.successesCount,
      handler.failuresCount + handler.errorsCount))
    io.flush()
    return nil, true
  end, {priority = 2})
  return handler
end
