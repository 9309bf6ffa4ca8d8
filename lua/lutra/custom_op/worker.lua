-- lutra.custom_op.worker — what a worker state (host/app/custom_op_cpu.c) runs for each part of a
-- call: the body over rows [lo, hi), with the table lutra.custom_op.abi makes from the argument
-- block. Loaded only in worker states; it requires nothing but abi (and abi only ffi).
local abi = require "lutra.custom_op.abi"
local view = abi.view

local M = {}

-- body: the function loaded from the kernel's bytecode; names: its argument names
-- ("y,x,b|alpha"); args: the argument block (a light userdata); rows [lo, hi), 0-based.
function M.run(body, names, args, lo, hi)
  body(view(args, names), lo, hi)
end

return M
