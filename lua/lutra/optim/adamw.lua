-- lutra.optim.adamw — AdamW (Loshchilov & Hutter), torch.optim.AdamW's arithmetic,
-- through the fused C step (lt_adamw_step: one pass over param, grad, m and v).
--
--   local opt = lutra.optim.AdamW(model, {lr = 1e-3, betas = {0.9, 0.99}, weight_decay = 0.1})
--
-- Per step, with t the parameter's own step count (bias correction):
--   p = p * (1 - lr * wd); m = lerp(m, g, 1 - beta1); v = beta2 * v + (1 - beta2) * g^2
--   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
-- State per parameter: {step = t, exp_avg = m, exp_avg_sq = v}; m and v are f32 (f64
-- for an f64 parameter), also for bf16/f16 parameters, whose grad may be f32.
--
-- update_group steps a whole param group with lt_adamw_step_multi: one C call (one OpenMP
-- loop, one CUDA launch) per device and step count, master weights included (the f32 copy is
-- stepped and rounded into the parameter inside the same pass). It gives every tensor exactly
-- what update gives it (bitwise), and falls back to update, tensor by tensor, when the
-- multi-tensor call refuses its input, so that errors name the tensor as before.
local ffi = require "ffi"
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local create = require "lutra.create"
local common = require "lutra.optim.common"
local Optimizer = require "lutra.optim.optimizer"
local group_step = require "lutra.optim.group_step"

local C_adamw = lt.fn("lt_adamw_step")
local C_adamw_multi = lt.fn("lt_adamw_step_multi")

local kind = {
  name = "adamw",
  title = "AdamW",
  defaults = {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 1e-2},
  optional = {},
  fields = {step = "number", exp_avg = "tensor", exp_avg_sq = "tensor"},
  required = {step = true, exp_avg = true, exp_avg_sq = true},
}
kind.known = common.known(kind)

function kind.check(g, who)
  common.number(g, who, "lr", 0)
  common.betas(g, who)
  common.number(g, who, "eps", 0)
  common.number(g, who, "weight_decay", 0)
end

function kind.state_dtype(p) return p.dtype == "f64" and "f64" or "f32" end

function kind.init(p)
  local dt = kind.state_dtype(p)
  return {step = 0, exp_avg = Optimizer.keep(create.zeros_like(p, {dtype = dt})),
          exp_avg_sq = Optimizer.keep(create.zeros_like(p, {dtype = dt}))}
end

function kind.update(p, g, st, group, lr)
  local step = st.step + 1
  local b = group.betas
  if C_adamw(p, g, st.exp_avg, st.exp_avg_sq, lr, b[1], b[2], group.eps, group.weight_decay, step) ~= 0 then
    errors.fail()
  end
  st.step = step
  Optimizer.bump(p)
end

-- The tensors of one multi-tensor call, as C arrays.
local function c_arrays(n)
  return ffi.new("lt_tensor*[?]", n), ffi.new("lt_tensor*[?]", n), ffi.new("lt_tensor*[?]", n),
    ffi.new("lt_tensor*[?]", n), ffi.new("lt_tensor*[?]", n)
end

-- One optimizer step of a param group: items = {{p =, grad =, st =}, ...} in the group's
-- order (each st made by init; st.master: the f32 master copy of a bf16/f16 p). Tensors are
-- batched by device and step count (the bias correction), in order.
function kind.update_group(items, group, lr)
  local b1, b2 = group.betas[1], group.betas[2]
  for _, b in ipairs(group_step.batches(items)) do
    local n, step = #b, b[1].st.step + 1
    local params, grads, ms, vs, masters = c_arrays(n)
    local any_master = false
    for i, it in ipairs(b) do
      local st, grad = it.st, it.grad
      if st.master ~= nil and grad.dtype ~= "f32" and grad.dtype ~= it.p.dtype then
        grad = grad:to("f32")
        it.grad_f32 = grad -- alive (b is read after the call) while C holds its pointer
      end
      params[i - 1], grads[i - 1], ms[i - 1], vs[i - 1] = it.p, grad, st.exp_avg, st.exp_avg_sq
      if st.master ~= nil then masters[i - 1], any_master = st.master, true end
    end
    if C_adamw_multi(n, params, grads, ms, vs, any_master and masters or nil, lr, b1, b2, group.eps,
        group.weight_decay, step) == 0 then
      for _, it in ipairs(b) do
        it.st.step = step
        if it.st.master ~= nil then Optimizer.bump(it.st.master) end
        Optimizer.bump(it.p)
      end
    else -- refused before touching anything: the per-tensor path names the culprit
      for _, it in ipairs(b) do kind.update_one(it, group, lr) end
    end
  end
end

-- The per-tensor path of one item (as the optimizer's own loop does it).
function kind.update_one(it, group, lr)
  local st, grad = it.st, it.grad
  if st.master ~= nil then
    if grad.dtype ~= "f32" then grad = grad:to("f32") end
    kind.update(st.master, grad, st, group, lr)
    it.p:copy_(st.master)
    Optimizer.bump(it.p)
  else
    kind.update(it.p, grad, st, group, lr)
  end
end

return kind
