-- lutra.custom_op — ops written in the script: lt.custom_op{name =, forward =, backward =} makes a
-- differentiable op from a forward and its backward (like torch.autograd.Function), and
-- lt.kernel{...} (lutra.custom_op.kernel) the fused bodies they call: a CPU body in Lua over
-- typed pointers, compiled by LuaJIT and split over lutra's threads, and a CUDA body in CUDA C,
-- compiled by NVRTC at run time.
--
--   local bias_gelu = lt.custom_op {
--     name = "bias_gelu",
--     forward = function(ctx, x, b)          -- runs without recording: one node for the op
--       local y = lt.empty_like(x)
--       k_forward{y, x, b}
--       ctx:save(x, b)                        -- saved tensors are version-checked
--       return y
--     end,
--     backward = function(ctx, gy)           -- one gradient per input (nil: none)
--       local x, b = ctx:saved()
--       local gx = lt.empty_like(x)
--       k_backward{gx, gy, x, b}
--       return gx, gx:sum(0)
--     end,
--   }
--   local y = bias_gelu(x, b)
--
-- The op returns forward's one tensor. When grad mode is on and an input requires grad, it
-- records a node named "<Name>Backward" (t.grad_fn); backward's gradients must have their
-- inputs' shapes and dtypes (checked, naming the input). ctx is a table: ctx:save(...) /
-- ctx:saved(), and any other field forward stores (numbers, flags) is there in backward;
-- ctx.needs_input_grad[i] says whether input i wants a gradient. double_backward = function(ctx,
-- grad), optional: the same gradients written with built-in (recorded) ops, which gradients of
-- gradients (backward{create_graph = true}) use; without it they raise, naming the op.
local errors = require "lutra.errors"
local ops = require "lutra.ops"
local op = require "lutra.autograd.op"
local S = require "lutra.autograd.state"
local fields = require "lutra.tensor.fields"
local shape = require "lutra.shape"
local kernel = require "lutra.custom_op.kernel"

local M = {}
local raise, is_tensor = errors.raise, ops.is_tensor
local MAX_SAVED = 8
local SAVE_FIELDS = {}
for i = 1, MAX_SAVED do SAVE_FIELDS[i] = "s" .. i end

M.kernel = kernel.kernel

local Ctx = {}
Ctx.__index = Ctx

-- Saves tensors for backward (at most 8; nil allowed).
function Ctx:save(...)
  local n = select("#", ...)
  if n > MAX_SAVED then raise(string.format("custom_op '%s': ctx:save takes at most %d tensors, got %d", self.op_name, MAX_SAVED, n)) end
  self.to_save, self.nsaved = {...}, n
end

-- The saved tensors, in the order saved.
function Ctx:saved()
  local node, out = self.node, {}
  for i = 1, self.nsaved or 0 do out[i] = node and node[SAVE_FIELDS[i]] or self.to_save[i] end
  return unpack(out, 1, self.nsaved or 0)
end

local function class_name(name)
  local base = name:gsub("^%l", string.upper):gsub("_(%w)", string.upper) .. "Backward" -- bias_gelu -> BiasGeluBackward
  local cls, k = base, 1
  while op.classes[cls] do
    k = k + 1
    cls = base .. k
  end
  return cls
end

local function check_grads(name, node, inputs, grads)
  local out = {}
  for i = 1, node.ninputs do
    local g, x = grads[i], inputs[i]
    if node[i] and g ~= nil then
      if not is_tensor(g) then
        raise(string.format("custom_op '%s': backward returned %s for input %d, expected a tensor or nil", name, type(g), i))
      end
      local gs = shape.shape_string(g)
      if gs ~= x.shape then
        raise(string.format("custom_op '%s': backward returned a gradient of shape %s for input %d of shape %s", name,
          gs, i, x.shape))
      end
      if g.dtype ~= x.dtype or g.device ~= x.device then
        raise(string.format("custom_op '%s': backward returned a %s %s gradient for input %d, a %s %s tensor", name,
          g.dtype, g.device, i, x.dtype, x.device))
      end
      out[i] = g
    end
  end
  return out
end

-- lt.custom_op{name =, forward = function(ctx, ...) -> tensor, backward = function(ctx, grad) -> grads...}
-- -> a differentiable op, op(...). forward runs with grad mode off (the op is one node, named
-- "<Name>Backward"), usually calling lt.kernel bodies, and stores what backward needs with
-- ctx:save(tensors...) (version-checked: an in-place change before backward is an error) or as
-- plain ctx fields; backward(ctx, grad) returns one gradient per input (nil for none), each of
-- its input's shape, dtype and device (checked, naming the input). ctx:saved() gives the saved
-- tensors back; ctx.needs_input_grad[i] says whether input i wants one. Without backward the op
-- refuses inputs that require grad. Check a backward with lt.gradcheck.
function M.custom_op(spec)
  if type(spec) ~= "table" then raise("custom_op: expected a table {name =, forward =, backward =}") end
  for key in pairs(spec) do
    if key ~= "name" and key ~= "forward" and key ~= "backward" and key ~= "double_backward" then
      raise("custom_op: unknown field " .. tostring(key) .. " (name, forward, backward, double_backward)")
    end
  end
  local name, forward, backward, double = spec.name, spec.forward, spec.backward, spec.double_backward
  if type(name) ~= "string" or not name:match("^[%a_][%w_]*$") then raise("custom_op: name must be an identifier, got " .. tostring(name)) end
  if type(forward) ~= "function" then raise(string.format("custom_op '%s': forward must be a function", name)) end
  if backward ~= nil and type(backward) ~= "function" then raise(string.format("custom_op '%s': backward must be a function", name)) end
  if double ~= nil and (type(double) ~= "function" or backward == nil) then
    raise(string.format("custom_op '%s': double_backward must be a function, given with backward", name))
  end
  local function grads_of(fn, node, g)
    local grads = {fn(node.ctx, g)}
    if #grads == 1 and type(grads[1]) == "table" and not is_tensor(grads[1]) then grads = grads[1] end
    return check_grads(name, node, node.inputs, grads)
  end
  local record = op.declare {
    name = class_name(name), save = SAVE_FIELDS,
    record = function(cls, out, node) node.cls = cls; op.attach(out, node) end,
    backward = function(node, g) return grads_of(backward, node, g) end,
    double_backward = double and function(node, g) return grads_of(double, node, g) end or nil,
    no_double = string.format("give custom_op '%s' a double_backward = function(ctx, grad) written with built-in ops", name),
    release = function(node) node.ctx, node.inputs = nil, nil end,
  }
  local function call(...)
    local n = select("#", ...)
    local inputs = {...}
    local ctx = setmetatable({op_name = name, needs_input_grad = {}}, Ctx)
    local tracked = false
    if S.enabled then
      for i = 1, n do
        local x = inputs[i]
        local want = is_tensor(x) and fields.is_tracked(x)
        ctx.needs_input_grad[i] = want or false
        tracked = tracked or want
      end
    end
    if tracked and not backward then raise(string.format("custom_op '%s' has no backward, and an input requires grad", name)) end
    local out = op.untracked(forward, ctx, ...)
    if not is_tensor(out) then raise(string.format("custom_op '%s': forward returned %s, expected a tensor", name, type(out))) end
    if tracked then
      local node = {ctx = ctx, ninputs = n, inputs = {}}
      for i = 1, n do
        local x = inputs[i]
        node[i] = is_tensor(x) and op.edge(x) or false
        if node[i] then node.inputs[i] = {shape = shape.shape_string(x), dtype = x.dtype, device = x.device} end
      end
      for i = 1, ctx.nsaved or 0 do
        local t = ctx.to_save[i]
        if t ~= nil then
          if t == out then op.save_output(node, SAVE_FIELDS[i], out) else op.save(node, SAVE_FIELDS[i], t) end
        end
      end
      ctx.to_save, ctx.node = nil, node
      record(out, node)
    end
    return out
  end
  return setmetatable({name = name}, {__call = function(_, ...) return call(...) end})
end

return M
