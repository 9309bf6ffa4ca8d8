-- lutra.dist.pp_exec — runs a pipeline schedule (a list of F/B actions from pp_schedule)
-- on this rank: forwards and backwards of the stage's chunks, activations (B, T, C) sent to
-- the next stage and their gradients back to the previous one.
--
-- The transfers follow lutra.dist.pp_program: g:p2p batches as Megatron-LM forms them (a
-- send with the next receive; with interleaving, a step's sends with the next step's
-- receives), which complete under NCCL's rules too (no tags, in-order streams: simulated
-- there). A batch with a receive is waited for before the action that needs it; a send
-- posted alone is waited for before its tensor is freed (at the latest, at the step's end).
-- Each micro-batch's activations are freed as soon as its backward ran.
local errors = require "lutra.errors"
local create = require "lutra.create"
local grad = require "lutra.nn.grad"
local autograd = require "lutra.autograd"
local spec = require "lutra.dist.spec"
local program = require "lutra.dist.pp_program"
local schedule = require "lutra.dist.pp_schedule"
local ops = require "lutra.ops"
local extras = require "lutra.train.extras"

local raise = errors.raise

local M = {}

-- Hooks for tests: M.trace(stage, action) is called before each action runs.
M.trace = nil

local function free(t)
  if t ~= nil and not t:is_freed() then t:free() end
end

-- The activation shape of batch b: (B, T, C), (B, T / tp, C) under sequence parallelism.
local function act_shape(st, b)
  local x = b.x or b[1]
  return x:size(0), x:size(1) / st.model.seq_div, st.model.cfg.d_model
end

-- The buffer an activation or gradient of batch b is received into.
local function buffer(st, b)
  local B, T, C = act_shape(st, b)
  return create.empty(B, T, C, {dtype = st.model.act_dtype, device = st.model.act_device})
end

local function check_activation(st, y, b, vs)
  local B, T, C = act_shape(st, b)
  if y.ndim ~= 3 or y:size(0) ~= B or y:size(1) ~= T or y:size(2) ~= C then
    raise(string.format("pp: virtual stage %d made an activation of shape [%s], expected (B, T, C) = [%d, %d, %d]",
      vs, table.concat(y.shape, ", "), B, T, C))
  end
  local want = st.model.act_dtype
  if y.dtype ~= want then
    raise(string.format("pp: virtual stage %d made a %s activation, the next stage receives %s (the model's dtype)",
      vs, y.dtype, want))
  end
  if not y:is_contiguous() then y = y:contiguous() end
  return y
end

-- The context of one run: this rank's place, the tensors in flight, what is pending.
--   inbox[key]   a received activation or gradient (or one handed over locally)
--   outbox[key]  {t =, rec =, free =}: computed, to be posted with a later batch
local function context(st)
  local P, s, v = st.size, st.stage, st.virtual_stages
  return {st = st, g = st.group, P = P, s = s, V = P * v, pending = {}, inbox = {}, outbox = {}, aux_sum = 0}
end

local function vs_of(c, k) return (k - 1) * c.P + c.s end

local function wait_all(h)
  if h ~= nil then h:wait() end
end

-- Posts one batch of transfers (pp_program's comm step) as one g:p2p (NCCL groups it);
-- with wait, returns once all are done.
local function post(c, ops, wait, batches)
  local items, frees, recs = {}, {}, {}
  for i, op in ipairs(ops) do
    local t
    if op.dir == "recv" then
      t = buffer(c.st, batches[op.micro])
      c.inbox[op.key] = t
    else
      local e = c.outbox[op.key]
      if e == nil then raise("pp: " .. op.key .. " is sent before it was computed (schedule order)") end
      c.outbox[op.key] = nil
      t = e.t
      if e.free then frees[#frees + 1] = t else recs[#recs + 1] = e.rec end
    end
    items[i] = {op.dir, t, op.peer}
  end
  local h = c.g:p2p(items)
  if wait then
    wait_all(h)
    for _, t in ipairs(frees) do free(t) end
  else
    c.pending[#c.pending + 1] = {h, frees}
    for _, rec in ipairs(recs) do rec.send = h end -- its output is freed once h is done
  end
end

-- A transfer between two chunks of this rank: a copy, straight into the inbox.
local function hand_over(c, op)
  local e = c.outbox[op.key]
  c.outbox[op.key] = nil
  c.inbox[op.key] = grad.no_grad(function() return e.t:clone() end)
  if e.free then free(e.t) end
end

local function take(c, op)
  local t = c.inbox[op.key]
  if t == nil then raise("pp: " .. op.key .. " was not received (schedule order)") end
  c.inbox[op.key] = nil
  return t
end

-- ---- the model a loss_fn sees on the last stage ------------------------------------------------

-- The trainer's loss_fn(model, batch) -> loss [, extra metrics] runs on the last stage with a
-- HeadModel for model: model(x[, y]) or model:forward(x, y) gives the logits (B, T, V; V / tp
-- under tensor parallel) [and the model's loss] of the activation that the stages computed from
-- the micro-batch's x, once a micro-batch; other fields are the stage's (cfg, loss, ...).
local Head = {}
local HeadModel = {__call = function(self, ...) return self:forward(...) end}
HeadModel.__index = function(self, k)
  local f = Head[k]
  if f ~= nil then return f end
  return rawget(self, "stage")[k]
end

function Head.forward(self, idx, targets, opts)
  local x = rawget(self, "x")
  if not rawequal(idx, x) and not (ops.is_tensor(idx) and idx.ndim == 2 and idx:size(0) == x:size(0)
      and idx:size(1) == x:size(1)) then
    raise(string.format("pp: loss_fn's model(x, ...) on the last pipeline stage gives the logits of its micro-batch's "
      .. "x [%d, %d]: call it with batch.x (got %s)", x:size(0), x:size(1),
      ops.is_tensor(idx) and "[" .. table.concat(idx.shape, ", ") .. "]" or type(idx)))
  end
  if opts and opts.cache then raise("pp: loss_fn's model(x, y, opts): no kv cache on a pipeline stage") end
  local act = rawget(self, "act")
  if act == nil then
    raise("pp: loss_fn called the model twice on one micro-batch: on the last pipeline stage it runs once a micro-batch")
  end
  rawset(self, "act", nil)
  local stage = rawget(self, "stage")
  local logits = stage:logits(act)
  rawset(self, "logits", logits)
  if targets == nil then return logits end
  local cp = rawget(self, "cp") -- context parallel: the micro-batch's context (lutra.dist.cp)
  local loss = cp and cp:loss(logits, targets, stage) or stage:loss(logits, targets)
  local aux = rawget(self, "aux") -- the last chunk's MoE aux losses, as Transformer:add_aux_loss
  if aux ~= nil then
    rawset(self, "lm_loss", loss)
    rawset(self, "aux_loss", aux)
    loss = loss + aux
  end
  return logits, loss
end

-- loss_fn on micro-batch b, y the activation from the stages: the loss and its extra metrics
-- (an accumulator: numbers, read before the logits are freed).
local function call_loss_fn(st, loss_fn, y, b, aux)
  local x = b.x or b[1]
  local model = setmetatable({stage = st.model, act = y, x = x, cfg = st.model.cfg, _tp = rawget(st.model, "_tp"),
                              cp = b.cp, aux = aux}, HeadModel)
  local loss, extra = loss_fn(model, b) -- called by its name: a traceback says 'loss_fn'
  if rawget(model, "act") ~= nil then
    raise("pp: loss_fn did not call the model: on the last pipeline stage model(batch.x, ...) gives the logits "
      .. "of the activation the stages computed")
  end
  if aux ~= nil and rawget(model, "lm_loss") == nil then -- (the other stages add theirs: the objective would mix)
    raise("pp: the model has MoE layers: loss_fn must take the model's loss, model(batch.x, batch.y), which adds "
      .. "their aux losses on each pipeline stage")
  end
  if not ops.is_tensor(loss) or loss:numel() ~= 1 then
    raise("pp: loss_fn must return the loss as a one-element tensor, got "
      .. (ops.is_tensor(loss) and "[" .. table.concat(loss.shape, ", ") .. "]" or type(loss)))
  end
  local acc = extras.add(extras.new(), extra, 1)
  grad.release(rawget(model, "logits"), loss)
  return loss, acc
end

-- The sum of the aux losses (lutra.nn.moe) of chunk k's MoE layers in the forward just run,
-- nil when it has none (or outside training: Transformer:forward adds them only there).
local function chunk_aux(st, k)
  if not st.model.training or not st.model.cfg.n_experts then return nil end
  local aux
  local blocks = st.model.blocks
  for _, i in ipairs(st.model.chunks[k]) do
    local mlp = blocks[tostring(i - 1)].mlp
    local a = mlp ~= nil and rawget(mlp, "aux_loss")
    if a then aux = aux and aux + a or a end
  end
  return aux
end

-- Forward of action a (micro-batch b through local chunk a.chunk). Returns the record
-- {input =, output =, loss =, aux =, send =} kept until the backward. A chunk's MoE aux
-- losses join the objective where they are made: the last chunk's in its loss (the model's
-- loss gives lm + aux, as in one process), another chunk's in rec.aux, backpropagated with
-- the gradient its output receives (and its value in c.aux_sum, for the reported loss).
local function forward(c, a, recv, send, b, train, loss_fn)
  local st, vs = c.st, vs_of(c, a.chunk)
  local rec = {}
  local x
  if vs == 0 then
    x = st.model:embed(b.x or b[1], b.positions)
  else
    x = take(c, recv)
    if train then x:requires_grad_(true) end
    rec.input = x
  end
  local packed = (b.positions ~= nil or b.segments ~= nil or b.cp) and
    {positions = b.positions, segments = b.segments, cp = b.cp} or nil
  local y = st.model:run_chunk(a.chunk, x, packed)
  local aux = train and chunk_aux(st, a.chunk) or nil
  if vs == c.V - 1 then
    if loss_fn then
      rec.output, rec.extras = call_loss_fn(st, loss_fn, y, b, aux)
    else
      rec.output = st.model:head(y, b.y or b[2], b.cp)
      if aux ~= nil then rec.output = rec.output + aux end
    end
    rec.loss = rec.output:item()
  else
    if aux ~= nil then
      rec.aux = aux
      c.aux_sum = c.aux_sum + aux:item()
    end
    y = check_activation(st, y, b, vs)
    rec.output = y
    c.outbox[send.key] = {t = y, rec = rec}
  end
  return rec
end

-- Backward of action a, rec from its forward.
local function backward(c, a, recv, send, rec, scale)
  local vs = vs_of(c, a.chunk)
  if vs == c.V - 1 then
    local loss = rec.output
    if scale ~= 1 then
      local scaled = loss * scale
      scaled:backward()
      free(scaled)
    else
      loss:backward()
    end
  else
    local gy = take(c, recv)
    wait_all(rec.send)
    -- (a stage whose parameters are all frozen, with no input that requires grad: nothing to do)
    local roots, grads = {}, {}
    if rec.output.requires_grad then roots[1], grads[1] = rec.output, gy end
    local aux = rec.aux
    if aux ~= nil and aux.requires_grad then
      if scale ~= 1 then aux = aux * scale end
      roots[#roots + 1] = aux -- (one pass with the output: the graphs share the chunk's activations)
    end
    if #roots > 0 then autograd.backward(roots, grads) end
    if aux ~= nil and aux ~= rec.aux then free(aux) end
    rec.aux = nil
    free(gy)
  end
  free(rec.output)
  if rec.input ~= nil then
    local gx = rec.input.grad
    if gx == nil then raise(string.format("pp: virtual stage %d: the input activation got no gradient", vs)) end
    rec.input.grad = nil
    free(rec.input)
    c.outbox[send.key] = {t = gx, free = true}
  end
end

local function finish(c)
  for _, p in ipairs(c.pending) do
    wait_all(p[1])
    for _, t in ipairs(p[2]) do free(t) end
  end
  c.pending = {}
end

-- The loss sum over the micro-batches on every rank of the pipeline: the last stage's sum
-- (its chunks' aux losses in) plus the aux losses of the other chunks (c.aux_sum of every
-- rank); and that other aux sum over the pipeline.
local function share_loss(c, sum)
  if c.P == 1 then return sum + c.aux_sum, c.aux_sum end
  local t = create.tensor({(c.s == c.P - 1 and sum or 0) + c.aux_sum, c.aux_sum}, {dtype = "f64"})
  c.g:all_reduce(t, "sum")
  local v, aux = t[0]:item(), t[1]:item()
  free(t)
  return v, aux
end

-- Runs the actions' program (lutra.dist.pp_program). Returns the sum of the losses and (last
-- stage) loss_fn's extra metrics over the micro-batches (lutra.train.extras).
local function run(st, actions, batches, scale, train, loss_fn)
  local c = context(st)
  local steps = program.program(actions, c.P, c.s, st.virtual_stages, program.mode(st.schedule))
  local recs, sum, acc = {}, 0, extras.new()
  for k = 1, st.virtual_stages do recs[k] = {} end
  for _, step in ipairs(steps) do
    if step.comm then
      post(c, step.comm, step.wait, batches)
    elseif step.local_send then
      hand_over(c, step.local_send)
    else
      local a = step.action
      if M.trace then M.trace(st, a) end
      local b = batches[a.micro]
      if type(b) ~= "table" then raise("pp.train_step: micro-batch " .. a.micro .. " is not a table {x =, y =}") end
      local recv, send = program.transfers(a, c.P, c.s, st.virtual_stages)
      if a.op == "F" then
        local rec = forward(c, a, recv, send, b, train, loss_fn)
        if rec.loss then sum = sum + rec.loss end
        if rec.extras then extras.merge(acc, rec.extras, 1 / #batches) end
        if train then
          recs[a.chunk][a.micro] = rec
        else
          if send and c.outbox[send.key] then c.outbox[send.key].free = true end -- freed once sent
          if vs_of(c, a.chunk) == c.V - 1 then free(rec.output) end
          free(rec.input)
        end
      else
        backward(c, a, recv, send, recs[a.chunk][a.micro], scale)
        recs[a.chunk][a.micro] = nil
      end
    end
  end
  finish(c)
  local total, other_aux = share_loss(c, sum)
  -- loss_fn's aux_loss (the default loss reports the model's lm_loss and aux_loss) saw the
  -- last chunk's layers: the other chunks' aux losses, a micro-batch's mean, join it
  local e = acc.aux_loss
  if e ~= nil and not e.sum and other_aux ~= 0 then e.value = e.value + other_aux / #batches end
  return total, acc
end

function M.train(st, actions, batches, scale, loss_fn) return run(st, actions, batches, scale, true, loss_fn) end

-- Forward only (grad mode off): batch through every local chunk in virtual stage order.
function M.forward_only(st, batch, loss_fn)
  return (run(st, schedule.eval_actions(st.virtual_stages), {batch}, 1, false, loss_fn))
end

function M.clip_grad_norm(st, max_norm, groups)
  if type(max_norm) ~= "number" or not (max_norm >= 0) then
    raise("pp.clip_grad_norm: max_norm must be a number >= 0, got " .. tostring(max_norm))
  end
  local clip = require "lutra.optim.clip"
  local params = st.model:parameters()
  local owned = {}
  for _, p in ipairs(params) do
    if spec.owned(p) and p.grad ~= nil then owned[#owned + 1] = p.grad end
  end
  local local_norm = clip.total_norm(owned, 2, #owned)
  local t = create.tensor({local_norm * local_norm}, {dtype = "f64"})
  for _, g in ipairs(groups) do
    if g ~= nil and g.size > 1 then g:all_reduce(t, "sum") end
  end
  local total = math.sqrt(t:item())
  free(t)
  if total ~= total or total == math.huge then return total end
  local coef = max_norm / (total + 1e-6)
  if coef < 1 then
    grad.no_grad(function()
      for _, p in ipairs(params) do
        if p.grad ~= nil then ops.mul(p.grad, coef, p.grad) end
      end
    end)
  end
  return total
end

return M
