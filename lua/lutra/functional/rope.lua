-- lutra.functional.rope — F.rope, rotary position embedding ("rotate half"), its backward (the
-- inverse rotation), and its autograd declaration (RopeBackward). The C side: lt_rope
-- (host/ops/rope.c).
--
--   F.rope(x, positions, theta, out)             -> x rotated; x (B, T, H, D), positions (T),
--                                                   (B, T) or nil (0 .. T-1), theta 10000
--   F.rope_backward(dout, positions, theta, out) -> dx
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local op = require "lutra.autograd.op"
local U = require "lutra.functional.util"
local C = lt.C

local M = {}

local new, fail = memory.new, errors.fail
local need, tensor_or_nil, tracked, writing = U.need, U.tensor_or_nil, U.tracked, U.writing
local edge, attach, save = op.edge, op.attach, op.save

local record_rope -- the declaration's, below

function M.rope(x, positions, theta, out)
  need("rope", "x", x)
  tensor_or_nil("rope", "positions", positions)
  writing("rope", out, x)
  out = out or new()
  if C.lt_rope(out, x, positions, theta or 10000.0, 0) ~= 0 then fail() end
  if tracked(x) then record_rope(out, x, positions, theta or 10000.0) end
  return out
end

function M.rope_backward(dout, positions, theta, out)
  out = out or new()
  if C.lt_rope(out, dout, positions, theta or 10000.0, 1) ~= 0 then fail() end
  return out
end
local rope_backward = M.rope_backward

record_rope = op.declare {
  name = "RopeBackward", op = "rope", save = {"positions"},
  record = function(cls, out, x, positions, theta)
    local node = {edge(x), cls = cls, theta = theta}
    if positions ~= nil then save(node, "positions", positions) end
    attach(out, node)
  end,
  backward = function(n, g) return rope_backward(g, n.positions, n.theta) end,
}

return M
