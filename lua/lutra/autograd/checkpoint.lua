-- lutra.checkpoint(fn, ...) — activation checkpointing.
--
-- The forward runs fn(...) with grad mode off, so none of its intermediate results are
-- kept; the node saves only the arguments and the random generator's state. When
-- backward reaches the node, fn runs again with grad mode on, from detached copies of
-- the arguments and the same generator state (dropout draws the same masks), and a
-- nested backward from its results gives the arguments' gradients (and accumulates
-- those of the parameters fn uses). fn may return several values; the tensors among
-- them that are floating point get gradients.
local S = require "lutra.autograd.state"
local engine = require "lutra.autograd.engine"
local U = require "lutra.autograd.util"
local ops = require "lutra.ops"
local create = require "lutra.create"
local dtype = require "lutra.dtype"
local memory = require "lutra.memory"
local errors = require "lutra.errors"

local edge, attach, class = S.edge, S.attach, S.class
local is_tensor, raise = ops.is_tensor, errors.raise

local Checkpoint = class("CheckpointBackward")
Checkpoint.always = true -- runs from the gradients its outputs delivered

-- One per output: hands the output's gradient to the checkpoint node.
local Output = class("CheckpointOutput")
Output.keeps_grad = true -- the engine must not free what it stores
function Output.backward(n, g)
  n[1].grads[n.slot] = g
  return engine.DELIVERED
end

local function release(node)
  for i = 1, node.nargs do
    local a = node.args[i]
    if is_tensor(a) and a.view_ == 2 then a:free() end
  end
  node.args = nil
end
Checkpoint.release = release

function Checkpoint.backward(node)
  if node.args == nil then raise(engine.FREED) end
  local args, n = node.args, node.nargs
  local inputs = {}
  for i = 1, n do
    local a = args[i]
    if is_tensor(a) then
      if a.storage == nil then raise("checkpoint: an argument saved for backward was freed before backward ran") end
      if S.modified(a, node.versions[i]) then
        raise("backward: a tensor needed for backward was modified in place: argument " .. i
          .. " of lutra.checkpoint")
      end
      local d = U.alias(a)
      if node[i] then S.set_requires_grad(d, true) end
      inputs[i] = d
    else
      inputs[i] = a
    end
  end
  -- recompute with grad, from the generator state and the autocast setting the forward saw
  local now = create.get_rng_state()
  create.set_rng_state(node.rng)
  local autocast = require "lutra.autocast"
  local cast_now = autocast.dtype
  autocast.dtype = node.autocast
  S.enabled = true
  local res = {pcall(node.fn, unpack(inputs, 1, n))}
  S.enabled = false
  autocast.dtype = cast_now
  create.set_rng_state(now)
  if not res[1] then error(res[2], 0) end
  local roots, grads = {}, {}
  for k, g in pairs(node.grads) do
    local out = res[k + 1]
    if is_tensor(out) and out.ag_ ~= 0 then
      roots[#roots + 1] = S.record(out)
      grads[#grads + 1] = g
    end
  end
  if #roots > 0 then engine.run(roots, grads, {}) end
  local result = {}
  local mine = memory.set_owner(nil)
  memory.set_owner(mine)
  for i = 1, n do
    if node[i] then
      local g = S.record(inputs[i]).grad
      result[i] = g
      if g ~= nil and mine then mine[g] = true end -- nobody else holds it: the engine may free it
    end
  end
  node.grads = {}
  return result
end

return function(M)
  -- Runs fn(...) without keeping its intermediate results; they are recomputed when
  -- backward needs them. Returns what fn returns.
  function M.checkpoint(fn, ...)
    if type(fn) ~= "function" and not (type(fn) == "table" and getmetatable(fn) and getmetatable(fn).__call) then
      raise("checkpoint: expected a function, got " .. type(fn))
    end
    if not S.enabled then return fn(...) end
    local n = select("#", ...)
    local args = {...}
    local node = {cls = Checkpoint, fn = fn, nargs = n, rng = create.get_rng_state(), grads = {}, versions = {},
                  autocast = require("lutra.autocast").dtype}
    for i = 1, n do
      local a = args[i]
      if is_tensor(a) then
        errors.check_alive(a, "checkpoint")
        node[i] = edge(a)
        args[i], node.versions[i] = S.save_value(a)
      else
        node[i] = false
      end
    end
    node.args = args
    S.enabled = false
    local res = {pcall(fn, ...)}
    S.enabled = true
    if not res[1] then error(res[2], 0) end
    for k = 2, table.maxn(res) do
      local out = res[k]
      if is_tensor(out) and out.ag_ == 0 and dtype.is_float(out.dtype_) then
        attach(out, {node, cls = Output, slot = k - 1})
      end
    end
    return unpack(res, 2, table.maxn(res))
  end
end
