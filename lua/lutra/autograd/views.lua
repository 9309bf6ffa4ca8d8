-- lutra.autograd.views — the declarations of the view ops (reshape-like, transpose, permute,
-- slice/narrow, select, indexing, expand), cat/stack, and index assignment t[key] = value.
-- Registered in lutra.autograd.op's records under the kind of view ("reshape", "slice",
-- "index", ...: see lutra/tensor.lua's viewed()), "cat", "stack" and "index_put".
--
-- A view's gradient is the gradient of the viewed tensor seen back through the inverse
-- geometry: reshaped, transposed back, summed over expanded dims, or written into a
-- zero tensor of the input's shape at the place the view took.
local op = require "lutra.autograd.op"
local U = require "lutra.autograd.util"
local ops = require "lutra.ops"
local index = require "lutra.index"
local dtype = require "lutra.dtype"
local fields = require "lutra.tensor.fields"

local declare, edge, attach = op.declare, op.edge, op.attach
local shape_of, reduce_to, zeros = U.shape_of, U.reduce_to, U.zeros

-- out is a view of t: the node keeps t's shape (and the view's arguments a, b, c, d).
local function record_view(cls, out, t)
  attach(out, {edge(t), cls = cls, shape = shape_of(t)})
end
local function record_view2(cls, out, t, a, b) attach(out, {edge(t), cls = cls, shape = shape_of(t), a = a, b = b}) end
local function record_view4(cls, out, t, a, b, c, d)
  attach(out, {edge(t), cls = cls, shape = shape_of(t), a = a, b = b, c = c, d = d})
end

declare {
  name = "ViewBackward", twice_differentiable = true, op = "reshape", record = record_view,
  backward = function(n, g) return g:reshape(n.shape) end,
}

declare {
  name = "TransposeBackward", twice_differentiable = true, op = "transpose", record = record_view2,
  backward = function(n, g) return g:transpose(n.a, n.b) end,
}

declare {
  name = "PermuteBackward", twice_differentiable = true, op = "permute",
  record = function(cls, out, t, dims)
    local inverse, n = {}, t.ndim
    for i = 1, #dims do
      local d = dims[i] < 0 and dims[i] + n or dims[i]
      inverse[d + 1] = i - 1
    end
    attach(out, {edge(t), cls = cls, shape = shape_of(t), inverse = inverse})
  end,
  backward = function(n, g) return g:permute(n.inverse) end,
}

declare {
  name = "ExpandBackward", twice_differentiable = true, op = "expand", record = record_view,
  backward = function(n, g) return reduce_to(g, n.shape) end,
}

-- slice, select, index: the gradient lands in zeros at the place the view took. Recorded
-- (create_graph): the same write as an index assignment z[key] = g (IndexPutBackward).
local function put_at(n, g, key)
  local z = zeros(n.shape, g)
  index.set(z, key, g)
  return z
end

-- The index key of dim `dim` (negative from the end) taking `entry`, the dims before it whole.
local function key_at(n, dim, entry)
  if dim < 0 then dim = dim + #n.shape end
  local key = {}
  for d = 1, dim do key[d] = {} end
  key[dim + 1] = entry
  return key
end

declare {
  name = "SliceBackward", op = "slice", record = record_view4, -- a, b, c, d: dim, start, stop, step
  backward = function(n, g)
    local z = zeros(n.shape, g)
    z:slice(n.a, n.b, n.c, n.d):copy_(g)
    return z
  end,
  double_backward = function(n, g) return put_at(n, g, key_at(n, n.a, {n.b, n.c, n.d})) end,
}

declare {
  name = "SelectBackward", op = "select", record = record_view2,
  backward = function(n, g)
    local z = zeros(n.shape, g)
    z:select(n.a, n.b):copy_(g)
    return z
  end,
  double_backward = function(n, g) return put_at(n, g, key_at(n, n.a, n.b)) end,
}

declare {
  name = "IndexBackward", op = "index", record = record_view2, -- a: the key
  backward = function(n, g)
    local z = zeros(n.shape, g)
    index.get(z, n.a):copy_(g)
    return z
  end,
  double_backward = function(n, g) return put_at(n, g, n.a) end,
}

-- ---- cat, stack -----------------------------------------------------------------------

-- out = cat(list, dim), or stack(list, dim) (each input one slice of out along dim).
local function record_cat(cls, out, list, dim)
  local stacked = cls.name == "StackBackward"
  local node = {cls = cls, dim = dim, n = #list}
  local sizes = {}
  for i = 1, #list do
    node[i] = edge(list[i])
    sizes[i] = stacked and 1 or fields.size(list[i], dim)
  end
  node.sizes = sizes
  attach(out, node)
end

declare {
  name = "CatBackward", twice_differentiable = true, op = "cat", record = record_cat,
  backward = function(n, g)
    local grads, start = {}, 0
    for i = 1, n.n do
      local len = n.sizes[i]
      if n[i] then grads[i] = g:narrow(n.dim, start, len) end
      start = start + len
    end
    return grads
  end,
}

declare {
  name = "StackBackward", twice_differentiable = true, op = "stack", record = record_cat,
  backward = function(n, g)
    local grads = {}
    for i = 1, n.n do
      if n[i] then grads[i] = g:select(n.dim, i - 1) end
    end
    return grads
  end,
}

-- ---- t[key] = value ---------------------------------------------------------------------

-- t (its old value, whose record edge(t) still is) got value at key.
declare {
  name = "IndexPutBackward", twice_differentiable = true, op = "index_put",
  record = function(cls, t, key, value)
    local node = {edge(t), false, cls = cls, key = key}
    if ops.is_tensor(value) then
      node[2] = edge(value)
      node.vshape, node.vdt = shape_of(value), fields.dtype_id(value)
    end
    attach(t, node)
  end,
  backward = function(n, g)
    local gt, gv
    if n[1] then
      gt = g:clone()
      index.set(gt, n.key, 0)
    end
    if n[2] then
      gv = reduce_to(index.get(g, n.key), n.vshape)
      if fields.dtype_id(gv) ~= n.vdt then gv = gv:to(dtype.name(n.vdt)) end
    end
    return gt, gv
  end,
}

return {}
