-- lutra.dist.ep_ops — the token exchange of expert parallelism as an autograd op.
--
--   all_to_all(x, group, send, recv)   x (S, ...): send[j] rows, in order, to the group's rank
--                                      j - 1 -> (sum of recv, ...): recv[i] rows from rank i - 1
--
-- Backward is the same exchange reversed (counts swapped): each row's gradient returns to the
-- rank and position its row came from. Gradients of gradients: backward recorded as this op
-- with the counts swapped. Every rank of the group calls it in the same order, forward and
-- backward; with a group of one it returns x itself.
local op = require "lutra.autograd.op"
local S = require "lutra.autograd.state"
local errors = require "lutra.errors"
local fields = require "lutra.tensor.fields"

local raise = errors.raise

local M = {}

local function exchange(x, group, send, recv) return group:all_to_all(nil, x, send, recv) end

local record = op.declare {
  name = "EPAllToAllBackward",
  record = function(cls, out, x, group, send, recv)
    op.attach(out, {op.edge(x), cls = cls, group = group, send = send, recv = recv})
  end,
  backward = function(n, g) return exchange(g, n.group, n.recv, n.send) end,
  double_backward = function(n, g) return M.all_to_all(g, n.group, n.recv, n.send) end,
}

function M.all_to_all(x, group, send, recv)
  if not require("lutra.ops").is_tensor(x) then raise("ep.all_to_all: expected a tensor, got " .. type(x)) end
  if type(group) ~= "table" or type(group.size) ~= "number" then
    raise("ep.all_to_all: expected a process group (lutra.dist.comm), got " .. type(group))
  end
  if group.size == 1 then return x end
  local out = op.untracked(exchange, x, group, send, recv)
  if S.enabled and fields.is_tracked(x) then record(out, x, group, send, recv) end
  return out
end

return M
