-- np: 2
-- What recipes use under a launcher: lt.dist.once (rank 0 runs first and alone, the others
-- after it, every rank gets its own results; before and after lt.dist.init) and
-- model:can_save_whole() after the trainer's conversion to each layout (whole under data
-- parallel and ZeRO 1-2; pieces under tensor parallel, pipeline stages and ZeRO 3).
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local testing = require "lutra.testing"
local equal = testing.assert_equal

comm.init()
local N, R = comm.size(), comm.rank()
local world = comm.world

local dir = os.getenv("TMPDIR") or "/tmp"
-- one name on every rank: rank 0's temporary file (removed at the end)
local stamp = world:all_gather_text(R == 0 and os.tmpname() or "")[1]

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- rank 0 writes the file, the others must find it when their turn comes
local function check_once(tag)
  local path = stamp .. "." .. tag
  if R == 0 then os.remove(path) end
  world:barrier()
  local calls = 0
  local a, b, c = lt.dist.once(function(x)
    calls = calls + 1
    if R == 0 then
      assert(not exists(path), "rank 0 runs first")
      local t0 = lt.now() -- slow preparation: the others would run meanwhile without the barrier
      while lt.now() - t0 < 0.3 do end
      local f = assert(io.open(path, "w"))
      f:write("ready")
      f:close()
    else
      assert(exists(path), "rank " .. R .. " ran before rank 0 had written " .. path)
    end
    return x * 2, nil, R
  end, 21)
  equal(calls, 1)
  equal({a, b, c}, {42, nil, R})
  world:barrier()
  if R == 0 then os.remove(path) end
end

test("lt.dist.once before lt.dist.init: rank 0 first, then the others, each with its results", function()
  check_once("before")
end)

test("lt.dist.once with a mesh", function()
  lt.dist.init{dp = N}
  check_once("mesh")
end)

test("lt.dist.once: a failure on rank 0 raises on every rank, and the others never run fn", function()
  local ran = false
  local ok, err = pcall(lt.dist.once, function()
    if R == 0 then error("no corpus at /nonexistent", 0) end
    ran = true
  end)
  equal(ok, false)
  if R == 0 then
    equal(err, "no corpus at /nonexistent")
  else
    assert(err:find("dist.once: rank 0 failed: no corpus at /nonexistent", 1, true), err)
  end
  equal(ran, false)
  world:barrier()
end)

-- ---- can_save_whole after the trainer's conversion ---------------------------------------

local path = string.format("%s/lutra_recipe_api_%d_%d.txt", dir, R, N)
testing.word_corpus(path, {"the", "cat", "sat", "on", "a", "mat"}, 2000, 5)
local tok = lt.tokenizer.char(assert(io.open(path)):read("*a"))

local function trained(parallel)
  lt.manual_seed(7)
  local model = lt.models.build{arch = "gpt2", n_layer = 2, n_head = 2, d_model = 16, vocab_size = tok.vocab_size,
                                block_size = 8}
  local data = lt.data.text(path, tok, {seq_len = 8, batch = 4, seed = 3, cache = path .. ".bin", quiet = true})
  lt.train{model = model, data = data, quiet = true, no_interrupt = true,
           config = {steps = 1, warmup = 0, eval_every = 0, run_dir = "", parallel = parallel}}
  return model
end

local CASES = {
  {{dp = 2}, true}, {{dp = 2, zero = 1}, true}, {{dp = 2, zero = 2}, true}, {{dp = 2, zero = 3}, false},
  {{tp = 2}, false}, {{pp = 2}, false},
}
for _, case in ipairs(CASES) do
  local parallel, whole = case[1], case[2]
  local name = {}
  for k, v in pairs(parallel) do name[#name + 1] = k .. "=" .. v end
  table.sort(name)
  test(string.format("can_save_whole() after %s is %s", table.concat(name, " "), tostring(whole)), function()
    equal(trained(parallel):can_save_whole(), whole)
  end)
end

test("cleanup", function()
  world:barrier()
  if R == 0 then os.remove(stamp) end
end)
