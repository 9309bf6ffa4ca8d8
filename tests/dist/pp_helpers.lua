-- Shared by tests/dist/test_pp.lua and test_pp_schedule.lua (loaded with dofile): the
-- small models, the data, the reference run (the unsplit model on the same micro-batches),
-- a pipeline stage trained as the trainer does, the comparison of a stage with the
-- reference, and whole pipelines in one process (coroutines). Returns a table of them.
-- The comparisons are those of layout_helpers.lua (which says why): 10 AdamW steps in f64
-- to F64_REL, and step 1 in f32 (loss, gradient norm, every gradient) to f32_tolerance.
local lt = require "lutra"
local testing = require "lutra.testing"
local models = require "lutra.models"
local optim = require "lutra.optim"
local pp = require "lutra.dist.pp"
local LH = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./") .. "layout_helpers.lua")

local CFG = {
  gpt2 = {arch = "gpt2", n_layer = 4, d_model = 32, n_head = 4, vocab_size = 64, block_size = 16, dropout = 0,
          dtype = "f64"},
  llama = {arch = "llama", n_layer = 4, d_model = 32, n_head = 4, n_kv_head = 2, vocab_size = 64, block_size = 16,
           dropout = 0, dtype = "f64"},
}
local STEPS, BATCH, MICRO, T = 10, 8, 4, 16
local ADAM = {lr = 1e-2, weight_decay = 0.1}

local function with(cfg, extra)
  local c = {}
  for k, v in pairs(cfg) do c[k] = v end
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end

-- ---- data, reference ----------------------------------------------------------------------

local function data(seed)
  lt.manual_seed(1000 + seed)
  local xs, ys = {}, {}
  for step = 1, STEPS do
    xs[step] = lt.randint(0, 64, {BATCH, T})
    ys[step] = lt.randint(0, 64, {BATCH, T})
  end
  return xs, ys
end

local function micro_batches(x, y)
  local list, b = {}, BATCH / MICRO
  for i = 1, MICRO do
    list[i] = {x = x:narrow(0, (i - 1) * b, b):contiguous(), y = y:narrow(0, (i - 1) * b, b):contiguous()}
  end
  return list
end

-- The unsplit model trained on the full batch of each step as the trainer does with
-- grad_accum = MICRO (each micro loss * 1 / MICRO before backward; the step's loss is their
-- mean), which is what a pipeline of MICRO micro-batches computes.
local function reference(cfg)
  local xs, ys = data(0)
  lt.manual_seed(7)
  local model = models.build(cfg)
  local opt = optim.AdamW(model, ADAM)
  local losses = {}
  for step = 1, STEPS do
    lt.tidy(function()
      opt:zero_grad()
      local sum = 0
      for _, b in ipairs(micro_batches(xs[step], ys[step])) do
        local _, loss = model(b.x, b.y)
        sum = sum + loss:item()
        local scaled = loss * (1 / MICRO)
        scaled:backward()
      end
      losses[step] = sum / MICRO
      optim.clip_grad_norm(model, 1.0)
      opt:step()
    end)
  end
  return model, losses
end

local ref_cache = {}
local function reference_of(name)
  if not ref_cache[name] then
    local model, losses = reference(CFG[name])
    local params = {}
    for pname, p in pairs(model:state_dict()) do params[pname] = p end
    ref_cache[name] = {losses = losses, params = params}
  end
  return ref_cache[name]
end

-- One pipeline stage trained as the trainer does it, each step inside lutra.tidy (not with
-- the in-process transport: tidy scopes are one stack, which coroutines would interleave).
local function pipelined(cfg, where, opts, no_tidy)
  local xs, ys = data(0)
  lt.manual_seed(7)
  local model = models.build(cfg)
  local st = pp.parallelize(model, where, opts)
  local opt = optim.AdamW(st.model, ADAM)
  local losses = {}
  local scope = no_tidy and function(fn) return fn() end or lt.tidy
  for step = 1, STEPS do
    scope(function()
      opt:zero_grad()
      local sum = st:train_step(micro_batches(xs[step], ys[step]), 1 / MICRO)
      losses[step] = sum / MICRO
      st:sync_grads()
      st:clip_grad_norm(1.0)
      opt:step()
    end)
  end
  return st, losses
end

-- f64: a stage's 10 steps against the reference's: every step's loss and every parameter
-- the stage holds (the tied copy too) to F64_REL relative. Returns the worst relative diff.
local function compare(name, st, losses, who)
  local ref = reference_of(name)
  local worst = 0
  for step = 1, STEPS do
    worst = math.max(worst, LH.assert_rel_number(losses[step], ref.losses[step], LH.F64_REL,
      who .. " loss of step " .. step))
  end
  local n = 0
  for pname, p in st.model:named_parameters() do
    local r = ref.params[pname]
    assert(r ~= nil, who .. ": " .. pname .. " is not a parameter of the full model")
    worst = math.max(worst, LH.assert_rel(p, r, LH.F64_REL, who .. " " .. pname .. " after " .. STEPS .. " steps"))
    n = n + 1
  end
  assert(n > 0, who .. ": the stage holds no parameters")
  return worst
end

-- ---- f32 step 1 (before the optimizer) ---------------------------------------------------

local step1_cache = {}
-- The unsplit model in f32, step 1 (MICRO micro-batches accumulated, as reference does):
-- the mean loss, the gradient norm and name -> gradient (f64).
local function reference_step1(name)
  if step1_cache[name] then return step1_cache[name] end
  local xs, ys = data(0)
  lt.manual_seed(7)
  local model = models.build(with(CFG[name], {dtype = "f32"}))
  local sum = 0
  for _, b in ipairs(micro_batches(xs[1], ys[1])) do
    local _, loss = model(b.x, b.y)
    sum = sum + loss:item()
    local scaled = loss * (1 / MICRO)
    scaled:backward()
  end
  local grads, sq = {}, 0
  for pname, p in model:named_parameters() do
    grads[pname] = p.grad:double()
    sq = sq + (grads[pname] * grads[pname]):sum():item()
  end
  step1_cache[name] = {loss = sum / MICRO, norm = math.sqrt(sq), grads = grads}
  return step1_cache[name]
end

local function f32_tolerance(name) return LH.f32_tolerance(CFG[name], BATCH * T) end

-- Step 1 of a pipeline stage in f32: the micro-batches, the tied-embedding sync, the global
-- norm over the stages (no clipping). Returns the stage, the mean loss and the norm.
local function pipelined_step1(name, where, opts)
  local xs, ys = data(0)
  lt.manual_seed(7)
  local st = pp.parallelize(models.build(with(CFG[name], {dtype = "f32"})), where, opts)
  local loss = st:train_step(micro_batches(xs[1], ys[1]), 1 / MICRO) / MICRO
  st:sync_grads()
  local norm = st:clip_grad_norm(math.huge)
  return st, loss, norm
end

-- f32: a stage's step-1 loss, the global norm and the gradient of every parameter it holds
-- (the tied copy's: the sum over both stages) against the unsplit model's, within
-- f32_tolerance. Returns the worst relative diff and the bound.
local function compare_step1(name, st, loss, norm, who)
  local ref, tol = reference_step1(name), f32_tolerance(name)
  local worst = math.max(LH.assert_rel_number(loss, ref.loss, tol, who .. " f32 step-1 loss"),
    LH.assert_rel_number(norm, ref.norm, tol, who .. " f32 step-1 gradient norm"))
  local n = 0
  for pname, p in st.model:named_parameters() do
    assert(ref.grads[pname] ~= nil, who .. ": " .. pname .. " is not a parameter of the full model")
    assert(p.grad ~= nil, who .. ": no gradient for " .. pname)
    worst = math.max(worst, LH.assert_rel(p.grad, ref.grads[pname], tol, who .. " f32 step-1 gradient of " .. pname))
    n = n + 1
  end
  assert(n > 0, who .. ": the stage holds no parameters")
  return worst, tol
end

-- ---- in-process pipelines (coroutines over a local transport) ------------------------------

-- P stages in this process: each a coroutine; send queues a copy, recv yields until there
-- is one; broadcast and all_reduce wait for every member. Returns run(fn) that runs
-- fn(stage_rank, mesh) for every stage and errors on a deadlock.
local function local_world(P)
  local queues, colls, progress = {}, {}, 0
  local function group(name, ranks, me)
    local g = {name = name, size = #ranks, ranks = ranks, seq = 0}
    for i, r in ipairs(ranks) do
      if r == me then g.rank = i - 1 end
    end
    local function q(src, dst, tag)
      local k = name .. ":" .. src .. ">" .. dst .. "#" .. tag
      queues[k] = queues[k] or {}
      return queues[k]
    end
    function g:send(t, peer, o)
      local list = q(self.rank, peer, o.tag)
      list[#list + 1] = lt.no_grad(function() return lt.keep(t:clone()) end)
      progress = progress + 1
    end
    function g:recv(t, peer, o)
      local list = q(peer, self.rank, o.tag)
      while #list == 0 do coroutine.yield() end
      local src = table.remove(list, 1)
      lt.no_grad(function() t:copy_(src) end)
      progress = progress + 1
    end
    -- sends queued at once; the handle's wait receives (yielding until the data is there)
    function g:p2p(list)
      local recvs = {}
      for _, item in ipairs(list) do
        if item[1] == "send" then self:send(item[2], item[3], {tag = 0}) else recvs[#recvs + 1] = item end
      end
      return {wait = function()
        for _, item in ipairs(recvs) do self:recv(item[2], item[3], {tag = 0}) end
      end}
    end
    local function collective(self, t, combine)
      self.seq = self.seq + 1
      local k = name .. "#" .. self.seq
      colls[k] = colls[k] or {n = 0}
      local c = colls[k]
      c[self.rank] = lt.no_grad(function() return lt.keep(t:clone()) end)
      c.n = c.n + 1
      progress = progress + 1
      while c.n < self.size do coroutine.yield() end
      lt.no_grad(function() t:copy_(combine(c)) end)
    end
    function g:broadcast(t, root) collective(self, t, function(c) return c[root] end) end
    function g:all_reduce(t, op)
      op = op or "sum"
      assert(op == "sum" or op == "min" or op == "max", op)
      collective(self, t, function(c)
        if op == "sum" then
          local s = c[0]:clone()
          for r = 1, self.size - 1 do s = s + c[r] end
          return s
        end
        local v = c[0]:tolist() -- (min and max: the small agreement vectors of pp.parallelize)
        for r = 1, self.size - 1 do
          for i, x in ipairs(c[r]:tolist()) do v[i] = op == "min" and math.min(v[i], x) or math.max(v[i], x) end
        end
        return lt.tensor(v, {dtype = c[0].dtype})
      end)
    end
    return g
  end
  return function(fn)
    local cos, results = {}, {}
    for s = 0, P - 1 do
      local ranks = {}
      for r = 0, P - 1 do ranks[#ranks + 1] = r end
      local mesh = {pp = group("pp", ranks, s)}
      if s == 0 or s == P - 1 then mesh.embed = group("embed", P > 1 and {0, P - 1} or {0}, s) end
      cos[s] = coroutine.create(function() results[s] = {fn(s, mesh)} end)
    end
    local alive = P
    while alive > 0 do
      local before, finished = progress, 0
      for s = 0, P - 1 do
        if coroutine.status(cos[s]) ~= "dead" then
          local ok, err = coroutine.resume(cos[s])
          if not ok then error(debug.traceback(cos[s], tostring(err)), 0) end
          if coroutine.status(cos[s]) == "dead" then finished = finished + 1 end
        end
      end
      alive = alive - finished
      if alive > 0 and finished == 0 and progress == before then error("in-process pipeline: deadlock") end
    end
    return results
  end
end

local function in_process(name, P, opts)
  local run = local_world(P)
  local results = run(function(s, mesh)
    local st, losses = pipelined(CFG[name], mesh, opts, true)
    return st, losses
  end)
  local worst = 0
  for s = 0, P - 1 do
    worst = math.max(worst, compare(name, results[s][1], results[s][2],
      string.format("%s pp%d %s stage %d", name, P, opts.schedule, s)))
  end
  local worst32, tol = 0, f32_tolerance(name)
  run = local_world(P)
  results = run(function(s, mesh) return pipelined_step1(name, mesh, opts) end)
  for s = 0, P - 1 do
    local r = results[s]
    worst32 = math.max(worst32, (compare_step1(name, r[1], r[2], r[3],
      string.format("%s pp%d %s stage %d", name, P, opts.schedule, s))))
  end
  print(string.format("  %s pp%d %-11s f64 worst rel diff %.1e (allowed %.0e); f32 step 1 %.1e (bound %.1e)", name,
    P, opts.schedule, worst, LH.F64_REL, worst32, tol))
end

return {CFG = CFG, STEPS = STEPS, BATCH = BATCH, MICRO = MICRO, T = T, ADAM = ADAM, with = with, data = data,
        micro_batches = micro_batches, reference_of = reference_of, ref_cache = ref_cache, pipelined = pipelined,
        compare = compare, in_process = in_process, reference_step1 = reference_step1, pipelined_step1 = pipelined_step1,
        compare_step1 = compare_step1, f32_tolerance = f32_tolerance, LH = LH}
