-- np: 2 4
-- Resharded resume (lutra.ckpt.train_state), in f64: a gpt2 trained 5 steps under ZeRO
-- stage 1 / 3 over the world, saved, restored into a single-process model and optimizer on
-- every rank (bitwise the state the shards held), trained 5 more steps: every loss and
-- parameter match the uninterrupted single-process run to 1e-9 relative (10 AdamW steps with
-- clipping; layout_helpers.lua says why f64); and the other way, a single-process checkpoint
-- restored into ZeRO 3 shards (bitwise, then 5 steps) and into tensor-parallel pieces (its
-- loss; saved again from tp, bitwise the single checkpoint).
-- lutra.ckpt across ranks: every rank saves its row shard (uneven, possibly empty) of W, its
-- tensor-parallel style q/k/v row pieces of a fused weight, a replicated bias (written once,
-- by one rank), a dup copy (skipped) and its own extra state; rank 0 commits. Then every rank
-- reads W whole, as column shards of this world, as row shards of another world size, and the
-- qkv weight whole, bitwise equal to the weights every rank can rebuild from the seed. Again
-- with an async save. A tensor whose ranks disagree on its shape fails on every rank.
local lt = require "lutra"
local ckpt = require "lutra.ckpt"
local spec = require "lutra.dist.spec"
local comm = require "lutra.dist.comm"
local T = require "lutra.testing"
local ts = require "lutra.ckpt.train_state"
local zero = require "lutra.dist.zero"
local tp = require "lutra.dist.tp"
local script = debug.getinfo(1, "S").source:sub(2)
local E = dofile((script:match("^(.*)/[^/]*$") or ".") .. "/dp_equiv.lua")
local ffi = require("lutra.ffi").ffi
local equal, fails = T.assert_equal, T.assert_error

comm.init()
local g = comm.world
local rank, n = g.rank, g.size

local function bytes_of(t)
  local c = t:contiguous()
  return ffi.string(ffi.cast("const char *", c:data_ptr()), c:numel() * c:element_size())
end
local function same_bytes(a, b, what)
  equal(table.concat(a.shape, ","), table.concat(b.shape, ","), what)
  if bytes_of(a) ~= bytes_of(b) then error(what .. ": bytes differ on rank " .. rank, 2) end
end

-- rank 0's temporary directory, broadcast to the others
local function shared_dir()
  local name = rank == 0 and (os.tmpname()) or ""
  local len = lt.tensor({#name}, {dtype = "i64"})
  g:broadcast(len, 0)
  local buf = lt.zeros({len:item()}, {dtype = "u8"})
  if rank == 0 then
    os.remove(name)
    ffi.copy(ffi.cast("char *", buf:data_ptr()), name, #name)
  end
  g:broadcast(buf, 0)
  return ffi.string(ffi.cast("const char *", buf:data_ptr()), len:item())
end

local root = shared_dir()
local R, C = 10, 6
lt.manual_seed(42)
local W = lt.randn(R, C)
local QKV = lt.randn(3 * 2 * n, C) -- q, k, v blocks of 2 rows per rank each
local B = lt.randn(5):to("bf16")

local function row_shard(t, parts, i) -- FSDP style: ceil(R / parts) rows each, the last ones short or empty
  local rows = t:size(0)
  local per = math.ceil(rows / parts)
  local lo = math.min(i * per, rows)
  local hi = math.min(lo + per, rows)
  local s = t:narrow(0, lo, hi - lo):clone()
  local off = {lo}
  for d = 2, t.ndim do off[d] = 0 end
  spec.set(s, {global = t.shape, offset = off})
  return s
end

local function my_qkv()
  local per = 2
  local parts, pieces, at = {}, {}, 0
  for j = 0, 2 do -- this rank's rows of q, then k, then v
    local g0 = j * 2 * n + rank * per
    parts[#parts + 1] = QKV:narrow(0, g0, per)
    pieces[#pieces + 1] = {offset = {g0, 0}, local_offset = {at, 0}, shape = {per, C}}
    at = at + per
  end
  local loc = lt.cat(parts, 0)
  spec.set(loc, {global = QKV.shape, offset = {0, 0}})
  spec.get(loc).pieces = pieces
  return loc
end

local function state(step)
  local dup = B:clone()
  if rank > 0 then spec.set(dup, {global = {5}, offset = {0}, dup = true}) end
  return {step = step, layout = {dp = n, tp = 1, pp = 1, zero = 3}, config = {world = n},
    tensors = {{name = "w", tensor = row_shard(W, n, rank)}, {name = "qkv", tensor = my_qkv()},
      {name = "bias", tensor = B:clone()}, {name = "tied", tensor = dup}},
    extra = {rank = rank, rng = {seed = 42, offset = 1000 + rank}}}
end

local function check(dir, step)
  local r = ckpt.load(dir)
  equal(r.manifest.step, step)
  equal(r.manifest.world, n)
  equal(#r.manifest.files, n)
  for _, t in ipairs(r.manifest.tensors) do
    if t.name == "bias" or t.name == "tied" then equal(#t.pieces, 1, t.name .. " written once") end
    if t.name == "qkv" then equal(#t.pieces, 3 * n) end
  end
  same_bytes(r:tensor("w"), W, "whole W")
  same_bytes(r:tensor("qkv"), QKV, "whole qkv")
  same_bytes(r:tensor("bias"), B, "bias")
  same_bytes(r:tensor("tied"), B, "tied")
  -- column shards of this world
  local per = math.ceil(C / n)
  local lo = math.min(rank * per, C)
  local w = math.min(per, C - lo)
  same_bytes(r:read("w", {0, lo}, {R, w}), W:narrow(1, lo, w):contiguous(), "column shard")
  -- row shards of other world sizes, through load_into
  for _, parts in ipairs {1, 3, n + 1} do
    for i = 0, parts - 1 do
      local t = row_shard(W, parts, i)
      local target = lt.zeros(t.shape)
      spec.copy(target, t)
      r:load_into({{name = "w", tensor = target}})
      same_bytes(target, t, "row shard " .. i .. " of " .. parts)
    end
  end
  for q = 0, n - 1 do
    local x = r:extra(q)
    equal(x.rank, q)
    equal(x.rng.offset, 1000 + q)
  end
  assert(r:verify())
end

test("sharded save on every rank, resharded reads", function()
local dir1 = root .. "/step_000001"
ckpt.save(dir1, state(1), {world = g})
check(dir1, 1)
equal(ckpt.latest(root, {quiet = true}), dir1)

local dir2 = root .. "/step_000002"
local st = state(2)
ckpt.save(dir2, st, {world = g, async = true, keep = 1})
ckpt.fence() -- the writer took its copy: training goes on and changes the weights
for _, e in ipairs(st.tensors) do e.tensor:fill_(0) end
ckpt.wait()
g:barrier()
check(dir2, 2)
equal(ckpt.latest(root, {quiet = true}), dir2)
local f = io.open(dir1 .. "/manifest.json")
equal(f, nil, "step 1 pruned (keep = 1)")

end)

test("ranks that disagree on a tensor's shape all fail", function()
-- ranks that disagree on a tensor's global shape: every rank fails, none hangs
local bad = lt.zeros(2, 2)
spec.set(bad, {global = {2 + (rank == 0 and 0 or 1), 2}, offset = {0, 0}})
fails("is f32 {", function() ckpt.save(root .. "/step_000003", {tensors = {{name = "x", tensor = bad}}}, {world = g}) end)
-- one rank's bad input: every rank raises (none waits in a collective)
local list = rank == 1 and {{name = "x"}} or {{name = "x", tensor = lt.zeros(2)}}
fails("rank 1: ckpt.save: state.tensors[1] must be", function()
  ckpt.save(root .. "/step_000004", {tensors = list}, {world = g})
end)
-- rank 0's config cannot be written (a function in it): every rank raises
fails("rank 0: ", function()
  ckpt.save(root .. "/step_000005", {tensors = {{name = "x", tensor = lt.zeros(2)}}, config = {f = print}},
    {world = g, async = true})
end)
ckpt.wait()
equal(io.open(root .. "/step_000005/manifest.json"), nil)
g:barrier()
if rank == 0 then os.execute("rm -rf " .. root) end
end)

-- ---- resharded resume through lutra.ckpt.train_state ------------------------------------

local H = dofile((script:match("^(.*)/[^/]*$") or ".") .. "/layout_helpers.lua")
local optim = require "lutra.optim"
local batches = E.batches()
local HALF = E.STEPS / 2
local function build() return E.build("gpt2", {dtype = "f64"}) end

local function single_steps(model, opt, from, to)
  local losses = {}
  for s = from, to do
    lt.tidy(function()
      opt:zero_grad()
      local _, loss = model(batches[s].x, batches[s].y)
      losses[s] = loss:item()
      loss:backward()
      optim.clip_grad_norm(model, E.CLIP)
      opt:step()
    end)
  end
  return losses
end

-- the uninterrupted single-process run
local ref_losses, ref_params = {}, {}
do
  local model = build()
  ref_losses = single_steps(model, E.adamw(model), 1, E.STEPS)
  for name, p in model:named_parameters() do ref_params[name] = p end
end

local worst = 0
-- losses[from..to] against the reference's
local function check_range(losses, from, to, what)
  for s = from, to do
    worst = math.max(worst, H.assert_rel_number(losses[s], ref_losses[s], H.F64_REL, what .. ": step " .. s .. " loss"))
  end
end

-- params: name -> whole tensor
local function check_params(params, what)
  local n = 0
  for name, r in pairs(ref_params) do
    assert(params[name] ~= nil, what .. ": no parameter " .. name)
    worst = math.max(worst, H.assert_rel(params[name], r, H.F64_REL, what .. " " .. name))
    n = n + 1
  end
  assert(n > 0)
  if rank == 0 then print(string.format("  %s: worst rel diff so far %.1e (allowed %.0e)", what, worst, H.F64_REL)) end
end

local function zero_steps(z, model, from, to)
  local losses = {}
  for s = from, to do
    lt.tidy(function() losses[s] = E.zero_step(z, model, g, batches[s]) end)
  end
  return losses
end

-- two runs' whole states (layout_helpers.gather_state) are bitwise equal: the same names,
-- tensors and optimizer numbers
local function same_state(a, b, what)
  local ta, na, xa = a[1], a[2], a[3]
  local tb, nb, xb = b[1], b[2], b[3]
  equal(table.concat(na, " "), table.concat(nb, " "), what .. ": the state's names")
  for _, name in ipairs(na) do same_bytes(ta[name], tb[name], what .. ": " .. name) end
  equal(xa, xb, what .. ": the optimizer's numbers")
end

local function named_of(model)
  local list = {}
  for name, p in model:named_parameters() do list[#list + 1] = {name = name, tensor = p} end
  return list
end

for _, stage in ipairs {1, 3} do
  test(string.format("zero %d over %d ranks -> single process: the resumed run matches", stage, n), function()
    local model = build()
    local z = zero.new(model, g, {stage = stage, bucket_mb = 0.01, optimizer = E.adamw})
    local first = zero_steps(z, model, 1, HALF)
    check_range(first, 1, HALF, "zero " .. stage .. " first half")
    local saved = {H.gather_state(model, z.optimizer, g)}
    local tensors, oextra = ts.collect(named_of(model), z.optimizer)
    local dir = string.format("%s/zero%d/step_%06d", root, stage, HALF)
    ckpt.save(dir, {step = HALF, layout = {dp = n, zero = stage}, tensors = tensors, extra = {optim = oextra}},
      {world = g, async = stage == 3})
    ckpt.wait()
    g:barrier()
    -- every rank: one process, the whole model
    local m2 = build()
    lt.manual_seed(5)
    for _, e in ipairs(named_of(m2)) do lt.no_grad(function() e.tensor:normal_(0, 1) end) end
    local opt2 = E.adamw(m2)
    ts.restore(ckpt.load(dir), named_of(m2), opt2)
    equal(opt2.steps, HALF)
    same_state({H.gather_state(m2, opt2, g)}, saved, "zero " .. stage .. " -> single, restored")
    local second = single_steps(m2, opt2, HALF + 1, E.STEPS)
    check_range(second, HALF + 1, E.STEPS, "zero " .. stage .. " -> single")
    check_params(E.params_of(m2), "zero " .. stage .. " -> single")
  end)
end

test("single process -> zero 3 over the world: the resumed run matches", function()
  local dir = root .. "/single/step_000005"
  -- (every rank runs the single process: its state is the one the shards must restore)
  local single = build()
  local opt = E.adamw(single)
  single_steps(single, opt, 1, HALF)
  if rank == 0 then
    local tensors, oextra = ts.collect(named_of(single), opt)
    ckpt.save(dir, {step = HALF, tensors = tensors, extra = {optim = oextra}})
  end
  g:barrier()
  local model = build()
  local z = zero.new(model, g, {stage = 3, bucket_mb = 0.01, optimizer = E.adamw})
  ts.restore(ckpt.load(dir), named_of(model), z.optimizer)
  same_state({H.gather_state(model, z.optimizer, g)}, {H.gather_state(single, opt, g)}, "single -> zero 3, restored")
  local second = zero_steps(z, model, HALF + 1, E.STEPS)
  check_range(second, HALF + 1, E.STEPS, "single -> zero 3")
  check_params(z:full_parameters(), "single -> zero 3")
  g:barrier()
end)

test("single process -> tp over the world -> single process: q/k/v pieces and moments round trip", function()
  local dir = root .. "/single/step_000005" -- the previous test's checkpoint
  local model = build()
  tp.parallelize(model, g)
  local opt = E.adamw(model)
  ts.restore(ckpt.load(dir), named_of(model), opt)
  -- the restored tp model computes the single-process loss of the next step
  local _, loss = model(batches[HALF + 1].x, batches[HALF + 1].y)
  check_range({[HALF + 1] = loss:item()}, HALF + 1, HALF + 1, "single -> tp")
  if rank == 0 then print(string.format("  single -> tp: worst rel diff so far %.1e (allowed %.0e)", worst, H.F64_REL)) end
  -- saved again from the tp layout (its pieces) and read whole: bitwise the first checkpoint
  local tensors, oextra = ts.collect(named_of(model), opt)
  local dir2 = root .. "/tp/step_000005"
  ckpt.save(dir2, {step = HALF, layout = {tp = n}, tensors = tensors, extra = {optim = oextra}}, {world = g})
  local a, b = ckpt.load(dir), ckpt.load(dir2)
  local m2 = b.manifest
  equal(#a.manifest.tensors, #m2.tensors)
  for _, t in ipairs(a.manifest.tensors) do
    same_bytes(b:tensor(t.name), a:tensor(t.name), "tp round trip of " .. t.name)
    if t.name:match("attn%.qkv%.weight$") then equal(#b:info(t.name).pieces, 3 * n, "q, k, v rows of each rank") end
  end
  g:barrier()
end)
