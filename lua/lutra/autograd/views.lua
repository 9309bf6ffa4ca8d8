-- lutra.autograd.views — records and backward formulas of the view ops (reshape-like,
-- transpose, permute, slice/narrow, select, indexing, expand), cat/stack, and index
-- assignment t[key] = value.
--
-- A view's gradient is the gradient of the viewed tensor seen back through the inverse
-- geometry: reshaped, transposed back, summed over expanded dims, or written into a
-- zero tensor of the input's shape at the place the view took.
local S = require "lutra.autograd.state"
local U = require "lutra.autograd.util"
local ops = require "lutra.ops"
local index = require "lutra.index"
local dtype = require "lutra.dtype"

local edge, attach, class = S.edge, S.attach, S.class
local shape_of, reduce_to, zeros = U.shape_of, U.reduce_to, U.zeros

local Reshape = class("ViewBackward")
function Reshape.backward(n, g) return g:reshape(n.shape) end

local Transpose = class("TransposeBackward")
function Transpose.backward(n, g) return g:transpose(n.a, n.b) end

local Permute = class("PermuteBackward")
function Permute.backward(n, g) return g:permute(n.inverse) end

local Expand = class("ExpandBackward")
function Expand.backward(n, g) return reduce_to(g, n.shape) end

-- slice, select, index: the gradient lands in zeros at the place the view took.
local Slice = class("SliceBackward")
function Slice.backward(n, g)
  local z = zeros(n.shape, g)
  z:slice(n.a, n.b, n.c, n.d):copy_(g)
  return z
end

local Select = class("SelectBackward")
function Select.backward(n, g)
  local z = zeros(n.shape, g)
  z:select(n.a, n.b):copy_(g)
  return z
end

local Index = class("IndexBackward")
function Index.backward(n, g)
  local z = zeros(n.shape, g)
  index.get(z, n.key):copy_(g)
  return z
end

-- out is a view of t made by `kind` (see lutra/tensor.lua: viewed()).
function S.view(out, t, kind, a, b, c, d)
  local node = {edge(t), shape = shape_of(t)}
  if kind == "reshape" then
    node.cls = Reshape
  elseif kind == "transpose" then
    node.cls, node.a, node.b = Transpose, a, b
  elseif kind == "permute" then
    local inverse, n = {}, t.ndim
    for i = 1, #a do
      local d = a[i] < 0 and a[i] + n or a[i]
      inverse[d + 1] = i - 1
    end
    node.cls, node.inverse = Permute, inverse
  elseif kind == "expand" then
    node.cls = Expand
  elseif kind == "slice" then
    node.cls, node.a, node.b, node.c, node.d = Slice, a, b, c, d -- dim, start, stop, step
  elseif kind == "select" then
    node.cls, node.a, node.b = Select, a, b
  elseif kind == "index" then
    node.cls, node.key = Index, a
  else
    error("autograd: unknown view kind " .. tostring(kind))
  end
  attach(out, node)
end

-- ---- cat, stack -----------------------------------------------------------------------

local Cat = class("CatBackward")
local Stack = class("StackBackward")

-- out = cat(list, dim), or stack(list, dim) when stacked.
function S.cat(out, list, dim, stacked)
  local node = {cls = stacked and Stack or Cat, dim = dim, n = #list}
  local sizes = {}
  for i = 1, #list do
    node[i] = edge(list[i])
    sizes[i] = stacked and 1 or tonumber(list[i].shape_[dim])
  end
  node.sizes = sizes
  attach(out, node)
end

function Cat.backward(n, g)
  local grads, start = {}, 0
  for i = 1, n.n do
    local len = n.sizes[i]
    if n[i] then grads[i] = g:narrow(n.dim, start, len) end
    start = start + len
  end
  return grads
end

function Stack.backward(n, g)
  local grads = {}
  for i = 1, n.n do
    if n[i] then grads[i] = g:select(n.dim, i - 1) end
  end
  return grads
end

-- ---- t[key] = value ---------------------------------------------------------------------

local IndexPut = class("IndexPutBackward")

-- t (its old value, whose record edge(t) still is) got value at key.
function S.index_put(t, key, value)
  local node = {edge(t), false, cls = IndexPut, key = key}
  if ops.is_tensor(value) then
    node[2] = edge(value)
    node.vshape, node.vdt = shape_of(value), value.dtype_
  end
  attach(t, node)
end

function IndexPut.backward(n, g)
  local gt, gv
  if n[1] then
    gt = g:clone()
    index.set(gt, n.key, 0)
  end
  if n[2] then
    gv = reduce_to(index.get(g, n.key), n.vshape)
    if gv.dtype_ ~= n.vdt then gv = gv:to(dtype.name(n.vdt)) end
  end
  return gt, gv
end

return {}
