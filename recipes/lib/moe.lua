-- recipes/lib/moe.lua — a mixture-of-experts MLP with top-k routing and a Switch-style
-- load-balancing loss, for recipes/custom_arch.lua (and tests/lua/test_custom_arch.lua).
--
--   local MoE = dofile("recipes/lib/moe.lua")
--   local moe = MoE{d_model = 64, n_experts = 4, top_k = 2, hidden = 128}  -- dtype =, device =
--   local y = moe(x)            -- x (..., C) -> y (..., C); moe.aux_loss: the balance loss
--
-- Routing, per token: probs = softmax(router(x)) over the E experts; the top_k largest
-- are chosen, and their gates are those probabilities renormalised over the chosen
-- experts (a softmax over the chosen logits). y = sum_e gate_e * expert_e(x), expert_e
-- being a GELU MLP C -> hidden -> C.
--
-- The experts are computed densely, then masked: every expert runs on every token, as
-- one batched matmul (E, N, C) @ (E, C, H), and the unchosen ones get gate 0. It spends
-- E / top_k times the FLOPs that gathering each expert's tokens would, but needs no
-- gather/scatter op and is simply correct; the gradient reaches only the chosen experts.
--
-- Load balancing (Switch Transformer, eq. 4, with top-k): f_e = the fraction of the N * k
-- assignments that went to expert e, P_e = the mean router probability of e over the
-- tokens, aux = E * sum_e f_e * P_e. It is 1 when routing is uniform and grows as it
-- concentrates; f is a count (no gradient), the gradient flows through P.
local lt = require "lutra"
local Module, Linear = lt.nn.Module, lt.nn.Linear

local MoE = Module:extend("MoE")

function MoE:init(cfg)
  local C, E, H = cfg.d_model, cfg.n_experts or 4, cfg.hidden or 4 * cfg.d_model
  local k = cfg.top_k or 2
  assert(k >= 1 and k <= E, "MoE: top_k must be in [1, n_experts]")
  self.n_experts, self.top_k, self.hidden = E, k, H
  local fo = {dtype = cfg.dtype, device = cfg.device}
  local std, resid_std = cfg.init_std or 0.02, cfg.resid_std or cfg.init_std or 0.02
  self.router = Linear(C, E, {bias = false, dtype = cfg.dtype, device = cfg.device})
  -- the experts' weights, stacked: w_in (E, C, H), b_in (E, 1, H), w_out (E, H, C), b_out (E, 1, C)
  lt.no_grad(function()
    self.w_in = lt.parameter(lt.normal_(lt.empty(E, C, H, fo), 0, std))
    self.b_in = lt.parameter(lt.zeros(E, 1, H, fo))
    self.w_out = lt.parameter(lt.normal_(lt.empty(E, H, C, fo), 0, resid_std))
    self.b_out = lt.parameter(lt.zeros(E, 1, C, fo))
    lt.normal_(self.router.weight, 0, std)
  end)
end

-- The routing of x (N, C): probs (N, E) (differentiable), mask (N, E) bool (top_k chosen
-- per row), gates (N, E): probs on the chosen experts renormalised to sum 1, 0 elsewhere.
function MoE:route(x)
  local probs = self.router(x):softmax(-1)
  local mask = lt.no_grad(function()
    -- knock out the largest k - 1 times; the k-th largest is then the row's max
    local p = probs:detach()
    for _ = 1, self.top_k - 1 do p = lt.where(p:ge((p:max(-1, true))), -1, p) end
    return probs:ge((p:max(-1, true)))
  end)
  local chosen = lt.where(mask, probs, 0)
  return probs, mask, chosen / chosen:sum(-1, true)
end

-- aux = E * sum_e f_e * P_e (see the header).
function MoE:balance_loss(probs, mask)
  local N, E = probs:size(0), self.n_experts
  local frac = mask:to(probs.dtype):sum(0) * (1 / (N * self.top_k)) -- (E,), no grad
  return (frac * probs:mean(0)):sum() * E
end

-- x (..., C) -> (..., C); sets self.aux_loss (a 0-d tensor) when training.
function MoE:forward(x)
  local shape = x.shape
  local C = shape[#shape]
  local xf = x:reshape(-1, C) -- (N, C)
  local probs, mask, gates = self:route(xf)
  local h = (xf:unsqueeze(0):matmul(self.w_in) + self.b_in):gelu() -- (E, N, H)
  local y = h:matmul(self.w_out) + self.b_out -- (E, N, C)
  local out = (y * gates:t():unsqueeze(-1)):sum(0) -- (N, C)
  self.aux_loss = self.training and self:balance_loss(probs, mask) or nil -- a plain field, its graph kept
  return out:reshape(shape)
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
