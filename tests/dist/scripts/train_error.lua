-- Rank 1's loss_fn raises in the middle of step 2 (its second micro-batch under grad_accum = 2:
-- the other ranks have posted that step's gradient reduction, or wait on a pipeline transfer);
-- the job must end at once with the message, exit status non-zero, no signal.
-- LAYOUT: "dp" (default), "zero3", "tp", "pp".
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local T = require "lutra.testing"
comm.init()
local R = comm.rank()

local path = string.format("%s/lutra_train_error_%d.txt", os.getenv("TMPDIR") or "/tmp", R)
T.word_corpus(path, {"the", "cat", "sat", "on", "a", "mat"}, 2000, 7)
local tok = lt.tokenizer.char(assert(io.open(path)):read("*a"))
local data = lt.data.text(path, tok, {seq_len = 8, batch = 4, seed = 3, cache = path .. ".bin", quiet = true})
lt.manual_seed(5)
local model = lt.models.build {arch = "gpt2", n_layer = 2, n_head = 2, d_model = 16, vocab_size = tok.vocab_size,
                               block_size = 8, dropout = 0, dtype = "f64"}
local layouts = {dp = {dp = 2, bucket_mb = 0.0001}, zero3 = {dp = 2, zero = 3, bucket_mb = 0.0001}, tp = {tp = 2},
                 pp = {pp = 2}}
local done, calls = 0, 0 -- steps logged; loss_fn's calls in the current step
lt.train {model = model, data = data, quiet = true, no_interrupt = true,
          log = function(r) if r.loss then done, calls = r.step, 0 end end,
          loss_fn = function(m, batch)
            calls = calls + 1
            if R == 1 and done == 1 and calls == 2 then error("rank 1's loss_fn fails in step 2 on purpose") end
            local _, loss = m(batch.x, batch.y)
            return loss
          end,
          config = {steps = 4, lr = 1e-2, warmup = 0, eval_every = 0, log_every = 1, run_dir = "", grad_accum = 2,
                    parallel = layouts[os.getenv("LAYOUT") or "dp"]}}
print("unreachable: rank " .. R .. " finished")
