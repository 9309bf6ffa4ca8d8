-- np: 2 4
-- lutra.dist.zero stages 1, 2, 3: 10 AdamW steps of small gpt2 and llama models (f64) on
-- this rank's rows of the global batch against the same model trained in one process on
-- the whole batch (losses and gathered parameters within 1e-9 relative); in f32, step 1's
-- shard gradients against one process's rows (dp_equiv.lua); then the bytes each stage
-- keeps per rank.
local script = debug.getinfo(1, "S").source:sub(2)
local E = dofile((script:match("^(.*)/[^/]*$") or ".") .. "/dp_equiv.lua")
local lt = require "lutra"
local zero = require "lutra.dist.zero"
local spec = require "lutra.dist.spec"
local nn = require "lutra.nn"
local testing = require "lutra.testing"

local g, batches, ref = E.setup()

-- Gradients of batch b's rows on this rank, reduced (no optimizer step): what the trace tests watch.
local function backward_step(z, model, b)
  lt.tidy(function()
    z:zero_grad()
    E.local_loss(model, g, b):backward()
    z:finish()
  end)
end

-- The full parameters: gathered by stage 3, the model's own tensors otherwise.
local function full_params(z, model)
  if z.stage == 3 then return z:full_parameters() end
  return E.params_of(model)
end

local function train(arch, stage, micro, bucket_mb)
  local model = E.build(arch)
  local z = zero.new(model, g, {stage = stage, bucket_mb = bucket_mb or 0.01, optimizer = E.adamw})
  local losses = {}
  for s, b in ipairs(batches) do
    lt.tidy(function() losses[s] = E.zero_step(z, model, g, b, micro) end)
  end
  return losses, full_params(z, model), z, model
end

for _, stage in ipairs {1, 2, 3} do
  for _, arch in ipairs {"gpt2", "llama"} do
    test(string.format("zero %d %s: 10 steps match one process on the global batch", stage, arch), function()
      local losses, params = train(arch, stage, 1)
      E.check_losses(losses, ref[arch].losses, "zero " .. stage .. " " .. arch)
      E.check_params(params, ref[arch].params, "zero " .. stage .. " " .. arch)
    end)
  end
end

for _, stage in ipairs {1, 2, 3} do
  for _, arch in ipairs {"gpt2", "llama"} do
    test(string.format("zero %d %s f32: step 1's shard gradients equal one process's rows (f32 bound)", stage, arch),
      function()
        local b = batches[1]
        local want = E.reference_grads(arch, b)
        local model = E.build(arch, {dtype = "f32"})
        local z = zero.new(model, g, {stage = stage, bucket_mb = 0.01, optimizer = E.adamw})
        E.local_loss(model, g, b):backward()
        z:finish()
        local got = {}
        for _, e in ipairs(z.entries) do
          local gr = e.shard.grad
          if gr ~= nil then
            local s = spec.get(e.shard)
            got[e.name] = spec.set(gr:view(gr.shape), {global = s.global, offset = s.offset})
          end
        end
        E.check_grads(got, want, "zero " .. stage .. " " .. arch .. " f32")
        z:remove()
      end)
  end
end

for _, stage in ipairs {2, 3} do
  test(string.format("zero %d gpt2 with gradient accumulation (no_sync, 2 micro-batches) matches", stage), function()
    local losses, params = train("gpt2", stage, 2, 25)
    E.check_losses(losses, ref.gpt2.losses, "zero " .. stage .. " accum")
    E.check_params(params, ref.gpt2.params, "zero " .. stage .. " accum")
  end)
end

test("zero shards: dim-0 rows [i*ceil(R/n), ...), specs, global names, uneven last shard", function()
  lt.manual_seed(3)
  local Odd = nn.Module:extend("Odd")
  function Odd:init()
    self.a = nn.Linear(4, 7) -- 7 rows: uneven over 2 and 4 ranks (4 ranks: 2, 2, 2, 1)
    self.b = nn.Linear(7, 3) -- 3 rows: the 4th rank holds none
  end
  function Odd:forward(x) return self.b(self.a(x)):sum() end
  for _, stage in ipairs {1, 3} do
    lt.manual_seed(3)
    local m = Odd()
    local full = {}
    lt.no_grad(function()
      for name, p in m:named_parameters() do full[name] = p:clone() end
    end)
    local z = zero.new(m, g, {stage = stage, optimizer = E.adamw})
    local n, r = g.size, g.rank
    for _, e in ipairs(z.entries) do
      local R = full[e.name]:size(0)
      local per = math.ceil(R / n)
      local lo = math.min(r * per, R)
      local cnt = math.max(0, math.min((r + 1) * per, R) - r * per)
      testing.assert_equal(e.shard:size(0), cnt, e.name .. " rows")
      testing.assert_equal(e.shard.ndim, full[e.name].ndim, e.name .. " ndim")
      local s = spec.get(e.shard)
      testing.assert_equal(s.offset[1], lo, e.name .. " offset")
      testing.assert_equal(s.global[1], R, e.name .. " global rows")
      if cnt > 0 then testing.assert_close(e.shard, full[e.name]:narrow(0, lo, cnt), {rtol = 0, atol = 0}) end
    end
    -- one step, then the gathered parameters agree with a plain AdamW step on the full grads
    local x = lt.ones(2, 4)
    m(x):backward()
    z:finish()
    z.optimizer:step()
    z:after_step()
    local got = full_params(z, m)
    lt.manual_seed(3)
    local plain = Odd()
    local opt = E.adamw(plain)
    plain(x):backward()
    opt:step()
    for name, p in plain:named_parameters() do
      testing.assert_close(got[name], p, {rtol = 0, atol = 1e-6, msg = "stage " .. stage .. " " .. name})
    end
    z:remove()
    -- the model holds its full, current parameters again
    for name, p in m:named_parameters() do
      testing.assert_close(p, got[name], {rtol = 0, atol = 0, msg = "after remove: " .. name})
    end
  end
end)

test("zero 1, 2: a parameter unused on some ranks still reduces (zeros), ranks stay in step", function()
  for _, stage in ipairs {1, 2} do
    lt.manual_seed(7)
    local m = E.TwoLinear()
    local z = zero.new(m, g, {stage = stage, bucket_mb = 0.00005, optimizer = E.adamw})
    local x = lt.ones(2, 4)
    for _ = 1, 2 do
      z:zero_grad()
      m(x, g.rank == 0):backward()
      z:finish()
    end
    -- b's rows: rank 0's gradient over the group size, on the rank that owns them
    lt.manual_seed(7)
    local plain = E.TwoLinear()
    plain(x, true):backward()
    local want = plain.b.weight.grad * (1 / g.size)
    local e
    for _, x_ in ipairs(z.entries) do
      if x_.name == "b.weight" then e = x_ end
    end
    local lo, cnt = e.geo.start(g.rank), e.geo.count(g.rank)
    if cnt > 0 then
      testing.assert_close(e.shard.grad, want:narrow(0, lo, cnt), {rtol = 1e-6, atol = 1e-7, msg = "stage " .. stage})
    end
    z:remove()
  end
end)

test("zero 3: parameters are released between modules, gathered in backward", function()
  local model = E.build("gpt2")
  local z = zero.new(model, g, {stage = 3, optimizer = E.adamw, trace = true})
  local C = require("lutra.ffi").C
  local function resident()
    local k = 0
    for _, e in ipairs(z.entries) do
      if C.lt_storage_is_resident(e.p) ~= 0 then k = k + 1 end
    end
    return k
  end
  testing.assert_equal(resident(), 0, "at rest")
  -- at rest the model holds the shards: global names, specs
  local k = 0
  for name, p in model:named_parameters() do
    k = k + 1
    testing.assert_equal(name, z.entries[k].name)
    assert(rawequal(p, z.entries[k].shard), name .. " is its shard at rest")
    testing.assert_equal(spec.get(p).global[1], z.entries[k].p:size(0))
  end
  testing.assert_equal(k, #z.entries)
  local seen, full_inside = 0, false
  local orig = model.blocks[2].attn.forward
  rawset(model.blocks[2].attn, "forward", function(m, ...)
    seen = resident() -- inside block 2: its params (and the tied embedding) only
    full_inside = rawequal(m.qkv.weight, z.entries[1].p) == false and m.qkv.weight:size(0) == 3 * 32
    return orig(m, ...)
  end)
  local b = batches[1]
  lt.tidy(function()
    local loss = E.local_loss(model, g, b)
    testing.assert_equal(resident(), 1, "after forward: the tied embedding (root)")
    loss:backward()
    z:finish()
    testing.assert_equal(resident(), 0, "after finish")
  end)
  local block_params = #model.blocks[2]:parameters()
  testing.assert_equal(seen, block_params + 1, "inside a block")
  assert(full_inside, "inside its forward a block holds its full parameters")
  local regathered = 0
  for _, ev in ipairs(z.trace) do
    if ev:match("^regather") then regathered = regathered + 1 end
  end
  assert(regathered >= 2 + 1,
    "expected the blocks and the head gathered again in backward: " .. table.concat(z.trace, ", "))
  local m = z:memory()
  testing.assert_equal(m.params, z:memory().params)
end)

-- Bytes per rank at each stage, measured after finish() of a second step (the optimizer
-- state exists). Expected: stage 1 cuts optimizer state to 1/n, stage 2 grads too, stage
-- 3 params too (rows divide evenly here: exact).
for _, stage in ipairs {2, 3} do
  test(string.format("zero %d overlap: reduce-scatters are launched while backward still runs", stage), function()
    local model = E.build("gpt2")
    local z = zero.new(model, g, {stage = stage, bucket_mb = 0.01, optimizer = E.adamw, trace = true})
    local b = batches[1]
    for _ = 1, 2 do
      z.trace = {}
      backward_step(z, model, b)
    end
    local first_launch, last_grad = nil, nil
    for i, ev in ipairs(z.trace) do
      if ev:match("^launch") then first_launch = first_launch or i end
      if ev:match("^grad") then last_grad = i end
    end
    assert(first_launch and first_launch < last_grad, "no launch before the last gradient: " .. table.concat(z.trace, ", "))
  end)
end

test("zero 3: the next unit's all-gather is launched before it runs (prefetch), in both directions", function()
  local model = E.build("gpt2")
  local z = zero.new(model, g, {stage = 3, optimizer = E.adamw, trace = true})
  local b = batches[1]
  backward_step(z, model, b) -- the first forward learns the order
  z.trace = {}
  backward_step(z, model, b)
  local at = {}
  for i, ev in ipairs(z.trace) do
    if at[ev] == nil then at[ev] = i end
  end
  local tr = table.concat(z.trace, ", ")
  -- forward: block 1's gather goes out while block 0 runs
  assert(at["prefetch blocks.1"] and at["prefetch blocks.1"] < at["forward blocks.1"], "forward prefetch: " .. tr)
  assert(at["forward blocks.0"] < at["prefetch blocks.1"], "forward prefetch from block 0: " .. tr)
  -- backward: block 0's gather goes out when block 1's backward begins
  local last_regather1 = at["regather blocks.1"]
  assert(last_regather1, "block 1 gathered again in backward: " .. tr)
  local pf = nil
  for i = last_regather1, #z.trace do
    if z.trace[i] == "prefetch blocks.0" then pf = i; break end
  end
  assert(pf and pf < (function()
    for i = last_regather1, #z.trace do if z.trace[i] == "regather blocks.0" then return i end end
  end)(), "backward prefetch: " .. tr)
  -- one all-gather a unit in forward and one in backward, nothing more
  local gathers = 0
  for _, ev in ipairs(z.trace) do
    if ev == "gather blocks.0" then gathers = gathers + 1 end
  end
  testing.assert_equal(gathers, 2, "all-gathers of block 0 in a step: " .. tr)
end)

test("zero memory: the 1/n cuts per stage", function()
  local rows, full = {}, nil
  for stage = 0, 3 do
    local model = E.build("gpt2", {d_model = 64})
    local z = zero.new(model, g, {stage = stage, optimizer = E.adamw})
    local b = batches[1]
    local m
    for step = 1, 2 do
      lt.tidy(function()
        z.optimizer:zero_grad()
        model:zero_grad()
        local _, loss = model(E.local_rows(b.x, g), E.local_rows(b.y, g))
        loss:backward()
        z:finish()
        if step == 2 then m = z:memory() end
        z.optimizer:step()
        z:after_step()
      end)
    end
    rows[stage] = m
    z:remove()
  end
  full = rows[0]
  local n = g.size
  local function near(got, want, what)
    assert(math.abs(got - want) <= 0.01 * want, string.format("%s: %d bytes, expected about %d", what, got, want))
  end
  near(full.grads, full.params, "stage 0 grads")
  near(full.optimizer, 2 * full.params, "stage 0 optimizer (AdamW: two moments)")
  near(rows[1].params, full.params, "stage 1 params")
  near(rows[1].grads, full.grads, "stage 1 grads")
  near(rows[1].optimizer, full.optimizer / n, "stage 1 optimizer")
  near(rows[2].params, full.params, "stage 2 params")
  near(rows[2].grads, full.grads / n, "stage 2 grads")
  near(rows[2].optimizer, full.optimizer / n, "stage 2 optimizer")
  near(rows[3].params, full.params / n, "stage 3 params")
  near(rows[3].grads, full.grads / n, "stage 3 grads")
  near(rows[3].optimizer, full.optimizer / n, "stage 3 optimizer")
  if g.rank == 0 then
    print(string.format("  zero memory per rank, dp=%d (gpt2 2 layers, d_model 64; bytes)", n))
    print(string.format("  %-6s %10s %10s %10s", "stage", "params", "grads", "optimizer"))
    for stage = 0, 3 do
      local r = rows[stage]
      print(string.format("  %-6d %10d %10d %10d", stage, r.params, r.grads, r.optimizer))
    end
  end
end)

test("zero.new: bad arguments", function()
  local lin = nn.Linear(2, 2)
  testing.assert_error("expected a group", function() zero.new(lin, nil, {optimizer = E.adamw}) end)
  testing.assert_error("stage must be", function() zero.new(lin, g, {stage = 4, optimizer = E.adamw}) end)
  testing.assert_error("optimizer must be", function() zero.new(lin, g, {stage = 1}) end)
  testing.assert_error("bucket_mb", function() zero.new(lin, g, {stage = 2, bucket_mb = -1, optimizer = E.adamw}) end)
end)
