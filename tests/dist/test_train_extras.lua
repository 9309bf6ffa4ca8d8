-- np: 2 4
-- The extra metrics a loss_fn returns reach metrics.jsonl under every layout, logged once a step
-- by rank 0, equal to one process's over the same global batch (computed on every rank, here):
--   - loss_fn's main loss drives backward everywhere, pipeline stages included (1.5 x the model's
--     loss, SGD without clipping: a loss_fn not called, or not backpropagated, changes every step);
--   - a summed extra ({value, reduce = "sum"}) is the global total: n_tokens = rows x T x
--     grad_accum of the global batch exactly, n_correct (argmax of the gathered logits) exactly
--     (an argmax flip needs two logits within the ~1e-14 the weights differ by);
--   - averaged extras (loss_again, logit_mean) are means of the ranks' and micro-batches' means of
--     equal rows: the same math, f64, 1e-9 relative as the layout tests (layout_helpers.lua);
--   - the val loss (steps 0 and 4) is loss_fn's, as one process's;
--   - rows: one per logged step (log_every = 2: steps 2 and 4), none missing, none twice, each
--     with rank_step_ms, rank_comm_wait_ms and rank_peak_mem_mb over the world (one process: without
--     them); a straggler (the last rank held 200 ms a micro-batch) has the smallest rank_comm_wait_ms.
-- metrics.jsonl is read with lutra.json (a whole JSON parser: the lists are arrays there).
-- A loss_fn whose names differ across the dp ranks is an error naming this rank's.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local tp = require "lutra.dist.tp"
local json = require "lutra.json"
local T = require "lutra.testing"

comm.init()
local N, R = comm.size(), comm.rank()
local F64_REL = 1e-9

local dir = os.getenv("TMPDIR") or "/tmp"
local path = string.format("%s/lutra_extras_%d_%d.txt", dir, R, N)
T.word_corpus(path, {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran"}, 2000, 7)
local tok = lt.tokenizer.char(assert(io.open(path)):read("*a"))
local BATCH, SEQ, ACCUM, STEPS = 8, 8, 2, 4
local function loader()
  return lt.data.text(path, tok, {seq_len = SEQ, batch = BATCH, seed = 3, cache = path .. ".bin", quiet = true})
end

-- run_dir shared by the ranks (rank 0 writes it): the same name on every rank
local job = os.getenv("OMPI_COMM_WORLD_JOBID") or "0"

local function with_extras(model, batch)
  local logits, loss = model(batch.x, batch.y)
  local full = tp.gather_logits(model, logits) -- (B, T, V) on every tp rank (no tp: logits)
  local correct = full:argmax(-1):eq(batch.y):long():sum():item()
  return loss * 1.5, {loss_again = loss, logit_mean = full:mean(), n_correct = {correct, reduce = "sum"},
                      n_tokens = {batch.y:numel(), reduce = "sum"}}
end

local function run(parallel, loss_fn, run_dir, log)
  lt.manual_seed(5)
  local model = lt.models.build {arch = "gpt2", n_layer = 2, n_head = 2, d_model = 16, vocab_size = tok.vocab_size,
                                 block_size = SEQ, dropout = 0, dtype = "f64"}
  local r = lt.train {model = model, data = loader(), loss_fn = loss_fn, quiet = true, no_interrupt = true, log = log,
                      config = {steps = STEPS, lr = 0.1, warmup = 0, schedule = "constant", optimizer = "sgd",
                                grad_clip = 0, eval_every = STEPS, eval_iters = 2, log_every = 2, run_dir = run_dir or "",
                                parallel = parallel, ckpt_every = 0, grad_accum = ACCUM}}
  if parallel then comm.world:barrier() end
  return r
end

-- one process over the global batch: the records of its logged steps
local reference, ref_val = {}, {}
run(nil, with_extras, nil, function(rec)
  if rec.loss then reference[#reference + 1] = rec end
  if rec.val_loss then ref_val[#ref_val + 1] = rec end
end)

local function layout_name(l)
  local parts = {}
  for _, k in ipairs {"dp", "tp", "pp", "schedule"} do
    if l[k] then parts[#parts + 1] = k .. "=" .. tostring(l[k]) end
  end
  return table.concat(parts, " ")
end

-- metrics.jsonl of run_dir (under runs/<id>/ when the run directory has a `latest` link)
local function metrics_path(run_dir)
  local f = io.open(run_dir .. "/latest/metrics.jsonl")
  if f then
    f:close()
    return run_dir .. "/latest/metrics.jsonl"
  end
  return run_dir .. "/metrics.jsonl"
end

local LAYOUTS = {
  [2] = {{dp = 2}, {tp = 2}, {pp = 2, schedule = "1f1b"}, {pp = 2, schedule = "gpipe"}},
  [4] = {{dp = 2, pp = 2}, {tp = 2, pp = 2}, {dp = 2, tp = 2}},
}

for _, layout in ipairs(LAYOUTS[N] or {}) do
  test("extra metrics under " .. layout_name(layout) .. ": one process's, once a logged step, with each rank's time",
    function()
      local run_dir = string.format("%s/lutra_extras_run_%s_%s", dir, job, layout_name(layout):gsub("[ =]", "_"))
      local logged, val = {}, {}
      local r = run(layout, with_extras, run_dir, function(rec)
        if rec.loss then logged[#logged + 1] = rec end
        if rec.val_loss then val[#val + 1] = rec end
      end)
      -- the time split of a parallel layout: forward and backward together, then the communication
      assert(r.time_split.forward_backward > 0 and r.time_split.communication > 0 and r.time_split.optimizer > 0,
        "time split " .. json.encode(r.time_split))
      T.assert_equal(#r.losses, STEPS)
      -- every rank's records carry the extras (rank 0 writes them)
      T.assert_equal(#logged, 2)
      local rows = logged
      if R == 0 then
        rows = {}
        for _, row in json.lines(metrics_path(run_dir)) do
          if row.loss ~= nil then rows[#rows + 1] = row end
        end
      end
      T.assert_equal(#rows, 2, "rows with a loss")
      -- the val loss is loss_fn's too (the pipeline's last stage calls it): at steps 0 and 4
      T.assert_equal(#val, 2, "val records")
      for i, v in ipairs(val) do
        T.assert_equal(v.step, ref_val[i].step)
        T.assert_close(v.val_loss, ref_val[i].val_loss, {rtol = F64_REL, atol = 0, msg = layout_name(layout) .. ": val_loss"})
      end
      for i, row in ipairs(rows) do
        local ref = reference[i]
        local what = layout_name(layout) .. ", step " .. tostring(row.step)
        T.assert_equal(row.step, 2 * i, what .. ": the logged steps")
        T.assert_close(row.loss, ref.loss, {rtol = F64_REL, atol = 0, msg = what .. ": loss"})
        T.assert_close(row.loss, 1.5 * row.loss_again, {rtol = 1e-12, atol = 0, msg = what .. ": loss_fn's loss"})
        T.assert_close(row.loss_again, ref.loss_again, {rtol = F64_REL, atol = 0, msg = what .. ": loss_again"})
        T.assert_close(row.logit_mean, ref.logit_mean, {rtol = F64_REL, atol = 0, msg = what .. ": logit_mean"})
        T.assert_equal(row.n_tokens, BATCH * SEQ * ACCUM, what .. ": n_tokens")
        T.assert_equal(ref.n_tokens, BATCH * SEQ * ACCUM, "one process: n_tokens")
        T.assert_equal(row.n_correct, ref.n_correct, what .. ": n_correct")
        T.assert_equal(type(row.rank_step_ms), "table", what .. ": rank_step_ms")
        T.assert_equal(#row.rank_step_ms, N, what .. ": rank_step_ms over the world")
        T.assert_equal(#row.rank_peak_mem_mb, N, what .. ": rank_peak_mem_mb over the world")
        for rank = 1, N do
          assert(row.rank_step_ms[rank] > 0, what .. ": rank_step_ms[" .. rank .. "] = " .. tostring(row.rank_step_ms[rank]))
          assert(row.rank_peak_mem_mb[rank] >= 0, what .. ": rank_peak_mem_mb")
        end
        T.assert_close(row.rank_step_ms[R + 1], row.step_ms, {rtol = 0, atol = 0, msg = what .. ": this rank's own"})
        T.assert_equal(ref.rank_step_ms, nil, "one process: no rank_step_ms")
      end
    end)
end

-- A batch with a field of its own (w: one weight a token): pipeline micro-batches get their rows of it
local function weighted(loader)
  return {local_batch = loader.local_batch, dp_size = 1, next = function()
    local x, y = loader:next()
    return {x = x, y = y, w = x:double() + 1, x, y}
  end}
end

local function weighted_loss(model, batch)
  local _, loss = model(batch.x, batch.y)
  return loss, {w_sum = {batch.w:sum(), reduce = "sum"}, w_mean = batch.w:mean()}
end

local function run_weighted(parallel)
  lt.manual_seed(5)
  local model = lt.models.build {arch = "gpt2", n_layer = 2, n_head = 2, d_model = 16, vocab_size = tok.vocab_size,
                                 block_size = SEQ, dropout = 0, dtype = "f64"}
  local rows = {}
  lt.train {model = model, data = weighted(loader()), loss_fn = weighted_loss, quiet = true, no_interrupt = true,
            log = function(rec) rows[#rows + 1] = rec end,
            config = {steps = 2, lr = 0.1, warmup = 0, optimizer = "sgd", eval_every = 0, run_dir = "",
                      parallel = parallel, grad_accum = ACCUM}}
  return rows
end

if N == 2 then
  test("pp = 2: loss_fn's micro-batches carry their rows of every batch field (w)", function()
    local ref, got = run_weighted(nil), run_weighted({pp = 2})
    T.assert_equal(#got, 2)
    for i = 1, 2 do
      T.assert_equal(got[i].w_sum, ref[i].w_sum, "w_sum, step " .. i)
      T.assert_close(got[i].w_mean, ref[i].w_mean, {rtol = 1e-12, atol = 0, msg = "w_mean, step " .. i})
    end
  end)
end

test("a loss_fn whose extra names differ across the dp ranks: an error naming this rank's", function()
  local ok, err = pcall(run, {dp = N}, function(model, batch)
    local _, loss = model(batch.x, batch.y)
    return loss, R == 0 and {a = 1} or {b = 1}
  end)
  assert(not ok, "expected an error")
  local want = R == 0 and "this rank, 0, gives {a}" or string.format("this rank, %d, gives {b}", R)
  assert(tostring(err):find("loss_fn's extra metrics differ across the data-parallel ranks", 1, true), tostring(err))
  assert(tostring(err):find(want, 1, true), tostring(err))
end)

test("a sum declared on some dp ranks only: an error naming the reductions", function()
  local ok, err = pcall(run, {dp = N}, function(model, batch)
    local _, loss = model(batch.x, batch.y)
    return loss, {n = R == 0 and {1, reduce = "sum"} or 1}
  end)
  assert(not ok, "expected an error")
  assert(tostring(err):find(R == 0 and "gives {n (sum)}" or "gives {n}", 1, true), tostring(err))
end)


-- A straggler: the last rank's loss_fn holds it 200 ms a micro-batch; the others reach the gradients'
-- reduction first and wait there for it, so its rank_comm_wait_ms is the smallest by far.
test("a straggler under dp: rank_comm_wait_ms names the slow rank (the others wait for it)", function()
  local ffi = require "ffi"
  pcall(ffi.cdef, "int usleep(unsigned int usec);")
  local rows = {}
  run({dp = N}, function(model, batch)
    if R == N - 1 then ffi.C.usleep(200000) end
    local _, loss = model(batch.x, batch.y)
    return loss
  end, nil, function(rec) if rec.loss then rows[#rows + 1] = rec end end)
  T.assert_equal(#rows, 2)
  for _, row in ipairs(rows) do
    local wait = row.rank_comm_wait_ms
    T.assert_equal(#wait, N, "rank_comm_wait_ms over the world")
    for rank = 1, N - 1 do
      -- 2 micro-batches of 200 ms: the others wait about 400 ms, the slow rank about none
      assert(wait[rank] > wait[N] + 200, string.format("step %d: rank %d waited %.1f ms, the slow rank %d %.1f ms",
        row.step, rank - 1, wait[rank], N - 1, wait[N]))
    end
    T.assert_close(wait[R + 1], row.comm_wait_ms, {rtol = 0, atol = 0, msg = "this rank's own"})
  end
end)
