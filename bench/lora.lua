-- bench/lora.lua — SFT training steps with LoRA against full fine-tuning, on the same model:
-- tokens/s (median step) and memory (lutra.memory_stats' peak over the timed steps, and the
-- bytes of parameters, gradients and optimizer state), side by side.
--   lutra bench/lora.lua [--arch gpt2|llama] [--layers 4] [--heads 4] [--dim 256] [--seq 128]
--                        [--vocab 4096] [--batch 8] [--steps 6] [--warmup 2] [--r 8]
--                        [--threads 0] [--device cpu]
-- A step: forward on random tokens with the first quarter of every row's targets masked
-- (the prompt, as SFT), backward, clip to 1, AdamW. LoRA: all-linear, r, alpha 2r; the
-- optimizer gets the adapters alone. Each mode runs in its own process (--mode full|lora: one
-- `mode=... tokens_per_s=...` line), so that neither sees the other's memory; the default
-- (--mode both) runs the two and prints them side by side.
local lt = require "lutra"
local lora = require "lutra.lora"
local optim = require "lutra.optim"
local util = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/util.lua")

local a = util.options({arch = "gpt2", layers = 4, heads = 4, dim = 256, seq = 128, vocab = 4096, batch = 8, steps = 6,
                        warmup = 2, r = 8, threads = 0, device = "cpu", mode = "both"}, "bench/lora")
if a.threads > 0 then lt.set_num_threads(a.threads) end
local dev = a.device
local cuda = dev:find("^cuda") ~= nil

local function bytes_of(list)
  local n = 0
  for _, t in ipairs(list) do n = n + t:numel() * t:element_size() end
  return n
end

local function sync() if cuda then lt.cuda.synchronize() end end

local function run(mode)
  lt.manual_seed(1)
  local model = lt.models.build{arch = a.arch, n_layer = a.layers, n_head = a.heads, d_model = a.dim,
                                vocab_size = a.vocab, block_size = a.seq, device = dev}
  local groups = model
  if mode == "lora" then
    lora.apply(model, {r = a.r, alpha = 2 * a.r})
    groups = lora.param_groups(model, {weight_decay = 0})
  end
  local opt = optim.AdamW(groups, {lr = 1e-4, weight_decay = 0})
  local x = lt.randint(0, a.vocab, {a.batch, a.seq}, {dtype = "i64", device = dev})
  local y = lt.randint(0, a.vocab, {a.batch, a.seq}, {dtype = "i64", device = dev})
  lt.no_grad(function() y:narrow(1, 0, math.floor(a.seq / 4)):fill_(-100) end)
  local function step()
    lt.tidy(function()
      opt:zero_grad()
      local _, loss = model(x, y)
      loss:backward()
      optim.clip_grad_norm(opt.params, 1.0)
      opt:step()
    end)
  end
  for _ = 1, a.warmup do step() end
  sync()
  lt.collectgarbage()
  lt.reset_peak_memory_stats(dev)
  local base = lt.memory_stats(dev).allocated
  local times = {}
  for _ = 1, a.steps do
    local t0 = util.now()
    step()
    sync()
    times[#times + 1] = util.now() - t0
  end
  local st = lt.memory_stats(dev)
  local params, grads, opt_state = model:parameters(), {}, {}
  for _, p in ipairs(params) do
    if p.grad ~= nil then grads[#grads + 1] = p.grad end
  end
  for _, s in pairs(opt.state) do
    for _, v in pairs(s) do
      if lt.is_tensor(v) then opt_state[#opt_state + 1] = v end
    end
  end
  local med = util.median(times)
  return {mode = mode, step_s = med, tokens_per_s = a.batch * a.seq / med, peak = st.peak, at_rest = base,
          params = bytes_of(params), grads = bytes_of(grads), opt = bytes_of(opt_state),
          trainable = model:num_parameters{trainable = true}, total = model:num_parameters()}
end

if a.mode ~= "both" then
  local r = run(a.mode)
  print(string.format("mode=%s tokens_per_s=%.1f step_ms=%.3f peak=%d at_rest=%d params=%d grads=%d opt=%d "
    .. "trainable=%d total=%d threads=%d", r.mode, r.tokens_per_s, r.step_s * 1e3, r.peak, r.at_rest, r.params,
    r.grads, r.opt, r.trainable, r.total, lt.get_num_threads()))
  os.exit(0)
end

local results = {}
for _, mode in ipairs {"full", "lora"} do
  local cmd = {arg[-1], arg[0]}
  for k, v in pairs(a) do
    if k ~= "mode" then cmd[#cmd + 1] = "--" .. k .. "=" .. tostring(v) end
  end
  cmd[#cmd + 1] = "--mode=" .. mode
  local p = assert(io.popen(table.concat(cmd, " ")))
  local out = p:read("*a")
  p:close()
  local line = out:match("(mode=%S+ tokens_per_s=[^\n]*)")
  if not line then
    io.stderr:write("bench/lora: the " .. mode .. " run printed no result:\n" .. out .. "\n")
    os.exit(1)
  end
  local r = {}
  for k, v in line:gmatch("([%w_]+)=(%S+)") do r[k] = tonumber(v) or v end
  r.step_s = r.step_ms / 1e3
  results[#results + 1] = r
end
local MB = 1024 * 1024
print(string.format("bench/lora: %s, %d layers, d_model %d, %d heads, vocab %d, seq %d, batch %d, r %d, %s, %d threads, "
  .. "median of %d steps", a.arch, a.layers, a.dim, a.heads, a.vocab, a.seq, a.batch, a.r, dev, results[1].threads,
  a.steps))
print(string.format("%-34s %14s %14s", "", "full", "lora"))
local function row(name, f)
  print(string.format("%-34s %14s %14s", name, f(results[1]), f(results[2])))
end
row("trainable parameters", function(r) return string.format("%d", r.trainable) end)
row("step (median, ms)", function(r) return string.format("%.1f", r.step_s * 1e3) end)
row("tokens/s", function(r) return string.format("%.0f", r.tokens_per_s) end)
row("peak tensor memory (MiB)", function(r) return string.format("%.1f", r.peak / MB) end)
row("memory between steps (MiB)", function(r) return string.format("%.1f", r.at_rest / MB) end)
row("parameters (MiB)", function(r) return string.format("%.2f", r.params / MB) end)
row("gradients (MiB)", function(r) return string.format("%.2f", r.grads / MB) end)
row("optimizer state (MiB)", function(r) return string.format("%.2f", r.opt / MB) end)
