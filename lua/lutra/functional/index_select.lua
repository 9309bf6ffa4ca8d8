-- lutra.functional.index_select — F.index_select, F.index_add, F.index_copy (PyTorch's semantics,
-- dims 0-based, negative from the end) and their autograd declarations. The C side:
-- lt_index_select, lt_index_add, lt_index_copy (host/ops/index_select.c, on gather's plan).
--
--   F.index_select(x, dim, index, out)       x's slices index[1], index[2], ... along dim
--   F.index_add(x, dim, index, src, out)     x with src's slices added at index (duplicates sum in order)
--   F.index_copy(x, dim, index, src, out)    x with src's slices written at index
--
-- index is 1-d i32/i64; src is x's shape with #index at dim. Gradients: index_select's is an
-- index_add of the gradient into zeros, index_add's are the gradient (x) and its index_select
-- (src), index_copy's are the gradient with the written slices zeroed (x) and its index_select.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local op = require "lutra.autograd.op"
local U = require "lutra.functional.util"
local shape_of = require("lutra.autograd.util").shape_of
local C = lt.C

local M = {}

local new, fail = memory.new, errors.fail
local need, tracked, writing = U.need, U.tracked, U.writing
local edge, attach, save = op.edge, op.attach, op.save

local function zeros(shape, t) return require("lutra.create").zeros(shape, {dtype = t.dtype, device = t.device}) end

local record_select, record_add, record_copy -- the declarations', below

function M.index_select(x, dim, index, out)
  need("index_select", "x", x)
  need("index_select", "index", index)
  errors.int_arg("index_select", dim, "dim")
  writing("index_select", out, x, index)
  out = out or new()
  if C.lt_index_select(out, x, dim, index) ~= 0 then fail() end
  if tracked(x) then record_select(out, x, dim, index) end
  return out
end

local function index_write(name, fn, record)
  return function(x, dim, index, src, out)
    need(name, "x", x)
    need(name, "index", index)
    need(name, "src", src)
    errors.int_arg(name, dim, "dim")
    writing(name, out, x, index, src)
    out = out or new()
    if fn(out, x, dim, index, src) ~= 0 then fail() end
    if tracked(x, src) then record(out, x, dim, index, src) end
    return out
  end
end
M.index_add = index_write("index_add", function(...) return C.lt_index_add(...) end,
  function(...) return record_add(...) end)
M.index_copy = index_write("index_copy", function(...) return C.lt_index_copy(...) end,
  function(...) return record_copy(...) end)
local index_select, index_add, index_copy = M.index_select, M.index_add, M.index_copy

record_select = op.declare {
  name = "IndexSelectBackward", twice_differentiable = true, op = "index_select", save = {"index"},
  record = function(cls, out, x, dim, index)
    local node = {edge(x), cls = cls, dim = dim, xshape = shape_of(x)}
    save(node, "index", index)
    attach(out, node)
  end,
  backward = function(n, g) return index_add(zeros(n.xshape, g), n.dim, n.index, g) end,
}

local function write_node(cls, out, x, dim, index, src)
  local node = {edge(x), edge(src), cls = cls, dim = dim, sshape = shape_of(src)}
  save(node, "index", index)
  attach(out, node)
end

record_add = op.declare {
  name = "IndexAddBackward", twice_differentiable = true, op = "index_add", save = {"index"},
  record = write_node,
  backward = function(n, g) return n[1] and g or nil, n[2] and index_select(g, n.dim, n.index) or nil end,
}

record_copy = op.declare {
  name = "IndexCopyBackward", twice_differentiable = true, op = "index_copy", save = {"index"},
  record = write_node,
  backward = function(n, g)
    local dx = n[1] and index_copy(g, n.dim, n.index, zeros(n.sshape, g)) or nil
    return dx, n[2] and index_select(g, n.dim, n.index) or nil
  end,
}

return M
