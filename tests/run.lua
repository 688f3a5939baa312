-- tests/run.lua — runs every busted spec under tests/lua inside keng:
--   keng tests/run.lua [busted options] [paths]
-- Ends with the line "N passed, N failed" (CI adds ctest's counts to it).
local here = debug.getinfo(1, "S").source:match("^@(.*)/tests/run.lua$") or "."
package.path = here .. "/tests/lua/?.lua;" .. package.path
local args = {...}
local has_path = false
for _, a in ipairs(args) do if a:sub(1, 1) ~= "-" then has_path = true end end
if not has_path then args[#args + 1] = here .. "/tests/lua" end
arg = {[0] = "busted", "--pattern=_spec", "--output=" .. here .. "/tests/lua/counting_output.lua", table.unpack(args)}
require("busted.runner")({standalone = false})
