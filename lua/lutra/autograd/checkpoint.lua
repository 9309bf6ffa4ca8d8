-- lutra.checkpoint(fn, ...) — activation checkpointing.
--
-- The forward runs fn(...) with grad mode off, so none of its intermediate results are
-- kept; the node saves only the arguments and the random generator's state. When
-- backward reaches the node, fn runs again with grad mode on, from detached copies of
-- the arguments and the same generator state (dropout draws the same masks), and a
-- nested backward from its results gives the arguments' gradients (and accumulates
-- those of the parameters fn uses). fn may return several values; the tensors among
-- them that are floating point get gradients.
local op = require "lutra.autograd.op"
local S = require "lutra.autograd.state"
local engine = require "lutra.autograd.engine"
local ops = require "lutra.ops"
local create = require "lutra.create"
local dtype = require "lutra.dtype"
local memory = require "lutra.memory"
local errors = require "lutra.errors"
local autocast = require "lutra.autocast"
local fields = require "lutra.tensor.fields"
local is_tracked = fields.is_tracked

local declare, edge, attach = op.declare, op.edge, op.attach
local is_tensor, raise = ops.is_tensor, errors.raise

local M = {}

-- One per output: hands the output's gradient to the checkpoint node.
local record_output = declare {
  name = "CheckpointOutput",
  twice_differentiable = true, -- hands the gradient over as it is (recorded under create_graph)
  keeps_grad = true, -- the engine must not free what it stores
  record = function(cls, out, node, slot) attach(out, {node, cls = cls, slot = slot}) end,
  backward = function(n, g)
    n[1].grads[n.slot] = g
    return engine.DELIVERED
  end,
}

-- Detached copies of the saved arguments, requiring grad where the argument did.
local function recompute_inputs(node)
  local args, inputs = node.args, {}
  for i = 1, node.nargs do
    local a = args[i]
    if is_tensor(a) then
      if fields.is_freed(a) then raise("checkpoint: an argument saved for backward was freed before backward ran") end
      if S.modified(a, node.versions[i]) then
        raise("backward: a tensor needed for backward was modified in place: argument " .. i
          .. " of lutra.checkpoint")
      end
      local d = S.share(a)
      if node[i] then S.set_requires_grad(d, true) end
      inputs[i] = d
    else
      inputs[i] = a
    end
  end
  return inputs
end

-- fn's results, recomputed with grad, from the generator state and the autocast setting the
-- forward saw.
local function recompute(node, inputs)
  local now = create.get_rng_state()
  create.set_rng_state(node.rng)
  local cast_now = autocast.dtype
  autocast.dtype = node.autocast
  S.enabled = true
  local res = {errors.pcall(node.fn, unpack(inputs, 1, node.nargs))}
  S.enabled = false
  autocast.dtype = cast_now
  create.set_rng_state(now)
  if not res[1] then error(res[2], 0) end
  return res
end

local function backward(node)
  if node.args == nil then raise(engine.FREED) end
  local inputs = recompute_inputs(node)
  local res = recompute(node, inputs)
  local roots, grads = {}, {}
  for k, g in pairs(node.grads) do
    local out = res[k + 1]
    if is_tensor(out) and is_tracked(out) then
      roots[#roots + 1] = S.record(out)
      grads[#grads + 1] = g
    end
  end
  if #roots > 0 then engine.run(roots, grads, {}) end
  local result = {}
  local mine = memory.set_owner(nil)
  memory.set_owner(mine)
  for i = 1, node.nargs do
    if node[i] then
      local g = S.record(inputs[i]).grad
      result[i] = g
      if g ~= nil and mine then mine[g] = true end -- nobody else holds it: the engine may free it
    end
  end
  node.grads = {}
  return result
end

-- create_graph: fn recomputed, recorded, on stand-ins for the arguments (views of them, connected
-- to the records the arguments had), and a nested recorded backward from the outputs' gradients
-- that ends at the stand-ins: the arguments' gradients, differentiable again through both.
local function double_backward(node)
  if node.args == nil then raise(engine.FREED) end
  local inputs, cap = {}, {}
  for i = 1, node.nargs do
    local a = node.args[i]
    if is_tensor(a) and node[i] then
      if fields.is_freed(a) then raise("checkpoint: an argument saved for backward was freed before backward ran") end
      if S.modified(a, node.versions[i]) then
        raise("backward: a tensor needed for backward was modified in place: argument " .. i
          .. " of lutra.checkpoint")
      end
      local src = node.sources[i]
      if src then -- an alias of a recorded result: connected while its stand-in is made
        S.set_record(a, src)
        fields.set_autograd_state(a, fields.RECORDED)
      end
      inputs[i] = a:view(a.shape)
      if src then
        S.set_record(a, nil)
        fields.set_autograd_state(a, fields.UNTRACKED)
      end
      cap[S.record(inputs[i])] = true
    else
      inputs[i] = a
    end
  end
  local res = recompute(node, inputs)
  S.enabled = true -- (recompute leaves it off, as the plain backward runs)
  local roots, grads = {}, {}
  for k, g in pairs(node.grads) do
    local out = res[k + 1]
    if is_tensor(out) and is_tracked(out) then
      roots[#roots + 1] = S.record(out)
      grads[#grads + 1] = g
    end
  end
  node.grads = {}
  local captured = #roots > 0 and engine.run(roots, grads, {create_graph = true, capture = cap, stop_at_capture = true})
    or {}
  local result = {}
  for i = 1, node.nargs do
    if node[i] then result[i] = captured[S.record(inputs[i])] end
  end
  return result
end

-- The node of fn(...): an edge per tensor argument, the arguments saved.
local record_checkpoint = declare {
  name = "CheckpointBackward",
  double_backward = double_backward,
  always = true, -- runs from the gradients its outputs delivered
  release = function(node)
    for i = 1, node.nargs do
      local a = node.args[i]
      if is_tensor(a) and fields.view_kind(a) == fields.SAVED_ALIAS then a:free() end
    end
    node.args = nil
  end,
  record = function(cls, fn, args, n)
    local node = {cls = cls, fn = fn, nargs = n, rng = create.get_rng_state(), grads = {}, versions = {},
                  sources = {}, autocast = autocast.dtype}
    for i = 1, n do
      local a = args[i]
      if is_tensor(a) then
        errors.check_alive(a, "checkpoint")
        node[i] = edge(a)
        args[i], node.versions[i], node.sources[i] = S.save_value(a)
      else
        node[i] = false
      end
    end
    node.args = args
    return node
  end,
  backward = backward,
}

-- Runs fn(...) without keeping its intermediate results; they are recomputed when
-- backward needs them. Returns what fn returns.
function M.checkpoint(fn, ...)
  if type(fn) ~= "function" and not (type(fn) == "table" and getmetatable(fn) and getmetatable(fn).__call) then
    raise("checkpoint: expected a function, got " .. type(fn))
  end
  if not S.enabled then return fn(...) end
  local node = record_checkpoint(fn, {...}, select("#", ...))
  local res = {op.untracked(fn, ...)}
  local n = table.maxn(res)
  for k = 1, n do
    local out = res[k]
    if is_tensor(out) and not is_tracked(out) and dtype.is_float(fields.dtype_id(out)) then
      record_output(out, node, k)
    end
  end
  return unpack(res, 1, n)
end

return M
