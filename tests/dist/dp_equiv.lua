-- dp_equiv.lua — what test_ddp.lua and test_zero.lua share (not a test file itself):
-- the tiny zoo models, the global batches, the single-process reference run, and the
-- comparisons (layout_helpers.lua says why): 10 AdamW steps in f64, losses and parameters
-- within 1e-9 relative of one process; in f32, step 1's gradients within the f32 bound.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local optim = require "lutra.optim"
local spec = require "lutra.dist.spec"

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/dist/") .. "layout_helpers.lua")

local M = {}

M.STEPS, M.BATCH, M.T, M.VOCAB = 10, 8, 16, 64
M.LR, M.WD, M.CLIP = 1e-2, 0.1, 1.0

function M.world()
  comm.init()
  return comm.world
end

M.H = H

-- A zoo model, f64 unless cfg says otherwise.
function M.build(arch, cfg)
  lt.manual_seed(1234)
  local c = {arch = arch, n_layer = 2, d_model = 32, n_head = 4, vocab_size = M.VOCAB, block_size = M.T, dropout = 0,
             dtype = "f64"}
  if arch == "llama" then c.n_kv_head = 2 end
  for k, v in pairs(cfg or {}) do c[k] = v end
  return lt.models.build(c)
end

-- Two linear layers (a, b) summed; b only where forward's use_b is true: a parameter that
-- some ranks leave unused.
M.TwoLinear = lt.nn.Module:extend("TwoLinear")
function M.TwoLinear:init()
  self.a = lt.nn.Linear(4, 4)
  self.b = lt.nn.Linear(4, 4)
end
function M.TwoLinear:forward(x, use_b)
  local y = self.a(x)
  if use_b then y = self.b(y) end
  return y:sum()
end

function M.adamw(params) return optim.AdamW(params, {lr = M.LR, weight_decay = M.WD}) end

-- The global batches: the same on every rank (one seed).
function M.batches()
  lt.manual_seed(99)
  local out = {}
  for s = 1, M.STEPS do
    out[s] = {x = lt.randint(0, M.VOCAB, {M.BATCH, M.T}), y = lt.randint(0, M.VOCAB, {M.BATCH, M.T})}
  end
  return out
end

-- Rows [r*B/n, (r+1)*B/n) of t: this rank's part of the global batch.
function M.local_rows(t, g, lo, n_rows)
  local per = M.BATCH / g.size
  lo = lo or 0
  n_rows = n_rows or per
  return t:narrow(0, g.rank * per + lo, n_rows):contiguous()
end

-- The loss of model on this rank's rows of batch b.
function M.local_loss(model, g, b)
  local _, loss = model(M.local_rows(b.x, g), M.local_rows(b.y, g))
  return loss
end

-- Forward and backward of one step on this rank's rows of batch b in `micro` micro-batches
-- (each loss scaled by 1/micro), all but the last under wrapper:no_sync (ddp or zero: the
-- gradients accumulate locally). Returns this rank's loss, the mean over the micro-batches.
function M.accumulate(model, wrapper, g, b, micro)
  local rows = M.BATCH / g.size / micro
  local sum = 0
  for m = 1, micro do
    local function fwd_bwd()
      local _, loss = model(M.local_rows(b.x, g, (m - 1) * rows, rows), M.local_rows(b.y, g, (m - 1) * rows, rows))
      sum = sum + loss:item() / micro
      loss = micro > 1 and loss * (1 / micro) or loss
      loss:backward()
    end
    if m < micro then wrapper:no_sync(fwd_bwd) else fwd_bwd() end
  end
  return sum
end

-- One training step of a zero.new wrapper z on batch b (micro micro-batches, default 1):
-- gradients cleared, accumulated, reduced, clipped, the optimizer stepped. Returns the loss
-- averaged over the group.
function M.zero_step(z, model, g, b, micro)
  z.optimizer:zero_grad()
  model:zero_grad()
  local loss = M.accumulate(model, z, g, b, micro or 1)
  z:finish()
  z:clip_grad_norm(M.CLIP)
  z.optimizer:step()
  z:after_step()
  return M.mean(g, loss)
end

-- Trains arch unsharded on the full batches: losses and final parameters (name -> clone).
function M.reference(arch, batches)
  local model = M.build(arch)
  local opt = M.adamw(model)
  local losses = {}
  for s, b in ipairs(batches) do
    lt.tidy(function()
      opt:zero_grad()
      local _, loss = model(b.x, b.y)
      losses[s] = loss:item()
      loss:backward()
      optim.clip_grad_norm(model, M.CLIP)
      opt:step()
    end)
  end
  local params = {}
  lt.no_grad(function()
    for name, p in model:named_parameters() do params[name] = lt.keep(p:clone()) end
  end)
  return losses, params
end

-- The mean of a number over the group.
function M.mean(g, v)
  local t = lt.tensor({v}, {dtype = "f64"})
  g:all_reduce(t, "avg")
  return t:item()
end

function M.check_losses(got, want, what)
  for s = 1, #want do H.assert_rel_number(got[s], want[s], H.F64_REL, string.format("%s: step %d loss", what, s)) end
end

-- params: name -> full tensor, compared with the reference's. Returns the worst relative difference.
function M.check_params(params, want, what)
  local n, worst = 0, 0
  for name, ref in pairs(want) do
    local p = params[name]
    assert(p ~= nil, what .. ": no parameter " .. name)
    worst = math.max(worst, H.assert_rel(p, ref, H.F64_REL, what .. " " .. name))
    n = n + 1
  end
  assert(n > 0)
  if comm.rank() == 0 then print(string.format("  %-24s f64, 10 steps: worst rel diff %.1e (allowed %.0e)", what, worst,
    H.F64_REL)) end
  return worst
end

-- Step 1 of one process in f32 on the whole first batch: name -> gradient (f64).
function M.reference_grads(arch, batch)
  local model = M.build(arch, {dtype = "f32"})
  local _, loss = model(batch.x, batch.y)
  loss:backward()
  local grads = {}
  for name, p in model:named_parameters() do grads[name] = p.grad:double() end
  return grads
end

-- The f32 bound of layout_helpers for these models and batches.
function M.f32_tolerance() return H.f32_tolerance({n_layer = 2, d_model = 32, vocab_size = M.VOCAB}, M.BATCH * M.T) end

-- got: name -> this rank's gradient (whole, or a dim-0 shard with a spec); compared with the
-- reference's rows within the f32 bound, the worst relative difference printed on rank 0.
function M.check_grads(got, want, what)
  local tol, n, worst = M.f32_tolerance(), 0, 0
  for name, g in pairs(got) do
    local ref = assert(want[name], what .. ": an unknown gradient " .. name)
    local s = spec.get(g)
    if s then ref = ref:narrow(0, s.offset[1], g:size(0)) end
    -- relative to the whole tensor's scale, as on one process (a shard may hold only zeros)
    local scale = want[name]:abs():max():item()
    local d = g:numel() > 0 and (g:double() - ref):abs():max():item() or 0
    assert(d <= tol * scale, string.format("%s: gradient of %s differs by %.3g, %.3g of its scale (f32 bound %.3g)",
      what, name, d, d / scale, tol))
    worst = math.max(worst, d / scale)
    n = n + 1
  end
  assert(n > 0, what .. ": no gradient compared")
  if comm.rank() == 0 then print(string.format("  %s step 1: worst rel diff %.1e (f32 bound %.1e)", what, worst, tol)) end
  return worst
end

function M.params_of(model)
  local out = {}
  for name, p in model:named_parameters() do out[name] = p end
  return out
end

-- The one-process reference of each arch: {gpt2 = {losses =, params =}, llama = ...}.
function M.references(batches)
  local ref = {}
  for _, arch in ipairs {"gpt2", "llama"} do
    local losses, params = M.reference(arch, batches)
    ref[arch] = {losses = losses, params = params}
  end
  return ref
end

-- What a data-parallel equivalence test starts from: the world group, the global batches and
-- the one-process reference of each arch.
function M.setup()
  local g = M.world()
  local batches = M.batches()
  return g, batches, M.references(batches)
end

return M
