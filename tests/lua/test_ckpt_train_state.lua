-- lutra.ckpt.train_state: exact resume through the sharded checkpoint. A small gpt2 trained
-- 2N AdamW steps straight, against N steps + save (sync and async) + a fresh model and
-- optimizer (other init) restored + N steps: the losses of the last N steps and every
-- parameter and moment are bitwise the same. Optimizer numbers (steps, per-parameter step),
-- the names used, and errors (another optimizer kind, a missing parameter).
local lt = require "lutra"
local optim = require "lutra.optim"
local ckpt = require "lutra.ckpt"
local json = require "lutra.json"
local ts = require "lutra.ckpt.train_state"
local T = require "lutra.testing"
local ffi = require("lutra.ffi").ffi
local equal, fails = T.assert_equal, T.assert_error

local base = os.tmpname()
os.remove(base)

local V, S, B, N = 64, 16, 4, 4
local function build(seed)
  lt.manual_seed(seed)
  local model = lt.models.build {arch = "gpt2", n_layer = 1, n_head = 2, d_model = 32, vocab_size = V, block_size = S,
                                 dropout = 0}
  return model, optim.AdamW(model, {lr = 1e-2, weight_decay = 0.1})
end

lt.manual_seed(99)
local batches = {}
for i = 1, 2 * N do batches[i] = {lt.randint(0, V, {B, S}), lt.randint(0, V, {B, S})} end

local function step(model, opt, i)
  opt:zero_grad(true)
  local loss = lt.tidy(function()
    local _, l = model(batches[i][1], batches[i][2])
    l:backward()
    return l:item()
  end)
  ckpt.fence() -- an async save copies the weights in its thread: before they change (as lt.train)
  opt:step()
  return loss
end

local function named(model)
  local list = {}
  for name, p in model:named_parameters() do list[#list + 1] = {name = name, tensor = p} end
  return list
end

local function bytes_of(t)
  local c = t:contiguous()
  return ffi.string(ffi.cast("const char *", c:data_ptr()), c:numel() * c:element_size())
end

local function straight()
  local model, opt = build(1)
  local losses = {}
  for i = 1, 2 * N do losses[i] = step(model, opt, i) end
  return losses, model, opt
end
local ref_losses, ref_model, ref_opt = straight()

for _, async in ipairs {false, true} do
  test("exact resume (" .. (async and "async" or "sync") .. " save)", function()
    local root = base .. (async and "/async" or "/sync")
    local model, opt = build(1)
    for i = 1, N do equal(step(model, opt, i), ref_losses[i]) end
    local tensors, oextra = ts.collect(named(model), opt)
    ckpt.save(root .. "/step_000004", {step = N, tensors = tensors, extra = {optim = oextra, rng = lt.get_rng_state()}},
      {async = async})
    for i = N + 1, N + 2 do step(model, opt, i) end -- training goes on, then "crashes"
    ckpt.wait()
    local model2, opt2 = build(7) -- other weights, empty optimizer state
    local r = ckpt.load(ckpt.latest(root))
    ts.restore(r, named(model2), opt2)
    lt.set_rng_state(r:extra(0).rng)
    equal(opt2.steps, N)
    for i = N + 1, 2 * N do equal(step(model2, opt2, i), ref_losses[i], "loss " .. i) end
    local ref = {}
    for name, p in ref_model:named_parameters() do ref[name] = p end
    for name, p in model2:named_parameters() do
      if bytes_of(p) ~= bytes_of(ref[name]) then error("parameter " .. name .. " differs") end
      local a, b = opt2.state[name], ref_opt.state[name]
      equal(a.step, b.step)
      if bytes_of(a.exp_avg) ~= bytes_of(b.exp_avg) or bytes_of(a.exp_avg_sq) ~= bytes_of(b.exp_avg_sq) then
        error("moments of " .. name .. " differ")
      end
    end
  end)
end

test("names in the checkpoint, numbers in extra, errors", function()
  local model, opt = build(1)
  step(model, opt, 1)
  local tensors, oextra = ts.collect(named(model), opt)
  local names = {}
  for _, e in ipairs(tensors) do names[e.name] = true end
  assert(names["wte.weight"] and names["optim.wte.weight.exp_avg"] and names["optim.wte.weight.exp_avg_sq"])
  equal(oextra.kind, "adamw")
  equal(oextra.steps, 1)
  equal(oextra.numbers["wte.weight"].step, 1)
  local root = base .. "/names"
  ckpt.save(root .. "/step_000001", {step = 1, tensors = tensors, extra = {optim = oextra}})
  local r = ckpt.load(root .. "/step_000001")
  local m2 = build(3)
  local sgd = optim.SGD(m2, {lr = 0.1})
  fails("the checkpoint's optimizer is 'adamw', this one is 'sgd'", function() ts.restore(r, named(m2), sgd) end)
  local extra_param = named(m2)
  extra_param[#extra_param + 1] = {name = "new.weight", tensor = lt.zeros(3)}
  fails("has no tensor 'new.weight'", function() ts.restore(r, extra_param) end)
  local ms = ts.model_state(r)
  equal(ms["optim.wte.weight.exp_avg"], nil)
  for name, p in model:named_parameters() do
    if bytes_of(ms[name]) ~= bytes_of(p) then error("model_state " .. name) end
  end
  -- parameters only (no optimizer), from a {name = tensor} map
  local m3 = build(5)
  local map = {}
  for name, p in m3:named_parameters() do map[name] = p end
  ts.restore(r, map)
  for name, p in model:named_parameters() do
    if bytes_of(p) ~= bytes_of(map[name]) then error(name .. " not restored") end
  end
end)

test("check: another model (layers, shapes, dtypes, unexpected tensors), optimizer state, NaN; nothing loaded", function()
  local model, opt = build(1)
  step(model, opt, 1)
  local tensors, oextra = ts.collect(named(model), opt)
  local root = base .. "/check"
  ckpt.save(root .. "/step_000001", {step = 1, tensors = tensors, extra = {optim = oextra}})
  local r = ckpt.load(root .. "/step_000001")
  local dir = r.dir
  -- a model of two layers: one line for the layer that only the model has
  lt.manual_seed(2)
  local two = lt.models.build {arch = "gpt2", n_layer = 2, n_head = 2, d_model = 32, vocab_size = V, block_size = S,
                               dropout = 0}
  local before = bytes_of(two.wte.weight)
  local err = fails(dir .. "/manifest.json does not match this model:", function() ts.restore(r, named(two)) end)
  assert(err:find("the checkpoint holds 1 layer (blocks.*), the model 2: 12 tensors of blocks.1 are missing from it",
    1, true), err)
  assert(not err:find("blocks.1.ln_1.weight", 1, true), "the layer's tensors are summed up: " .. err)
  equal(bytes_of(two.wte.weight), before, "nothing loaded")
  -- a model that lacks some of the checkpoint's tensors (the list of all names says so)
  local subset = {}
  for _, e in ipairs(named(build(3))) do if e.name ~= "ln_f.bias" then subset[#subset + 1] = e end end
  err = fails("unexpected tensor 'ln_f.bias' (the checkpoint has it, the model does not)",
    function() ts.restore(r, subset) end)
  -- another dtype, another shape
  local m64 = lt.models.build {arch = "gpt2", n_layer = 1, n_head = 2, d_model = 32, vocab_size = V, block_size = S,
                               dropout = 0, dtype = "f64"}
  fails("tensor 'wte.weight' is f32 in the checkpoint, the model's parameter is f64", function() ts.restore(r, named(m64)) end)
  local wide = lt.models.build {arch = "gpt2", n_layer = 1, n_head = 2, d_model = 32, vocab_size = V + 1, block_size = S,
                                dropout = 0}
  fails("tensor 'wte.weight' is {64, 32} in the checkpoint, the model's is {65, 32}", function() ts.restore(r, named(wide)) end)
  -- optimizer state of another shape than its parameter (a manifest edited to say so)
  local m = json.decode(assert(io.open(dir .. "/manifest.json")):read("*a"))
  for _, t in ipairs(m.tensors) do
    if t.name == "optim.wte.weight.exp_avg" then
      t.shape = {32, 64}
      t.pieces[1].shape = {32, 64}
    end
  end
  local f = assert(io.open(dir .. "/manifest.json", "w"))
  f:write(json.encode(m))
  f:close()
  local m2, opt2 = build(4)
  fails("optimizer state 'optim.wte.weight.exp_avg' is {32, 64}, its parameter {64, 32}",
    function() ts.restore(ckpt.load(dir), named(m2), opt2) end)
  -- a NaN in a parameter: counted, refused (allow_nonfinite loads it)
  local w = model.wte.weight:detach():clone()
  w:view(-1):narrow(0, 5, 1):fill_(0 / 0)
  for i, e in ipairs(tensors) do if e.name == "wte.weight" then tensors[i] = {name = e.name, tensor = w} end end
  ckpt.save(root .. "/step_000002", {step = 2, tensors = tensors, extra = {optim = oextra}})
  local m3, opt3 = build(5)
  fails("tensor 'wte.weight': 1 of its 2048 values are not finite (NaN or inf)",
    function() ts.restore(ckpt.load(root .. "/step_000002"), named(m3), opt3) end)
  ts.restore(ckpt.load(root .. "/step_000002"), named(m3), opt3, {allow_nonfinite = true})
  local back = m3.wte.weight:view(-1):narrow(0, 5, 1):item()
  assert(back ~= back, "the NaN loaded when allowed")
end)
