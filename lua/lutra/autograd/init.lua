-- lutra.autograd — reverse-mode automatic differentiation, define-by-run.
--
--   local x = lutra.randn(3, 4, {requires_grad = true})   -- or x.requires_grad = true
--   local loss = (x * x):sum()
--   loss:backward()                    -- x.grad == 2 x; grads accumulate across calls
--   x:zero_grad()                      -- or lutra.zero_grad(params)
--   lutra.no_grad(function() ... end)  -- nothing is recorded inside
--   y:detach(), y:register_hook(fn), y:retain_grad(), lutra.checkpoint(fn, ...)
--   lutra.detect_anomaly(true)         -- the op that made the first nan/inf, and its line
--   lutra.autograd.grad(y, x, nil, {create_graph = true})  -- dy/dx, itself differentiable
--
-- Every op on a tensor that requires grad, in grad mode, attaches a node to its result
-- (t.grad_fn names it); backward walks the nodes from the result back to the leaves.
-- How an op declares its node, saved tensors and backward: lutra/autograd/op.lua; how
-- nodes are attached, saved tensors held and released: lutra/autograd/state.lua; the
-- backward pass: lutra/autograd/engine.lua; the declarations:
-- lutra/autograd/{elementwise,reduce,views,matmul,checkpoint}.lua, and each fused op's beside
-- its binding in lutra/functional/<op>.lua.
--
-- In-place ops (add_, copy_, t[k] = v, out=) on tensors that take part in autograd:
--   - on a leaf that requires grad: an error in grad mode (use lutra.no_grad);
--   - on a view made in grad mode from a tensor that requires grad, or writing a value
--     that requires grad into any view: an error (compute it out of place);
--   - otherwise recorded (the tensor's node is replaced), and a tensor saved for
--     backward that is written in place afterwards makes backward fail with "a tensor
--     needed for backward was modified in place" (version counters).
--
-- Memory: backward drops every saved tensor once its node ran and frees the aliases
-- autograd made to hold results of ops, so the activations that only the graph held go
-- back at once (no GC); gradients are freed as soon as their consumers used them. A
-- graph dropped without backward goes back to the GC (two cycles: tensors, then the
-- nodes' aliases). Run a training step inside lutra.tidy to also return, without a GC,
-- the activations the step's own code held: leaf gradients survive the scope.
-- Gradients of gradients: backward{create_graph = true} and grad(..., {create_graph = true})
-- record the backward pass, so the gradients they give (x.grad, or grad's results) have a
-- grad_fn and can be differentiated again: gradient penalties, Hessian-vector products,
-- meta-learning.
--   local gx = lutra.autograd.grad(loss, x, nil, {create_graph = true})
--   ((gx * gx):sum() * lambda):backward()      -- ||dL/dx||^2 into the parameters' .grad
--   local g = lutra.autograd.grad(loss, params, nil, {create_graph = true})
--   local hv = lutra.autograd.grad(g, params, v)  -- Hessian-vector products H v
-- The graph is then retained (retain_graph defaults to true) and .grad is summed out of place.
-- Twice differentiable: add, sub, mul, div, neg, pow, maximum/minimum, the scalar forms, every
-- unary op (exp, log, sqrt, rsqrt, tanh, sigmoid, relu, gelu, silu, abs, sin, cos, square,
-- reciprocal), clamp, where/masked_fill, copies and casts, sum, mean, max/min, prod, norm,
-- var, std, softmax, log_softmax, logsumexp, matmul/gemm, F.linear, every view (reshape,
-- transpose, permute, narrow, slice, select, indexing, expand), cat, stack, index assignment,
-- F.cross_entropy, F.embedding, gather/scatter/scatter_add/scatter_reduce, index_select/
-- index_add/index_copy, F.layer_norm, F.rms_norm, F.add_layer_norm, F.add_rms_norm, F.rope,
-- F.scaled_dot_product_attention and nn's fused qkv attention (their double backward
-- recomputes the attention weights, (B, H, T, S), with recorded ops), cumsum, cumprod
-- ((..., L, L) in memory), tril/triu, sort/topk values, lutra.checkpoint (fn recomputed and
-- differentiated with recorded ops), the tensor-parallel collectives (each backward recorded
-- as its conjugate collective): the models of the zoo. The vocab-parallel cross-entropy gives
-- its first gradients, and a gradient of those raises "OP (NodeName): double backward is not
-- supported (its backward is a fused kernel, not recorded ops)" with what to use instead; so
-- does any op declared without a recorded backward (lutra/autograd/op.lua).
-- Not supported: backward through in-place writes into views (refused, see above).
local S = require "lutra.autograd.state"
local engine = require "lutra.autograd.engine"
local tensor = require "lutra.tensor"
local ops = require "lutra.ops"
local create = require "lutra.create"
local dtype = require "lutra.dtype"
local errors = require "lutra.errors"
local shape = require "lutra.shape"
local fields = require "lutra.tensor.fields"
local is_tracked = fields.is_tracked
local is_recorded = fields.is_recorded
for _, part in ipairs {"lutra.autograd.elementwise", "lutra.autograd.reduce", "lutra.autograd.views",
                       "lutra.autograd.matmul", "lutra.functional"} do require(part) end

local M = {}

local record, set_record, raise, is_tensor = S.record, S.set_record, errors.raise, ops.is_tensor
local methods, properties, setters = tensor.methods, tensor.properties, tensor.setters

-- ---- grad mode ---------------------------------------------------------------------------

-- Whether ops are being recorded for backward (false inside lutra.no_grad).
function M.is_grad_enabled() return S.enabled end

-- Turns recording for backward on or off; returns the previous setting.
function M.set_grad_enabled(on)
  local previous = S.enabled
  S.enabled = on and true or false
  return previous
end

local function with_grad_mode(on, fn, ...)
  if type(fn) ~= "function" and not (type(fn) == "table" and getmetatable(fn) and getmetatable(fn).__call) then
    raise((on and "enable_grad" or "no_grad") .. ": expected a function, got " .. type(fn))
  end
  return errors.with_field(S, "enabled", on, fn, ...)
end

-- Runs fn(...) with grad mode off (nothing recorded); returns what fn returns.
function M.no_grad(fn, ...) return with_grad_mode(false, fn, ...) end
-- Runs fn(...) with grad mode on (inside no_grad, for example).
function M.enable_grad(fn, ...) return with_grad_mode(true, fn, ...) end

-- ---- requires_grad, grad, grad_fn, is_leaf ---------------------------------------------------

local set_requires_grad = S.set_requires_grad

properties.requires_grad = function(t) return is_tracked(t) end
setters.requires_grad = function(t, v) set_requires_grad(t, v) end
-- t:requires_grad_(on): autograd follows the leaf t (on nil or true) or stops following it.
function methods.requires_grad_(t, on)
  if on == nil then on = true end
  return set_requires_grad(t, on)
end

properties.is_leaf = function(t) return not is_recorded(t) end
properties.grad_fn = function(t)
  if not is_recorded(t) then return nil end
  return record(t).cls.name
end
properties.grad = function(t)
  local rec = record(t)
  return rec and rec.grad
end
setters.grad = function(t, g)
  if g ~= nil and not is_tensor(g) then raise("grad: expected a tensor or nil, got " .. type(g)) end
  if g ~= nil and not engine.same_shape(g, t) then
    raise("grad: assigned a gradient of shape " .. shape.shape_string(g) .. " to a tensor of shape "
      .. shape.shape_string(t))
  end
  local rec = record(t)
  if rec == nil then
    if g == nil then return end
    rec = {leaf = true}
    set_record(t, rec)
  end
  rec.grad = g
end

-- Sets .grad to nil (set_to_none, the default) or zeroes it in place.
function methods.zero_grad(t, set_to_none)
  local rec = record(t)
  if rec == nil or rec.grad == nil then return t end
  if set_to_none == false then
    M.no_grad(rec.grad.zero_, rec.grad)
  else
    rec.grad = nil
  end
  return t
end

-- zero_grad of every tensor in params (a list, a table of named tensors, or anything
-- with a :parameters() method).
function M.zero_grad(params, set_to_none)
  if type(params) == "table" and type(params.parameters) == "function" then params = params:parameters() end
  if type(params) ~= "table" then raise("zero_grad: expected a list of tensors, got " .. type(params)) end
  for _, p in pairs(params) do
    if is_tensor(p) then methods.zero_grad(p, set_to_none) end
  end
end

-- A tensor sharing t's storage that autograd does not follow.
function methods.detach(t)
  errors.check_alive(t, "detach")
  return S.share(t)
end

-- Makes t a leaf that does not require grad (its graph is dropped).
function methods.detach_(t)
  if is_recorded(t) then set_record(t, nil) end
  fields.set_autograd_state(t, fields.UNTRACKED)
  return t
end

-- A non-leaf keeps its gradient in .grad after backward.
function methods.retain_grad(t)
  if not is_tracked(t) then raise("retain_grad: the tensor does not require grad") end
  if is_recorded(t) then record(t).retains = true end
  return t
end

-- ---- hooks -------------------------------------------------------------------------------------

-- fn(grad) runs when the gradient of t is computed (before it accumulates into a leaf's
-- .grad or flows on); it may return a tensor of the same shape to use instead. Returns
-- a handle whose :remove() unregisters it.
function methods.register_hook(t, fn)
  if not is_tracked(t) then raise("register_hook: cannot register a hook on a tensor that does not require grad") end
  if type(fn) ~= "function" and not (type(fn) == "table" and getmetatable(fn) and getmetatable(fn).__call) then
    raise("register_hook: expected a function, got " .. type(fn))
  end
  local rec = record(t)
  rec.hooks = rec.hooks or {}
  local hooks = rec.hooks
  local i = #hooks + 1
  hooks[i] = fn
  return {remove = function() hooks[i] = false end}
end

-- fn(grad) runs after a leaf's gradient has accumulated into its .grad during backward (all
-- of this backward's contributions summed): data parallel launches its all-reduce from
-- here. Returns a handle whose :remove() unregisters it.
function methods.register_post_accumulate_grad_hook(t, fn)
  if fields.autograd_state(t) ~= fields.LEAF then
    raise("register_post_accumulate_grad_hook: expected a leaf tensor that requires grad")
  end
  if type(fn) ~= "function" then raise("register_post_accumulate_grad_hook: expected a function, got " .. type(fn)) end
  local rec = record(t)
  rec.post_accumulate = rec.post_accumulate or {}
  local list = rec.post_accumulate
  local i = #list + 1
  list[i] = fn
  return {remove = function() list[i] = false end}
end

-- ---- backward ----------------------------------------------------------------------------------

local function root_grad(t, grad, op)
  if grad == nil then
    local n = fields.numel(t)
    if n ~= 1 then
      raise(string.format("%s: grad can be implicitly created only for scalar outputs (this one has shape %s); "
        .. "pass a gradient of that shape", op, shape.shape_string(t)))
    end
    return create.ones_like(t), true
  end
  if not is_tensor(grad) then raise(op .. ": the gradient must be a tensor, got " .. type(grad)) end
  if not engine.same_shape(grad, t) then
    raise(string.format("%s: the gradient has shape %s, the tensor %s", op, shape.shape_string(grad),
      shape.shape_string(t)))
  end
  if fields.dtype_id(grad) ~= fields.dtype_id(t) or fields.device_id(grad) ~= fields.device_id(t) then
    return grad:to(dtype.name(fields.dtype_id(t)), dtype.device_name(fields.device_id(t))), true
  end
  return grad, false
end

local OPTIONS = {backward = {retain_graph = true, create_graph = true},
                 grad = {retain_graph = true, create_graph = true, allow_unused = true}}

local function check_opts(op, opts)
  opts = opts or {}
  if type(opts) ~= "table" then raise(op .. ": options must be a table, got " .. type(opts)) end
  for k in pairs(opts) do
    if not OPTIONS[op][k] then
      local known = {}
      for name in pairs(OPTIONS[op]) do known[#known + 1] = name end
      table.sort(known)
      raise(op .. ": unknown option " .. tostring(k) .. " (" .. table.concat(known, ", ") .. ")")
    end
  end
  return opts
end

-- backward(tensors, grads, opts): tensors a tensor or a list; grads likewise (nil
-- entries for one-element tensors). opts: retain_graph; create_graph (record the backward
-- pass: the leaves' .grad can be differentiated again; retain_graph then defaults to true).
function M.backward(tensors, grads, opts)
  if is_tensor(tensors) then tensors, grads = {tensors}, {grads} end
  grads = grads or {}
  opts = check_opts("backward", opts)
  local roots, root_grads, owned = {}, {}, {}
  for i, t in ipairs(tensors) do
    if not is_tensor(t) then raise("backward: expected tensors, got " .. type(t)) end
    if not is_tracked(t) then
      raise("backward: the tensor does not require grad and has no grad_fn (did an op run under no_grad, "
        .. "or on tensors that do not require grad?)")
    end
    local g, made = root_grad(t, grads[i], "backward")
    if made then owned[g] = true end
    roots[#roots + 1] = record(t)
    root_grads[#root_grads + 1] = g
  end
  engine.run(roots, root_grads, {retain_graph = opts.retain_graph, owned = owned, create_graph = opts.create_graph})
end

-- t:backward([grad], [opts]) or t:backward{retain_graph = true}; {create_graph = true}
-- records the backward pass (gradients of gradients: see lutra.autograd).
function methods.backward(t, grad, opts)
  if type(grad) == "table" and not is_tensor(grad) then grad, opts = nil, grad end
  M.backward({t}, {grad}, opts)
end

-- The gradients of outputs with respect to inputs (lists, or single tensors), without
-- touching any .grad. grad_outputs as for backward. opts: retain_graph, allow_unused,
-- create_graph (the gradients are recorded, differentiable again: penalties, Hessian-vector
-- products; retain_graph then defaults to true).
function M.grad(outputs, inputs, grad_outputs, opts)
  local single = is_tensor(inputs)
  if is_tensor(outputs) then outputs, grad_outputs = {outputs}, {grad_outputs} end
  if single then inputs = {inputs} end
  grad_outputs = grad_outputs or {}
  opts = check_opts("grad", opts)
  local roots, root_grads, owned, capture = {}, {}, {}, {}
  for i, t in ipairs(outputs) do
    if not is_tracked(t) then raise("grad: output " .. i .. " does not require grad and has no grad_fn") end
    local g, made = root_grad(t, grad_outputs[i], "grad")
    if made then owned[g] = true end
    roots[#roots + 1] = record(t)
    root_grads[#root_grads + 1] = g
  end
  for i, x in ipairs(inputs) do
    if not is_tensor(x) or not is_tracked(x) then raise("grad: input " .. i .. " does not require grad") end
    capture[record(x)] = true
  end
  local captured = engine.run(roots, root_grads, {retain_graph = opts.retain_graph, owned = owned, capture = capture,
    create_graph = opts.create_graph})
  local result = {}
  for i, x in ipairs(inputs) do
    result[i] = captured[record(x)]
    if result[i] == nil and not opts.allow_unused then
      raise("grad: input " .. i .. " was not used to compute the outputs (pass {allow_unused = true})")
    end
  end
  if single then return result[1] end
  return result
end

M.checkpoint = require("lutra.autograd.checkpoint").checkpoint

-- lutra.detect_anomaly(true | false | fn): the first op whose output or gradient holds a nan or
-- inf raises, naming the op and the caller's line (lutra/autograd/anomaly.lua)
local anomaly = require "lutra.autograd.anomaly"
M.detect_anomaly, M.is_anomaly_enabled = anomaly.detect_anomaly, anomaly.is_enabled

return M
