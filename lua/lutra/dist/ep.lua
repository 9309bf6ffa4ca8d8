-- lutra.dist.ep — expert parallelism for nn.MoE layers (Megatron's layout: the ep group inside dp).
--
--   ep.parallelize(model, mesh)   -- every MoE layer of model, in place (parallelize.lua calls it)
--   ep.is_expert(p)               -- p holds experts sharded over the ep group
--   ep.finish_grads(params, mesh) -- after the expert gradients' reduction over expert_dp
--   ep.alias(p)                   -- p's storage without requires_grad (for the optimizer under ZeRO 1-2)
--
-- Each rank keeps n_experts / ep of every layer's experts: global expert ep_rank * El + j is its
-- local j (w_gate, w_up, w_down narrowed on dim 0, with a lutra.dist.spec of their global shape:
-- checkpoints save experts by global index and reshard across ep sizes). The layer's forward
-- (nn/moe.lua) calls the hooks below, set on it as `_ep`, inside the parallel step (ep.engage):
--   gather    routing is local (the router on this rank's own tokens); the slots per expert of
--             every dp rank and their token counts are all-gathered over dp, so that capacity
--             drops follow the single-process rule on the global batch (the dp ranks' batches
--             concatenated in dp order: an expert keeps its earliest slots) and the balance loss
--             uses the global fractions;
--   experts   the kept slots go to the rank holding their expert (all_to_all, counts exchanged
--             first), are regrouped by local expert, run, put back in arrival order and returned
--             by the reverse all_to_all (ep_ops: its backward is the reverse exchange);
--   balance   E * sum_e f_e P_e over the global batch: this rank's share of the sum, all-reduced
--             over dp; its backward all-reduces the gradient, so that after the dp average every
--             rank's router gets the gradient of the one global loss.
-- With ep = 1 and dp > 1 only gather and balance change (the experts stay whole).
--
-- Gradients: an expert's gradient on its rank sums the losses of the ep group's tokens. Averaged
-- over expert_dp (the dp / ep ranks holding the same experts) and divided by ep it is the
-- gradient of the mean loss over the global batch, as dp's average is for the other parameters.
-- Under ZeRO the other parameters are sharded over dp as usual (ZeRO 3: gathered around each
-- unit); the experts stay whole on their ranks (plain buckets over expert_dp, left out of ZeRO 3's
-- units by its keep option) and the one optimizer steps them through aliases.
-- Tensor parallel (lutra.dist.tp, which runs first): each expert is cut over tp on its hidden dim
-- as well; the ep group is the one at this rank's tp coordinate, whose ranks hold the same tp
-- columns, so the exchange moves whole tokens (the same on every tp rank) and the sharded experts
-- reduce their outputs over tp before the return exchange (tp.lua's experts).
-- Not yet: context parallel with ep (refused by name); the GPU (NCCL) path
-- of all_to_all is the collective's own, untested here.
local errors = require "lutra.errors"
local create = require "lutra.create"
local grad = require "lutra.nn.grad"
local ops = require "lutra.ops"
local F = require "lutra.functional"
local spec = require "lutra.dist.spec"
local tp_ops = require "lutra.dist.tp_ops"
local ep_ops = require "lutra.dist.ep_ops"

local raise, release = errors.raise, grad.release

local M = {}

local experts_of = setmetatable({}, {__mode = "k"}) -- expert parameter -> true

function M.is_expert(p) return experts_of[p] == true end

local Hooks = {}
Hooks.__index = Hooks

-- The hooks act inside the parallel step only (M.engage: par:forward_backward, par:eval_loss), where
-- every rank runs the same layers; a forward outside it (generation on rank 0) stays local.
local state = {on = false}

-- fn wrapped so that the hooks act while it runs.
function M.engage(fn)
  return function(...) return errors.with_field(state, "on", true, fn, ...) end
end

-- The hooks for moe's forward, or nil (local computation) outside the parallel step; an error
-- there when moe holds only some of the experts.
function Hooks:engaged(moe)
  if state.on then return self end
  if self.ep.size > 1 then
    local El = moe.n_experts / self.ep.size
    raise(string.format("MoE: this rank holds experts %d..%d of %d (parallel.ep = %d): the layer runs inside the "
      .. "parallel step only (par:forward_backward, par:eval_loss), not alone", self.ep.rank * El,
      (self.ep.rank + 1) * El - 1, moe.n_experts, self.ep.size))
  end
end

local function i64(list, device)
  if #list == 0 then return create.empty({0}, {dtype = "i64", device = device}) end
  return create.tensor(list, {dtype = "i64", device = device})
end

-- routed (E slots per expert, this rank's) and N (its tokens) of every dp rank: {routed = global
-- slots per expert, N = global tokens, before = slots per expert on the earlier dp ranks}.
function Hooks:gather(routed, N)
  local E, dp = #routed, self.dp
  local mine = {}
  for e = 1, E do mine[e] = routed[e] end
  mine[E + 1] = N
  local all = dp.size > 1 and dp:all_gather(nil, i64(mine)):reshape(-1):tolist() or mine
  local g = {routed = {}, before = {}, N = 0}
  for e = 1, E do g.routed[e], g.before[e] = 0, 0 end
  for r = 0, dp.size - 1 do
    for e = 1, E do
      local c = all[r * (E + 1) + e]
      g.routed[e] = g.routed[e] + c
      if r < dp.rank then g.before[e] = g.before[e] + c end
    end
    g.N = g.N + all[r * (E + 1) + E + 1]
  end
  return g
end

-- The balance loss of the global batch: probs (N, E) this rank's router probabilities, g of gather.
function Hooks:balance(probs, g, k)
  local E = #g.routed
  local routed = create.tensor(g.routed, {dtype = probs.dtype, device = probs.device})
  local part = (probs:sum(0) * routed):sum() * (E / (g.N * g.N * k))
  return tp_ops.reduce_from(tp_ops.copy_to(part, self.dp), self.dp)
end

-- moe's local experts on the slots of the whole ep group: xs (S, C) this rank's kept slots sorted
-- by global expert, counts (E) the slots per expert -> (S, C) the experts' outputs, same order.
function Hooks:experts(moe, xs, counts)
  local group = self.ep
  local n, r, E = group.size, group.rank, #counts
  if n == 1 then return moe:experts(xs, counts) end
  local El = E / n
  -- c[i][e]: the slots rank i - 1 sends to global expert e
  local all = grad.no_grad(function() return group:all_gather(nil, i64(counts)):reshape(-1):tolist() end)
  local send, recv, local_counts = {}, {}, {}
  for j = 1, n do
    send[j] = 0
    for e = (j - 1) * El + 1, j * El do send[j] = send[j] + counts[e] end
  end
  for j = 1, El do local_counts[j] = 0 end
  local at, starts = 0, {} -- arrival order: by source rank, then by local expert
  for i = 1, n do
    recv[i], starts[i] = 0, {}
    for j = 1, El do
      local c = all[(i - 1) * E + r * El + j]
      starts[i][j] = at
      at = at + c
      recv[i] = recv[i] + c
      local_counts[j] = local_counts[j] + c
    end
  end
  -- the permutation to expert-major order (rows of one expert contiguous) and its inverse
  local perm, inv = {}, {}
  for j = 1, El do
    for i = 1, n do
      local s = starts[i][j]
      for q = 0, all[(i - 1) * E + r * El + j] - 1 do
        perm[#perm + 1] = s + q
        inv[s + q + 1] = #perm - 1
      end
    end
  end
  local xr = ep_ops.all_to_all(xs, group, send, recv) -- (sum recv, C) in arrival order
  local xe = F.index_select(xr, 0, i64(perm, xs.device))
  release(xr, xs, xe)
  local ye = moe:experts(xe, local_counts)
  release(xe, xs, ye)
  local yr = F.index_select(ye, 0, i64(inv, xs.device))
  release(ye, xs, yr)
  local ys = ep_ops.all_to_all(yr, group, recv, send)
  release(yr, xs, ys)
  return ys
end

local function shape_of(t)
  local s = {}
  for i = 1, t.ndim do s[i] = t:size(i - 1) end
  return s
end

-- Keeps this rank's experts of m: experts [r El, (r + 1) El) of its stacked weights.
local function shard(m, n, r)
  local E = m.n_experts
  if E % n ~= 0 then
    raise(string.format("ep.parallelize: n_experts %d does not divide among the %d expert-parallel ranks", E, n))
  end
  local El = E / n
  for _, name in ipairs {"w_gate", "w_up", "w_down"} do
    local full = m[name]
    if full ~= nil then
      local t = grad.no_grad(function() return full:narrow(0, r * El, El):contiguous() end)
      grad.set_requires_grad(t, full.requires_grad)
      m:param(name, t)
      -- (under tp, full is already this tp rank's hidden columns: its box keeps that offset)
      local s = spec.get(full)
      local offset = s and {s.offset[1], s.offset[2], s.offset[3]} or {0, 0, 0}
      offset[1] = offset[1] + r * El
      spec.set(t, {global = s and s.global or shape_of(full), offset = offset})
      experts_of[t] = true
    end
  end
end

function M.parallelize(model, mesh)
  local MoE = require "lutra.nn.moe"
  local n = mesh.ep_size or 1
  if (mesh.cp_size or 1) > 1 then -- (a row's tokens over cp ranks: routing statistics stay per rank)
    if n > 1 then
      raise(string.format("ep.parallelize: expert parallel with context parallel is not supported yet (%s)",
        mesh:layout()))
    end
    return
  end
  local found = 0
  for _, m in ipairs(model:modules()) do
    if getmetatable(m) == MoE and rawget(m, "_ep") == nil then
      if n > 1 then shard(m, n, mesh.ep_rank) end
      rawset(m, "_ep", setmetatable({ep = mesh.ep, dp = mesh.dp}, Hooks))
      found = found + 1
    end
  end
  if n > 1 and found == 0 then
    raise(string.format("ep.parallelize: parallel.ep is %d but the model has no MoE layer (nn.MoE) to shard", n))
  end
end

-- An alias of expert parameter p (its storage, its spec), without requires_grad: what an
-- optimizer beside ZeRO's shards steps.
function M.alias(p)
  local a = grad.no_grad(function() return p:detach() end)
  spec.copy(a, p)
  experts_of[a] = true
  return a
end

-- Divides the expert gradients (reduced over expert_dp) by ep (see the header).
function M.finish_grads(params, mesh)
  local n = mesh.ep_size or 1
  if n == 1 then return end
  grad.no_grad(function()
    for _, p in ipairs(params) do
      if experts_of[p] and p.grad ~= nil then ops.mul(p.grad, 1 / n, p.grad) end
    end
  end)
end

return M
