-- np: 2 4
-- nn.MoE layers in pipeline stages (lutra.dist.pp: each stage backpropagates its layers' aux
-- losses with the gradient it receives), against one process on the same global batch
-- (computed on every rank, in this process) accumulating the same micro-batches (a pipeline
-- micro-batch j of every dp rank together: the balance statistics of a micro-batch are global
-- over dp, lutra.dist.ep), each micro loss (lm + aux) scaled by 1 / m:
--   - f64 models of 4 layers, 4 experts top-2: "moe" (Llama, SwiGLU experts) dropless, gpt2
--     (GELU experts, tied embeddings) with capacity factor 1 (tokens dropped);
--   - step 1's loss, the default loss_fn's lm_loss and aux_loss metrics, every layer's balance
--     loss, the gradient norm and every gathered gradient; every loss of 3 SGD steps and the
--     final weights: 1e-9 relative;
--   - lt.train (AdamW, clipping, grad_accum 2, one pipeline micro-batch a batch): the logged loss,
--     lm_loss and aux_loss of 4 steps and the final weights against the same config in one process.
-- Layouts: np 2: pp 2 with 1f1b, gpipe, interleaved (2 chunks a rank: the last rank's first
-- chunk is not the last stage); np 4: dp 2 x pp 2, dp 2 x ep 2 x pp 2 (1f1b, gpipe), tp 2 x pp 2
-- (with and without sequence parallel).
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local extras = require "lutra.train.extras"
local default_loss = require("lutra.train.batch").default_loss
local testing = require "lutra.testing"

comm.init()
local world, N, R = comm.world, comm.size(), comm.rank()
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/dist/") .. "layout_helpers.lua")

local M = 2 -- pipeline micro-batches
local LAYOUTS = {[2] = {{pp = 2, schedule = "1f1b"}, {pp = 2, schedule = "gpipe"},
                       {pp = 2, schedule = "interleaved", virtual_stages = 2}},
                 [4] = {{dp = 2, pp = 2, schedule = "1f1b"}, {dp = 2, ep = 2, pp = 2, schedule = "1f1b"},
                        {dp = 2, ep = 2, pp = 2, schedule = "gpipe"}, {tp = 2, pp = 2, schedule = "1f1b"},
                        {tp = 2, pp = 2, schedule = "1f1b", sequence_parallel = true}}}
if not LAYOUTS[N] then testing.skip("test_moe_pp runs on 2 or 4 ranks, not " .. N) end

local MH = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/dist/") .. "moe_helpers.lua")(world, H)
local BATCH, T, VOCAB, LR = MH.BATCH, MH.T, MH.VOCAB, MH.LR
local REL = H.F64_REL
local batches, local_batch, dropped, as_module = MH.batches, MH.local_batch, MH.dropped, H.as_module

local function build(cfg)
  lt.manual_seed(1234)
  return lt.models.build(cfg)
end


-- name -> MoE layer
local function moe_layers(model)
  local out = {}
  for name, m in model:named_modules() do
    if getmetatable(m) == lt.nn.MoE then out[name] = m end
  end
  return out
end

-- Global micro-batch j (1-based) of batch b under dp ranks: micro-batch j of each dp rank's rows.
local function global_micro(b, dp, j)
  local per = BATCH / dp
  local mb = per / M
  local xs, ys = {}, {}
  for r = 0, dp - 1 do
    xs[#xs + 1] = b.x:narrow(0, r * per + (j - 1) * mb, mb)
    ys[#ys + 1] = b.y:narrow(0, r * per + (j - 1) * mb, mb)
  end
  return {x = lt.cat(xs, 0):contiguous(), y = lt.cat(ys, 0):contiguous()}
end

-- One process accumulating the layout's micro-batches: step 1's loss, metrics, balance losses
-- (of the last micro-batch, what a layer keeps) and grads, every step's loss, the final weights.
local function reference(cfg, dp)
  local model = build(cfg)
  local opt = lt.optim.SGD(model, {lr = LR})
  local ref = {losses = {}, grads = {}, balance = {}, params = {}, names = {}}
  for s, b in ipairs(batches) do
    opt:zero_grad()
    local sum, lm, aux = 0, 0, 0
    for j = 1, M do
      local loss, extra = default_loss(model, global_micro(b, dp, j))
      sum, lm, aux = sum + loss:item(), lm + extra.lm_loss, aux + extra.aux_loss
      local scaled = loss * (1 / M)
      scaled:backward()
    end
    ref.losses[s] = sum / M
    if s == 1 then
      ref.lm, ref.aux = lm / M, aux / M
      local sq = 0
      for name, p in model:named_parameters() do
        ref.grads[name] = p.grad:clone()
        sq = sq + (p.grad * p.grad):sum():item()
      end
      ref.norm = math.sqrt(sq)
      for name, m in pairs(moe_layers(model)) do ref.balance[name] = m.balance_loss:item() end
    end
    opt:step()
  end
  for name, p in model:named_parameters() do
    ref.names[#ref.names + 1] = name
    ref.params[name] = p:detach():clone()
  end
  return ref
end

local function run_layout(layout, cfg, ref, what)
  local opts = {micro_batches = M}
  for k, v in pairs(layout) do opts[k] = v end
  local mesh = lt.dist.init(opts)
  local model = build(cfg)
  local worst = 0
  local par = lt.dist.parallelize(model, mesh,
    {optimizer = function(named) return lt.optim.SGD(as_module(named), {lr = LR}) end})
  local layers = moe_layers(par.model)
  assert(next(layers) ~= nil, what .. ": this stage has no MoE layer")
  for _, m in pairs(layers) do
    testing.assert_equal(m.w_down:size(0), cfg.n_experts / (layout.ep or 1), what .. ": local experts")
  end
  for s, b in ipairs(batches) do
    par:zero_grad()
    local loss, acc = par:forward_backward({local_batch(b, mesh)}, default_loss)
    local norm = par:finish(0)
    worst = math.max(worst, H.assert_rel_number(loss, ref.losses[s], REL, what .. " step " .. s .. " loss"))
    if s == 1 then
      local ex = extras.values(par:reduce_extras(acc))
      worst = math.max(worst, H.assert_rel_number(ex.lm_loss, ref.lm, REL, what .. " lm_loss metric"))
      worst = math.max(worst, H.assert_rel_number(ex.aux_loss, ref.aux, REL, what .. " aux_loss metric"))
      worst = math.max(worst, H.assert_rel_number(norm, ref.norm, REL, what .. " gradient norm"))
      for name, m in pairs(layers) do
        worst = math.max(worst, H.assert_rel_number(m.balance_loss:item(), ref.balance[name], REL,
          what .. " " .. name .. " balance loss"))
      end
      if cfg.capacity_factor then assert(dropped(par.model) > 0, what .. ": nothing dropped") end
      worst = math.max(worst, MH.compare_grads(par, ref, REL, what))
    end
    par.optimizer:step()
    par:after_step()
  end
  worst = math.max(worst, MH.compare_weights(par, ref, REL, what))
  if R == 0 then print(string.format("  %-44s f64 worst rel diff %.1e (allowed %.0e)", what, worst, REL)) end
end

local function layout_name(l)
  return string.format("dp%d ep%d tp%d pp%d %s%s", l.dp or 1, l.ep or 1, l.tp or 1, l.pp, l.schedule,
    l.sequence_parallel and " sp" or "")
end

local COMMON = {n_layer = 4, d_model = 16, n_head = 2, vocab_size = VOCAB, block_size = T, dropout = 0, dtype = "f64",
                n_experts = 4, top_k = 2, aux_loss_coef = 0.5, z_loss_coef = 0.1}
local function with(extra)
  local cfg = {}
  for k, v in pairs(COMMON) do cfg[k] = v end
  for k, v in pairs(extra) do cfg[k] = v end
  return cfg
end
local CONFIGS = {{name = "moe dropless", cfg = with {arch = "moe", n_kv_head = 2, ffn_hidden = 24}},
                 {name = "gpt2 capacity 1.0", cfg = with {arch = "gpt2", capacity_factor = 1.0}}}

for _, c in ipairs(CONFIGS) do
  local refs = {} -- dp -> reference
  for _, layout in ipairs(LAYOUTS[N]) do
    local name = layout_name(layout)
    test(c.name .. ", " .. name .. ": step 1 and 3 SGD steps equal one process (f64)", function()
      local dp = layout.dp or 1
      refs[dp] = refs[dp] or reference(c.cfg, dp)
      run_layout(layout, c.cfg, refs[dp], c.name .. " " .. name)
    end)
  end
end

-- ---- through the trainer (lt.train: AdamW, clipping, grad_accum 2, the default loss_fn) ----------
-- One pipeline micro-batch a step's batch, so that one process (the same config) is the reference.

local data = MH.text_data("moe_pp")
local tok, TT = data.tok, data.TT
local TRAIN_LAYOUT = N == 2 and {pp = 2, schedule = "1f1b"} or {dp = 2, ep = 2, pp = 2, schedule = "1f1b"}

test("lt.train, " .. layout_name(TRAIN_LAYOUT) .. ": 4 AdamW steps, their loss, lm_loss and aux_loss equal one "
  .. "process (f64)", function()
  local what = "lt.train " .. layout_name(TRAIN_LAYOUT)
  local function run(parallel)
    lt.manual_seed(7)
    local model = lt.models.build {arch = "moe", n_layer = 4, d_model = 16, n_head = 2, n_kv_head = 2, ffn_hidden = 24,
                                   n_experts = 4, vocab_size = tok.vocab_size, block_size = TT, dropout = 0,
                                   dtype = "f64", aux_loss_coef = 0.5, z_loss_coef = 0.1}
    local records = {}
    local r = lt.train{model = model, quiet = true, no_interrupt = true,
                       data = data.loader(),
                       log = function(rec) if rec.loss then records[#records + 1] = rec end end,
                       config = {steps = 4, lr = 1e-2, warmup = 0, schedule = "constant", grad_clip = 0.5,
                                 weight_decay = 0.1, grad_accum = 2, eval_every = 0, log_every = 1, run_dir = "",
                                 parallel = parallel, ckpt_every = 0}}
    return r, model, records
  end
  local ref, ref_model, want = run(nil)
  local names, params = {}, {}
  for name, p in ref_model:named_parameters() do names[#names + 1], params[name] = name, p end
  local parallel = {micro_batches = 1}
  for k, v in pairs(TRAIN_LAYOUT) do parallel[k] = v end
  local r, _, got = run(parallel)
  H.compare_losses(r.losses, ref.losses, REL, what)
  if R == 0 then -- (rank 0 logs)
    testing.assert_equal({#want, #got}, {4, 4}, what .. ": logged steps (one process, layout)")
    for i, rec in ipairs(want) do
      assert(rec.aux_loss and rec.aux_loss > 0, what .. ": the reference logs aux_loss")
      for _, k in ipairs {"loss", "lm_loss", "aux_loss"} do
        H.assert_rel_number(got[i][k], rec[k], REL, string.format("%s step %d %s", what, rec.step, k))
      end
    end
  end
  local gathered = H.gather(r.parallel, names, params, world)
  for _, name in ipairs(names) do H.assert_rel(gathered[name], params[name], REL, what .. " weight " .. name) end
end)
