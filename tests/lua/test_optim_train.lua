-- lutra.optim with autograd: small problems trained with backward(), gradient
-- accumulation, clipping of .grad, zero_grad, and the optimizer inside lutra.tidy.
local lt = require "lutra"
local optim = require "lutra.optim"
local T = require "lutra.testing"
local close, equal = T.assert_close, T.assert_equal

-- A fixed linear regression: y = X w* + b* (+ a little noise), X (64, 5), in f64.
local function regression()
  local X = lt.randn(64, 5, {dtype = "f64"})
  local w_true = lt.tensor({{1.5}, {-2}, {0.5}, {3}, {-1}}, {dtype = "f64"})
  local y = X:matmul(w_true) + 0.7 + lt.randn(64, 1, {dtype = "f64"}) * 0.01
  return X, y
end

local function mse(X, y, w, b) return ((X:matmul(w) + b - y) ^ 2):mean() end

local function train(name, opts, steps)
  local X, y = regression()
  local w = lt.zeros(5, 1, {dtype = "f64", requires_grad = true})
  local b = lt.zeros(1, {dtype = "f64", requires_grad = true})
  local opt = optim.create(name, {{params = {w}}, {params = {b}, weight_decay = 0}}, opts)
  local first, last
  for _ = 1, steps do
    opt:zero_grad()
    local loss = mse(X, y, w, b)
    loss:backward()
    opt:step()
    last = loss:item()
    first = first or last
  end
  equal(w.requires_grad, true)
  equal(w.is_leaf, true)
  return first, last, w, b, opt
end

test("a linear regression trained with backward: AdamW, SGD with Nesterov, Lion", function()
  local sched = optim.schedule.cosine{lr = 0.1, min_lr = 0.01, warmup = 10, total = 300}
  local first, last, w, b = train("adamw", {schedule = sched, weight_decay = 0}, 300)
  assert(last < 1e-3 * first, string.format("AdamW: loss %g -> %g", first, last))
  close(w:view(-1), {1.5, -2, 0.5, 3, -1}, {atol = 0.02, rtol = 0})
  close(b, {0.7}, {atol = 0.02, rtol = 0})
  first, last = train("sgd", {lr = 0.05, momentum = 0.9, nesterov = true}, 150)
  assert(last < 1e-3 * first, string.format("SGD: loss %g -> %g", first, last))
  first, last = train("lion", {schedule = optim.schedule.linear{lr = 0.05, warmup = 5, total = 300}}, 300)
  assert(last < 1e-2 * first, string.format("Lion: loss %g -> %g", first, last))
end)

test("the optimizer reads .grad, skips parameters without one; zero_grad drops or zeroes", function()
  local p, q = lt.ones(3, {requires_grad = true}), lt.ones(2, {requires_grad = true})
  local opt = optim.SGD({p, q}, {lr = 0.5})
  ;(p * 2):sum():backward()
  opt:step()
  close(p, {0, 0, 0})
  close(q, {1, 1})
  equal(opt.state[2], nil)
  opt:zero_grad(false)
  close(p.grad, {0, 0, 0})
  opt:zero_grad()
  equal(p.grad, nil)
  opt:step() -- no gradients at all: nothing moves, the step still counts
  close(p, {0, 0, 0})
  equal(opt.steps, 2)
end)

test("gradient accumulation: k micro-batches give the full batch's gradients and step", function()
  local X, y = regression()
  local function model()
    local w = lt.randn(5, 1, {dtype = "f64"}):requires_grad_()
    local b = lt.zeros(1, {dtype = "f64"}):requires_grad_()
    return w, b
  end
  local w1, b1 = model()
  local w2, b2 = w1:detach():clone():requires_grad_(), b1:detach():clone():requires_grad_()
  local o1 = optim.AdamW({w1, b1}, {lr = 0.01})
  local o2 = optim.AdamW({w2, b2}, {lr = 0.01})
  for _ = 1, 3 do
    o1:zero_grad()
    local full = mse(X, y, w1, b1)
    full:backward()
    o2:zero_grad()
    local k = 4
    local mean = optim.accumulate(k, function(i)
      local rows = {(i - 1) * 16, i * 16}
      return mse(X[{rows}], y[{rows}], w2, b2)
    end)
    close(mean, full:item(), {rtol = 1e-12})
    close(w2.grad, w1.grad, {rtol = 1e-12, atol = 1e-15})
    close(b2.grad, b1.grad, {rtol = 1e-12, atol = 1e-15})
    o1:step()
    o2:step()
  end
  close(w2, w1, {rtol = 1e-12})
  equal(optim.scale_loss(lt.tensor(6), 3):item(), 2)
end)

test("clip_grad_norm on .grad: parameters, a module, an optimizer; missing grads", function()
  local a = lt.tensor({3, 0}, {requires_grad = true})
  local b = lt.tensor({0, 4}, {requires_grad = true})
  local c = lt.ones(2, {requires_grad = true}) -- never gets a gradient
  ;(a * a / 2 + b * b / 2):sum():backward() -- grads: a and b themselves
  equal(optim.grad_norm({a, b, c}), 5)
  local norm = optim.clip_grad_norm({a, b, c}, 1)
  equal(norm, 5)
  close(a.grad, {3 / (5 + 1e-6), 0}, {rtol = 1e-6})
  close(b.grad, {0, 4 / (5 + 1e-6)}, {rtol = 1e-6})
  equal(c.grad, nil)
  local model = {parameters = function() return {a, b} end}
  close(optim.clip_grad_norm(model, 10), 1, {rtol = 1e-6}) -- under: unchanged
  close(a.grad, {3 / (5 + 1e-6), 0}, {rtol = 1e-6})
  local opt = optim.SGD({a, b, c}, {lr = 1})
  close(optim.clip_grad_norm(opt, 0.5), 1, {rtol = 1e-6})
  close(b.grad, {0, 0.4}, {rtol = 1e-5})
end)

test("a small gpt2 trains with AdamW from its named parameters (default decay groups)", function()
  local models = require "lutra.models"
  local model = models.build{arch = "gpt2", n_layer = 1, n_head = 2, d_model = 16, vocab_size = 11, block_size = 8}
  local opt = optim.AdamW(model, {lr = 3e-3, weight_decay = 0.1})
  equal(opt.keys[1], "blocks.0.attn.qkv.weight")
  equal(opt.param_groups[2].weight_decay, 0)
  local idx = lt.randint(0, 11, {2, 8}, {dtype = "i64"})
  local tgt = lt.randint(0, 11, {2, 8}, {dtype = "i64"})
  local first, last
  for _ = 1, 25 do
    opt:zero_grad()
    local _, loss = model(idx, tgt)
    loss:backward()
    optim.clip_grad_norm(model, 1.0)
    opt:step()
    last = loss:item()
    first = first or last
  end
  assert(last < 0.7 * first, string.format("loss %g -> %g", first, last))
  equal(opt.state["wte.weight"].step, 25)
  local sd = opt:state_dict()
  equal(sd.param_groups[2].keys[1], "wte.weight")
end)

test("a step inside lutra.tidy: the state outlives the scope, memory stays flat", function()
  local p = lt.randn(64, 64, {requires_grad = true})
  local opts = {sgd = {lr = 0.1, momentum = 0.9, weight_decay = 0.01}, lion = {lr = 0.01, weight_decay = 0.1},
                adamw = {lr = 0.01}}
  for _, name in ipairs {"adamw", "sgd", "lion"} do
    local opt = optim.create(name, {p}, opts[name])
    local function one()
      lt.tidy(function()
        opt:zero_grad()
        ;(p * p):sum():backward()
        opt:step()
        opt:zero_grad()
      end)
    end
    one()
    lt.collectgarbage() -- gradients dropped by zero_grad wait for the GC (autograd keeps them out of tidy)
    local before = lt.memory_stats().allocated
    for _ = 1, 3 do one() end
    lt.collectgarbage()
    local after = lt.memory_stats().allocated
    assert(after <= before, string.format("%s: %d bytes held after 3 more steps, %d before", name, after, before))
    for k, v in pairs(opt.state[1]) do
      if lt.is_tensor(v) then equal(v:sum():item() == v:sum():item(), true, name .. " state " .. k .. " alive") end
    end
  end
end)
