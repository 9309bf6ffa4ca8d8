-- lutra.ckpt (sharded format): round trips of every dtype (scalars, empty and non-contiguous
-- tensors) compared byte for byte; resharding (a tensor saved as permuted qkv-style row boxes
-- read back whole, as column shards, as odd boxes, into non-contiguous outs; spec'd locals of
-- another layout filled by load_into); extra state and copied files; atomic saves under fault
-- injection at every point (a subprocess that dies mid-save; the previous checkpoint still
-- loads and latest still names it); async saves (copy semantics, back to back, a process that
-- exits with a save in flight); corruption (flipped byte, truncated and deleted shards, a
-- manifest that lies, broken JSON) each detected with the file, tensor and problem named, and
-- latest() falling back; prune; bad arguments.
local lt = require "lutra"
local ckpt = require "lutra.ckpt"
local spec = require "lutra.dist.spec"
local json = require "lutra.json"
local T = require "lutra.testing"
local ffi = require("lutra.ffi").ffi
local equal, fails = T.assert_equal, T.assert_error
local files = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "file_helpers.lua")
local read, write = files.read, files.write

local base = files.temp_dir()
local LUTRA = (os.getenv("LUTRA_BUILD_DIR") or "build") .. "/lutra"

local function bytes_of(t)
  local c = t:contiguous()
  return ffi.string(ffi.cast("const char *", c:data_ptr()), c:numel() * c:element_size())
end

local function same_bytes(a, b, what)
  equal(a.dtype, b.dtype, what)
  equal(table.concat(a.shape, ","), table.concat(b.shape, ","), what)
  if bytes_of(a) ~= bytes_of(b) then error((what or "tensors") .. ": bytes differ", 2) end
end

local function fresh(name)
  local d = base .. "/" .. name
  os.execute("rm -rf " .. d)
  return d
end

local function all_dtypes()
  local x = T.random_list({3, 5})
  return {
    {name = "a.f32", tensor = lt.tensor(x)},
    {name = "a.f64", tensor = lt.tensor(x, {dtype = "f64"})},
    {name = "a.bf16", tensor = lt.tensor(x, {dtype = "bf16"})},
    {name = "a.f16", tensor = lt.tensor(x, {dtype = "f16"})},
    {name = "a.i32", tensor = lt.tensor({{1, -2, 2147483647}, {-2147483648, 0, 7}}, {dtype = "i32"})},
    {name = "a.i64", tensor = lt.tensor({5, -6, 2 ^ 40}, {dtype = "i64"})},
    {name = "a.u8", tensor = lt.tensor({0, 255, 7}, {dtype = "u8"})},
    {name = "a.bool", tensor = lt.tensor({true, false, true})},
    {name = "scalar", tensor = lt.tensor(3.25)},
    {name = "empty", tensor = lt.zeros(3, 0)},
    {name = "noncontig", tensor = lt.randn(4, 6):t()},
    {name = "big", tensor = lt.randn(300, 700)}, -- 840 KB: several frames at chunk_mb = 0.25
  }
end

test("every dtype round trips bitwise, with extra state and copied files", function()
  local root = fresh("dtypes")
  local list = all_dtypes()
  write(base .. "/tok.json", '{"vocab": 3}')
  local extra = {rng = {seed = 7, offset = 2 ^ 52 + 3}, loader = {pos = 123, epoch = 2}, lr = 0.1 + 0.2, name = "x\n\"y"}
  local dir = ckpt.save(root .. "/step_000010", {step = 10, layout = {dp = 1, tp = 1}, config = {lr = 3e-4, n = 2},
    tensors = list, extra = extra, files = {["tokenizer.json"] = base .. "/tok.json"}}, {chunk_mb = 0.25})
  equal(dir, root .. "/step_000010")
  equal(read(root .. "/latest"), "step_000010\n")
  local r = ckpt.load(dir)
  equal(r.manifest.step, 10)
  equal(r.manifest.layout.dp, 1)
  equal(r.manifest.config.lr, 3e-4)
  for _, e in ipairs(list) do same_bytes(r:tensor(e.name), e.tensor, e.name) end
  local big = list[12].tensor -- 4 frames of 0.25 MB: rows of it decode only the frames holding them
  same_bytes(r:read("big", {100, 0}, {150, 700}), big:narrow(0, 100, 150):contiguous(), "rows of a multi-frame piece")
  same_bytes(r:read("big", {299, 3}, {1, 9}), big:narrow(0, 299, 1):narrow(1, 3, 9):contiguous(), "a corner")
  local x = r:extra(0)
  equal(x.rng.offset, 2 ^ 52 + 3)
  equal(x.lr, 0.1 + 0.2)
  equal(x.name, "x\n\"y")
  equal(read(dir .. "/tokenizer.json"), '{"vocab": 3}')
  assert(r:verify())
  local last = ckpt.last_save()
  assert(last.raw > 840000 and last.compressed > 0, "save statistics")
end)

-- one local tensor holding three row boxes of a (12, 10) global in permuted order (as a
-- tensor-parallel fused qkv weight holds its q, k and v rows)
local function qkv_like(W)
  local rows = {{8, 4}, {0, 4}, {4, 4}}
  local parts = {}
  for i, p in ipairs(rows) do parts[i] = W:narrow(0, p[1], p[2]) end
  local loc = lt.cat(parts, 0)
  spec.set(loc, {global = {12, 10}, offset = {0, 0}})
  local pieces, at = {}, 0
  for i, p in ipairs(rows) do
    pieces[i] = {offset = {p[1], 0}, local_offset = {at, 0}, shape = {p[2], 10}}
    at = at + p[2]
  end
  spec.get(loc).pieces = pieces
  return loc
end

test("resharding: permuted row boxes read back whole, as column shards and odd boxes", function()
  local root = fresh("reshard")
  local W = lt.randn(12, 10)
  local B = lt.randn(12):to("bf16")
  ckpt.save(root .. "/step_000001", {step = 1, tensors = {{name = "qkv.weight", tensor = qkv_like(W)},
    {name = "b", tensor = B}}})
  local r = ckpt.load(root .. "/step_000001")
  equal(#r.manifest.tensors[1].pieces, 3)
  same_bytes(r:tensor("qkv.weight"), W, "whole")
  for c = 0, 1 do -- two column shards
    same_bytes(r:read("qkv.weight", {0, c * 5}, {12, 5}), W:narrow(1, c * 5, 5):contiguous(), "column shard " .. c)
  end
  same_bytes(r:read("qkv.weight", {3, 2}, {7, 7}), W:narrow(0, 3, 7):narrow(1, 2, 7):contiguous(), "odd box")
  local out = lt.zeros(10, 12):t() -- a non-contiguous out
  r:read("qkv.weight", {0, 0}, {12, 10}, out)
  same_bytes(out, W, "non-contiguous out")
  -- load_into: locals of another layout (4 row shards of 3; bf16 halves)
  for i = 0, 3 do
    local t = lt.zeros(3, 10)
    spec.set(t, {global = {12, 10}, offset = {i * 3, 0}})
    r:load_into({{name = "qkv.weight", tensor = t}})
    same_bytes(t, W:narrow(0, i * 3, 3):contiguous(), "row shard " .. i)
  end
  local half = lt.zeros(6):to("bf16")
  spec.set(half, {global = {12}, offset = {6}})
  r:load_into({{name = "b", tensor = half}})
  same_bytes(half, B:narrow(0, 6, 6):contiguous(), "bias half")
  fails("has no tensor 'nope'", function() r:load_into({{name = "nope", tensor = half}}) end)
  equal(#r:load_into({{name = "nope", tensor = half}}, {strict = false}), 1)
  local wrong = lt.zeros(5, 10)
  fails("the model's is {5, 10}", function() r:load_into({{name = "qkv.weight", tensor = wrong}}) end)
  fails("does not fit", function() r:read("qkv.weight", {10, 0}, {3, 10}) end)
  fails("'qkv.weight' is f32, out is bf16", function() r:read("qkv.weight", nil, nil, lt.zeros(12, 10):to("bf16")) end)
  fails("out has shape {12, 9}", function() r:read("qkv.weight", nil, nil, lt.zeros(12, 9)) end)
end)

test("dup tensors are skipped; pieces that do not tile fail the save", function()
  local root = fresh("tiles")
  local a, d = lt.randn(4), lt.randn(4)
  spec.set(d, {global = {4}, offset = {0}, dup = true})
  ckpt.save(root .. "/step_000001", {tensors = {{name = "a", tensor = a}, {name = "dup", tensor = d}}})
  local r = ckpt.load(root .. "/step_000001")
  equal(#r:names(), 1)
  local part = lt.randn(2, 3)
  spec.set(part, {global = {4, 3}, offset = {2, 0}})
  fails("'p' {4, 3}: the ranks' pieces cover 6 of its 12 elements", function()
    ckpt.save(root .. "/step_000002", {tensors = {{name = "p", tensor = part}}})
  end)
  fails("given twice", function() ckpt.save(root .. "/step_000002", {tensors = {{name = "a", tensor = a}, {name = "a", tensor = a}}}) end)
  fails("must be {name = <string>, tensor = <tensor>}", function() ckpt.save(root .. "/step_000002", {tensors = {{name = "a"}}}) end)
  fails("dir must be a path string", function() ckpt.save(nil, {}) end)
  equal(read(root .. "/latest"), "step_000001\n")
end)

-- ---- atomic saves: a process killed at each point of a save --------------------------------

local function child_script(root, step, async)
  local path = base .. "/child_" .. step .. ".lua"
  write(path, string.format([[
local lt = require "lutra"
local ckpt = require "lutra.ckpt"
local w = lt.arange(0, 50000):view(100, 500):to("f32") * %d
ckpt.save(%q, {step = %d, tensors = {{name = "w", tensor = w}, {name = "b", tensor = lt.ones(7) * %d}}}, {async = %s, chunk_mb = 0.05})
if %s then ckpt.wait() end
]], step, root .. string.format("/step_%06d", step), step, step, tostring(async), tostring(async)))
  return path
end

local function run_child(root, step, async, fault)
  local env = fault and ("LUTRA_FAULT=" .. fault) or "-u LUTRA_FAULT"
  local r, _, code = os.execute(string.format("env %s %s %s 2>%s/child.err", env, LUTRA, child_script(root, step, async),
    base))
  if type(r) == "number" then return math.floor(r / 256) end -- the raw wait status
  return r and 0 or code
end

local function expect_step(root, step)
  local dir = ckpt.latest(root, {quiet = true})
  equal(dir, root .. string.format("/step_%06d", step), "latest")
  local r = ckpt.load(dir)
  local w = r:tensor("w")
  equal(w:narrow(0, 1, 1):narrow(1, 0, 1):item(), 500 * step, "w[1][0]")
  equal(r:tensor("b"):sum():item(), 7 * step)
end

test("a crash at any point of a save leaves the previous checkpoint loadable", function()
  local tried, survived = 0, 0
  for _, async in ipairs {false, true} do
    for _, point in ipairs {"save:start", "save:mid_file", "save:after_file", "save:after_manifest", "save:after_rename"} do
      local root = fresh("fault")
      equal(run_child(root, 1, async, nil), 0, "the first save")
      expect_step(root, 1)
      local code = run_child(root, 2, async, point)
      equal(code, 86, point .. ": the child died at the fault (" .. read(base .. "/child.err") .. ")")
      tried = tried + 1
      equal(read(root .. "/latest"), "step_000001\n", point .. ": latest still names step 1")
      expect_step(root, 1)
      survived = survived + 1
      -- the next save (no fault) cleans up and commits
      equal(run_child(root, 3, async, nil), 0)
      ckpt.prune(root, 5)
      expect_step(root, 3)
      for _, name in ipairs(require("lutra.ckpt.files").list(root)) do
        assert(not name:match("%.tmp$"), point .. ": a leftover " .. name)
      end
    end
  end
  -- POINT@R: only rank R dies (here rank 0 of 1 via LUTRA_RANK; rank 1's fault does not fire)
  local root = fresh("fault_rank")
  equal(run_child(root, 1, false, "save:after_file@1"), 0)
  expect_step(root, 1)
  local r, _, code = os.execute(string.format("env LUTRA_FAULT=save:after_file@0 LUTRA_RANK=0 %s %s 2>/dev/null", LUTRA,
    child_script(root, 2, false)))
  equal(type(r) == "number" and math.floor(r / 256) or code, 86)
  expect_step(root, 1)
  io.stderr:write(string.format("  fault injection: %d of %d crashes mid-save survived\n", survived, tried))
end)

-- ---- async ---------------------------------------------------------------------------------

test("async saves copy the state, run in the background, queue, and finish before exit", function()
  local root = fresh("async")
  local w = lt.randn(256, 1024)
  local keep = w:clone()
  ckpt.save(root .. "/step_000001", {step = 1, tensors = {{name = "w", tensor = w}}}, {async = true})
  ckpt.fence() -- the writer thread has taken its copy: training may change the weights now
  w:fill_(0)
  ckpt.save(root .. "/step_000002", {step = 2, tensors = {{name = "w", tensor = w}}}, {async = true}) -- waits for 1
  equal(ckpt.wait(), root .. "/step_000002")
  equal(ckpt.wait(), nil)
  assert(not ckpt.busy())
  same_bytes(ckpt.load(root .. "/step_000001"):tensor("w"), keep, "step 1")
  equal(ckpt.load(root .. "/step_000002"):tensor("w"):abs():sum():item(), 0)
  local last = ckpt.last_save()
  assert(last.stall >= 0 and last.seconds > 0, "stall and writer time measured")
  -- defer = false: the copy is taken before save returns (no fence needed)
  local root3 = fresh("async_eager")
  local v = lt.randn(64, 64)
  local v0 = v:clone()
  ckpt.save(root3 .. "/step_000001", {step = 1, tensors = {{name = "v", tensor = v}}}, {async = true, defer = false})
  v:fill_(1)
  ckpt.wait()
  same_bytes(ckpt.load(root3 .. "/step_000001"):tensor("v"), v0, "eager copy")
  -- a process that exits right after an async save still leaves it committed
  local root2 = fresh("async_exit")
  local path = base .. "/exit.lua"
  write(path, string.format([[
local lt = require "lutra"
local ckpt = require "lutra.ckpt"
ckpt.save(%q, {step = 5, tensors = {{name = "w", tensor = lt.ones(512, 1024)}}}, {async = true, level = 9})
os.exit(0)
]], root2 .. "/step_000005"))
  assert(os.execute("env -u LUTRA_FAULT " .. LUTRA .. " " .. path) == 0)
  local r = ckpt.load(ckpt.latest(root2))
  equal(r:tensor("w"):sum():item(), 512 * 1024)
end)

-- ---- corruption ----------------------------------------------------------------------------

local function three_steps(root)
  local ws = {}
  for s = 1, 3 do
    ws[s] = lt.randn(64, 64)
    ckpt.save(root .. string.format("/step_%06d", s), {step = s, tensors = {{name = "layer.w", tensor = ws[s]}}},
      {chunk_mb = 0.004})
  end
  return ws
end

local function flip(path, at)
  local s = read(path)
  at = at or math.floor(#s / 2)
  write(path, s:sub(1, at - 1) .. string.char((s:byte(at) + 77) % 256) .. s:sub(at + 1))
end

test("corruption is detected, named, and latest() falls back", function()
  local root = fresh("corrupt")
  local ws = three_steps(root)
  local s3, s2, s1 = root .. "/step_000003", root .. "/step_000002", root .. "/step_000001"
  -- a flipped byte in the data
  flip(s3 .. "/rank_00000.lz4", 200)
  local err = fails("rank_00000.lz4", function() ckpt.load(s3):tensor("layer.w") end)
  assert(err:find("tensor 'layer.w'", 1, true) and (err:find("checksum mismatch") or err:find("corrupt frame")), err)
  local dir, skipped = ckpt.latest(root, {quiet = true})
  equal(dir, s2)
  equal(skipped[1].dir, s3)
  assert(skipped[1].why:find("rank_00000.lz4"), skipped[1].why)
  same_bytes(ckpt.load(dir):tensor("layer.w"), ws[2], "fallback step 2")
  -- quick structural checks do not decode the data (the flip goes unseen), full ones do
  equal(ckpt.latest(root, {quiet = true, full = false}), s3)
  -- a truncated shard
  local s = read(s2 .. "/rank_00000.lz4")
  write(s2 .. "/rank_00000.lz4", s:sub(1, #s - 100))
  fails("truncated", function() ckpt.load(s2):tensor("layer.w") end)
  equal(ckpt.latest(root, {quiet = true}), s1)
  -- a deleted shard
  os.remove(s1 .. "/rank_00000.lz4")
  fails("rank_00000.lz4 is missing", function() ckpt.load(s1):tensor("layer.w") end)
  local none, all = ckpt.latest(root, {quiet = true})
  equal(none, nil)
  equal(#all, 3)
end)

test("a manifest that lies or is broken is caught", function()
  local root = fresh("manifest")
  three_steps(root)
  local s3, s2 = root .. "/step_000003", root .. "/step_000002"
  local m = json.decode(read(s3 .. "/manifest.json"))
  local p = m.tensors[1].pieces[1]
  p.shape[1], p.bytes = 32, 32 * 64 * 4 -- half the rows: consistent for the validator, wrong for the file
  write(s3 .. "/manifest.json", json.encode(m))
  fails("tensor 'layer.w' piece 1: the manifest says 8192 bytes, rank_00000.lz4 piece 0 holds 16384: size mismatch",
    function() ckpt.load(s3):tensor("layer.w") end)
  p.shape[1], p.bytes = 64, 64 * 64 * 4
  p.index = 3
  write(s3 .. "/manifest.json", json.encode(m))
  fails("rank_00000.lz4 holds 1 pieces, the manifest says piece 3", function() ckpt.load(s3):tensor("layer.w") end)
  p.index, p.bytes = 0, 12
  write(s3 .. "/manifest.json", json.encode(m))
  fails("bytes must be 16384", function() ckpt.load(s3) end)
  write(s3 .. "/manifest.json", "{not json")
  fails("not valid JSON", function() ckpt.load(s3) end)
  os.remove(s2 .. "/manifest.json")
  fails("is incomplete: it has no manifest.json", function() ckpt.load(s2) end)
  local dir, skipped = ckpt.latest(root, {quiet = true})
  equal(dir, root .. "/step_000001")
  equal(#skipped, 2)
  fails("no checkpoint at", function() ckpt.load(root .. "/step_000042") end)
end)

test("prune keeps the newest K readable ones, the one latest names and every one it cannot read, and removes interrupted saves", function()
  local root = fresh("prune")
  for s = 1, 5 do ckpt.save(root .. string.format("/step_%06d", s), {step = s, tensors = {{name = "x", tensor = lt.ones(2) * s}}}) end
  os.execute("mkdir -p " .. root .. "/step_000009.tmp " .. root .. "/step_000003.old-77")
  ckpt.prune(root, 2)
  local names = require("lutra.ckpt.files").list(root)
  equal(table.concat(names, " "), "latest step_000004 step_000005")
  ckpt.save(root .. "/step_000006", {step = 6, tensors = {{name = "x", tensor = lt.ones(2)}}}, {keep = 1})
  equal(table.concat(require("lutra.ckpt.files").list(root), " "), "latest step_000006")
  -- a checkpoint prune cannot read (another format version, a damaged manifest) is never removed
  -- nor counted: the newest readable ones are kept
  for st = 7, 9 do ckpt.save(root .. string.format("/step_%06d", st), {step = st, tensors = {{name = "x", tensor = lt.ones(2)}}}) end
  write(root .. "/step_000008/manifest.json", '{"format": "lutra-checkpoint", "version": 999}')
  write(root .. "/step_000006/manifest.json", "{not json")
  ckpt.prune(root, 1)
  equal(table.concat(require("lutra.ckpt.files").list(root), " "), "latest step_000006 step_000008 step_000009")
  ckpt.save(root .. "/step_000010", {step = 10, tensors = {{name = "x", tensor = lt.ones(2)}}}, {keep = 2})
  equal(table.concat(require("lutra.ckpt.files").list(root), " "), "latest step_000006 step_000008 step_000009 step_000010")
  ckpt.save(root .. "/step_000011", {step = 11, tensors = {{name = "x", tensor = lt.ones(2)}}}, {keep = 1})
  equal(table.concat(require("lutra.ckpt.files").list(root), " "), "latest step_000006 step_000008 step_000011")
  os.execute("rm -rf " .. root .. "/step_000006 " .. root .. "/step_000008")
  -- saving the same step again replaces it
  ckpt.save(root .. "/step_000006", {step = 6, tensors = {{name = "x", tensor = lt.ones(2) * 9}}})
  equal(ckpt.load(root .. "/step_000006"):tensor("x"):sum():item(), 18)
end)
