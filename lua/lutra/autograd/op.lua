-- lutra.autograd.op — the one way to declare a differentiable op: its node class (the name
-- t.grad_fn shows), the tensors the node saves, how the node is recorded and its backward.
--
--   local record_rms_norm = op.declare {
--     name = "RMSNormBackward",
--     op = "rms_norm",                         -- optional: also op.records.rms_norm (or a list)
--     save = {"x", "w", "rstd"},               -- node fields holding saved tensors
--     record = function(cls, out, x, w, rstd)  -- attaches a node of class cls to out
--       local node = {op.edge(x), w ~= nil and op.edge(w) or false, cls = cls}
--       op.save(node, "x", x) ...
--       op.attach(out, node)
--     end,
--     backward = function(node, grad) return dx, dw end,  -- one gradient per edge
--   }
--   -- the forward, after its C call, when grad mode is on and an input requires grad:
--   record_rms_norm(out, x, w, rstd)
--
-- declare returns the record function, without the class argument. A node is a table
-- {edge_1, edge_2, ..., cls = class}: edge_i the record of input i (op.edge: false when it
-- does not require grad). backward returns the edges' gradients, as values or as one list
-- (nil: no gradient), or DELIVERED for an edge whose gradient it handed on itself.
-- Optional flags: always (backward runs even when the node got no gradient), keeps_grad
-- (the engine must not free the gradient backward stored), release(node) (drops what the
-- node holds beyond its saved tensors).
--
-- Gradients of gradients (backward{create_graph = true}): the engine runs the formulas with
-- grad mode on and the saved tensors connected to the nodes that made them, so that what a
-- formula computes is recorded in turn. One of, per op:
--   twice_differentiable = true   backward is written with recorded ops (no kernel of its own,
--                                 nothing in place on the gradient), so it runs as it is;
--   double_backward = fn(node, grad)  the same gradients written with recorded ops, used instead of
--                                 backward (which calls a fused kernel) under create_graph;
--   neither: the op's gradients are computed but their own gradient raises, naming the op;
--                                 no_double = "..." says what to use instead.
--
-- Op wrappers that cannot require the declaring module (it requires them, for the math of
-- its backward) look the record up by the `op` name in op.records when they record. The
-- declaring modules are loaded by lutra.autograd, which the library's entry points (lutra,
-- lutra.nn) load before any op records; a missing name is an error.
local S = require "lutra.autograd.state"
local with_field = require("lutra.errors").with_field

local M = {}

local classes = {} -- node class name -> class
M.classes = classes

M.records = setmetatable({}, {__index = function(_, name)
  error("autograd: no op declares the record " .. tostring(name)
    .. " (the declarations load with lutra.autograd: require \"lutra\" first)", 2)
end})

local FLAGS = {name = true, op = true, save = true, record = true, backward = true, always = true,
               keeps_grad = true, release = true, twice_differentiable = true, double_backward = true,
               no_double = true}

local function class_of(spec)
  for k in pairs(spec) do
    if not FLAGS[k] then error("autograd.op: unknown field " .. tostring(k), 3) end
  end
  local name = spec.name
  if type(name) ~= "string" then error("autograd.op: name (the node class) is required", 3) end
  if classes[name] then error("autograd.op: node class " .. name .. " declared twice", 3) end
  if type(spec.record) ~= "function" or type(spec.backward) ~= "function" then
    error("autograd.op: " .. name .. " needs record and backward functions", 3)
  end
  local op = spec.op
  if type(op) == "table" then op = op[1] end
  if spec.double_backward ~= nil and type(spec.double_backward) ~= "function" then
    error("autograd.op: " .. name .. ": double_backward must be a function", 3)
  end
  local cls = {name = name, op = op, saves = spec.save or {}, versions = {}, sources = {}, backward = spec.backward,
               always = spec.always, keeps_grad = spec.keeps_grad, release = spec.release,
               double_backward = spec.double_backward or (spec.twice_differentiable and spec.backward) or nil,
               no_double = spec.no_double}
  for i, f in ipairs(cls.saves) do cls.versions[i], cls.sources[i] = "ver_" .. f, "src_" .. f end
  classes[name] = cls
  return cls
end

-- Declares an op (see the header); returns its record function.
function M.declare(spec)
  local cls = class_of(spec)
  local record = spec.record
  local function bound(a, b, c, d, e, f, g, h, i, j, k, l) return record(cls, a, b, c, d, e, f, g, h, i, j, k, l) end
  local names = type(spec.op) == "table" and spec.op or {spec.op}
  for _, name in ipairs(names) do
    if rawget(M.records, name) then error("autograd.op: record " .. name .. " declared twice", 2) end
    M.records[name] = bound
  end
  return bound
end

-- ---- what record functions use -------------------------------------------------------------

M.edge, M.attach, M.clear = S.edge, S.attach, S.clear

-- The node fields holding the version of saved tensor `field` ("ver_" .. field) and, for an
-- alias of a recorded op's result, that result's record ("src_" .. field), made once.
local save_value, save_output = S.save_value, S.save_output
local function field_names(prefix)
  return setmetatable({}, {__index = function(names, field)
    local v = prefix .. field
    names[field] = v
    return v
  end})
end
local versions, sources = field_names("ver_"), field_names("src_")

-- Saves tensor t for backward in node[field] (an alias for results of recorded ops).
function M.save(node, field, t)
  local s, v, src = save_value(t)
  node[field] = s
  node[versions[field]] = v
  if src ~= nil then node[sources[field]] = src end
  return s
end

-- Saves out, the result of the op being recorded (always through an alias; with no "src_"
-- field: the engine knows an alias without one for the node's own result).
function M.save_output(node, field, out) return save_output(node, field, versions[field], out) end

-- Runs fn(...) with grad mode off: the pieces of an op that records itself as one node
-- (views and kernels) are not recorded one by one. Returns what fn returns.
function M.untracked(fn, ...)
  if not S.enabled then return fn(...) end
  return with_field(S, "enabled", false, fn, ...)
end

return M
