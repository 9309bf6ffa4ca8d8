-- lutra.selftest.train — whole training steps on the device against the CPU.
--
--   "<arch> step loss|grads|params": one fp32 AdamW step (with gradient clipping) of a small
--     gpt2, llama and moe, the same weights and batch on both sides. Every op of the step is
--     already checked on its own; this catches what only shows in composition (a view the
--     device path mishandles, a stream or allocator reuse bug, a missing sync).
--   "<arch> bf16 vs fp32": 50 steps on the device in bf16 autocast track 50 steps in fp32
--     (the worst relative gap of the per-step losses).
local F = require "lutra.functional"
local models = require "lutra.models"
local optim = require "lutra.optim"

-- A sum over a step is a few thousand products: the device sums in another order (and
-- device expf/tanhf differ by an ulp), so fp32 agrees to ~1e-5 relative; Adam's update
-- divides by sqrt(v), which magnifies differences in tiny gradients, hence the looser
-- tolerance on grads and params than on the loss.
local TOL = {loss = 1e-4, grads = 2e-3, params = 1e-4}
-- bf16 keeps 8 bits of mantissa: the per-step losses stay within 2% of the initial loss of
-- fp32's (on the CPU, emulated: 1.05% for gpt2, 0.47% for llama, the gap growing late as the
-- tiny model memorises its 4 batches along a slightly different path).
local BF16_TRACK = 0.02

local V, B, T = 64, 4, 32

local function build(arch, seed)
  local lt = require "lutra"
  lt.manual_seed(seed)
  return models.build {arch = arch, n_layer = 2, n_head = 4, d_model = 64, vocab_size = V, block_size = T}
end

local function batch(lt, seed)
  lt.manual_seed(seed)
  local w = lt.randint(0, V, {B, T + 1})
  return w:narrow(1, 0, T):contiguous(), w:narrow(1, 1, T):contiguous()
end

-- One fp32 step: loss, then (after clipping) the gradients and the updated parameters.
local function step(model, x, y)
  local opt = optim.AdamW(model, {lr = 1e-2, weight_decay = 0.1})
  opt:zero_grad()
  local _, loss = model:forward(x, y)
  loss:backward()
  optim.clip_grad_norm(model, 1.0)
  local grads = {}
  for name, p in model:named_parameters() do grads[name] = p.grad:cpu() end
  opt:step()
  return loss:cpu(), grads
end

local function one_step(st, arch)
  local lt = st.lt
  local cpu_model, dev_model = build(arch, 21), build(arch, 21)
  dev_model:to(st.device)
  local x, y = batch(lt, 5)
  local want_loss, want_grads = step(cpu_model, x, y)
  local got_loss, got_grads = step(dev_model, st.to_device(x), st.to_device(y))
  st.check(arch .. " step loss", "f32", got_loss, want_loss, TOL.loss)
  local dev_params = {}
  for name, p in dev_model:named_parameters() do dev_params[name] = p end
  for name, p in cpu_model:named_parameters() do
    st.check(arch .. " step grads", "f32", got_grads[name], want_grads[name], TOL.grads)
    st.check(arch .. " step params", "f32", dev_params[name], p, TOL.params)
  end
end

-- The losses of `steps` AdamW steps on the device, in autocast dtype (nil: fp32).
local function losses(st, arch, dtype, steps)
  local lt = st.lt
  local model = build(arch, 33)
  model:to(st.device)
  local opt = optim.AdamW(model, {lr = 3e-3, weight_decay = 0.1})
  local batches = {}
  for i = 1, 4 do batches[i] = {batch(lt, 100 + i)} end
  local out = {}
  for s = 1, steps do
    local x, y = batches[(s - 1) % #batches + 1][1], batches[(s - 1) % #batches + 1][2]
    opt:zero_grad()
    local _, loss = F.autocast(dtype, model.forward, model, st.to_device(x), st.to_device(y))
    loss:backward()
    optim.clip_grad_norm(model, 1.0)
    opt:step()
    out[s] = loss:item()
  end
  return out
end

local function bf16_tracks(st, arch)
  local steps = 50
  local l32, l16 = losses(st, arch, nil, steps), losses(st, arch, "bf16", steps)
  local max_abs = 0
  for s = 1, steps do
    local abs = math.abs(l16[s] - l32[s])
    if abs ~= abs then abs = math.huge end
    max_abs = math.max(max_abs, abs)
  end
  local max_rel = max_abs / l32[1] -- relative to the initial loss
  -- and it learned: the last loss is well under the first
  local learned = l32[steps] < 0.8 * l32[1] and l16[steps] < 0.8 * l16[1]
  st.report(arch .. " bf16 vs fp32", {steps}, "bf16", max_abs, max_rel, learned and max_rel <= BF16_TRACK)
end

-- lutra.train with the model on the device and a loader of CPU batches (the trainer moves
-- them): 5 steps with eval, the losses against the same run on the CPU.
local function trainer(st, arch)
  local lt, train = st.lt, require "lutra.train"
  local function loader()
    local L = {pos = 0, batches = {}}
    for i = 1, 3 do L.batches[i] = {batch(lt, 200 + i)} end
    function L:next()
      self.pos = self.pos % #self.batches + 1
      return self.batches[self.pos][1], self.batches[self.pos][2]
    end
    return L
  end
  local function losses_on(device)
    local model = build(arch, 44)
    model:to(device)
    local cfg = {steps = 5, lr = 3e-3, warmup = 1, eval_every = 5, eval_iters = 2, run_dir = "", log_every = 1}
    local r = train.train {model = model, data = loader(), val_data = loader(), config = cfg, quiet = true}
    local out = {}
    for i, l in ipairs(r.losses) do out[i] = l end
    out[#out + 1] = r.val_loss
    return out
  end
  local want, got = losses_on("cpu"), losses_on(st.device)
  local max_abs, max_rel = 0, 0
  for i = 1, #want do
    local abs = math.abs((got[i] or math.huge) - want[i])
    if abs ~= abs then abs = math.huge end
    max_abs, max_rel = math.max(max_abs, abs), math.max(max_rel, abs / math.abs(want[i]))
  end
  st.report(arch .. " lutra.train", {#want}, "f32", max_abs, max_rel, #got == #want and max_rel <= TOL.grads)
end

return function(st)
  for _, arch in ipairs {"gpt2", "llama"} do
    one_step(st, arch)
    trainer(st, arch)
    bf16_tracks(st, arch)
  end
  -- Mixtral's layout (8 experts top-2): the sparse dispatch (topk, argsort, index_select, grouped
  -- matmuls, index_add) on the device. fp32 only: bf16 routes near-tied tokens to other experts.
  one_step(st, "moe")
  trainer(st, "moe")
end
