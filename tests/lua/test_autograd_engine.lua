-- Autograd semantics: requires_grad (property, method, creation option), leaves and grad_fn,
-- backward of scalars and of non-scalars with a gradient, accumulation across backward calls,
-- zero_grad, no_grad/enable_grad nesting, detach, retain_graph and the freed-graph error,
-- hooks, retain_grad, lutra.autograd.grad and multi-root backward, shared subgraphs, and
-- in-place ops: refused where autograd cannot follow them, recorded where it can, and saved
-- tensors modified in place detected by version counters.
local lt = require "lutra"
local T = require "lutra.testing"
local check, close, equal, fails = T.gradcheck, T.assert_close, T.assert_equal, T.assert_error

local function f64(data) return lt.tensor(data, {dtype = "f64"}) end

test("requires_grad: property, setter, requires_grad_, creation options, integer dtypes refused", function()
  local x = lt.ones(2, 3)
  equal(x.requires_grad, false)
  x.requires_grad = true
  equal(x.requires_grad, true)
  equal(x.is_leaf, true)
  equal(x.grad_fn, nil)
  x:requires_grad_(false)
  equal(x.requires_grad, false)
  equal(lt.ones(2):requires_grad_().requires_grad, true)
  for _, t in ipairs {lt.tensor({1, 2}, {requires_grad = true}), lt.zeros(2, {requires_grad = true}),
                      lt.randn(2, 2, {dtype = "f64", requires_grad = true}), lt.rand(3, {requires_grad = true}),
                      lt.full({2}, 3, {requires_grad = true}), lt.empty(2, {requires_grad = true}),
                      lt.ones_like(x, {requires_grad = true}), lt.randn_like(x, {requires_grad = true}),
                      lt.arange(0, 1, 0.25, {requires_grad = true}), lt.linspace(0, 1, 5, {requires_grad = true})} do
    equal(t.requires_grad, true)
    equal(t.is_leaf, true)
  end
  equal(lt.zeros(2, {requires_grad = false}).requires_grad, false)
  fails("only floating point tensors can require gradients", function() lt.arange(3).requires_grad = true end)
  fails("only floating point tensors", function() lt.zeros(2, {dtype = "i32", requires_grad = true}) end)
  local y = x:requires_grad_() * 2
  equal(y.requires_grad, true)
  equal(y.is_leaf, false)
  equal(y.grad_fn, "MulScalarBackward")
  fails("only leaf tensors", function() y.requires_grad = false end)
  -- results of ops on tensors that do not require grad do not either
  equal((lt.ones(2) * 2).requires_grad, false)
end)

test("backward: scalars, non-scalars with a gradient, errors as torch", function()
  local x = f64({1, 2, 3}):requires_grad_()
  local y = x * x
  fails("grad can be implicitly created only for scalar outputs", function() y:backward() end)
  fails("the gradient has shape [2]", function() y:backward(lt.ones(2, "f64")) end)
  y:backward(f64({1, 0, 2}))
  equal(x.grad:tolist(), {2, 0, 12})
  fails("does not require grad and has no grad_fn", function() lt.ones(2):sum():backward() end)
  -- a gradient of another dtype is converted
  local z = f64({1, 2}):requires_grad_()
  ;(z * 3):backward(lt.ones(2))
  equal(z.grad:tolist(), {3, 3})
  equal(z.grad.dtype, "f64")
  -- backward on a leaf sets its own gradient
  local w = f64({5}):requires_grad_()
  w:backward(f64({7}))
  equal(w.grad:tolist(), {7})
  -- a non-leaf has no .grad unless retained
  equal(y.grad, nil)
  fails("backward: unknown option create_grpah (create_graph, retain_graph)", function()
    (x * x):sum():backward{create_grpah = true}
  end)
end)

test("gradients accumulate across backward calls; zero_grad drops or zeroes them", function()
  local x = f64({1, 2}):requires_grad_()
  for _ = 1, 3 do (x * x):sum():backward() end
  equal(x.grad:tolist(), {6, 12})
  local g = x.grad
  x:zero_grad(false)
  equal(x.grad:tolist(), {0, 0})
  assert(x.grad == g, "zero_grad(false) keeps the same tensor")
  x:zero_grad()
  equal(x.grad, nil)
  local a, b = f64({1}):requires_grad_(), f64({2}):requires_grad_()
  ;(a * b):sum():backward()
  lt.zero_grad({a, b})
  equal({a.grad, b.grad}, {nil, nil})
  ;(a * b):sum():backward()
  lt.zero_grad({first = a, second = b}, false)
  equal({a.grad:item(), b.grad:item()}, {0, 0})
  -- the user may set .grad (shape checked)
  a.grad = f64({4})
  ;(a * 1):sum():backward()
  equal(a.grad:tolist(), {5})
  fails("assigned a gradient of shape [2]", function() a.grad = lt.ones(2, "f64") end)
end)

test("no_grad and enable_grad nest, return values, restore the mode on errors", function()
  local x = lt.ones(2, {requires_grad = true})
  equal(lt.is_grad_enabled(), true)
  local y, extra = lt.no_grad(function(a)
    equal(lt.is_grad_enabled(), false)
    local inner = lt.no_grad(function() return a * 2 end)
    local on = lt.enable_grad(function() return a * 3 end)
    equal(on.requires_grad, true)
    equal(lt.is_grad_enabled(), false)
    return a * inner, "extra"
  end, x)
  equal(y.requires_grad, false)
  equal(extra, "extra")
  equal(lt.is_grad_enabled(), true)
  local ok = pcall(lt.no_grad, function() error("boom") end)
  equal(ok, false)
  equal(lt.is_grad_enabled(), true)
  local prev = lt.set_grad_enabled(false)
  equal(prev, true)
  equal((x * 2).requires_grad, false)
  lt.set_grad_enabled(true)
  equal((x * 2).requires_grad, true)
  fails("expected a function", function() lt.no_grad(3) end)
end)

test("detach shares the storage and cuts the graph; detach_", function()
  local x = f64({1, 2}):requires_grad_()
  local y = x * 2
  local d = y:detach()
  equal(d.requires_grad, false)
  d[0] = 10 -- writes y's storage
  equal(y:tolist(), {10, 4})
  local z = (y * 1 + d * x):sum() -- d is a constant
  z:backward()
  equal(x.grad:tolist(), {2 + 10, 2 + 4})
  local w = x * 3
  w:detach_()
  equal({w.requires_grad, w.is_leaf}, {false, true})
end)

test("retain_graph: a second backward through freed saved tensors fails clearly", function()
  local x = f64({1, 2}):requires_grad_()
  local y = (x * x):sum()
  y:backward()
  fails("backward through the graph a second time", function() y:backward() end)
  local z = (x:exp() * 2):sum()
  z:backward{retain_graph = true}
  z:backward()
  close(x.grad, (x:exp() * 4 + x * 2):detach(), {rtol = 1e-12})
  -- nothing saved: running twice is fine, as in torch
  x.grad = nil
  local s = (x + 1):sum()
  s:backward()
  s:backward()
  equal(x.grad:tolist(), {2, 2})
end)

test("hooks see, replace and stop seeing gradients; retain_grad", function()
  local x = f64({1, 2, 3}):requires_grad_()
  local seen = {}
  local h1 = x:register_hook(function(g) seen[#seen + 1] = g:tolist() end)
  x:register_hook(function(g) return g * 10 end)
  local y = x * 2
  y:retain_grad()
  local hy = y:register_hook(function(g) return g + 1 end)
  y:sum():backward()
  equal(seen, {{4, 4, 4}}) -- (1 + 1) * 2: after y's hook
  equal(x.grad:tolist(), {40, 40, 40})
  equal(y.grad:tolist(), {2, 2, 2})
  h1:remove()
  hy:remove()
  x.grad = nil
  ;(x * 2):sum():backward()
  equal(#seen, 1)
  equal(x.grad:tolist(), {20, 20, 20})
  local bad = f64({1}):requires_grad_()
  bad:register_hook(function() return lt.ones(3, "f64") end)
  fails("a hook returned a tensor of shape [3]", function() (bad * 1):sum():backward() end)
  fails("does not require grad", function() lt.ones(2):register_hook(print) end)
end)

test("shared subgraphs accumulate; autograd.grad and multi-root backward", function()
  local x = f64({1, 2}):requires_grad_()
  local s = x:exp()
  local y = (s * s + s:sin() + x):sum() -- s used three times, x twice
  check(function(a) local e = a:exp(); return (e * e + e:sin() + a):sum() end, {f64({0.3, -0.2}):requires_grad_()})
  local gx = lt.autograd.grad(y, x)
  equal(x.grad, nil) -- untouched
  close(gx, (s * s * 2 + s:cos() * s + 1):detach(), {rtol = 1e-12})
  local a, b = f64({1}):requires_grad_(), f64({3}):requires_grad_()
  local ga, gb = unpack(lt.autograd.grad({a * b}, {a, b}, {f64({2})}))
  equal({ga:item(), gb:item()}, {6, 2})
  fails("was not used", function() lt.autograd.grad((a * 2):sum(), {a, b}) end)
  local r = lt.autograd.grad((a * 2):sum(), {a, b}, nil, {allow_unused = true})
  equal({r[1]:item(), r[2]}, {2, nil})
  lt.autograd.backward({a * 2, b * b}, {f64({1}), f64({0.5})})
  equal({a.grad:item(), b.grad:item()}, {2, 3})
end)

test("in-place: refused on leaves that require grad (allowed under no_grad) and on views in the graph", function()
  local w = lt.ones(3, {requires_grad = true})
  fails("a leaf tensor that requires grad cannot be modified in place", function() w:add_(1) end)
  fails("leaf tensor that requires grad", function() w:copy_(lt.zeros(3)) end)
  fails("leaf tensor that requires grad", function() w:zero_() end)
  fails("leaf tensor that requires grad", function() w:uniform_() end)
  fails("leaf tensor that requires grad", function() lt.add(lt.ones(3), 1, w) end)
  lt.no_grad(function() w:mul_(3) end)
  equal(w:tolist(), {3, 3, 3})
  equal(w.is_leaf, true)
  local v = (w * 1)[{{0, 2}}]
  fails("in-place write into a view", function() v:add_(1) end)
  local plain = lt.zeros(4)
  fails("in-place write into a view", function() plain[{{0, 3}}]:copy_(w) end)
  -- a view of a tensor that does not require grad can be written with plain values
  plain[{{0, 2}}]:fill_(1)
  equal(plain:tolist(), {1, 1, 0, 0})
end)

test("in-place: recorded on results of ops (rebased) and on plain tensors given grad values", function()
  check(function(a)
    local y = a * 2
    y:add_(1)
    y:mul_(3)
    y:sub_(a)
    y:exp_() -- from the output: y's old value is not needed (but y must not change again)
    local r = (a * 1):relu_()
    return y, r
  end, {f64({0.5, -0.25, 0.125}):requires_grad_()})
  local y = lt.ones(2, {requires_grad = true}) * 1
  y:exp_()
  y:relu_() -- changes the output exp_ saved
  fails("modified in place: y of InplaceUnaryBackward", function() y:sum():backward() end)
  check(function(a, b)
    local buf = lt.zeros(3, "f64")
    buf:add_(a)     -- buf now depends on a
    buf:mul_(2)
    lt.add(buf, b * a, buf)
    local other = lt.zeros(3, "f64")
    other:copy_(b:sin()) -- replaces other's value
    return buf, other
  end, {f64({0.5, -1, 2}):requires_grad_(), f64({3, 1, -2}):requires_grad_()})
  local z = lt.ones(2, {requires_grad = true}) * 2
  z:add_(1)
  equal(z.grad_fn, "AddScalarBackward")
end)

test("a tensor saved for backward and modified in place afterwards makes backward fail", function()
  local a, b = f64({1, 2}):requires_grad_(), f64({3, 4}):requires_grad_()
  local function modified(fn)
    return fails("a tensor needed for backward was modified in place", fn)
  end
  -- the saved tensor itself
  local x = a * 1
  local z = (x * b):sum()
  x:add_(1)
  modified(function() z:backward() end)
  -- through index assignment, and through a view of a detached alias
  x = a * 1
  z = x:sin():sum()
  x[0] = 5
  modified(function() z:backward() end)
  x = a * 1
  z = x:sigmoid():sum()
  x:detach()[{{0, 1}}]:fill_(0)
  modified(function() z:backward() end)
  -- a saved output (softmax keeps y)
  local y = a:softmax()
  z = (y * b):sum()
  lt.no_grad(function() y:mul_(2) end)
  modified(function() z:backward() end)
  -- an in-place op that overwrites what it needs itself
  x = a * 2
  x:mul_(a)
  modified(function() x:sum():backward() end)
  x = a * 1
  x:log_()
  modified(function() x:sum():backward() end)
  -- a saved leaf freed by hand
  local c = f64({1, 2}):requires_grad_()
  z = (c * c):sum()
  c:free()
  fails("was freed", function() z:backward() end)
  -- modifying after backward is fine
  x = a * 1
  z = (x * b):sum()
  z:backward()
  x:add_(1)
end)

test("tostring shows requires_grad and grad_fn", function()
  local x = lt.ones(2, {requires_grad = true})
  assert(tostring(x):find("requires_grad=true", 1, true), tostring(x))
  assert(tostring(x * 2):find("grad_fn=<MulScalarBackward>", 1, true), tostring(x * 2))
  assert(not tostring(lt.ones(2)):find("grad", 1, true))
end)

test("random programs: shared values, broadcasting, reductions and views, against finite differences", function()
  local unary = {
    function(x) return x:tanh() end,
    function(x) return x:sigmoid() * 2 end,
    function(x) return x:sin() end,
    function(x) return (x * 0.5):exp() end,
    function(x) return x:t():contiguous():t() end,
    function(x) return x:sum(1, true) + x end,
    function(x) return x:mean(0, true) * x end,
    function(x) return x:softmax(1) end,
  }
  local binary = {
    function(x, y) return x + y end,
    function(x, y) return x - y * 0.5 end,
    function(x, y) return x * y end,
    function(x, y) return lt.maximum(x, y * 1.1) end,
    function(x, y) return x / (y * y + 1) end,
  }
  for program = 1, 12 do
    local steps = {}
    for s = 1, 6 do
      local use_binary = T.uniform() < 0.5
      steps[s] = {use_binary, use_binary and T.randint(1, #binary + 1) or T.randint(1, #unary + 1),
                  T.randint(1, 100), T.randint(1, 100)}
    end
    local function run(a, b, c)
      local values = {a, b, c}
      for _, st in ipairs(steps) do
        local x, y = values[(st[3] % #values) + 1], values[(st[4] % #values) + 1]
        values[#values + 1] = st[1] and binary[st[2]](x, y) or unary[st[2]](x)
      end
      return values[#values] + values[#values - 1] * 0.25 -- (3, 4) by broadcasting
    end
    T.gradcheck(run, {f64(T.random_list({3, 1})):requires_grad_(), f64(T.random_list({1, 4})):requires_grad_(),
                      f64(T.random_list({3, 4})):requires_grad_()}, {msg = "program " .. program})
  end
end)
