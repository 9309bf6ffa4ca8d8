-- np: 2 4
-- Pipeline parallel (lutra.dist.pp): schedules, stage construction, and equivalence with
-- the unsplit model. Pure schedule tests and an in-process pipeline (all stages in this
-- process as coroutines, over a local transport) run on every rank without communication;
-- the MPI tests split the world into one pipeline of world-size stages.
local lt = require "lutra"
local testing = require "lutra.testing"
local models = require "lutra.models"
local optim = require "lutra.optim"
local S = require "lutra.dist.pp_schedule"
local pp = require "lutra.dist.pp"
local exec = require "lutra.dist.pp_exec"
local spec = require "lutra.dist.spec"

local CFG = {
  gpt2 = {arch = "gpt2", n_layer = 4, d_model = 32, n_head = 4, vocab_size = 64, block_size = 16, dropout = 0},
  llama = {arch = "llama", n_layer = 4, d_model = 32, n_head = 4, n_kv_head = 2, vocab_size = 64, block_size = 16,
           dropout = 0},
}
local STEPS, BATCH, MICRO, T = 10, 8, 4, 16
local ADAM = {lr = 1e-2, weight_decay = 0.1}

local function with(cfg, extra)
  local c = {}
  for k, v in pairs(cfg) do c[k] = v end
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end

-- ---- schedules -----------------------------------------------------------------------------

test("1f1b order: warmup P - s - 1 forwards, then one forward one backward, then cooldown", function()
  local expected = {
    [0] = "F1 F2 F3 F4 B1 F5 B2 F6 B3 B4 B5 B6",
    [1] = "F1 F2 F3 B1 F4 B2 F5 B3 F6 B4 B5 B6",
    [2] = "F1 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 B6",
    [3] = "F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6",
  }
  for s = 0, 3 do testing.assert_equal(S.describe(S.actions("1f1b", 4, s, 6)), expected[s], "stage " .. s) end
  -- fewer micro-batches than stages: all forwards, then all backwards
  testing.assert_equal(S.describe(S.actions("1f1b", 4, 0, 2)), "F1 F2 B1 B2")
  testing.assert_equal(S.describe(S.actions("gpipe", 3, 1, 3)), "F1 F2 F3 B1 B2 B3")
  local r = S.simulate("1f1b", 4, 8)
  for s = 0, 3 do testing.assert_equal(r.peak[s], 4 - s, "1f1b activations alive on stage " .. s) end
  r = S.simulate("gpipe", 4, 8)
  for s = 0, 3 do testing.assert_equal(r.peak[s], 8, "gpipe activations alive on stage " .. s) end
end)

test("interleaved order: groups of P micro-batches per chunk (Megatron)", function()
  testing.assert_equal(S.describe(S.actions("interleaved", 2, 0, 4, 2), 2),
    "F1.1 F2.1 F1.2 F2.2 F3.1 B1.2 F4.1 B2.2 F3.2 B1.1 F4.2 B2.1 B3.2 B4.2 B3.1 B4.1")
  testing.assert_equal(S.describe(S.actions("interleaved", 2, 1, 4, 2), 2),
    "F1.1 F2.1 F1.2 B1.2 F2.2 B2.2 F3.1 B1.1 F4.1 B2.1 F3.2 B3.2 F4.2 B4.2 B3.1 B4.1")
  -- m == P: every forward first
  testing.assert_equal(S.describe(S.actions("interleaved", 2, 1, 2, 2), 2), "F1.1 F2.1 F1.2 F2.2 B1.2 B2.2 B1.1 B2.1")
end)

test("every schedule completes without deadlock (sends never block, receives wait)", function()
  for _, kind in ipairs{"gpipe", "1f1b"} do
    for P = 1, 6 do
      for m = 1, 9 do S.simulate(kind, P, m) end
    end
  end
  for P = 1, 5 do
    for v = 1, 3 do
      for k = 1, 3 do S.simulate("interleaved", P, k * P, v) end
    end
  end
  -- the simulator does catch a bad order: stage 1 waiting for a backward that stage 0 runs late
  local actions = S.actions
  S.actions = function(kind, P, s, m, v)
    if s == 0 then return {{op = "F", micro = 1, chunk = 1}, {op = "B", micro = 1, chunk = 1}, {op = "F", micro = 2,
      chunk = 1}, {op = "B", micro = 2, chunk = 1}} end
    return {{op = "F", micro = 2, chunk = 1}, {op = "F", micro = 1, chunk = 1}, {op = "B", micro = 1, chunk = 1},
      {op = "B", micro = 2, chunk = 1}}
  end
  local ok, err = pcall(S.simulate, "gpipe", 2, 2)
  S.actions = actions
  assert(not ok and tostring(err):find("deadlock", 1, true), tostring(err))
end)

test("schedule options: clear errors", function()
  testing.assert_error("schedule must be", S.actions, "zigzag", 2, 0, 4)
  testing.assert_error("multiple of the pipeline size", S.actions, "interleaved", 4, 0, 6, 2)
  testing.assert_error("micro_batches must be a positive integer", S.actions, "1f1b", 2, 0, 0)
  testing.assert_error("needs schedule = \"interleaved\"", S.actions, "1f1b", 2, 0, 4, 2)
end)

test("balance by parameters: embeddings on the first stage, head on the last", function()
  testing.assert_equal(pp.balance_by_params({10, 10, 10, 10}, 0, 0, 2), {2, 2})
  testing.assert_equal(pp.balance_by_params({10, 10, 10, 10}, 20, 0, 2), {1, 3})
  testing.assert_equal(pp.balance_by_params({10, 10, 10, 10}, 0, 20, 2), {3, 1})
  testing.assert_equal(pp.balance_by_params({10, 40, 10, 10, 10, 10}, 0, 0, 3), {1, 1, 4})
  testing.assert_equal(pp.balance_by_params({1, 1, 1, 1}, 0, 0, 4), {1, 1, 1, 1})
end)

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
-- mean), which is what a pipeline of MICRO micro-batches computes. (One backward over the
-- whole batch sums in another order: 10 AdamW steps at lr 1e-2 carry that rounding to
-- 1.5e-5 in llama's wte, over the 1e-5 bar, for both.)
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

local function compare(name, st, losses, who)
  local ref = reference_of(name)
  for step = 1, STEPS do
    testing.assert_close(losses[step], ref.losses[step], {rtol = 1e-5, atol = 0, msg = who .. " loss of step " .. step})
  end
  local n = 0
  for pname, p in st.model:named_parameters() do
    local r = ref.params[pname]
    assert(r ~= nil, who .. ": " .. pname .. " is not a parameter of the full model")
    if pname:find("attn%.qkv%.bias$") then
      -- The key bias's gradient is zero in exact arithmetic (softmax ignores a shift of a
      -- row's scores), so it is rounding noise, which AdamW scales up to lr-sized steps:
      -- any change of summation order (here the tied embedding's grad, summed per stage)
      -- moves it by ~1e-5. It stays compared, with atol 1e-4; q and v at 1e-5.
      local H = CFG[name].n_head
      local Hkv = CFG[name].n_kv_head or H
      local rows = p:size(0) -- [q | k | v] rows, of this tp rank's heads under tp
      local C, kv = rows * H / (H + 2 * Hkv), rows * Hkv / (H + 2 * Hkv)
      testing.assert_close(p:narrow(0, 0, C), r:narrow(0, 0, C), {rtol = 1e-5, atol = 1e-5, msg = who .. " " .. pname})
      testing.assert_close(p:narrow(0, C, kv), r:narrow(0, C, kv), {rtol = 1e-5, atol = 1e-4,
        msg = who .. " " .. pname .. " (key part)"})
      testing.assert_close(p:narrow(0, C + kv, kv), r:narrow(0, C + kv, kv), {rtol = 1e-5, atol = 1e-5,
        msg = who .. " " .. pname})
    else
      testing.assert_close(p, r, {rtol = 1e-5, atol = 1e-5, msg = who .. " " .. pname})
    end
    n = n + 1
  end
  assert(n > 0, who .. ": the stage holds no parameters")
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
      assert(op == "sum")
      collective(self, t, function(c)
        local s = c[0]:clone()
        for r = 1, self.size - 1 do s = s + c[r] end
        return s
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
  for s = 0, P - 1 do
    compare(name, results[s][1], results[s][2], string.format("%s pp%d %s stage %d", name, P, opts.schedule, s))
  end
end

-- (no communication: run once per job size, not again under -np 4)
local world_size = require("lutra.dist.comm").init().size
if world_size <= 2 then
  test("in-process pipeline, gpt2 (tied), 1f1b over 2 stages and interleaved over 2 x 2 = the unsplit model", function()
    in_process("gpt2", 2, {schedule = "1f1b", micro_batches = MICRO})
    in_process("gpt2", 2, {schedule = "interleaved", micro_batches = MICRO, virtual_stages = 2})
  end)

  test("in-process pipeline, llama, gpipe over 4 stages = the unsplit model", function()
    in_process("llama", 4, {schedule = "gpipe", micro_batches = MICRO})
  end)
end

-- ---- over MPI: one pipeline of world-size stages -------------------------------------------

local comm = require "lutra.dist.comm"
local dist = require "lutra.dist"
local world = comm.init()
local P = world.size
local mesh = dist.init{pp = P}
local pp_group = comm.split(0, world.rank, "pp_test") -- the same ranks, as a plain Group

local function mpi_case(name, where, opts, cfg_name)
  local st, losses = pipelined(CFG[name], where, opts)
  compare(cfg_name or name, st, losses, string.format("%s pp%d %s stage %d", name, P, opts.schedule, st.stage))
  -- the loss is the same number on every rank
  local t = lt.tensor({losses[STEPS]}, {dtype = "f64"})
  local hi = t:clone()
  world:all_reduce(t, "min")
  world:all_reduce(hi, "max")
  testing.assert_equal(t:item(), hi:item(), "the loss differs between ranks")
  return st
end

test("mpirun: gpt2 (tied embeddings) 1f1b over the mesh = the unsplit model", function()
  local st = mpi_case("gpt2", mesh, {schedule = "1f1b", micro_batches = MICRO})
  local names = {}
  for pname in st.model:named_parameters() do names[#names + 1] = pname end
  local s = st.stage
  testing.assert_equal(names[1] == "wte.weight", s == 0 or s == P - 1, "wte.weight on the first and last stage")
  if s == P - 1 and P > 1 then
    assert(spec.get(st.model.lm_head.weight).dup, "the last stage's tied copy is marked dup")
    assert(rawequal(st.model.lm_head.weight, st.model.wte.weight), "the copy is lm_head's weight")
  end
  -- 4 layers over P stages, named by their global index
  local per = 4 / P
  for _, pname in ipairs(names) do
    local i = pname:match("^blocks%.(%d+)%.")
    if i then assert(tonumber(i) >= s * per and tonumber(i) < (s + 1) * per, "stage " .. s .. " holds " .. pname) end
  end
end)

test("mpirun: gpt2 gpipe over a Group (tied grads over comm.split) = the unsplit model", function()
  mpi_case("gpt2", pp_group, {schedule = "gpipe", micro_batches = MICRO})
end)

test("mpirun: llama 1f1b and gpipe = the unsplit model", function()
  mpi_case("llama", mesh, {schedule = "1f1b", micro_batches = MICRO})
  mpi_case("llama", mesh, {schedule = "gpipe", micro_batches = MICRO})
end)

test("mpirun: interleaved 1f1b (2 chunks per rank) = the unsplit model", function()
  CFG.gpt2_8 = with(CFG.gpt2, {n_layer = 2 * P})
  mpi_case("gpt2_8", mesh, {schedule = "interleaved", micro_batches = MICRO, virtual_stages = 2})
end)

test("mpirun: the trace of 1f1b on each stage is the schedule's order", function()
  local seen = {}
  exec.trace = function(st, a) seen[#seen + 1] = a end
  local ok, err = pcall(mpi_case, "llama", mesh, {schedule = "1f1b", micro_batches = MICRO})
  exec.trace = nil
  assert(ok, err)
  local one = {}
  for i = 1, 2 * MICRO do one[i] = seen[i] end
  local want = {
    [1] = {"F1 B1 F2 B2 F3 B3 F4 B4"},
    [2] = {"F1 B1 F2 B2 F3 B3 F4 B4", "F1 F2 B1 F3 B2 F4 B3 B4"},
    [4] = {"F1 B1 F2 B2 F3 B3 F4 B4", "F1 F2 B1 F3 B2 F4 B3 B4", "F1 F2 F3 B1 F4 B2 B3 B4", "F1 F2 F3 F4 B1 B2 B3 B4"},
  }
  testing.assert_equal(S.describe(one), want[P][P - world.rank], "stage " .. world.rank)
  testing.assert_equal(#seen, 2 * MICRO * STEPS)
end)

test("mpirun: eval gives the last stage's loss on every rank (1f1b and interleaved stages)", function()
  local xs, ys = data(3)
  local cfg = with(CFG.gpt2, {n_layer = 2 * P})
  lt.manual_seed(7)
  local ref = models.build(cfg)
  local _, want = lt.no_grad(function() return ref(xs[1], ys[1]) end)
  for _, o in ipairs{{micro_batches = MICRO}, {schedule = "interleaved", micro_batches = P, virtual_stages = 2}} do
    lt.manual_seed(7)
    local st = pp.parallelize(models.build(cfg), mesh, o)
    local got = st:eval({x = xs[1], y = ys[1]})
    testing.assert_close(got, want:item(), {rtol = 1e-6, atol = 0, msg = o.schedule or "1f1b"})
    assert(st.model.training, "eval leaves the stage in training mode")
  end
end)

-- ---- 3D: through the trainer's step (lutra.dist.parallelize: tp, then pp, then dp) ----------

-- Trains CFG[name] under `layout` (config.parallel) as lutra.train does with a mesh; this
-- rank's dp share of each global batch is one local batch, split into the layout's
-- micro-batches. Returns the losses and the local model.
local function train_layout(name, layout)
  local m = dist.init(layout)
  local xs, ys = data(0)
  lt.manual_seed(7)
  local model = models.build(CFG[name])
  local par = dist.parallelize(model, m,
    {optimizer = function(named) return optim.AdamW(optim.param_groups(named), ADAM) end})
  local rows = BATCH / m.dp_size
  local losses = {}
  for step = 1, STEPS do
    lt.tidy(function()
      par:zero_grad()
      local x = xs[step]:narrow(0, m.dp_rank * rows, rows):contiguous()
      local y = ys[step]:narrow(0, m.dp_rank * rows, rows):contiguous()
      losses[step] = par:forward_backward({{x = x, y = y}}, function(mod, b) return select(2, mod(b.x, b.y)) end)
      par:finish(1.0)
      par.optimizer:step()
      par:after_step()
    end)
  end
  return losses, par.model, m
end

local function as_stage(list)
  return {model = {named_parameters = function()
    local i = 0
    return function()
      i = i + 1
      if list[i] then return list[i][1], list[i][2] end
    end
  end}}
end

-- The layout against the unsplit model (tp shards gathered).
local function layout_case(name, layout)
  local losses, local_model, m = train_layout(name, layout)
  local tp = require "lutra.dist.tp"
  local full = {}
  for pname, p in local_model:named_parameters() do full[#full + 1] = {pname, tp.gather(local_model, p)} end
  compare(name, as_stage(full), losses, string.format("%s %s rank %d", name, m:layout(), m.rank))
end

-- The same model under tensor parallel alone over `group`, trained on the same MICRO
-- micro-batches (grad accumulation): losses and this rank's shards by name.
local function tp_reference(name, group, sp)
  local tp = require "lutra.dist.tp"
  local xs, ys = data(0)
  lt.manual_seed(7)
  local model = tp.parallelize(models.build(CFG[name]), group, {sequence_parallel = sp})
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
      tp.sync_grads(model)
      local sq = 0
      for _, p in ipairs(model:parameters()) do
        if spec.owned(p) and p.grad ~= nil then sq = sq + p.grad:norm():item() ^ 2 end
      end
      local t = lt.tensor({sq}, {dtype = "f64"})
      group:all_reduce(t, "sum")
      local coef = 1.0 / (math.sqrt(t:item()) + 1e-6)
      if coef < 1 then
        lt.no_grad(function()
          for _, p in ipairs(model:parameters()) do
            if p.grad ~= nil then p.grad:mul_(coef) end
          end
        end)
      end
      opt:step()
    end)
  end
  local params = {}
  for pname, p in pairs(model:state_dict()) do params[pname] = p end
  return {losses = losses, params = params}
end

if P == 4 then
  test("mpirun: dp2 x pp2 (1f1b and gpipe, 2 micro-batches a replica) = the unsplit model", function()
    layout_case("gpt2", {dp = 2, pp = 2, micro_batches = 2})
    layout_case("llama", {dp = 2, pp = 2, micro_batches = 2, schedule = "gpipe"})
  end)

  test("mpirun: tp2 x pp2 (1f1b, 4 micro-batches; llama also sequence-parallel) = tp2 alone on the same micro-batches",
    function()
    -- (against the unsplit model, llama's tp rounding grows to 1.4e-5 in 10 AdamW steps: tp's
    -- own matter; here the pipeline is checked on top of it: the same ranks' tp pairs)
    local group = comm.split(math.floor(world.rank / 2), world.rank % 2, "tp_ref")
    for _, case in ipairs{{"gpt2", false}, {"llama", false}, {"llama", true}} do
      local name, sp = case[1], case[2]
      local key = name .. "_tp2" .. (sp and "_sp" or "")
      ref_cache[key] = tp_reference(name, group, sp)
      CFG[key] = CFG[name]
      local losses, local_model, m = train_layout(name, {tp = 2, pp = 2, micro_batches = 4, sequence_parallel = sp})
      if sp then testing.assert_equal(local_model.seq_div, 2, "activations (B, T / 2, C) between stages") end
      local list = {}
      for pname, p in local_model:named_parameters() do list[#list + 1] = {pname, p} end
      compare(key, as_stage(list), losses, string.format("%s %s rank %d", name, m:layout(), m.rank))
    end
  end)
elseif P == 2 then
  test("mpirun: pp2 through the trainer's step (lutra.dist.parallelize)", function()
    layout_case("gpt2", {pp = 2, micro_batches = 4})
  end)
end

test("bad input: balance, too many stages, options", function()
  local function build(cfg) lt.manual_seed(7) return models.build(cfg or CFG.llama) end
  local five = {5}
  if P > 1 then
    five = {}
    for i = 1, P do five[i] = i == P and 5 - (P - 1) or 1 end
  end
  testing.assert_error("sums to 5 layers, the model has 4", pp.parallelize, build(), pp_group, {balance = five})
  testing.assert_error("balance has 3 entries for " .. P .. " pipeline stages", pp.parallelize, build(), mesh,
    {balance = {1, 1, 2}})
  testing.assert_error("balance[1] must be a positive integer", pp.parallelize, build(), mesh,
    {balance = P == 1 and {0} or P == 2 and {0, 4} or {0, 2, 1, 1}})
  if P > 1 then
    testing.assert_error(P .. " pipeline stages need at least " .. P .. " layers", pp.parallelize,
      build(with(CFG.llama, {n_layer = P - 1})), mesh, {})
  end
  testing.assert_error(5 * P .. " pipeline stages (" .. P .. " x 5 virtual) need at least", pp.parallelize, build(),
    mesh, {schedule = "interleaved", micro_batches = P, virtual_stages = 5})
  testing.assert_error("unknown option 'micro'", pp.parallelize, build(), mesh, {micro = 4})
  if P > 1 then
    testing.assert_error("multiple of the pipeline size", pp.parallelize, build(), mesh,
      {schedule = "interleaved", micro_batches = 2 * P + 1})
  end
  local st = pp.parallelize(build(), mesh, {micro_batches = MICRO})
  testing.assert_error("expected a list of 4 micro-batches", st.train_step, st, {{x = 1, y = 2}})
end)

return {}
