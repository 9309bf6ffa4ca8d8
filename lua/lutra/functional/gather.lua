-- lutra.functional.gather — F.gather, F.scatter, F.scatter_add (PyTorch's semantics, dims 0-based,
-- negative from the end) and their autograd declarations. The C side: lt_gather, lt_scatter,
-- lt_scatter_add (host/ops/gather.c).
--
--   F.gather(x, dim, index, out)             out[p] = x[p with dim := index[p]], shaped as index
--   F.scatter(x, dim, index, src, out)       x with src (a tensor, or a number) written at index
--   F.scatter_add(x, dim, index, src, out)   x with src added at index (duplicates sum in index order)
--   F.scatter_reduce(x, dim, index, src, reduce, {include_self = true, out = })
--       reduce "sum", "mean", "amax" or "amin" at index; include_self false leaves x's values out of
--       the places written (a place nothing is written to keeps x's value)
--
-- index is i32/i64 with x's number of dims; a value outside [0, x.shape[dim]) is an error naming
-- the op, the value and its position. Gradients: gather's is a scatter_add of the gradient into
-- zeros, scatter_add's are the gradient (x) and its gather (src), scatter's are the gradient with
-- the written places zeroed (x) and its gather (src, which must then be shaped as index);
-- scatter_reduce's as PyTorch's (mean: the gradient over the count; amax/amin: split evenly between
-- the values equal to the result).
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local op = require "lutra.autograd.op"
local U = require "lutra.functional.util"
local shape_of = require("lutra.autograd.util").shape_of
local C = lt.C

local M = {}

local new, fail, raise = memory.new, errors.fail, errors.raise
local need, tracked, writing = U.need, U.tracked, U.writing
local edge, attach, save = op.edge, op.attach, op.save

local function create() return require "lutra.create" end

-- zeros shaped as `shape` (a list) with t's dtype and device
local function zeros(shape, t) return create().zeros(shape, {dtype = t.dtype, device = t.device}) end

-- src as a tensor: a number fills index's shape in x's dtype
local function src_tensor(name, src, x, index)
  if type(src) == "number" then return create().full(shape_of(index), src, {dtype = x.dtype, device = x.device}) end
  return need(name, "src", src)
end

local record_gather, record_scatter, record_scatter_add, record_scatter_reduce -- the declarations', below

function M.gather(x, dim, index, out)
  need("gather", "x", x)
  need("gather", "index", index)
  errors.int_arg("gather", dim, "dim")
  writing("gather", out, x, index)
  out = out or new()
  if C.lt_gather(out, x, dim, index) ~= 0 then fail() end
  if tracked(x) then record_gather(out, x, dim, index) end
  return out
end

local function scatter_op(name, fn, record)
  return function(x, dim, index, src, out)
    need(name, "x", x)
    need(name, "index", index)
    errors.int_arg(name, dim, "dim")
    src = src_tensor(name, src, x, index)
    writing(name, out, x, index, src)
    out = out or new()
    if fn(out, x, dim, index, src) ~= 0 then fail() end
    if tracked(x, src) then record(out, x, dim, index, src) end
    return out
  end
end
M.scatter = scatter_op("scatter", function(...) return C.lt_scatter(...) end,
  function(...) return record_scatter(...) end)
M.scatter_add = scatter_op("scatter_add", function(...) return C.lt_scatter_add(...) end,
  function(...) return record_scatter_add(...) end)
local gather, scatter, scatter_add = M.gather, M.scatter, M.scatter_add

local IDENTITY = {sum = 0, mean = 0, amax = -math.huge, amin = math.huge}

function M.scatter_reduce(x, dim, index, src, reduce, opts)
  need("scatter_reduce", "x", x)
  need("scatter_reduce", "index", index)
  errors.int_arg("scatter_reduce", dim, "dim")
  src = src_tensor("scatter_reduce", src, x, index)
  if IDENTITY[reduce] == nil then
    raise("scatter_reduce: reduce is " .. tostring(reduce) .. ", expected \"sum\", \"mean\", \"amax\" or \"amin\"")
  end
  opts = opts or {}
  local base = x
  if opts.include_self == false then base = scatter(x, dim, index, IDENTITY[reduce]) end
  local out
  if reduce == "sum" then
    out = scatter_add(base, dim, index, src, opts.out)
  elseif reduce == "mean" then -- the sum over the count of values summed (x's own counting when included)
    local like = {dtype = x.dtype, device = x.device}
    local count = create().full(shape_of(x), opts.include_self == false and 0 or 1, like)
    count = scatter_add(count, dim, index, create().ones(shape_of(index), like))
    out = scatter_add(base, dim, index, src) / count:clamp(1, math.huge)
    if opts.include_self == false then out = require("lutra.ops").where(count:eq(0), x, out) end
    if opts.out ~= nil then opts.out:copy_(out) out = opts.out end
  else
    writing("scatter_reduce", opts.out, base, index, src)
    out = opts.out or new()
    if C.lt_scatter_reduce(out, base, dim, index, src, reduce) ~= 0 then fail() end
    if tracked(base, src) then record_scatter_reduce(out, base, dim, index, src) end
  end
  return out
end

record_gather = op.declare {
  name = "GatherBackward", twice_differentiable = true, op = "gather", save = {"index"},
  record = function(cls, out, x, dim, index)
    local node = {edge(x), cls = cls, dim = dim, xshape = shape_of(x)}
    save(node, "index", index)
    attach(out, node)
  end,
  backward = function(n, g) return scatter_add(zeros(n.xshape, g), n.dim, n.index, g) end,
}

-- src's gradient: g gathered at index, which must be src's shape
local function src_grad(name, n, g)
  local d = gather(g, n.dim, n.index)
  local want, got = n.sshape, shape_of(d)
  for k = 1, math.max(#want, #got) do
    if want[k] ~= got[k] then
      raise(name .. ": the gradient of src needs index shaped as src (as PyTorch's); index is smaller")
    end
  end
  return d
end

local function scatter_node(cls, out, x, dim, index, src)
  local node = {edge(x), edge(src), cls = cls, dim = dim, sshape = shape_of(src)}
  save(node, "index", index)
  attach(out, node)
end

record_scatter = op.declare {
  name = "ScatterBackward", twice_differentiable = true, op = "scatter", save = {"index"},
  record = scatter_node,
  backward = function(n, g)
    local dx = n[1] and scatter(g, n.dim, n.index, 0) or nil
    return dx, n[2] and src_grad("scatter", n, g) or nil
  end,
}

record_scatter_add = op.declare {
  name = "ScatterAddBackward", twice_differentiable = true, op = "scatter_add", save = {"index"},
  record = scatter_node,
  backward = function(n, g) return n[1] and g or nil, n[2] and src_grad("scatter_add", n, g) or nil end,
}

-- amax / amin, as PyTorch's: the gradient of each result is split evenly between the values
-- (x's at the place, src's scattered there) equal to it
record_scatter_reduce = op.declare {
  name = "ScatterReduceBackward", twice_differentiable = true, op = "scatter_reduce", save = {"x", "src", "out", "index"},
  record = function(cls, out, x, dim, index, src)
    local node = {edge(x), edge(src), cls = cls, dim = dim, sshape = shape_of(src)}
    save(node, "x", x)
    save(node, "src", src)
    save(node, "out", out)
    save(node, "index", index)
    attach(out, node)
  end,
  backward = function(n, g)
    local dt = g.dtype
    local self_hit = n.x:eq(n.out):to(dt)
    local src_hit = n.src:eq(gather(n.out, n.dim, n.index)):to(dt)
    local share = g / scatter_add(self_hit, n.dim, n.index, src_hit)
    local dx = n[1] and self_hit * share or nil
    return dx, n[2] and src_hit * gather(share, n.dim, n.index) or nil
  end,
}

return M
