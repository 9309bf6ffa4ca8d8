-- np: 2 4
-- lutra.dist.ddp: bucketed, overlapped gradient all-reduce. Each case trains a small zoo
-- model 10 AdamW steps (f64) on this rank's rows of the global batch and compares with the
-- same model trained in one process on the whole batch, to 1e-9 relative; in f32, step 1's
-- averaged gradients against one process's (dp_equiv.lua).
local script = debug.getinfo(1, "S").source:sub(2)
local E = dofile((script:match("^(.*)/[^/]*$") or ".") .. "/dp_equiv.lua")
local lt = require "lutra"
local ddp = require "lutra.dist.ddp"
local optim = require "lutra.optim"
local nn = require "lutra.nn"
local testing = require "lutra.testing"

local g, batches, ref = E.setup()

-- Trains with ddp; micro = 2: two micro-batches a step, the first under no_sync.
local function train(arch, micro, bucket_mb)
  local model = E.build(arch)
  local d = ddp.new(model:named_parameters(), g, {bucket_mb = bucket_mb or 25})
  local opt = E.adamw(model)
  local losses = {}
  for s, b in ipairs(batches) do
    lt.tidy(function()
      opt:zero_grad()
      local loss = E.accumulate(model, d, g, b, micro)
      d:finish()
      optim.clip_grad_norm(model, E.CLIP)
      opt:step()
      losses[s] = E.mean(g, loss)
    end)
  end
  d:remove()
  return losses, E.params_of(model)
end

for _, arch in ipairs {"gpt2", "llama"} do
  test("ddp " .. arch .. ": 10 steps match one process on the global batch", function()
    local losses, params = train(arch, 1, 0.01)
    E.check_losses(losses, ref[arch].losses, "ddp " .. arch)
    E.check_params(params, ref[arch].params, "ddp " .. arch)
  end)
end

for _, arch in ipairs {"gpt2", "llama"} do
  test("ddp " .. arch .. " f32: step 1's averaged gradients equal one process's (f32 bound)", function()
    local b = batches[1]
    local want = E.reference_grads(arch, b)
    local model = E.build(arch, {dtype = "f32"})
    local d = ddp.new(model:named_parameters(), g, {bucket_mb = 0.01})
    E.local_loss(model, g, b):backward()
    d:finish()
    local got = {}
    for name, p in model:named_parameters() do got[name] = p.grad end
    E.check_grads(got, want, "ddp " .. arch .. " f32")
    d:remove()
  end)
end

test("ddp gpt2 with gradient accumulation (no_sync, 2 micro-batches) matches", function()
  local losses, params = train("gpt2", 2, 25)
  E.check_losses(losses, ref.gpt2.losses, "ddp accum")
  E.check_params(params, ref.gpt2.params, "ddp accum")
end)

test("ddp buckets: reverse order, several with a small bucket_mb, one with a big one", function()
  local model = E.build("gpt2")
  local d = ddp.new(model:named_parameters(), g, {bucket_mb = 0.01})
  local names = {}
  for name in model:named_parameters() do names[#names + 1] = name end
  assert(#d.buckets > 3, "expected several buckets, got " .. #d.buckets)
  testing.assert_equal(d.buckets[1].names[1], names[#names])
  local last = d.buckets[#d.buckets]
  testing.assert_equal(last.names[#last.names], names[1])
  d:remove()
  local one = ddp.new(model:named_parameters(), g, {bucket_mb = 100})
  testing.assert_equal(#one.buckets, 1)
  one:remove()
end)

test("ddp overlap: buckets are launched while backward still runs", function()
  local model = E.build("gpt2")
  local d = ddp.new(model:named_parameters(), g, {bucket_mb = 0.01, trace = true})
  local b = batches[1]
  lt.tidy(function()
    E.local_loss(model, g, b):backward()
    -- backward is over: some buckets must already be in flight
    local launched, grads, first_launch, last_grad = 0, 0, nil, nil
    for i, ev in ipairs(d.trace) do
      if ev:match("^launch") then
        launched = launched + 1
        first_launch = first_launch or i
      elseif ev:match("^grad") then
        grads = grads + 1
        last_grad = i
      end
    end
    assert(launched >= 2,
      "expected buckets launched during backward, got " .. launched .. ": " .. table.concat(d.trace, ", "))
    assert(first_launch < last_grad, "the first launch came after the last gradient: " .. table.concat(d.trace, ", "))
    -- wte.weight (tied, first registered) is the last gradient; its bucket launched after it
    testing.assert_equal(d.trace[last_grad], "grad wte.weight")
    d:finish()
  end)
  d:remove()
end)

test("ddp: replicas start equal (broadcast from rank 0)", function()
  lt.manual_seed(100 + g.rank) -- different weights on every rank
  local lin = nn.Linear(8, 4)
  local d = ddp.new(lin:named_parameters(), g)
  local w = lin.weight:clone()
  g:broadcast(w, 0)
  testing.assert_close(lin.weight, w, {rtol = 0, atol = 0})
  d:remove()
end)

test("ddp: a parameter unused on some ranks still reduces (zeros), ranks stay in step", function()
  lt.manual_seed(7)
  local m = E.TwoLinear()
  local d = ddp.new(m:named_parameters(), g, {bucket_mb = 0.0001})
  local x = lt.ones(2, 4)
  for _ = 1, 2 do
    m:zero_grad()
    m(x, g.rank == 0):backward()
    d:finish()
  end
  -- b's grad: rank 0's over the group size; a's: the same everywhere (average)
  local gb = m.b.weight.grad:clone()
  local full = gb * g.size
  g:broadcast(gb, 0)
  testing.assert_close(m.b.weight.grad, gb, {rtol = 0, atol = 0})
  assert(full:abs():sum():item() > 0)
  d:remove()
end)

test("ddp.new: bad arguments", function()
  local lin = nn.Linear(2, 2)
  testing.assert_error("expected a group", function() ddp.new(lin:named_parameters(), nil) end)
  testing.assert_error("bucket_mb", function() ddp.new(lin:named_parameters(), g, {bucket_mb = 0}) end)
  lin:freeze()
  testing.assert_error("no parameter requires grad", function() ddp.new(lin:named_parameters(), g) end)
end)
