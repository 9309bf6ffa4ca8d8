-- np: 2
-- The extra numbers a loss_fn returns ({name = number}) reach metrics.jsonl under parallel
-- layouts, logged once by rank 0: under dp = 2 the mean of the ranks' values (each rank gives
-- its own rank + 1: 1.5 is logged), under tp = 2 the value of rank 0's dp group (the loss the
-- same on both tp ranks); one row per step, the loss and the extras of the same step. A loss_fn
-- whose names differ across the dp ranks is an error naming this rank's names. The run's time
-- split has the parallel phases (forward_backward, communication, optimizer).
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local metrics = require "lutra.train.metrics"
local T = require "lutra.testing"

comm.init()
local R = comm.rank()

local dir = os.getenv("TMPDIR") or "/tmp"
local path = string.format("%s/lutra_extras_%d.txt", dir, R)
T.word_corpus(path, {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran"}, 2000, 7)
local tok = lt.tokenizer.char(assert(io.open(path)):read("*a"))
local function loader()
  return lt.data.text(path, tok, {seq_len = 8, batch = 4, seed = 3, cache = path .. ".bin", quiet = true})
end

-- run_dir shared by the ranks (rank 0 writes it): the same name on every rank
local run_dir = string.format("%s/lutra_extras_run_%s", dir, os.getenv("OMPI_COMM_WORLD_JOBID") or "0")

local function run(parallel, loss_fn)
  lt.manual_seed(5)
  local model = lt.models.build {arch = "gpt2", n_layer = 2, n_head = 2, d_model = 16, vocab_size = tok.vocab_size,
                                 block_size = 8, dropout = 0, dtype = "f64"}
  local r = lt.train {model = model, data = loader(), loss_fn = loss_fn, quiet = true, no_interrupt = true,
                      config = {steps = 3, lr = 1e-2, warmup = 0, schedule = "constant", eval_every = 0, log_every = 1,
                                run_dir = run_dir, parallel = parallel, ckpt_every = 0, grad_accum = 2}}
  comm.world:barrier()
  return r
end

local function with_extras(model, batch)
  local _, loss = model(batch.x, batch.y)
  return loss, {rank_plus_one = R + 1, loss_again = loss}
end

for _, case in ipairs {{{dp = 2}, 1.5}, {{tp = 2}, 1}} do
  local layout, want = case[1], case[2]
  test("extra metrics under " .. (layout.dp and "dp = 2" or "tp = 2") .. ": in metrics.jsonl, once a step", function()
    local r = run(layout, with_extras)
    -- the time split of a parallel layout: forward and backward together, then the communication
    assert(r.time_split.forward_backward > 0 and r.time_split.communication > 0 and r.time_split.optimizer > 0,
      "time split " .. require("lutra.json").encode(r.time_split))
    if R == 0 then
      local rows = metrics.read(run_dir .. "/latest/metrics.jsonl")
      local steps = {}
      for _, row in ipairs(rows) do
        if row.loss ~= nil and row.step then
          steps[#steps + 1] = row
          T.assert_equal(row.rank_plus_one, want)
          -- loss_again is each rank's loss averaged like the logged loss (the global mean)
          T.assert_close(row.loss_again, row.loss, {rtol = 1e-12, atol = 0, msg = "loss_again, step " .. row.step})
        end
      end
      T.assert_equal(#steps, 3)
      T.assert_equal(#r.losses, 3)
    end
  end)
end

test("a loss_fn whose extra names differ across the dp ranks: an error naming this rank's", function()
  local ok, err = pcall(run, {dp = 2}, function(model, batch)
    local _, loss = model(batch.x, batch.y)
    return loss, R == 0 and {a = 1} or {b = 1}
  end)
  assert(not ok, "expected an error")
  local want = R == 0 and "this rank, 0, gives {a}" or "this rank, 1, gives {b}"
  assert(tostring(err):find("loss_fn's extra metrics differ across the data-parallel ranks", 1, true), tostring(err))
  assert(tostring(err):find(want, 1, true), tostring(err))
end)
