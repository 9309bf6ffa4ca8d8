-- Shared by the multi-rank layout tests (dofile'd; not a test file itself): gathering a
-- layout's pieces into whole tensors, the step-1 gradients of a layout, and the two
-- comparisons every layout test makes.
--
-- Why two comparisons. Under a layout the f32 sums run in another order (row-parallel
-- partial products, dp averages, vocab-parallel cross-entropy, the clip norm) and OpenBLAS
-- picks its kernel by CPU; AdamW's first steps, m / sqrt(v) ~ g / |g|, then turn a 1e-11
-- change of a gradient near eps into ~1e-6 of weight. So:
--   - whole training runs (10 AdamW steps, clipping on) are compared in f64, where the same
--     run agrees to ~1e-14 and a tolerance of 1e-9 relative is exact by construction;
--   - in f32, what a layout must not change is checked before the optimizer can hide it:
--     the step-1 loss, every gathered gradient and the global gradient norm, within the
--     rounding bound of f32_tolerance below.
local lt = require "lutra"
local spec = require "lutra.dist.spec"
local train_state = require "lutra.ckpt.train_state"

local M = {}

-- A copy of t cut from its graph, a leaf that requires grad: the input that a layer and its
-- parallel counterpart each take, so that both inputs' gradients can be compared.
function M.leaf(t)
  t = t:detach():clone()
  t.requires_grad = true
  return t
end

-- Relative agreement of two f64 runs of the same math (the same run agrees to ~1e-14).
M.F64_REL = 1e-9

-- The f32 rounding bound of one training step's values, relative to the magnitude of the
-- tensor compared. A length-K sum in f32 is within K*u of its exact value relative to the
-- sum of its terms' magnitudes (Higham, the dot-product lemma; u = 2^-24), whatever the
-- order, so two orders differ by at most 2*K*u. A gradient passes through `depth` such
-- reductions (forward and backward of every layer, the loss, the dp/tp sums), and the
-- first-order errors add: 2 * K * u * depth. K is the longest reduction of the step (the
-- tokens of the global batch for weight gradients, the hidden width, the vocabulary).
-- For the small models of these tests (K = 128, depth = 2 * (4 layers * 4 + 2) = 36) it is
-- 5.5e-4: far above the 1e-7..1e-6 that reordering gives, far below the factor 2 of a sum
-- for an average or the 1/2 of a dropped micro-batch.
function M.f32_tolerance(cfg, tokens)
  local u = 2 ^ -24
  local K = math.max(tokens, cfg.d_model * 4, cfg.vocab_size)
  local depth = 2 * (cfg.n_layer * 4 + 2)
  return 2 * K * u * depth
end

-- |a - b| <= rel * max|b|, element by element: relative to the tensor's scale, so that an
-- element that is zero in exact arithmetic (gpt2's key bias gradient) is held to the
-- rounding of its neighbours rather than to itself.
function M.assert_rel(a, b, rel, what)
  a, b = a:double(), b:double()
  local scale = b:abs():max():item()
  local d = (a - b):abs():max():item()
  if not (d <= rel * scale) then
    error(string.format("%s: max |diff| %.3g is %.3g of the tensor's scale %.3g (allowed %.3g)", what, d,
      scale > 0 and d / scale or math.huge, scale, rel), 2)
  end
  return scale > 0 and d / scale or 0
end

function M.assert_rel_number(a, b, rel, what)
  if not (math.abs(a - b) <= rel * math.abs(b)) then
    error(string.format("%s: %.17g under the layout, %.17g on one process (rel %.3g, allowed %.3g)", what, a, b,
      math.abs(a - b) / math.abs(b), rel), 2)
  end
  return math.abs(a - b) / math.abs(b)
end

-- Every step's loss of a layout against one process's, within rel; returns the worst.
function M.compare_losses(got, want, rel, what)
  assert(#got == #want, string.format("%s: %d losses, one process has %d", what, #got, #want))
  local worst = 0
  for i = 1, #want do
    worst = math.max(worst, M.assert_rel_number(got[i], want[i], rel, what .. " step " .. i .. " loss"))
  end
  return worst
end

-- A layout's step 1 (M.step1's loss, norm, grads) against one process's {loss =, norm =,
-- grads = name -> f64 tensor}: every gradient present on both sides, all within tol.
-- Returns the worst relative difference and the number of gradients compared.
function M.compare_step1(loss, norm, grads, ref, tol, what)
  local worst = math.max(M.assert_rel_number(loss, ref.loss, tol, what .. " loss"),
    M.assert_rel_number(norm, ref.norm, tol, what .. " gradient norm"))
  local n = 0
  for name, g in pairs(ref.grads) do
    assert(grads[name] ~= nil, what .. ": no rank has a gradient for " .. name)
    worst = math.max(worst, M.assert_rel(grads[name], g, tol, what .. " gradient of " .. name))
    n = n + 1
  end
  for name in pairs(grads) do assert(ref.grads[name] ~= nil, what .. ": a gradient for unknown " .. name) end
  return worst, n
end

-- Whole tensors from a layout's pieces. entries: {{name =, tensor =}, ...} on every rank
-- (global names; sharded tensors carry their lutra.dist.spec; dup copies are skipped).
-- Every element is taken from the lowest world rank that owns it, so replicas are not
-- summed and the result is bitwise the owner's value; an element that no rank owns is an
-- error. Returns name -> f64 tensor, the same on every rank. names: the
-- order to gather in (every rank must gather the same names in the same order).
function M.gather_entries(entries, names, shapes, world)
  local by_name = {}
  for _, e in ipairs(entries) do by_name[e.name] = e.tensor end
  local rank = world.rank
  local none = world.size -- "no rank owns it" in the owner map
  local out = {}
  for _, name in ipairs(names) do
    local t = by_name[name]
    local shape = shapes[name]
    local owner = lt.full(shape, none, {dtype = "f64"})
    local boxes = {}
    if t ~= nil and spec.owned(t) and t:numel() > 0 then
      for _, box in ipairs(spec.boxes(t)) do
        local dst, src = owner, t
        for d = 0, t.ndim - 1 do
          dst = dst:narrow(d, box.offset[d + 1], box.shape[d + 1])
          src = src:narrow(d, box.local_offset[d + 1], box.shape[d + 1])
        end
        lt.no_grad(function() dst:fill_(rank) end)
        boxes[#boxes + 1] = {box = box, src = src}
      end
    end
    world:all_reduce(owner, "min")
    local unowned = owner:eq(none):to("f64"):sum():item()
    if unowned > 0 then error(string.format("gather: %d elements of %s are owned by no rank", unowned, name), 2) end
    local full = lt.zeros(shape, {dtype = "f64"}) -- exact for every float dtype
    for _, b in ipairs(boxes) do
      local dst, mine = full, owner
      for d = 0, #shape - 1 do
        dst = dst:narrow(d, b.box.offset[d + 1], b.box.shape[d + 1])
        mine = mine:narrow(d, b.box.offset[d + 1], b.box.shape[d + 1])
      end
      lt.no_grad(function() dst:copy_(lt.where(mine:eq(rank), b.src:detach():double(), dst)) end)
    end
    world:all_reduce(full, "sum") -- one owner per element, zeros elsewhere: exact
    out[name] = full
  end
  return out
end

-- The full value of every parameter of a layout, in f64 (exact for f32 values). par: the
-- trainer's result.parallel; names: the parameter names in order; ref_params: name -> a
-- tensor of the global shape.
function M.gather(par, names, ref_params, world)
  local entries, shapes = {}, {}
  for name, p in par.model:named_parameters() do entries[#entries + 1] = {name = name, tensor = p} end
  for _, name in ipairs(names) do shapes[name] = ref_params[name].shape end
  return M.gather_entries(entries, names, shapes, world)
end

-- Every tensor of a run's state (parameters and optimizer state, as a checkpoint names
-- them), gathered whole, and the optimizer's numbers. model: the single-process model or
-- par.model; opt: its optimizer. Returns {name -> tensor}, the sorted names, numbers.
function M.gather_state(model, opt, world)
  local named = {}
  for name, p in model:named_parameters() do named[#named + 1] = {name = name, tensor = p} end
  local entries, numbers = train_state.collect(named, opt)
  local names, shapes = M.global_names(entries, world)
  return M.gather_entries(entries, names, shapes, world), names, numbers
end

-- Every rank's entries' names (sorted) and their global shapes: the union over ranks, so
-- that every rank gathers the same names (a pipeline stage holds only its layers).
function M.global_names(entries, world)
  local mine = {}
  for _, e in ipairs(entries) do
    local s = spec.get(e.tensor)
    mine[#mine + 1] = e.name .. "=" .. table.concat(s and s.global or e.tensor.shape, ",")
  end
  local names, shapes = {}, {}
  for _, item in ipairs(M.union(mine, world)) do
    local name, dims = item:match("^(.*)=([%d,]*)$")
    local shape = {}
    for d in dims:gmatch("%d+") do shape[#shape + 1] = tonumber(d) end
    names[#names + 1], shapes[name] = name, shape
  end
  return names, shapes
end

-- The sorted union of every rank's list of strings.
function M.union(list, world)
  local set = {}
  for _, text in ipairs(world:all_gather_text(table.concat(list, "\n"))) do
    for item in text:gmatch("[^\n]+") do set[item] = true end
  end
  local out = {}
  for item in pairs(set) do out[#out + 1] = item end
  table.sort(out)
  return out
end

-- {name, tensor} pairs as something with named_parameters() (what optimizers take)
function M.as_module(named)
  return {named_parameters = function()
    local i = 0
    return function()
      i = i + 1
      if named[i] then return named[i][1], named[i][2] end
    end
  end}
end

-- One step of a layout up to the optimizer: forward and backward of the first batch of
-- `loader` (the global batch; each dp rank takes its rows as the trainer does), the
-- gradient sync, no clipping. Returns the global mean loss, the global gradient norm and
-- name -> whole gradient (f64), gathered from the optimizer's parameters (shards under
-- ZeRO, tp pieces, replicas). model: freshly built (it is converted in place).
function M.step1(model, layout, loader, world)
  local mesh = lt.dist.init(layout)
  local data = loader
  if mesh.dp_size > 1 then data = loader:with{dp_rank = mesh.dp_rank, dp_size = mesh.dp_size} end
  local par = lt.dist.parallelize(model, mesh, {local_batch = data.local_batch,
    optimizer = function(named) return lt.optim.SGD(M.as_module(named), {lr = 0}) end})
  local x, y = data:next()
  par:zero_grad()
  local loss = par:forward_backward({{x = x, y = y, x, y}}, function(m, b)
    local _, l = m:forward(b.x, b.y)
    return l
  end)
  local norm = par:finish(0)
  local opt = par.optimizer
  local entries = {}
  for k, key in ipairs(opt.keys) do
    local p = opt.params[k]
    if p.grad ~= nil then
      local g = p.grad
      local s = spec.get(p)
      if s then
        spec.set(g, {global = s.global, offset = s.offset, dup = s.dup})
        spec.get(g).pieces = s.pieces
      end
      entries[#entries + 1] = {name = tostring(key), tensor = g}
    end
  end
  local names, shapes = M.global_names(entries, world)
  return loss, norm, M.gather_entries(entries, names, shapes, world)
end

-- A fresh directory of this job's own, the same path on every rank of world (rank 0 makes it): a
-- test that writes checkpoints there never meets another job's files (another test run, or the
-- same test at another rank count, at the same time).
function M.job_dir(world, name)
  local dir = ""
  if world.rank == 0 then
    dir = os.tmpname()
    os.remove(dir)
    dir = dir .. "_" .. name
    assert(os.execute("mkdir -p '" .. dir .. "'"))
  end
  return world:all_gather_text(dir)[1]
end

return M
