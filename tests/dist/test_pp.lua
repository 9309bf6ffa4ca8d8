-- np: 2 4
-- Pipeline parallel (lutra.dist.pp) over MPI: the world is one pipeline of world-size
-- stages (and, on 4 ranks, dp2 x pp2 and tp2 x pp2 through the trainer's step); each
-- against the unsplit model in this process: 10 AdamW steps (clipping) in f64 to 1e-9
-- relative, and step 1 in f32 (loss, gradient norm, every gradient) within the f32 rounding
-- bound (pp_helpers.lua, layout_helpers.lua). Schedules alone and in-process pipelines:
-- test_pp_schedule.lua.
local lt = require "lutra"
local testing = require "lutra.testing"
local models = require "lutra.models"
local optim = require "lutra.optim"
local S = require "lutra.dist.pp_schedule"
local pp = require "lutra.dist.pp"
local exec = require "lutra.dist.pp_exec"
local spec = require "lutra.dist.spec"
-- tests/dist/pp_helpers.lua, next to this file
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./") .. "pp_helpers.lua")
local CFG, STEPS, BATCH, MICRO, ADAM = H.CFG, H.STEPS, H.BATCH, H.MICRO, H.ADAM
local with, data, micro_batches, pipelined, compare = H.with, H.data, H.micro_batches, H.pipelined, H.compare
local LH = H.LH

-- ---- over MPI: one pipeline of world-size stages -------------------------------------------

local comm = require "lutra.dist.comm"
local dist = require "lutra.dist"
local world = comm.init()
local P = world.size
local mesh = dist.init{pp = P}
local pp_group = comm.split(0, world.rank, "pp_test") -- the same ranks, as a plain Group

-- the largest of a number over the world
local function world_max(v)
  local t = lt.tensor({v}, {dtype = "f64"})
  world:all_reduce(t, "max")
  return t:item()
end

-- rank 0 prints the worst relative differences over the world next to the allowed ones
local function report(what, worst64, worst32, tol)
  worst64, worst32 = world_max(worst64), world_max(worst32)
  if world.rank == 0 then
    print(string.format("  %-36s f64 worst rel diff %.1e (allowed %.0e); f32 step 1 %.1e (bound %.1e)", what,
      worst64, LH.F64_REL, worst32, tol))
  end
end

local function mpi_case(name, where, opts)
  local who = string.format("%s pp%d %s stage %d", name, P, opts.schedule, world.rank)
  local st, losses = pipelined(CFG[name], where, opts)
  local worst = compare(name, st, losses, who)
  -- the loss is the same number on every rank
  local t = lt.tensor({losses[STEPS]}, {dtype = "f64"})
  local hi = t:clone()
  world:all_reduce(t, "min")
  world:all_reduce(hi, "max")
  testing.assert_equal(t:item(), hi:item(), "the loss differs between ranks")
  local st1, loss1, norm1 = H.pipelined_step1(name, where, opts)
  local worst32, tol = H.compare_step1(name, st1, loss1, norm1, who)
  report(string.format("%s pp%d %s", name, P, opts.schedule), worst, worst32, tol)
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
  -- every tensor of the full model's state dict is owned (not dup) by exactly one stage,
  -- under one of its names (the tied lm_head.weight is wte.weight: the first stage's)
  local ref_params = H.reference_of("gpt2").params
  local full = {}
  for name in pairs(ref_params) do full[#full + 1] = name end
  table.sort(full)
  local groups, group_of = {}, {} -- the names of each tensor, in name order
  for _, name in ipairs(full) do
    local t = ref_params[name]
    if group_of[t] == nil then
      groups[#groups + 1] = {}
      group_of[t] = groups[#groups]
    end
    local list = group_of[t]
    list[#list + 1] = name
  end
  local mine = st.model:state_dict()
  local count = lt.zeros({#groups}, {dtype = "f64"})
  lt.no_grad(function()
    for i, names in ipairs(groups) do
      for _, name in ipairs(names) do
        if mine[name] ~= nil and spec.owned(mine[name]) then count[i - 1] = 1 end
      end
    end
  end)
  world:all_reduce(count, "sum")
  for i, names in ipairs(groups) do
    testing.assert_equal(count[i - 1]:item(), 1, table.concat(names, " = ") .. ": owned by exactly one stage")
  end
end)

test("mpirun: gpt2 gpipe over a Group (tied grads over comm.split) = the unsplit model", function()
  mpi_case("gpt2", pp_group, {schedule = "gpipe", micro_batches = MICRO})
end)

test("mpirun: llama 1f1b and gpipe = the unsplit model", function()
  mpi_case("llama", mesh, {schedule = "1f1b", micro_batches = MICRO})
  mpi_case("llama", mesh, {schedule = "gpipe", micro_batches = MICRO})
end)

test("mpirun: explicit balance (uneven stages) = the unsplit model", function()
  CFG.llama_6 = with(CFG.llama, {n_layer = 6})
  local balance = ({[1] = {6}, [2] = {1, 5}, [4] = {3, 1, 1, 1}})[P]
  local st = mpi_case("llama_6", mesh, {schedule = "1f1b", micro_batches = MICRO, balance = balance})
  testing.assert_equal(st.counts, balance)
  local first = 0
  for i = 1, st.stage do first = first + balance[i] end
  local held = {}
  for pname in st.model:named_parameters() do
    local i = pname:match("^blocks%.(%d+)%.")
    if i then held[tonumber(i)] = true end
  end
  for i = 0, 5 do
    testing.assert_equal(held[i] == true, i >= first and i < first + balance[st.stage + 1], "stage " .. st.stage
      .. " holds blocks." .. i)
  end
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
  testing.assert_equal(#seen, 2 * MICRO * (STEPS + 1)) -- (and the f32 step 1)
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
    LH.assert_rel_number(got, want:item(), LH.F64_REL, o.schedule or "1f1b") -- (f64: one forward)
    assert(st.model.training, "eval leaves the stage in training mode")
  end
end)

-- ---- 3D: through the trainer's step (lutra.dist.parallelize: tp, then pp, then dp) ----------

-- Trains CFG[name] under `layout` (config.parallel) as lutra.train does with a mesh; this
-- rank's dp share of each global batch is one local batch, split into the layout's
-- micro-batches. Returns the losses and the trainer's result.parallel.
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
  return losses, par
end

-- The first global batch as a loader for layout_helpers.step1 (each dp rank its rows).
local function first_batch(x, y)
  local L = {local_batch = x:size(0)}
  function L:next() return x, y end
  function L:with(o)
    local rows = BATCH / o.dp_size
    return first_batch(x:narrow(0, o.dp_rank * rows, rows):contiguous(), y:narrow(0, o.dp_rank * rows, rows):contiguous())
  end
  return L
end

-- The layout against the unsplit model: in f64 every step's loss and every parameter
-- (gathered whole from the stages and tp pieces) after 10 steps; in f32 step 1's loss,
-- gradient norm and every gathered gradient. Returns the f64 run's result.parallel.
local function layout_case(name, layout)
  local ref = H.reference_of(name)
  local losses, par = train_layout(name, layout)
  local what = string.format("%s %s", name, par.mesh and par.mesh:layout() or "")
  local worst = 0
  for step = 1, STEPS do
    worst = math.max(worst, LH.assert_rel_number(losses[step], ref.losses[step], LH.F64_REL,
      what .. " loss of step " .. step))
  end
  lt.manual_seed(7)
  local names = {}
  for pname in models.build(CFG[name]):named_parameters() do names[#names + 1] = pname end
  local got = LH.gather(par, names, ref.params, world)
  for _, pname in ipairs(names) do
    worst = math.max(worst, LH.assert_rel(got[pname], ref.params[pname], LH.F64_REL, what .. " " .. pname))
  end
  local ref1, tol = H.reference_step1(name), H.f32_tolerance(name)
  local xs, ys = data(0)
  lt.manual_seed(7)
  local loss, norm, grads = LH.step1(models.build(with(CFG[name], {dtype = "f32"})), layout, first_batch(xs[1], ys[1]),
    world)
  local worst32 = LH.compare_step1(loss, norm, grads, ref1, tol, what .. " f32 step 1")
  local parts = {}
  for _, k in ipairs {"dp", "tp", "pp", "micro_batches", "schedule", "sequence_parallel"} do
    if layout[k] ~= nil then parts[#parts + 1] = k .. "=" .. tostring(layout[k]) end
  end
  report(name .. " " .. table.concat(parts, " "), worst, worst32, tol)
  return par
end

if P == 4 then
  test("mpirun: dp2 x pp2 (1f1b and gpipe, 2 micro-batches a replica) = the unsplit model", function()
    layout_case("gpt2", {dp = 2, pp = 2, micro_batches = 2})
    layout_case("llama", {dp = 2, pp = 2, micro_batches = 2, schedule = "gpipe"})
  end)

  test("mpirun: tp2 x pp2 (1f1b, 4 micro-batches; llama also sequence-parallel) = the unsplit model", function()
    for _, case in ipairs{{"gpt2", false}, {"llama", false}, {"llama", true}} do
      local name, sp = case[1], case[2]
      local layout = {tp = 2, pp = 2, micro_batches = 4, sequence_parallel = sp}
      local par = layout_case(name, layout)
      if sp then
        testing.assert_equal(par.model.seq_div, 2, "activations (B, T / 2, C) between stages")
      end
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
  if P > 1 then
    -- ranks that disagree stop at once (on every rank) instead of hanging in the schedule
    testing.assert_error("the " .. P .. " ranks of the pipeline disagree on micro_batches", pp.parallelize, build(),
      mesh, {micro_batches = world.rank == 0 and 8 or 4})
    testing.assert_error("disagree on schedule", pp.parallelize, build(), mesh,
      {schedule = world.rank == 0 and "gpipe" or "1f1b"})
  end
end)

return {}
