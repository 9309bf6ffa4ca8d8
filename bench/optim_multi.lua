-- bench/optim_multi.lua — one AdamW step over a GPT-2-small-shaped parameter list (148 tensors,
-- 124M parameters by default), the multi-tensor path (adamw.update_group: one
-- lt_adamw_step_multi call) against the per-tensor loop (adamw.update_one per parameter, what the
-- optimizer did before), on the CPU.
--   lutra bench/optim_multi.lua [--layers 12] [--dim 768] [--vocab 50257] [--ctx 1024] [--runs 7]
--                               [--dtype f32|bf16]      (bf16: bf16 parameters with f32 masters)
-- The two paths alternate run by run on the same tensors (the values drift, the work does not).
-- Printed per path: the median wall time and the median process CPU time (os.clock, all threads)
-- of one step, and their ratios per-tensor / multi.
local lt = require "lutra"
local adamw = require "lutra.optim.adamw"
local util = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/util.lua")
local now, median = util.now, util.median

local opts = {layers = 12, dim = 768, vocab = 50257, ctx = 1024, runs = 7, dtype = "f32"}
for i = 1, #arg, 2 do
  local k = arg[i]:match("^%-%-(.*)$")
  if not k or opts[k] == nil then error("optim_multi bench: unknown option " .. tostring(arg[i])) end
  opts[k] = tonumber(arg[i + 1]) or arg[i + 1]
end

-- GPT-2's parameters: embeddings, per block ln_1, attn (qkv, proj), ln_2, mlp (fc, proj), ln_f.
local C = opts.dim
local shapes = {{opts.vocab, C}, {opts.ctx, C}}
for _ = 1, opts.layers do
  for _, s in ipairs {{C}, {C}, {3 * C, C}, {3 * C}, {C, C}, {C}, {C}, {C}, {4 * C, C}, {4 * C}, {C, 4 * C}, {C}} do
    shapes[#shapes + 1] = s
  end
end
shapes[#shapes + 1], shapes[#shapes + 2] = {C}, {C}

lt.manual_seed(1)
local items, numel = {}, 0
local master = opts.dtype ~= "f32"
for i, s in ipairs(shapes) do
  local p = lt.randn(s, {dtype = opts.dtype}) * 0.02
  local st = adamw.init(p)
  if master then st.master = p:to("f32") end
  items[i] = {p = p, grad = lt.randn(s, {dtype = opts.dtype}) * 1e-3, st = st}
  numel = numel + p:numel()
end
local group = {lr = 6e-4, betas = {0.9, 0.95}, eps = 1e-8, weight_decay = 0.1}

local function per_tensor()
  for _, it in ipairs(items) do adamw.update_one(it, group, group.lr) end
end
local function multi() adamw.update_group(items, group, group.lr) end

local paths = {{"per-tensor loop", per_tensor}, {"multi-tensor", multi}}
local wall, cpu = {{}, {}}, {{}, {}}
per_tensor() -- warm: pages touched, state steps equal for both paths from here
multi()
for r = 1, opts.runs do
  for k = 1, 2 do
    local j = (r + k) % 2 + 1 -- alternate which path goes first
    collectgarbage()
    local c0, t0 = os.clock(), now()
    paths[j][2]()
    wall[j][#wall[j] + 1], cpu[j][#cpu[j] + 1] = now() - t0, os.clock() - c0
  end
end

print(string.format("AdamW step: %d tensors, %.1fM parameters, %s%s, %d threads, median of %d", #items, numel / 1e6,
  opts.dtype, master and " + f32 masters" or "", lt.C.lt_get_num_threads(), opts.runs))
local med = {}
for j, path in ipairs(paths) do
  med[j] = {median(wall[j]), median(cpu[j])}
  print(string.format("  %-16s wall %8.2f ms   cpu %8.2f ms", path[1], med[j][1] * 1e3, med[j][2] * 1e3))
end
print(string.format("  per-tensor / multi: wall %.2fx, cpu %.2fx", med[1][1] / med[2][1], med[1][2] / med[2][2]))
