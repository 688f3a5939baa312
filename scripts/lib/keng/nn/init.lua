-- keng.nn — modules (the training-library issue builds the rest); `functional` is available
-- from the foundation on.
local nn = {}
nn.functional = require "keng.nn.functional"
return nn
