-- Autograd and memory: saved tensors are released as backward uses them (memory after backward
-- is the pre-forward level plus the gradients, with no GC), intermediate gradients are freed
-- as they are consumed (a long chain's backward peaks at two gradients), a dropped graph
-- goes back to the GC, tidy() around a step returns everything but the gradients; and
-- activation checkpointing: the same gradients as without it (dropout masks replayed from
-- the saved generator state), twice the forward calls, less memory held between forward and
-- backward, several outputs, non-tensor arguments.
local lt = require "lutra"
local T = require "lutra.testing"
local close, equal, fails = T.assert_close, T.assert_equal, T.assert_error

local MiB = 1024 * 1024
local function allocated() return lt.memory_stats().allocated end
local function full_gc() -- a dropped graph needs two cycles: tensors, then the nodes' aliases
  collectgarbage()
  collectgarbage()
end

test("after backward, memory is the pre-forward level plus the gradients (no GC needed)", function()
  full_gc()
  local x = lt.randn(MiB / 4, {requires_grad = true}) -- 1 MiB
  local base = allocated()
  local loss
  do -- intermediates only the graph holds once the GC has run
    local y = x:exp()
    local z = y:tanh()
    loss = (z * y):sum()
  end
  full_gc()
  assert(allocated() - base >= 2 * MiB, "the graph should hold y and z")
  loss:backward()
  local grads = x.grad:numel() * 4
  assert(allocated() - base <= grads + 64, string.format("left %d bytes, grads %d", allocated() - base, grads))
  close(x.grad, ((1 - x:exp():tanh():square()) * x:exp():square() + x:exp():tanh() * x:exp()):detach(),
    {rtol = 1e-5, atol = 1e-6})
end)

test("a long chain's backward frees each gradient once used: the peak stays at two", function()
  local x = lt.randn(MiB / 4, {requires_grad = true})
  local y = x
  for _ = 1, 30 do y = y * 1.01 + 0.5 end -- nothing saved
  local loss = y:sum()
  y = nil
  local before = allocated()
  lt.reset_peak_memory_stats()
  loss:backward()
  local peak = lt.memory_stats().peak - before
  assert(peak <= 2 * MiB + 4096, string.format("backward peaked at %.1f MiB over the forward", peak / MiB))
  assert(allocated() - before <= MiB + 64, "only x.grad stays")
  close(x.grad:mean():item(), 1.01 ^ 30, {rtol = 1e-5})
end)

test("a dropped graph goes back to the GC", function()
  local x = lt.randn(MiB / 4, {requires_grad = true})
  full_gc()
  local base = allocated()
  do
    local y = x:exp():tanh():sin()
    local s = (y * y):sum()
  end
  full_gc()
  equal(allocated(), base)
end)

test("tidy around a training step: everything but the gradients comes back, without a GC", function()
  local w = lt.randn(256, 256, {requires_grad = true})
  local b = lt.zeros(256, {requires_grad = true})
  local x = lt.randn(64, 256)
  full_gc()
  local base = allocated()
  for step = 1, 3 do
    local loss = lt.tidy(function()
      local h = lt.F.linear(x, w, b):relu()
      local l = (h * h):mean()
      l:backward()
      return l:item()
    end)
    assert(type(loss) == "number")
    equal(allocated() - base, (256 * 256 + 256) * 4, "step " .. step) -- w.grad and b.grad only
  end
end)

test("saved tensors are dropped after backward; aliases autograd made are freed", function()
  local x = lt.randn(8, {dtype = "f64", requires_grad = true})
  local y = x * 2
  local z = y:sin() -- saves an alias of y (y is the result of an op)
  local S = require "lutra.autograd.state"
  local node = S.record(z)
  local alias = node.x
  assert(alias ~= nil and alias ~= y, "a non-leaf input is saved through an alias")
  z:sum():backward()
  equal(node.x, nil)
  equal(alias:is_freed(), true)
  equal(y:is_freed(), false)
  local n2 = S.record(x * x)
  assert(n2.a == x, "a leaf is saved as it is")
end)

-- ---- checkpoint ---------------------------------------------------------------------------------

local function make_block(counter)
  local w1 = lt.randn(8, 6, {dtype = "f64", requires_grad = true})
  local w2 = lt.randn(6, 8, {dtype = "f64", requires_grad = true})
  local function block(x, scale)
    counter.calls = counter.calls + 1
    local h = lt.F.linear(x, w1):gelu()
    local mask = lt.rand_like(h):gt(0.3):double() -- a dropout mask from the default generator
    h = h * mask / 0.7
    return lt.F.linear(h, w2) * scale + x, h:sum()
  end
  return block, {w1, w2}
end

test("checkpoint: the same gradients (dropout replayed), twice the forward calls", function()
  local counter = {calls = 0}
  local block, params = make_block(counter)
  local x0 = lt.randn(4, 6, {dtype = "f64"})
  local function run(use_checkpoint)
    local x = x0:clone():requires_grad_()
    lt.zero_grad(params)
    lt.manual_seed(7)
    counter.calls = 0
    local y, aux
    if use_checkpoint then y, aux = lt.checkpoint(block, x, 0.5) else y, aux = block(x, 0.5) end
    equal(y.requires_grad, true)
    local loss = (y * y):sum() + aux
    loss:backward()
    return {x.grad:tolist(), params[1].grad:tolist(), params[2].grad:tolist(), loss:item(), counter.calls}
  end
  local plain, ckpt = run(false), run(true)
  equal(plain[5], 1)
  equal(ckpt[5], 2)
  for i = 1, 4 do close(ckpt[i], plain[i], {rtol = 1e-12, atol = 1e-12, msg = "result " .. i}) end
  -- the generator continues from where the forward left it, as without checkpointing
  lt.manual_seed(3)
  local y = lt.checkpoint(block, x0:clone():requires_grad_(), 1)
  local after_forward = lt.rand(1):item()
  lt.manual_seed(3)
  block(x0, 1)
  equal(lt.rand(1):item(), after_forward)
  y:sum():backward()
end)

test("checkpoint: gradient checks, nested checkpoints, no_grad, non-tensor arguments", function()
  local w = lt.randn(5, 5, {dtype = "f64", requires_grad = true})
  local function f(x, opts) return (x:matmul(w) * opts.k):tanh() end
  T.gradcheck(function(x) return lt.checkpoint(f, x, {k = 0.5}) end, {lt.randn(3, 5, {dtype = "f64"}):requires_grad_()})
  T.gradcheck(function(x)
    return lt.checkpoint(function(a) return lt.checkpoint(f, a:sin(), {k = 2}) * a end, x)
  end, {lt.randn(2, 5, {dtype = "f64"}):requires_grad_()})
  local y = lt.no_grad(lt.checkpoint, f, lt.ones(2, 5, "f64"), {k = 1})
  equal(y.requires_grad, false)
  -- an input that does not require grad: the parameters still get gradients
  w.grad = nil
  lt.checkpoint(f, lt.ones(2, 5, "f64"), {k = 1}):sum():backward()
  assert(w.grad ~= nil, "w got no gradient")
  fails("expected a function", function() lt.checkpoint(3) end)
end)

test("checkpoint keeps less memory between forward and backward", function()
  local w = lt.randn(512, 512, {requires_grad = true})
  local function block(x) return lt.F.linear(lt.F.linear(x, w):gelu():tanh(), w):sin() end
  local x = lt.randn(256, 512, {requires_grad = true})
  local function held(use_checkpoint)
    full_gc()
    local base = allocated()
    local y = use_checkpoint and lt.checkpoint(block, x) or block(x)
    local loss = y:sum()
    full_gc()
    local kept = allocated() - base
    loss:backward()
    x.grad, w.grad = nil, nil
    return kept
  end
  local plain, ckpt = held(false), held(true)
  -- without: 4 activations of 512 KiB kept (gelu in, tanh in, linear in, sin in); with: y only
  assert(ckpt < plain / 2, string.format("checkpoint held %d bytes, plain %d", ckpt, plain))
  assert(ckpt <= 256 * 512 * 4 + 4096, "checkpoint held more than its output: " .. ckpt)
end)

test("checkpoint: a saved argument modified in place, a second backward", function()
  local x = lt.randn(3, {dtype = "f64", requires_grad = true})
  local a = x * 1
  local y = lt.checkpoint(function(t) return t:exp() end, a)
  a:add_(1)
  fails("modified in place", function() y:sum():backward() end)
  local z = lt.checkpoint(function(t) return t:exp() end, x * 1)
  z:sum():backward()
  fails("backward through the graph a second time", function() z:sum():backward() end)
end)
