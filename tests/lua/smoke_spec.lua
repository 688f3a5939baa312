local keng = require "keng"
local H = require "helper"
describe("smoke", function()
  it("matmul gradient matches finite differences", function()
    local a, b = H.leaf({3, 4}), H.leaf({4, 2})
    H.gradcheck(function(x, y) return x:matmul(y) end, {a, b})
  end)
end)
