-- nn.MoE{d_model =, d_ff =, n_experts =, top_k = 2, capacity_factor = nil, n_shared_experts = 0,
--   shared_hidden = nil, shared_gate = false, activation = "swiglu" | "gelu", norm_topk_prob = true,
--   aux_loss_coef = 0.01, z_loss_coef = 0,
--   dropout = 0, init_std = 0.02, resid_std = init_std, dtype =, device =}
-- A mixture-of-experts feed-forward layer (Mixtral's sparse MoE block, DeepSeek-MoE's shared
-- experts, Switch/GShard's capacity), x (..., d_model) -> y (..., d_model):
--
--   local moe = nn.MoE{d_model = 512, d_ff = 1024, n_experts = 8, top_k = 2}
--   local y = moe(x)                       -- and moe.aux_loss: add it to the training loss
--   loss = lm_loss + nn.MoE.aux_loss_of(model)   -- every MoE layer's aux_loss, summed
--
-- Routing (token choice): logits = router(x) (N, E), probs = softmax(logits); each token picks
-- its top_k experts by probability, weighted by those probabilities, renormalised to sum 1 over
-- the chosen ones when norm_topk_prob (Mixtral; Qwen-MoE's flag of that name, false there).
-- Dispatch is sparse: the N * top_k (token, expert) slots are sorted by expert (a stable argsort:
-- within an expert, in order of position), the tokens gathered into one expert-contiguous buffer
-- (index_select), each expert's matmuls run on its own rows (F.grouped_linear: the experts'
-- weights are stacked, w_gate/w_up (E, d_ff, d_model) and w_down (E, d_model, d_ff), one
-- parameter each), the results weighted and summed back per token (index_add). An expert
-- computes only for the tokens it received: top_k / E of a dense layer of all experts.
-- activation "swiglu": w_down(silu(w_gate x) * w_up x) (Mixtral's w1, w3, w2); "gelu":
-- w_down(gelu(w_up x)) (tanh approximation), no w_gate. No biases. In a bf16/f16 model or under
-- autocast the router's softmax, the top-k and the aux losses run in f32 (Mixtral's float32
-- softmax: bf16 probabilities near 1/E would tie); the experts compute as Linear layers do.
--
-- capacity_factor (nil: dropless, every slot is computed): each expert takes at most
-- capacity = ceil(capacity_factor * N * top_k / E) slots, the earliest positions first (Switch,
-- GShard); a dropped slot contributes nothing (the token keeps its other experts' outputs and,
-- in a block, its residual). The routing weights are renormalised before dropping.
-- n_shared_experts (DeepSeek-MoE): a dense MLP of width n_shared_experts * d_ff, with the
-- experts' activation, on every token, added to the output (`shared`); shared_hidden sets that
-- width apart from d_ff (Qwen2-MoE's shared_expert_intermediate_size), shared_gate scales the
-- shared output per token by sigmoid(shared_gate(x)), a Linear (d_model -> 1, no bias): Qwen2-MoE's
-- shared_expert_gate. dropout: on the output.
--
-- Auxiliary losses, set by every forward as plain fields (0-d tensors in the graph, not
-- parameters) for the training loss to add, as Megatron's MoE layers attach theirs:
--   moe.balance_loss  E * sum_e f_e * P_e (Switch, eq. 4, with top-k as Megatron): f_e the share
--                     of the N * top_k slots routed to e (before capacity drops; no gradient),
--                     P_e the mean router probability of e. 1 when routing is uniform. (Hugging
--                     Face's Mixtral load_balancing_loss_func gives top_k times this.)
--   moe.z_loss        mean over tokens of logsumexp(logits)^2 (ST-MoE's router z-loss)
--   moe.aux_loss      aux_loss_coef * balance_loss + z_loss_coef * z_loss: what to add
--   moe.tokens_per_expert   the slots each expert received (a Lua list, before drops), and
--   moe.dropped       how many slots the capacity dropped (0 when dropless)
-- Inside the parallel step under data or expert parallelism (lutra.dist.ep sets the layer's `_ep`
-- hooks) the capacity rule and balance_loss are the global batch's, the experts may live on other
-- ranks; tokens_per_expert and dropped stay this rank's.
-- MoE.aux_loss_of(model) sums aux_loss over the model's MoE layers (nil when none ran); the model
-- zoo's arch = "moe" adds it to the loss it returns with targets.
local Module = require "lutra.nn.module"
local O = require "lutra.nn.options"
local Linear = require "lutra.nn.linear"
local MLP = require "lutra.nn.mlp"
local SwiGLU = require "lutra.nn.swiglu"
local Dropout = require "lutra.nn.dropout"
local F = require "lutra.functional"
local create = require "lutra.create"
local errors = require "lutra.errors"
local grad = require "lutra.nn.grad"
local shape = require "lutra.shape"

local raise, no_grad, release = errors.raise, grad.no_grad, grad.release

local MoE = Module:extend("MoE")

local KEYS = {"d_model", "d_ff", "n_experts", "top_k", "capacity_factor", "n_shared_experts", "shared_hidden",
              "shared_gate", "activation",
              "norm_topk_prob", "aux_loss_coef", "z_loss_coef", "dropout", "init_std", "resid_std", "dtype", "device"}

local function nonnegative(what, v, default)
  if v == nil then return default end
  if type(v) ~= "number" or not (v >= 0) or v == math.huge then
    raise(string.format("MoE: %s must be a number >= 0, got %s", what, tostring(v)))
  end
  return v
end

function MoE:init(cfg)
  cfg = O.check("MoE", cfg, KEYS)
  local C = O.positive_int("MoE", "d_model", cfg.d_model)
  local H = O.positive_int("MoE", "d_ff", cfg.d_ff)
  local E = O.positive_int("MoE", "n_experts", cfg.n_experts)
  local k = O.positive_int("MoE", "top_k", cfg.top_k or 2)
  if k > E then raise(string.format("MoE: top_k (%d) must be at most n_experts (%d)", k, E)) end
  local act = cfg.activation or "swiglu"
  if act ~= "swiglu" and act ~= "gelu" then
    raise("MoE: activation must be \"swiglu\" or \"gelu\", got " .. tostring(act))
  end
  if cfg.capacity_factor ~= nil then O.positive("MoE", "capacity_factor", cfg.capacity_factor) end
  local n_shared = cfg.n_shared_experts or 0
  if n_shared ~= 0 then O.positive_int("MoE", "n_shared_experts", n_shared) end
  local shared_hidden = cfg.shared_hidden
  if shared_hidden ~= nil then O.positive_int("MoE", "shared_hidden", shared_hidden) end
  local shared_gate = O.boolean("MoE", "shared_gate", cfg.shared_gate, false)
  if n_shared == 0 and (shared_hidden ~= nil or shared_gate) then
    raise("MoE: shared_hidden and shared_gate need n_shared_experts >= 1")
  end
  self.d_model, self.d_ff, self.n_experts, self.top_k, self.activation = C, H, E, k, act
  self.capacity_factor, self.n_shared_experts = cfg.capacity_factor, n_shared
  self.norm_topk_prob = O.boolean("MoE", "norm_topk_prob", cfg.norm_topk_prob, true)
  self.aux_loss_coef = nonnegative("aux_loss_coef", cfg.aux_loss_coef, 0.01)
  self.z_loss_coef = nonnegative("z_loss_coef", cfg.z_loss_coef, 0)
  local std = nonnegative("init_std", cfg.init_std, 0.02)
  local fo = O.factory(cfg)
  self:add("router", Linear(C, E, {bias = false, dtype = cfg.dtype, device = cfg.device}))
  if act == "swiglu" then self:param("w_gate", create.empty(E, H, C, fo)) end
  self:param("w_up", create.empty(E, H, C, fo))
  self:param("w_down", create.empty(E, C, H, fo))
  if n_shared > 0 then
    local ffn = {d_model = C, hidden = shared_hidden or n_shared * H, bias = false, dtype = cfg.dtype,
                 device = cfg.device}
    self:add("shared", act == "swiglu" and SwiGLU(ffn) or MLP(ffn))
    if shared_gate then self:add("shared_gate", Linear(C, 1, {bias = false, dtype = cfg.dtype, device = cfg.device})) end
  end
  self:add("drop", Dropout(cfg.dropout or 0))
  self:init_weights(std, nonnegative("resid_std", cfg.resid_std, std))
end

-- Draws the weights again: N(0, std), the projections back into the residual stream (w_down, the
-- shared experts' proj) N(0, resid_std) (the model zoo's GPT-2 initialisation).
function MoE:init_weights(std, resid_std)
  no_grad(function()
    create.normal_(self.router.weight, 0, std)
    if self.w_gate then create.normal_(self.w_gate, 0, std) end
    create.normal_(self.w_up, 0, std)
    create.normal_(self.w_down, 0, resid_std)
    local sh = self.shared
    if sh then
      for _, name in ipairs {"gate", "up", "fc"} do
        if sh[name] then create.normal_(sh[name].weight, 0, std) end
      end
      create.normal_(sh.proj.weight, 0, resid_std)
    end
    if self.shared_gate then create.normal_(self.shared_gate.weight, 0, std) end
  end)
end

-- The slots per expert that the capacity allows, N tokens.
function MoE:capacity(N)
  if self.capacity_factor == nil then return nil end
  return math.max(1, math.ceil(self.capacity_factor * N * self.top_k / self.n_experts))
end

-- The dispatch plan of expert ids top_i (N, k) i64, no gradient: slots (S,) the kept slot
-- numbers (token * k + choice, 0-based) in expert-major order, tokens (S,) their tokens,
-- counts (Lua list, E) the kept slots per expert, routed (Lua list, E) the slots per expert
-- before drops, routed_t (E,) the same as a tensor (x's dtype, for the balance loss).
local function plan(self, top_i, N, dt, ep)
  local E, k = self.n_experts, self.top_k
  local flat = top_i:reshape(-1) -- (N k,) slot s = token * k + choice
  local order = F.argsort(flat) -- stable: within an expert, in order of slot, i.e. of position
  local routed_t = F.one_hot(flat, E):sum(0) -- (E,) i64
  local routed = routed_t:tolist()
  local tokens_of_slot = create.arange(0, N, {device = top_i.device}):unsqueeze(1):expand(N, k):reshape(-1)
  -- data/expert parallel (lutra.dist.ep): capacity and balance over the global batch, this rank's
  -- slots after the earlier dp ranks' (g.before)
  local g = ep and ep:gather(routed, N)
  local counts, slots, cap = routed, order, self:capacity(g and g.N or N)
  local dropped = 0
  if cap ~= nil then
    counts = {}
    local keep, off = {}, 0
    for e = 1, E do
      counts[e] = math.max(0, math.min(routed[e], cap - (g and g.before[e] or 0)))
      dropped = dropped + routed[e] - counts[e]
      if counts[e] > 0 then keep[#keep + 1] = order:narrow(0, off, counts[e]) end
      off = off + routed[e]
    end
    if dropped > 0 then slots = #keep > 0 and create.cat(keep, 0) or create.empty({0}, {dtype = "i64"}) end
  end
  return {slots = slots, tokens = F.index_select(tokens_of_slot, 0, slots), counts = counts, routed = routed,
          routed_t = routed_t:to(dt), dropped = dropped, global = g}
end

-- The experts on their rows: xs (S, C) sorted by expert, counts per expert -> (S, C).
function MoE:experts(xs, counts)
  local up = F.grouped_linear(xs, self.w_up, counts)
  local h
  if self.w_gate then
    local gate = F.grouped_linear(xs, self.w_gate, counts)
    local a = gate:silu()
    release(gate, xs, a)
    h = a * up
    release(a, xs, h)
  else
    h = up:gelu()
  end
  release(up, xs, h)
  local y = F.grouped_linear(h, self.w_down, counts)
  release(h, xs, y)
  return y
end

-- x (..., d_model) -> (..., d_model); sets the aux loss fields (see the header).
function MoE:forward(x)
  local sh = x.shape
  if x.ndim < 1 or sh[#sh] ~= self.d_model then
    raise(string.format("MoE: expected x (..., %d), got %s", self.d_model, shape.shape_string(x)))
  end
  local C, E, k = self.d_model, self.n_experts, self.top_k
  local xf = x:reshape(-1, C) -- (N, C)
  local N = xf:size(0)
  local logits = self.router(xf) -- (N, E)
  -- routing in f32 for a low-precision model or under autocast (Mixtral's softmax in float32):
  -- bf16's probabilities near 1/E would tie, and ties go to the lower experts
  if logits.dtype == "bf16" or logits.dtype == "f16" then logits = logits:to("f32") end
  local probs = logits:softmax(-1)
  local top_w, top_i = F.topk(probs, k) -- (N, k): sorted, ties to the lower expert
  if self.norm_topk_prob then top_w = top_w / top_w:sum(-1, true) end
  local ep = rawget(self, "_ep")
  if ep then ep = ep:engaged(self) end -- nil outside the parallel step (lutra.dist.ep)
  local p = no_grad(plan, self, top_i, N, probs.dtype, ep)
  local xs = F.index_select(xf, 0, p.tokens) -- (S, C), expert-contiguous
  local ys = ep and ep:experts(self, xs, p.counts) or self:experts(xs, p.counts)
  local w = F.index_select(top_w:reshape(-1), 0, p.slots):unsqueeze(1) -- (S, 1)
  if w.dtype ~= ys.dtype then w = w:to(ys.dtype) end
  local yw = ys * w
  release(ys, x, yw)
  local y = F.index_add(create.zeros({N, C}, {dtype = yw.dtype, device = x.device}), 0, p.tokens, yw)
  release(yw, x, y)
  if self.shared then
    local s = self.shared(xf)
    if self.shared_gate then s = s * self.shared_gate(xf):sigmoid() end -- (N, 1) broadcast over C
    y = y + s
  end
  -- the aux losses
  local balance = ep and ep:balance(probs, p.global, k) or (probs:mean(0) * p.routed_t):sum() * (E / (N * k))
  local lse = F.logsumexp(logits, -1)
  local z = (lse * lse):mean()
  rawset(self, "balance_loss", balance)
  rawset(self, "z_loss", z)
  rawset(self, "aux_loss", balance * self.aux_loss_coef + z * self.z_loss_coef)
  rawset(self, "tokens_per_expert", p.routed)
  rawset(self, "dropped", p.dropped)
  return self.drop(y:reshape(sh))
end

-- The sum of aux_loss over model's MoE layers (model itself may be one), or nil when none has run.
function MoE.aux_loss_of(model)
  local sum
  for _, m in ipairs(model:modules()) do
    local a = getmetatable(m) == MoE and rawget(m, "aux_loss")
    if a then sum = sum and sum + a or a end
  end
  return sum
end

function MoE:extra_repr()
  local s = string.format("%d -> %d -> %d, %d experts, top-%d, %s", self.d_model, self.d_ff, self.d_model,
    self.n_experts, self.top_k, self.activation)
  if self.capacity_factor then s = s .. string.format(", capacity factor %g", self.capacity_factor) end
  if self.n_shared_experts > 0 then
    s = s .. string.format(", %d shared%s", self.n_shared_experts, self.shared_gate and " (gated)" or "")
  end
  return s
end

return MoE
