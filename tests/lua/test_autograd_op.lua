-- lutra.autograd.op, the one way to declare a differentiable op: a declared op records its
-- node and its backward runs (gradcheck), its records land in op.records under its names,
-- malformed or repeated declarations are refused, untracked runs fn without recording and
-- restores grad mode on errors, and the one layer-norm backward makes only the parameter
-- gradients asked for.
local lt = require "lutra"
local op = require "lutra.autograd.op"
local T = require "lutra.testing"
local check, close, equal, fails = T.gradcheck, T.assert_close, T.assert_equal, T.assert_error
local F = lt.F

-- y = x^3 (the C ops run untracked; one node of its own records the op)
local record_cube = op.declare {
  name = "TestCubeBackward", op = {"test_cube", "test_cube_alias"}, save = {"x"},
  record = function(cls, y, x)
    local node = {op.edge(x), cls = cls}
    op.save(node, "x", x)
    op.attach(y, node)
  end,
  backward = function(n, g) return g * n.x * n.x * 3 end,
}

local function cube(x)
  local y = op.untracked(function() return x * x * x end)
  if lt.is_grad_enabled() and x.requires_grad then record_cube(y, x) end
  return y
end

test("a declared op records its node and its backward gives the gradient", function()
  local x = T.random_leaf({3, 4})
  local y = cube(x)
  equal(y.grad_fn, "TestCubeBackward")
  check(function(a) return cube(a) end, {T.random_leaf({2, 5})})
  y:sum():backward()
  close(x.grad, x:detach() * x:detach() * 3)
end)

test("records are registered under every name the declaration gives", function()
  equal(rawequal(op.records.test_cube, record_cube), true)
  equal(rawequal(op.records.test_cube_alias, record_cube), true)
  equal(type(op.records.layer_norm), "function")
  equal(type(op.classes.LayerNormBackward), "table")
  fails("no op declares the record", function() return op.records.no_such_op end)
end)

test("malformed and repeated declarations are refused", function()
  local backward = function() end
  local record = function() end
  fails("declared twice", op.declare, {name = "TestCubeBackward", record = record, backward = backward})
  fails("record test_cube declared twice",
    op.declare, {name = "TestOtherBackward", op = "test_cube", record = record, backward = backward})
  fails("unknown field", op.declare, {name = "TestBadBackward", saves = {}, record = record, backward = backward})
  fails("name (the node class) is required", op.declare, {record = record, backward = backward})
  fails("needs record and backward", op.declare, {name = "TestNoBackward", record = record})
end)

test("the saved tensors of a declared op are checked for in-place writes", function()
  local x = T.random_leaf({3})
  local x2 = x * 1
  local y = cube(x2)
  lt.no_grad(function() x2:add_(1) end)
  fails("modified in place: x of TestCubeBackward", function() y:sum():backward() end)
end)

test("untracked: nothing recorded inside, grad mode back after an error", function()
  local x = T.random_leaf({2})
  local y, z = op.untracked(function(a) return a * 2, a + 1 end, x)
  equal(y.requires_grad, false)
  equal(z.requires_grad, false)
  fails("boom", op.untracked, function() error("boom") end)
  equal(lt.is_grad_enabled(), true)
  lt.no_grad(function()
    equal(op.untracked(function() return lt.is_grad_enabled() end), false)
    equal(lt.is_grad_enabled(), false)
  end)
end)

test("layer_norm_backward makes the parameter gradients asked for", function()
  local x, w, b = lt.randn(4, 6, "f64"), lt.randn(6, "f64"), lt.randn(6, "f64")
  local _, mean, rstd = F.layer_norm(x, w, b)
  local g = lt.randn(4, 6, "f64")
  local dx, dw, db = F.layer_norm_backward(g, x, w, mean, rstd)
  equal(dw ~= nil and db ~= nil, true)
  local dx2, dw2, db2 = F.layer_norm_backward(g, x, w, mean, rstd, nil, false, true)
  equal(dw2, nil)
  close(dx2, dx)
  close(db2, db)
  local _, rms_rstd = F.rms_norm(x, w)
  local rdx, rdw = F.rms_norm_backward(g, x, w, rms_rstd)
  local rdx2, rdw2 = F.rms_norm_backward(g, x, w, rms_rstd, nil, false)
  equal(rdw ~= nil, true)
  equal(rdw2, nil)
  close(rdx2, rdx)
end)
