-- lutra.dist.pp_exec — runs a pipeline schedule (a list of F/B actions from pp_schedule)
-- on this rank: forwards and backwards of the stage's chunks, activations (B, T, C) sent to
-- the next stage and their gradients back to the previous one.
--
-- Sends are posted asynchronously (a Handle; waited for before the tensor is freed, and all
-- of them at the end of the step); a stage blocks only in the receive of what it needs next,
-- so a schedule that pp_schedule.simulate completes cannot deadlock. Tags keep activations
-- and gradients apart (both travel from the last rank to the first with interleaving):
-- 1 + 2 vs for the activation into virtual stage vs, 2 + 2 vs for the gradient into it.
-- Each micro-batch's activations are freed as soon as its backward ran.
local errors = require "lutra.errors"
local create = require "lutra.create"
local grad = require "lutra.nn.grad"
local spec = require "lutra.dist.spec"
local ops = require "lutra.ops"

local raise = errors.raise

local M = {}

-- Hooks for tests: M.trace(stage, action) is called before each action runs.
M.trace = nil

local function act_tag(vs) return 1 + 2 * vs end
local function grad_tag(vs) return 2 + 2 * vs end

local function free(t)
  if t ~= nil and not t:is_freed() then t:free() end
end

-- Posts t to pipeline rank peer; returns a Handle, or nil when already done. A send to
-- this rank itself (interleaving on one rank) goes through a local queue.
local function send(c, t, peer, tag)
  if peer == c.s then
    local q = c.local_queue[tag] or {}
    c.local_queue[tag] = q
    q[#q + 1] = grad.no_grad(function() return t:clone() end)
    return nil
  end
  local h = c.g:send(t, peer, {tag = tag, async = true})
  if (type(h) == "table" or type(h) == "cdata") and type(h.wait) == "function" then return h end
  return nil -- a blocking send: done
end

-- Receives into t from pipeline rank peer.
local function recv(c, t, peer, tag)
  if peer == c.s then
    local q = c.local_queue[tag]
    local src = q and table.remove(q, 1)
    if src == nil then raise("pp: nothing was sent to this rank under tag " .. tag .. " (schedule order)") end
    grad.no_grad(function() t:copy_(src) end)
    free(src)
    return
  end
  c.g:recv(t, peer, {tag = tag})
end

local function wait(h)
  if h ~= nil then h:wait() end
end

-- The activation shape of batch b: (B, T, C), (B, T / tp, C) under sequence parallelism.
local function act_shape(st, b)
  local x = b.x or b[1]
  return x:size(0), x:size(1) / st.model.seq_div, st.model.cfg.d_model
end

-- The buffer an activation or gradient of batch b is received into.
local function buffer(st, b)
  local cfg = st.model.cfg
  local B, T, C = act_shape(st, b)
  return create.empty(B, T, C, {dtype = cfg.dtype or "f32", device = cfg.device or "cpu"})
end

local function check_activation(st, y, b, vs)
  local B, T, C = act_shape(st, b)
  if y.ndim ~= 3 or y:size(0) ~= B or y:size(1) ~= T or y:size(2) ~= C then
    raise(string.format("pp: virtual stage %d made an activation of shape [%s], expected (B, T, C) = [%d, %d, %d]",
      vs, table.concat(y.shape, ", "), B, T, C))
  end
  local want = st.model.cfg.dtype or "f32"
  if y.dtype ~= want then
    raise(string.format("pp: virtual stage %d made a %s activation, the next stage receives %s (the model's dtype)",
      vs, y.dtype, want))
  end
  if not y:is_contiguous() then y = y:contiguous() end
  return y
end

-- The context of one run: where each virtual stage sits, what is pending.
local function context(st)
  local P, s, v = st.size, st.stage, st.virtual_stages
  return {st = st, g = st.group, P = P, s = s, V = P * v, pending = {}, local_queue = {}}
end

local function vs_of(c, k) return (k - 1) * c.P + c.s end
local function rank_of(c, vs) return vs % c.P end

-- Forward of micro-batch i through local chunk k. Returns the record {input =, output =,
-- loss =, send =} kept until the backward.
local function forward(c, k, i, b, train)
  local st, vs = c.st, vs_of(c, k)
  local rec = {}
  local x
  if vs == 0 then
    x = st.model:embed(b.x or b[1], b.positions)
  else
    x = buffer(st, b)
    recv(c, x, rank_of(c, vs - 1), act_tag(vs))
    if train then x:requires_grad_(true) end
    rec.input = x
  end
  local packed = (b.positions ~= nil or b.segments ~= nil) and {positions = b.positions, segments = b.segments} or nil
  local y = st.model:run_chunk(k, x, packed)
  if vs == c.V - 1 then
    rec.output = st.model:head(y, b.y or b[2])
    rec.loss = rec.output:item()
  else
    y = check_activation(st, y, b, vs)
    rec.output = y
    rec.send = send(c, y, rank_of(c, vs + 1), act_tag(vs + 1))
  end
  return rec
end

-- Backward of micro-batch i through local chunk k (rec from its forward).
local function backward(c, k, rec, b, scale)
  local vs = vs_of(c, k)
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
    local gy = buffer(c.st, b)
    recv(c, gy, rank_of(c, vs + 1), grad_tag(vs))
    wait(rec.send)
    -- (a stage whose parameters are all frozen, with no input that requires grad: nothing to do)
    if rec.output.requires_grad then rec.output:backward(gy) end
    free(gy)
  end
  free(rec.output)
  if rec.input ~= nil then
    local gx = rec.input.grad
    if gx == nil then raise(string.format("pp: virtual stage %d: the input activation got no gradient", vs)) end
    local h = send(c, gx, rank_of(c, vs - 1), grad_tag(vs - 1))
    rec.input.grad = nil
    free(rec.input)
    if h then
      c.pending[#c.pending + 1] = {h, gx}
    else
      free(gx)
    end
  end
end

local function finish(c)
  for _, p in ipairs(c.pending) do
    wait(p[1])
    free(p[2])
  end
  c.pending = {}
end

-- The loss sum of the last stage, broadcast over the pipeline group.
local function share_loss(c, sum)
  if c.P == 1 then return sum end
  local t = create.tensor({c.s == c.P - 1 and sum or 0}, {dtype = "f64"})
  c.g:broadcast(t, c.P - 1)
  local v = t:item()
  free(t)
  return v
end

function M.train(st, actions, batches, scale)
  local c = context(st)
  local recs, sum = {}, 0
  for k = 1, st.virtual_stages do recs[k] = {} end
  for _, a in ipairs(actions) do
    if M.trace then M.trace(st, a) end
    local b = batches[a.micro]
    if type(b) ~= "table" then raise("pp.train_step: micro-batch " .. a.micro .. " is not a table {x =, y =}") end
    if a.op == "F" then
      local rec = forward(c, a.chunk, a.micro, b, true)
      if rec.loss then sum = sum + rec.loss end
      recs[a.chunk][a.micro] = rec
    else
      backward(c, a.chunk, recs[a.chunk][a.micro], b, scale)
      recs[a.chunk][a.micro] = nil
    end
  end
  finish(c)
  return share_loss(c, sum)
end

-- Forward only (grad mode off): batch through every local chunk in virtual stage order.
function M.forward_only(st, batch)
  local c = context(st)
  local loss = 0
  for k = 1, st.virtual_stages do
    local rec = forward(c, k, 1, batch, false)
    if rec.loss then loss = rec.loss end
    if rec.send then c.pending[#c.pending + 1] = {rec.send, rec.output} else free(rec.output) end
  end
  finish(c)
  return share_loss(c, loss)
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
