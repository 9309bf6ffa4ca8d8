-- recipes/lib/moe.lua — a mixture-of-experts MLP written in a few lines of lutra's ops, for
-- recipes/custom_arch.lua (and tests/lua/test_custom_arch.lua): top-k routing, sparse dispatch,
-- a Switch-style load-balancing loss. (lt.nn.MoE is the full layer: SwiGLU experts, capacity,
-- shared experts, z-loss; this file shows how such a layer is prototyped.)
--
--   local MoE = dofile("recipes/lib/moe.lua")
--   local moe = MoE{d_model = 64, n_experts = 4, top_k = 2, hidden = 128}  -- dtype =, device =
--   local y = moe(x)            -- x (..., C) -> y (..., C); moe.aux_loss: the balance loss
--
-- Per token: probs = softmax(router(x)) over the E experts, the top_k largest chosen, their gates
-- those probabilities renormalised over the chosen; y = sum_e gate_e * expert_e(x), expert_e a
-- GELU MLP C -> hidden -> C. Each expert computes only for its own tokens: the (token, expert)
-- slots are sorted by expert (argsort), the tokens gathered (index_select), each expert's rows
-- multiplied by its weights (F.grouped_linear over the stacked weights), the outputs weighted
-- and added back to their tokens (index_add).
--
-- Load balancing (Switch Transformer, eq. 4, with top-k): f_e = the fraction of the N * k
-- assignments that went to expert e, P_e = the mean router probability of e over the tokens,
-- aux = E * sum_e f_e * P_e: 1 when routing is uniform, larger as it concentrates. Training mode only.
local lt = require "lutra"
local F = lt.F

local MoE = lt.nn.Module:extend("MoE")

function MoE:init(cfg)
  local C, E, H = cfg.d_model, cfg.n_experts or 4, cfg.hidden or 4 * cfg.d_model
  local k = cfg.top_k or 2
  assert(k >= 1 and k <= E, "MoE: top_k must be in [1, n_experts]")
  self.n_experts, self.top_k, self.hidden = E, k, H
  local fo = {dtype = cfg.dtype, device = cfg.device}
  local std, resid_std = cfg.init_std or 0.02, cfg.resid_std or cfg.init_std or 0.02
  self.router = lt.nn.Linear(C, E, {bias = false, dtype = cfg.dtype, device = cfg.device})
  lt.no_grad(function() lt.normal_(self.router.weight, 0, std) end)
  -- the experts' weights, stacked (one parameter each): (E, out, in) as a Linear's, biases (E, out)
  self:param("w_in", lt.no_grad(lt.normal_, lt.empty(E, H, C, fo), 0, std))
  self:param("b_in", lt.zeros(E, H, fo))
  self:param("w_out", lt.no_grad(lt.normal_, lt.empty(E, C, H, fo), 0, resid_std))
  self:param("b_out", lt.zeros(E, C, fo))
end

-- x (..., C) -> (..., C); sets self.aux_loss (training mode) and self.counts (slots per expert).
function MoE:forward(x)
  local shape, E, k = x.shape, self.n_experts, self.top_k
  local xf = x:reshape(-1, shape[#shape]) -- (N, C)
  local N = xf:size(0)
  local probs = self.router(xf):softmax(-1) -- (N, E)
  local gate, expert = probs:topk(k) -- (N, k): each token's experts, best first
  gate = gate / gate:sum(-1, true)
  -- dispatch: the N k slots sorted by expert, their tokens and experts, the slots per expert
  local slot = expert:reshape(-1):argsort() -- (N k,) slot s = token * k + choice
  local token = lt.arange(0, N, {device = x.device}):unsqueeze(1):expand(N, k):reshape(-1):index_select(0, slot)
  local eid = expert:reshape(-1):index_select(0, slot)
  local counts = F.one_hot(expert:reshape(-1), E):sum(0):tolist()
  -- the experts, each on its own rows; weighted by the gates and added back per token
  local xs = xf:index_select(0, token) -- (N k, C), expert-contiguous
  local h = (F.grouped_linear(xs, self.w_in, counts) + self.b_in:index_select(0, eid)):gelu()
  local ys = F.grouped_linear(h, self.w_out, counts) + self.b_out:index_select(0, eid)
  ys = ys * gate:reshape(-1):index_select(0, slot):unsqueeze(1)
  local y = lt.zeros_like(xf):index_add(0, token, ys)
  self.counts = counts
  local frac = lt.tensor(counts, {dtype = x.dtype, device = x.device}) * (1 / (N * k)) -- f_e, no gradient
  self.aux_loss = self.training and (frac * probs:mean(0)):sum() * E or nil -- a plain field, its graph kept
  return y:reshape(shape)
end

function MoE:extra_repr()
  return string.format("%d experts, top-%d, hidden %d", self.n_experts, self.top_k, self.hidden)
end

-- The mean of the aux losses of every MoE layer of model, or nil (none set).
function MoE.aux_loss_of(model)
  local sum, n = nil, 0
  for _, m in ipairs(model:modules()) do
    local a = getmetatable(m) == MoE and rawget(m, "aux_loss")
    if a then
      sum, n = sum and sum + a or a, n + 1
    end
  end
  return sum and sum * (1 / n)
end

return MoE
