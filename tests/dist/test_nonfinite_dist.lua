-- np: 2
-- config.nonfinite under parallel layouts (dp=2 plain, ZeRO 1, 2 and 3; tp=2; pp=2): every rank
-- decides alike when only one rank's loss is nan (rank 1's loss_fn multiplies its loss by nan at
-- step 3; under pp, where the stages compute the loss themselves, lr 1e30 blows step 2 up):
--   - stop: every rank raises at the same step, naming the same parameter, with its weights
--     bitwise those after the step before;
--   - skip: every rank skips the step (its weights bitwise unchanged), the run goes on, and the
--     data-parallel replicas still hold the same weights at the end;
--   - rollback (dp=2, ZeRO 2 and 3): every rank goes back to the checkpoint they saved together
--     and ends bitwise as the same layout's run without the bad step.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local testing = require "lutra.testing"
local equal, fails = testing.assert_equal, testing.assert_error

comm.init()
local N, R = comm.size(), comm.rank()
local world = comm.world

local dir = os.getenv("TMPDIR") or "/tmp"
local path = string.format("%s/lutra_nonfinite_%d_%d.txt", dir, R, N)
testing.word_corpus(path, {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"}, 3000, 99)
local tok = lt.tokenizer.char(assert(io.open(path)):read("*a"))
local function loader()
  return lt.data.text(path, tok, {seq_len = 16, batch = 8, seed = 3, cache = path .. ".bin", quiet = true})
end
-- a directory every rank names alike (rank 0's temporary name)
local base = world:all_gather_text(R == 0 and os.tmpname() or "")[1] .. "_nonfinite"

local function build()
  lt.manual_seed(7)
  return lt.models.build{arch = "gpt2", n_layer = 2, n_head = 4, d_model = 32, vocab_size = tok.vocab_size,
                         block_size = 16, dropout = 0}
end

local function config(parallel, extra)
  local cfg = {steps = 6, lr = 3e-3, warmup = 0, schedule = "constant", grad_clip = 1.0, weight_decay = 0.1,
               eval_every = 0, log_every = 1, run_dir = "", parallel = parallel}
  for k, v in pairs(extra or {}) do cfg[k] = v end
  return cfg
end

-- rank 1's loss is nan at the training calls listed in `at`
local function nan_on_rank1(at)
  local calls = 0
  return function(model, batch)
    local _, loss = model:forward(batch.x, batch.y)
    if lt.is_grad_enabled() then
      calls = calls + 1
      if R == 1 and at[calls] then loss = loss * (0 / 0) end
    end
    return loss
  end
end

-- this rank's weights (its pieces) as plain numbers
local function weights(model)
  local out = {}
  for name, p in model:named_parameters() do out[name] = p:tolist() end
  return out
end

local function snapshots(model)
  local after = {}
  return after, function(r)
    if r.loss ~= nil then after[r.step] = weights(model) end
  end
end

-- every rank's string, checked equal
local function same_on_every_rank(s, what)
  local all = world:all_gather_text(s)
  for r = 2, #all do equal(all[r], all[1], what .. ": rank " .. (r - 1) .. " vs rank 0") end
end

local function checksum(model)
  local s = 0
  for _, p in ipairs(model:parameters()) do s = s + p:double():sum():item() end
  return string.format("%.17g", s)
end

local LAYOUTS = {
  {name = "dp2", parallel = {dp = 2}, replicas = true},
  {name = "zero1", parallel = {dp = 2, zero = 1}, replicas = true},
  {name = "zero2", parallel = {dp = 2, zero = 2}, replicas = true},
  {name = "zero3", parallel = {dp = 2, zero = 3}},
  {name = "tp2", parallel = {tp = 2}},
}

for _, L in ipairs(LAYOUTS) do
  test(L.name .. ": stop: every rank stops at step 3, naming the same parameter; weights are step 2's", function()
    local model = build()
    local after, log = snapshots(model)
    local err = fails("train: step 3: loss ", function()
      lt.train{model = model, data = loader(), config = config(L.parallel), loss_fn = nan_on_rank1{[3] = true},
               quiet = true, no_interrupt = true, log = log}
    end)
    assert(err:find("gradient norm nan; the first parameter whose gradient holds a nan or inf is wte.weight. "
      .. "Stopped (nonfinite=stop) before the optimizer step", 1, true), err)
    if L.replicas then assert(err:find("train: step 3: loss nan,", 1, true), err) end
    same_on_every_rank(err:match("gradient norm.*"), "the message")
    equal(weights(model), after[2])
  end)

  test(L.name .. ": skip: every rank skips step 3 alike and goes on", function()
    local model = build()
    local after, log = snapshots(model)
    local r = lt.train{model = model, data = loader(), config = config(L.parallel, {nonfinite = "skip"}),
                       loss_fn = nan_on_rank1{[3] = true}, quiet = true, no_interrupt = true, log = log}
    equal({r.step, r.nonfinite_skips}, {6, 1})
    equal(after[3], after[2])
    assert(not testing.equal(after[4], after[3]), "step 4 did not train")
    if L.replicas then same_on_every_rank(checksum(r.parallel and r.parallel.model or model), "the weights") end
  end)
end

for _, L in ipairs {LAYOUTS[1], LAYOUTS[3], LAYOUTS[4]} do
  test(L.name .. ": rollback: every rank goes back to step 4 and ends as the run without the bad step", function()
    local clean_model = build()
    lt.train{model = clean_model, data = loader(), config = config(L.parallel), quiet = true, no_interrupt = true}
    local model = build()
    local run_dir = base .. "_" .. L.name
    local r = lt.train{model = model, data = loader(),
                       config = config(L.parallel, {nonfinite = "rollback", run_dir = run_dir, ckpt_every = 2}),
                       loss_fn = nan_on_rank1{[5] = true}, quiet = true, no_interrupt = true}
    equal({r.step, r.rollbacks}, {6, 1})
    equal(weights(model), weights(clean_model))
  end)
end

test("pp2: lr 1e30 stops both stages at step 2", function()
  local model = build()
  local err = fails("train: step 2: loss nan, gradient norm nan; the first parameter whose gradient holds a nan or inf "
    .. "is ", function()
    lt.train{model = model, data = loader(), config = config({pp = 2, schedule = "1f1b"}, {lr = 1e30}), quiet = true,
             no_interrupt = true}
  end)
  same_on_every_rank(err:match("gradient norm.*"), "the message")
end)
