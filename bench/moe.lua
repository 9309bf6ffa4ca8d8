-- bench/moe.lua — the cost of a mixture of experts against the dense MLP of the same active
-- width, on the same tokens: nn.MoE (n_experts, top_k, each expert SwiGLU d_model -> d_ff) and
-- nn.SwiGLU d_model -> top_k * d_ff (the FLOPs of the experts a token goes through), forward +
-- backward, run alternately, medians of --runs runs each and their ratio.
--   lutra bench/moe.lua [--tokens 4096] [--d_model 512] [--d_ff 1024] [--experts 8] [--top_k 2]
--                       [--runs 7] [--warmup 2] [--threads 2] [--dtype f32] [--device cpu]
--                       [--capacity 0] [--profile 1]
-- --capacity F > 0 runs the MoE with capacity_factor F (else dropless). The router is trained
-- as in a model (its weights random, N(0, 0.02)), so the routing is near uniform, as early in
-- training. --profile 1 also prints where the MoE's forward time goes, phase by phase (each
-- phase timed alone, synchronised); the forward and backward are timed apart in the runs.
-- Measured on a 2-core CPU shared with other jobs (f32, 2 threads, 9 runs): 4096 tokens, d_model
-- 512, d_ff 1024: 1.10-1.23x over several runs (forward: the experts' grouped matmuls 100 ms
-- against the dense MLP's 93 ms, the routing and dispatch 13 ms more); 8192 tokens, d_model 1024,
-- d_ff 2048 (--tokens 8192 --d_model 1024 --d_ff 2048 --runs 5): 1.07x.
local lt = require "lutra"
local F = lt.F or require "lutra.functional"
local util = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/util.lua")

local a = util.options({tokens = 4096, d_model = 512, d_ff = 1024, experts = 8, top_k = 2, runs = 7, warmup = 2,
                        threads = 2, dtype = "f32", device = "cpu", capacity = 0, profile = 1}, "bench/moe")
if a.threads > 0 then lt.set_num_threads(a.threads) end
local cuda = a.device:find("^cuda") ~= nil
local function sync() if cuda then lt.cuda.synchronize() end end

lt.manual_seed(1)
local fo = {dtype = a.dtype, device = a.device}
local moe = lt.nn.MoE{d_model = a.d_model, d_ff = a.d_ff, n_experts = a.experts, top_k = a.top_k,
                      capacity_factor = a.capacity > 0 and a.capacity or nil, dtype = a.dtype, device = a.device}
local dense = lt.nn.SwiGLU{d_model = a.d_model, hidden = a.top_k * a.d_ff, bias = false, dtype = a.dtype,
                           device = a.device}
local x = lt.randn(a.tokens, a.d_model, fo)
local dy = lt.randn(a.tokens, a.d_model, fo)

print(string.format("sizes: %d tokens, d_model %d; MoE: %d experts top-%d, d_ff %d each (SwiGLU), %s; dense SwiGLU: "
  .. "d_ff %d; %s on %s, %d threads", a.tokens, a.d_model, a.experts, a.top_k, a.d_ff,
  a.capacity > 0 and ("capacity factor " .. a.capacity) or "dropless", a.top_k * a.d_ff, a.dtype, a.device,
  lt.get_num_threads and lt.get_num_threads() or a.threads))

-- One forward + backward of module m on x (requiring grad), upstream gradient dy: seconds of
-- the whole step, of the forward and of the backward.
local function step(m)
  local xi = x:detach()
  xi.requires_grad = true
  local t0, t1
  sync()
  t0 = util.now()
  lt.tidy(function()
    local y = m(xi)
    local loss = (y * dy):sum()
    if m == moe then loss = loss + moe.aux_loss end
    sync()
    t1 = util.now()
    loss:backward()
  end)
  sync()
  local t2 = util.now()
  m:zero_grad()
  return t2 - t0, t1 - t0, t2 - t1
end

for _ = 1, a.warmup do
  step(moe)
  step(dense)
end
local tm, td, fm, bm, fd, bd = {}, {}, {}, {}, {}, {}
for i = 1, a.runs do -- alternately, so that both see the same machine
  tm[i], fm[i], bm[i] = step(moe)
  td[i], fd[i], bd[i] = step(dense)
end
local function ms(v) return v * 1e3 end
local med_m, med_d = util.median(tm), util.median(td)
print(string.format("dense SwiGLU  forward+backward: median %7.1f ms (min %.1f, max %.1f; forward %.1f, backward %.1f)",
  ms(med_d), ms(td[1]), ms(td[#td]), ms(util.median(fd)), ms(util.median(bd))))
print(string.format("MoE           forward+backward: median %7.1f ms (min %.1f, max %.1f; forward %.1f, backward %.1f)",
  ms(med_m), ms(tm[1]), ms(tm[#tm]), ms(util.median(fm)), ms(util.median(bm))))
print(string.format("ratio MoE / dense: %.2fx over %d runs each (goal <= 1.3x); slots per expert in the last run: %s",
  med_m / med_d, a.runs, table.concat(moe.tokens_per_expert, " ")))

if a.profile == 0 then return end

-- Where the forward's time goes: the phases of nn.MoE:forward, each timed (median of runs).
local phases, order = {}, {}
local function timed(name, fn, ...)
  sync()
  local t0 = util.now()
  local r1, r2, r3 = fn(...)
  sync()
  local dt = util.now() - t0
  if not phases[name] then
    phases[name], order[#order + 1] = {}, name
  end
  table.insert(phases[name], dt)
  return r1, r2, r3
end
local E, k, N, C = a.experts, a.top_k, a.tokens, a.d_model
for _ = 1, a.runs do
  lt.tidy(function()
    lt.no_grad(function()
      local logits = timed("router linear", moe.router, x)
      local probs = timed("softmax", function() return logits:softmax(-1) end)
      local w, idx = timed("topk + renormalise", function()
        local v, i = F.topk(probs, k)
        return v / v:sum(-1, true), i
      end)
      local flat = idx:reshape(-1)
      local order = timed("argsort", F.argsort, flat)
      local counts = timed("counts (one_hot sum, to host)", function() return F.one_hot(flat, E):sum(0):tolist() end)
      local tokens = timed("token of each slot", function()
        return F.index_select(lt.arange(0, N, {device = x.device}):unsqueeze(1):expand(N, k):reshape(-1), 0, order)
      end)
      local xs = timed("index_select tokens", F.index_select, x, 0, tokens)
      local ys = timed("experts (grouped matmuls, silu, mul)", moe.experts, moe, xs, counts)
      local yw = timed("weight by router probs", function()
        return ys * F.index_select(w:reshape(-1), 0, order):unsqueeze(1)
      end)
      timed("index_add back", function() return F.index_add(lt.zeros({N, C}, fo), 0, tokens, yw) end)
      timed("aux losses", function()
        local lse = F.logsumexp(logits, -1)
        return (probs:mean(0) * lt.tensor(counts, a.dtype)):sum(), (lse * lse):mean()
      end)
      timed("dense SwiGLU forward (for scale)", dense, x)
    end)
  end)
end
print("MoE forward, phase by phase (no_grad, median ms):")
local total = 0
for _, name in ipairs(order) do
  local m = util.median(phases[name])
  if not name:find("dense") then total = total + m end
  print(string.format("  %-40s %8.2f", name, ms(m)))
end
print(string.format("  %-40s %8.2f", "sum of the MoE phases", ms(total)))
