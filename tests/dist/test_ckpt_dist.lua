-- np: 2 4
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
for _, e in ipairs(st.tensors) do e.tensor:fill_(0) end -- training goes on
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
g:barrier()
if rank == 0 then os.execute("rm -rf " .. root) end
end)
