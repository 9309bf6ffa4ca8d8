-- lutra.optim: AdamW, SGD and Lion against naive double loops of torch's formulas,
-- parameter groups, gradient clipping, state_dict round trips, bad settings.
-- (Schedules: test_optim_schedule.lua; PyTorch trajectories: test_optim_torch.lua;
-- training with autograd: test_optim_train.lua.)
local lt = require "lutra"
local optim = require "lutra.optim"
local T = require "lutra.testing"
local close, equal, fails = T.assert_close, T.assert_equal, T.assert_error

local function rand_list(n, scale)
  local l = {}
  for i = 1, n do l[i] = (T.uniform() * 2 - 1) * (scale or 1) end
  return l
end

local function numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

-- A tensor of `shape` from a flat list.
local function from_list(list, shape, dt) return lt.tensor(list, {dtype = dt or "f64"}):view(shape) end
local function flat(t) return t:reshape(-1):tolist() end

local function random_shapes(k)
  local shapes = {}
  for i = 1, k do
    local nd = T.randint(1, 4)
    local s = {}
    for d = 1, nd do s[d] = T.randint(1, 5) end
    shapes[i] = s
  end
  return shapes
end

-- ---- naive references: one step on plain Lua lists, in doubles --------------------------

local naive = {}

function naive.adamw(p, g, st, o, lr)
  st.step = (st.step or 0) + 1
  st.m, st.v = st.m or {}, st.v or {}
  local b1, b2 = o.betas[1], o.betas[2]
  local bc1, bc2 = 1 - b1 ^ st.step, 1 - b2 ^ st.step
  for i = 1, #p do
    local m = (st.m[i] or 0) + (g[i] - (st.m[i] or 0)) * (1 - b1)
    local v = b2 * (st.v[i] or 0) + (1 - b2) * g[i] * g[i]
    st.m[i], st.v[i] = m, v
    p[i] = p[i] * (1 - lr * o.weight_decay) - lr / bc1 * m / (math.sqrt(v) / math.sqrt(bc2) + o.eps)
  end
end

function naive.sgd(p, g, st, o, lr)
  local d = {}
  for i = 1, #p do d[i] = g[i] + o.weight_decay * p[i] end
  if o.momentum ~= 0 then
    if not st.buf then
      st.buf = {}
      for i = 1, #p do st.buf[i] = d[i] end
    else
      for i = 1, #p do st.buf[i] = o.momentum * st.buf[i] + (1 - o.dampening) * d[i] end
    end
    for i = 1, #p do d[i] = o.nesterov and d[i] + o.momentum * st.buf[i] or st.buf[i] end
  end
  for i = 1, #p do p[i] = p[i] - lr * d[i] end
end

local function sign(x) return x > 0 and 1 or (x < 0 and -1 or 0) end

function naive.lion(p, g, st, o, lr)
  st.m = st.m or {}
  local b1, b2 = o.betas[1], o.betas[2]
  for i = 1, #p do
    local m = st.m[i] or 0
    p[i] = p[i] * (1 - lr * o.weight_decay) - lr * sign(b1 * m + (1 - b1) * g[i])
    st.m[i] = b2 * m + (1 - b2) * g[i]
  end
end

-- Runs `steps` steps of optimizer `name` with settings o on random params (two groups:
-- the second without weight decay) in dtype dt, and the naive loop beside it.
local function against_naive(name, dt, o, steps, sched, tol)
  local shapes = random_shapes(4)
  local lists, params, group_of = {}, {}, {}
  for i, s in ipairs(shapes) do
    lists[i] = rand_list(numel(s))
    params[i] = from_list(lists[i], s, dt)
    lists[i] = flat(params[i]) -- the values as stored (f32 rounding)
    group_of[i] = i % 2 + 1
  end
  local groups = {{params = {}}, {params = {}, weight_decay = 0}}
  local order = {}
  for i = 1, #params do
    local g = groups[group_of[i]]
    g.params[#g.params + 1] = params[i]
  end
  for gi = 1, 2 do
    for i = 1, #params do if group_of[i] == gi then order[#order + 1] = i end end
  end
  local opts = {}
  for k, v in pairs(o) do opts[k] = v end
  opts.schedule = sched
  local opt = optim.create(name, groups, opts)
  local states = {}
  for step = 0, steps - 1 do
    local lr = sched and sched(step) or o.lr
    local grads = {}
    for k, i in ipairs(order) do
      local gl = rand_list(#lists[i], 2)
      grads[k] = from_list(gl, shapes[i], dt)
      gl = flat(grads[k])
      local oi = {}
      for key, v in pairs(o) do oi[key] = v end
      if group_of[i] == 2 then oi.weight_decay = 0 end
      states[i] = states[i] or {}
      naive[name](lists[i], gl, states[i], oi, lr)
    end
    opt:step{grads = grads}
    equal(opt.steps, step + 1)
    for gi, g in ipairs(opt.param_groups) do equal(g.last_lr, lr, "group " .. gi .. " lr") end
  end
  for i = 1, #params do close(flat(params[i]), lists[i], {rtol = tol, atol = tol, msg = name .. " param " .. i}) end
  return opt
end

local ADAMW = {lr = 0.02, betas = {0.9, 0.99}, eps = 1e-8, weight_decay = 0.1}
local SCHED = optim.schedule.cosine{lr = 0.02, min_lr = 0.002, warmup = 3, total = 10}

test("AdamW: steps in f64 and f32 match a naive double loop (two groups, cosine schedule)", function()
  local opt = against_naive("adamw", "f64", ADAMW, 10, SCHED, 1e-12)
  equal(opt.state[1].step, 10)
  equal(opt.state[1].exp_avg.dtype, "f64")
  opt = against_naive("adamw", "f32", ADAMW, 10, SCHED, 2e-5)
  equal(opt.state[2].exp_avg_sq.dtype, "f32")
  against_naive("adamw", "f64", {lr = 1e-3, betas = {0.5, 0.9}, eps = 1e-3, weight_decay = 0}, 6, nil, 1e-12)
end)

test("SGD: plain, momentum with dampening and weight decay, Nesterov: naive double loop", function()
  for _, o in ipairs {
    {lr = 0.1, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false},
    {lr = 0.05, momentum = 0.9, dampening = 0.1, weight_decay = 0.01, nesterov = false},
    {lr = 0.05, momentum = 0.8, dampening = 0, weight_decay = 1e-3, nesterov = true},
  } do
    local opt = against_naive("sgd", "f64", o, 8, nil, 1e-12)
    if o.momentum == 0 then equal(next(opt.state[1]), nil) else equal(opt.state[1].momentum_buffer.dtype, "f64") end
    against_naive("sgd", "f32", o, 8, nil, 1e-5)
  end
end)

test("Lion: naive double loop (f64, f32), with the schedule", function()
  local o = {lr = 0.01, betas = {0.9, 0.99}, weight_decay = 0.1}
  local sched = optim.schedule.cosine{lr = 0.01, min_lr = 0.001, warmup = 2, total = 8}
  against_naive("lion", "f64", o, 8, sched, 1e-12)
  against_naive("lion", "f32", o, 8, sched, 1e-5)
end)

test("AdamW: a bf16 parameter with an f32 gradient is updated in f32 and rounded once", function()
  local p16 = lt.randn(3, 5):to("bf16")
  local p32 = p16:to("f32")
  local g = lt.randn(3, 5)
  local a = optim.AdamW({p16}, ADAMW)
  local b = optim.AdamW({p32}, ADAMW)
  for _ = 1, 3 do
    a:step{grads = {g}}
    b:step{grads = {g}}
    close(p16, p32:to("bf16"), {rtol = 0, atol = 0})
    p32:copy_(p16) -- the next step starts from the same rounded values
  end
  equal(a.state[1].exp_avg.dtype, "f32")
  close(a.state[1].exp_avg, b.state[1].exp_avg, {rtol = 0, atol = 0})
end)

test("non-contiguous parameters and gradients are updated in place", function()
  for _, name in ipairs {"adamw", "sgd", "lion"} do
    local base = lt.randn(4, 6, {dtype = "f64"})
    local p = base:t() -- (6, 4), a view
    local ref = p:contiguous():clone()
    local gbase = lt.randn(4, 6, {dtype = "f64"})
    local o = name == "sgd" and {lr = 0.1, momentum = 0.9} or {lr = 0.1}
    local a = optim.create(name, {p}, o)
    local b = optim.create(name, {ref}, o)
    for _ = 1, 3 do
      a:step{grads = {gbase:t()}}
      b:step{grads = {gbase:t():contiguous()}}
    end
    close(base:t(), ref, {rtol = 0, atol = 0, msg = name})
  end
end)

test("parameters without a gradient are skipped; each keeps its own step count", function()
  local p1, p2 = lt.randn(3, {dtype = "f64"}), lt.randn(2, {dtype = "f64"})
  local before = p2:clone()
  local opt = optim.AdamW({p1, p2}, ADAMW)
  opt:step{grads = {lt.ones(3, {dtype = "f64"})}}
  opt:step{grads = {lt.ones(3, {dtype = "f64"}), lt.ones(2, {dtype = "f64"})}}
  equal(opt.state[1].step, 2)
  equal(opt.state[2].step, 1)
  equal(opt.steps, 2)
  -- p2's one step is a first step: lr * sign(g) (plus decay) with bias correction
  close(p2, (before * (1 - 0.02 * 0.1) - 0.02 * (1 / (1 + 1e-8))):tolist(), {rtol = 1e-12})
end)

-- A stand-in module: named_parameters() as a list of {name, tensor} pairs.
local function fake_model()
  local named = {
    {"wte.weight", lt.randn(10, 4)}, {"wpe.weight", lt.randn(8, 4)},
    {"blocks.0.ln_1.weight", lt.ones(4)}, {"blocks.0.attn.c_attn.weight", lt.randn(12, 4)},
    {"blocks.0.attn.c_attn.bias", lt.zeros(12)}, {"blocks.0.mlp.c_fc.weight", lt.randn(16, 4)},
    {"embed_tokens.weight", lt.randn(10, 4)}, {"lm_head.weight", lt.randn(10, 4)}, {"ln_f.bias", lt.zeros(4)},
  }
  return {named_parameters = function() return named end}, named
end

local function names_of(group) return group.names end

test("param_groups: no decay on 1-D params and embeddings by default; patterns and functions override", function()
  local model = fake_model()
  local groups = optim.param_groups(model, {weight_decay = 0.1})
  equal(#groups, 2)
  equal(names_of(groups[1]), {"blocks.0.attn.c_attn.weight", "blocks.0.mlp.c_fc.weight", "lm_head.weight"})
  equal(groups[1].weight_decay, 0.1)
  equal(names_of(groups[2]), {"wte.weight", "wpe.weight", "blocks.0.ln_1.weight", "blocks.0.attn.c_attn.bias",
                              "embed_tokens.weight", "ln_f.bias"})
  equal(groups[2].weight_decay, 0)
  -- the peer's (nanoGPT's) rule: every matrix decays, embeddings included
  groups = optim.param_groups(model, {no_decay = {}})
  equal(names_of(groups[1]), {"wte.weight", "wpe.weight", "blocks.0.attn.c_attn.weight", "blocks.0.mlp.c_fc.weight",
                              "embed_tokens.weight", "lm_head.weight"})
  equal(groups[1].weight_decay, nil) -- the optimizer's default applies
  groups = optim.param_groups(model, {no_decay = {"lm_head"}})
  equal(names_of(groups[2]), {"blocks.0.ln_1.weight", "blocks.0.attn.c_attn.bias", "lm_head.weight", "ln_f.bias"})
  groups = optim.param_groups(model, {no_decay = function(name) return name:find("mlp") ~= nil end})
  equal(names_of(groups[2]), {"blocks.0.mlp.c_fc.weight"})
  groups = optim.param_groups(model, {no_decay = function() return false end})
  equal(#groups, 1)
  -- an iterator, and a name -> tensor map (sorted)
  local it = optim.param_groups({named_parameters = function()
    local i = 0
    return function()
      i = i + 1
      if i == 1 then return "b.bias", lt.zeros(3) elseif i == 2 then return "a.weight", lt.zeros(3, 3) end
    end
  end})
  equal(names_of(it[1]), {"a.weight"})
  local map = optim.param_groups({z = lt.zeros(2, 2), a = lt.zeros(2, 2), m = lt.zeros(2)})
  equal(names_of(map[1]), {"a", "z"})
  fails("no_decay must be", optim.param_groups, model, {no_decay = 3})
  fails("unknown option 'weight_decy'", optim.param_groups, model, {weight_decy = 0.1})
  fails("not a tensor", optim.param_groups, {{"x", 3}})
end)

test("an optimizer built from a module: state by name, group lrs scaled by the schedule", function()
  local model, named = fake_model()
  local sched = optim.schedule.cosine{lr = 1e-3, min_lr = 1e-4, warmup = 10, total = 100}
  local opt = optim.AdamW(model, {weight_decay = 0.1, schedule = sched})
  equal(opt.defaults.lr, 1e-3)
  equal(opt.param_groups[1].weight_decay, 0.1)
  equal(opt.param_groups[2].weight_decay, 0)
  equal(#opt.keys, #named)
  local grads = {}
  for _, e in ipairs(named) do grads[e[1]] = lt.ones_like(e[2]) end
  grads["wpe.weight"] = nil
  opt:step{grads = grads}
  equal(opt.state["wte.weight"].step, 1)
  equal(opt.state["wpe.weight"], nil)
  equal(opt.param_groups[1].last_lr, sched(0))
  -- a group with half the lr follows the schedule at half
  local a, b = lt.randn(3, 3), lt.randn(3)
  local o2 = optim.AdamW({{params = {a}}, {params = {b}, lr = 5e-4}}, {schedule = sched})
  for _ = 1, 20 do o2:step{grads = {lt.ones(3, 3), lt.ones(3)}} end
  equal(o2.param_groups[1].last_lr, sched(19))
  close(o2.param_groups[2].last_lr, sched(19) / 2, {rtol = 1e-15})
  equal(o2:get_lr(), sched(20))
  -- an explicit lr for one step wins over the schedule
  o2:step{grads = {lt.ones(3, 3), lt.ones(3)}, lr = 0.5}
  equal(o2.param_groups[1].last_lr, 0.5)
  equal(o2.param_groups[2].last_lr, 0.25)
  fails("differs from the schedule's peak lr", optim.AdamW, {a}, {lr = 1, schedule = sched})
end)

test("clip_grads: the global norm against a naive one; scales only when over; nil grads skipped", function()
  for _, dt in ipairs {"f32", "f64", "bf16"} do
    local lists, grads, total = {}, {}, 0
    for i = 1, 4 do
      if i ~= 2 then
        lists[i] = rand_list(T.randint(1, 40), 3)
        grads[i] = lt.tensor(lists[i], {dtype = dt})
        lists[i] = grads[i]:to("f64"):tolist()
        for _, x in ipairs(lists[i]) do total = total + x * x end
      end
    end
    total = math.sqrt(total)
    local norm = optim.clip_grads(grads, 1e9, nil, 4) -- not over: untouched
    close(norm, total, {rtol = dt == "f64" and 1e-14 or 2e-7})
    close(grads[1], lists[1], {rtol = 0, atol = 0})
    local max_norm = total / 3
    norm = optim.clip_grads(grads, max_norm, nil, 4)
    close(norm, total, {rtol = dt == "f64" and 1e-14 or 2e-7})
    local coef = max_norm / (total + 1e-6)
    local tol = ({f32 = 1e-6, f64 = 1e-14, bf16 = 8e-3})[dt]
    for _, i in ipairs {1, 3, 4} do
      local want = {}
      for k, x in ipairs(lists[i]) do want[k] = x * coef end
      close(grads[i]:to("f64"), want, {rtol = tol, atol = 1e-30, msg = dt})
    end
    close(optim.clip_grads(grads, 1e9, nil, 4), max_norm, {rtol = tol})
  end
  -- the inf norm
  local g = {lt.tensor {1, -7, 2}, lt.tensor {3}}
  equal(optim.clip_grads(g, 100, {norm_type = math.huge}), 7)
  close(optim.clip_grads(g, 3.5, {norm_type = math.huge}), 7)
  close(g[1], {0.5, -3.5, 1}, {rtol = 1e-6})
end)

test("clip_grads: nan and inf norms are returned and leave grads alone, or raise", function()
  local g = {lt.tensor {1, 0 / 0}, lt.tensor {3, 4}}
  local norm = optim.clip_grads(g, 1)
  assert(norm ~= norm, "nan expected")
  close(g[2], {3, 4}, {rtol = 0, atol = 0})
  g[1] = lt.tensor {math.huge, 1}
  equal(optim.clip_grads(g, 1), math.huge)
  close(g[2], {3, 4}, {rtol = 0, atol = 0})
  fails("total norm of the gradients is inf", optim.clip_grads, g, 1, {error_if_nonfinite = true})
  fails("max_norm must be a number >= 0", optim.clip_grads, g, -1)
  fails("norm_type must be 2 or math.huge", optim.clip_grads, g, 1, {norm_type = 1})
  fails("unknown option 'error_if_nan'", optim.clip_grads, g, 1, {error_if_nan = true})
  fails("not a tensor", optim.clip_grads, {lt.ones(2), "x"}, 1)
end)

-- Runs 2n steps straight, and n steps, a state_dict save, a new optimizer on copies of
-- the parameters loading it, n more steps: the parameters must agree bitwise.
local function resume_case(name, o, named)
  local shapes = random_shapes(3)
  local init, grads = {}, {}
  for i, s in ipairs(shapes) do init[i] = lt.randn(s) end
  for step = 1, 8 do
    grads[step] = {}
    for i, s in ipairs(shapes) do grads[step][i] = lt.randn(s) end
  end
  local function make(params)
    if not named then return optim.create(name, params, o) end
    local model = {named_parameters = function()
      local l = {}
      for i, p in ipairs(params) do l[i] = {"p" .. i, p} end
      return l
    end}
    return optim.create(name, model, o)
  end
  local function step(opt, k)
    local g = grads[k]
    if named then g = {p1 = g[1], p2 = g[2], p3 = g[3]} end
    if k == 3 then g[named and "p2" or 2] = nil end -- one missing gradient on the way
    opt:step{grads = g}
  end
  local straight = {}
  for i, p in ipairs(init) do straight[i] = p:clone() end
  local a = make(straight)
  for k = 1, 8 do step(a, k) end
  local first = {}
  for i, p in ipairs(init) do first[i] = p:clone() end
  local b = make(first)
  for k = 1, 4 do step(b, k) end
  local sd = b:state_dict()
  local second = {}
  for i, p in ipairs(first) do second[i] = p:clone() end
  local c = make(second)
  c:load_state_dict(sd)
  equal(c.steps, 4)
  for k = 5, 8 do step(c, k) end
  for k = 5, 8 do step(b, k) end -- the saved optimizer goes on too: the loaded state is a copy
  for i = 1, #init do
    close(second[i], straight[i], {rtol = 0, atol = 0, msg = name .. " resumed param " .. i})
    close(first[i], straight[i], {rtol = 0, atol = 0, msg = name .. " saved param " .. i})
  end
  return a, c
end

test("state_dict round trip: a resumed run continues exactly as an uninterrupted one", function()
  local sched = optim.schedule.cosine{lr = 0.01, min_lr = 0.001, warmup = 2, total = 8}
  local a, c = resume_case("adamw", {schedule = sched, betas = {0.9, 0.99}, weight_decay = 0.1}, false)
  equal(a.state[2].step, 7)
  equal(c.state[2].step, 7)
  resume_case("adamw", {lr = 0.01, weight_decay = 0.1}, true)
  resume_case("sgd", {lr = 0.05, momentum = 0.9, nesterov = true, weight_decay = 0.01}, false)
  resume_case("sgd", {lr = 0.05, momentum = 0.9, dampening = 0.2}, true)
  resume_case("lion", {schedule = sched, weight_decay = 0.1}, false)
end)

test("state_dict: plain tables, inspectable; settings restored from the checkpoint", function()
  local p = lt.randn(2, 3)
  local opt = optim.AdamW({p}, {lr = 0.01})
  opt:step{grads = {lt.ones(2, 3)}}
  local sd = opt:state_dict()
  equal(sd.optimizer, "adamw")
  equal(sd.steps, 1)
  equal(sd.param_groups[1].keys, {1})
  equal(sd.param_groups[1].lr, 0.01)
  equal(sd.param_groups[1].betas, {0.9, 0.999})
  equal(sd.state[1].step, 1)
  equal(sd.state[1].exp_avg.shape, {2, 3})
  local q = optim.AdamW({p:clone()}, {lr = 0.5})
  q:load_state_dict(sd)
  equal(q.param_groups[1].lr, 0.01)
  close(q.state[1].exp_avg_sq, opt.state[1].exp_avg_sq, {rtol = 0, atol = 0})
  sd.param_groups[1].betas[1] = 0.5 -- the loaded settings are copies
  equal(q.param_groups[1].betas[1], 0.9)
end)

test("load_state_dict: clear errors on a mismatch, and nothing changes", function()
  local p, b = lt.randn(2, 3), lt.randn(3)
  local opt = optim.AdamW({p, b})
  opt:step{grads = {lt.ones(2, 3), lt.ones(3)}}
  local sd = opt:state_dict()
  local function fresh() return optim.AdamW({p:clone(), b:clone()}) end
  fails("the state is for optimizer 'adamw', this one is 'sgd'", function() optim.SGD({p, b}, {lr = 1}):load_state_dict(sd) end)
  fails("the state has 1 parameter groups, this optimizer 2", function()
    optim.AdamW({{params = {p}}, {params = {b}}}):load_state_dict(sd)
  end)
  fails("group 1 has 2 parameters in the state, 1 here", function() optim.AdamW({p}):load_state_dict(sd) end)
  local bad = fresh():state_dict()
  bad.state[1] = {step = 1, exp_avg = lt.zeros(3, 2), exp_avg_sq = lt.zeros(2, 3)}
  bad.steps = 1
  local q = fresh()
  fails("state '1'.exp_avg has shape [3, 2], the parameter [2, 3]", q.load_state_dict, q, bad)
  equal(q.steps, 0)
  equal(next(q.state), nil)
  bad.state[1] = {step = 1, exp_avg = lt.zeros(2, 3)}
  fails("state of '1' lacks field 'exp_avg_sq'", q.load_state_dict, q, bad)
  bad.state[1] = {step = 1, exp_avg = lt.zeros(2, 3), exp_avg_sq = lt.zeros(2, 3), momentum = 3}
  fails("unknown field 'momentum'", q.load_state_dict, q, bad)
  bad.state[1] = nil
  bad.state[7] = {step = 1}
  fails("an entry for '7', not a parameter here", q.load_state_dict, q, bad)
  bad.state[7] = nil
  bad.param_groups[1].lr = -1
  fails("lr must be >= 0", q.load_state_dict, q, bad)
  bad.param_groups[1].lr = 1e-3
  bad.param_groups[1].momentum = 0.9
  fails("unknown setting 'momentum'", q.load_state_dict, q, bad)
  fails("needs steps, param_groups and state", q.load_state_dict, q, {optimizer = "adamw"})
  -- names against positions
  local named = optim.AdamW({named_parameters = function() return {{"w", p}, {"b", b}} end},
    {no_decay = function() return false end})
  fails("parameter 1 is '1' in the state, 'w' here", named.load_state_dict, named, sd)
end)

test("bad settings and arguments raise clear errors", function()
  local p = lt.randn(3)
  fails("lr must be >= 0", optim.AdamW, {p}, {lr = -1})
  fails("betas[2] must be in [0, 1)", optim.AdamW, {p}, {betas = {0.9, 1}})
  fails("betas must be a list of two numbers", optim.Lion, {p}, {betas = 0.9})
  fails("unknown option 'weight_decy'", optim.AdamW, {p}, {weight_decy = 0.1})
  fails("group 2: unknown setting 'momentun'", optim.SGD, {{params = {p}}, {params = {lt.randn(2)}, momentun = 1}}, {lr = 1})
  fails("lr is required", optim.SGD, {p})
  fails("Nesterov momentum needs momentum > 0 and dampening 0", optim.SGD, {p}, {lr = 1, nesterov = true})
  fails("Nesterov momentum needs momentum > 0 and dampening 0", optim.SGD, {p},
    {lr = 1, nesterov = true, momentum = 0.9, dampening = 0.1})
  fails("a parameter appears twice", optim.AdamW, {p, p})
  fails("two parameters are named 'w'", optim.AdamW, {{named = {{"w", p}}}, {named = {{"w", lt.randn(2)}}}})
  fails("either every group has parameter names or none has", optim.AdamW, {{named = {{"w", p}}}, {params = {lt.randn(2)}}})
  fails("no parameters given", optim.AdamW, {})
  fails("expected parameters", optim.AdamW, 3)
  fails("unknown optimizer adam", optim.create, "adam", {p})
  fails("schedule must be a function", optim.AdamW, {p}, {schedule = 3})
  local opt = optim.AdamW({p})
  fails("not a tensor", opt.step, opt, {grads = {3}})
  fails("lr must be a number >= 0", opt.step, opt, {grads = {}, lr = -1})
  fails("adamw: grad is [2] f32 cpu, expected 3 elements", opt.step, opt, {grads = {lt.ones(2)}})
  fails("expected f32", opt.step, opt, {grads = {lt.ones(3, {dtype = "f64"})}})
end)

test("printing an optimizer shows its groups", function()
  local opt = optim.SGD({lt.randn(3)}, {lr = 0.1, momentum = 0.9})
  local s = tostring(opt)
  assert(s:find("SGD (step 0)", 1, true) and s:find("momentum=0.9", 1, true), s)
end)
