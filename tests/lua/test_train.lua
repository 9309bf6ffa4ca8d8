-- lutra.train and its parts: the checkpoint (lutra.ckpt) it saves, metrics lines, the progress
-- line, sampling (top-k, top-p, KV cache against recomputation), and the loop itself
-- (gradient accumulation, clipping, schedule, evaluation, metrics, Ctrl-C, memory, errors).
local ffi = require "ffi"
local lt = require "lutra"
local train = require "lutra.train"
local ckpt = require "lutra.ckpt"
local files = require "lutra.ckpt.files"
local json = require "lutra.json"
local metrics = require "lutra.train.metrics"
local progress = require "lutra.train.progress"
local generate = require "lutra.generate"
local models = require "lutra.models"
local T = require "lutra.testing"
local equal, fails, close = T.assert_equal, T.assert_error, T.assert_close

local dir = os.tmpname()
os.remove(dir)
os.execute("mkdir -p " .. dir)

-- ---- checkpoint format (lutra.ckpt, what the trainer saves) -----------------------------------

local function bytes_of(t)
  local c = t:contiguous()
  return ffi.string(ffi.cast("const char *", c:data_ptr()), c:numel() * c:element_size())
end

test("checkpoint: tensors of every dtype and a state of numbers, strings, booleans round-trip exactly", function()
  local a = lt.randn(3, 5)
  local tensors = {f32 = a, f64 = lt.randn(4, {dtype = "f64"}), bf16 = lt.randn(6):to("bf16"), i64 = lt.arange(5),
                   u8 = lt.tensor({1, 2, 255}, {dtype = "u8"}), noncontig = a:t(), scalar = lt.tensor(3.5),
                   ["nested.deeper.t"] = lt.arange(10):to("i32"), tied1 = a, tied2 = a}
  local list = {}
  for name, t in pairs(tensors) do list[#list + 1] = {name = name, tensor = t} end
  -- JSON numbers: the extra state holds no inf (the trainer's state has none)
  local extra = {step = 12, x = 0.1, tiny = 5e-324, big = 2 ^ 60 + 2 ^ 8, neg = -1 / 3,
                 s = "line1\nline2 \"quoted\" \\ \0 end", flag = true, off = false, list = {1, 2.5, "three"},
                 nested = {deeper = {n = 7}}, ["odd key"] = 1}
  local path = ckpt.save(dir .. "/ck/step_000001", {step = 12, tensors = list, extra = extra})
  equal(path, dir .. "/ck/step_000001")
  local r = ckpt.load(path)
  equal(r.manifest.step, 12)
  local back = r:extra(0)
  for _, k in ipairs {"step", "x", "tiny", "big", "neg", "s", "flag", "off", "odd key"} do
    assert(back[k] == extra[k], "key " .. tostring(k) .. ": " .. tostring(back[k]))
  end
  equal(back.list, {1, 2.5, "three"})
  equal(back.nested.deeper.n, 7)
  for name, t in pairs(tensors) do
    local got = r:tensor(name)
    equal(got.dtype, t.dtype, name)
    equal(got.shape, t.shape, name)
    equal(got:tolist(), t:tolist(), name)
    assert(bytes_of(got) == bytes_of(t), name .. ": bytes differ")
  end
  equal(ckpt.latest(dir .. "/ck"), path)
end)

test("checkpoint: replacing, latest, prune, errors", function()
  local root = dir .. "/ck2"
  local function state(s) return {step = s, tensors = {{name = "x", tensor = lt.ones(2) * s}}} end
  for s = 1, 4 do ckpt.save(string.format("%s/step_%06d", root, s), state(s)) end
  ckpt.save(root .. "/step_000004", state(44)) -- replaces the older one
  equal(ckpt.load(root .. "/step_000004").manifest.step, 44)
  equal(ckpt.latest(root), root .. "/step_000004")
  ckpt.prune(root, 2)
  assert(not files.exists(root .. "/step_000001/manifest.json"))
  assert(not files.exists(root .. "/step_000002/manifest.json"))
  assert(files.exists(root .. "/step_000003/manifest.json"))
  equal(ckpt.latest(dir .. "/nothing"), nil)
  fails("no checkpoint at", ckpt.load, dir .. "/nothing")
  fails("must be {name = <string>, tensor = <tensor>}", ckpt.save, root .. "/bad", {step = 1, tensors = {{name = "f"}}})
  assert(not files.exists(root .. "/bad/manifest.json"), "a failed save leaves nothing")
  -- truncated shard, wrong format, corrupt manifest
  local p = ckpt.save(root .. "/step_000009", {step = 9, tensors = {{name = "t", tensor = lt.ones(4)}}})
  local f = assert(io.open(p .. "/rank_00000.lz4", "wb"))
  f:write("abc")
  f:close()
  fails("rank_00000.lz4", function() ckpt.load(p):tensor("t") end)
  local manifest = json.decode(files.read(p .. "/manifest.json"))
  manifest.format = "other"
  f = assert(io.open(p .. "/manifest.json", "w"))
  f:write(json.encode(manifest))
  f:close()
  fails("lutra-checkpoint", ckpt.load, p)
  f = assert(io.open(p .. "/manifest.json", "w"))
  f:write("{{{")
  f:close()
  fails("not valid JSON", ckpt.load, p)
end)

-- ---- metrics, progress ---------------------------------------------------------------------

test("metrics: JSON lines, appended and read back", function()
  equal(metrics.encode{step = 3, loss = 0.5, name = "a\"b\n", ok = true, bad = 0 / 0},
    '{"bad":null,"loss":0.5,"name":"a\\"b\\n","ok":true,"step":3}')
  -- invalid UTF-8 (a stray byte, an overlong form, a surrogate): each byte that does not begin a
  -- valid sequence becomes U+FFFD, so the line stays valid JSON; valid UTF-8 is kept as it is
  equal(metrics.encode{p = "a\255b\192\128c\237\160\128", q = "h\195\169 \240\159\153\130"},
    '{"p":"a\239\191\189b\239\191\189\239\191\189c\239\191\189\239\191\189\239\191\189",'
    .. '"q":"h\195\169 \240\159\153\130"}')
  local path = dir .. "/m.jsonl"
  local log = metrics.open(path, "w")
  log:write{step = 1, loss = 2.25}
  log:write{step = 2, loss = 1 / 3, val_loss = 1.5}
  log:close()
  local recs = metrics.read(path)
  equal(#recs, 2)
  equal(recs[2].loss, 1 / 3)
  equal(recs[2].val_loss, 1.5)
end)

local function sink()
  local s = {buf = {}}
  function s:write(...)
    for _, v in ipairs {...} do self.buf[#self.buf + 1] = v end
  end
  function s:flush() end
  function s:text() return table.concat(self.buf) end
  return s
end

test("progress: in place on a terminal, plain lines otherwise", function()
  local r = {step = 5, loss = 2.5, lr = 1e-3, grad_norm = 0.75, tokens_per_s = 12345, eta = 75}
  local out = sink()
  local bar = progress.new{total = 100, out = out, tty = true}
  bar:update(r)
  bar:update(r)
  bar:print("val")
  bar:finish()
  local s = out:text()
  assert(s:find("^\rstep   5/100 | loss 2.5000 | lr 1.00e%-03 | norm 0.750 | 12.3k tok/s | eta 1m15s\27%[K\r"), s)
  equal(progress.new{total = 100, tty = false}:format{step = 5, loss = 2.5, peak_mem_mb = 1536},
    "step   5/100 | loss 2.5000 | mem 1.5 GB")
  equal(progress.new{total = 100, tty = false}:format{step = 5, loss = 2.5, peak_mem_mb = 812.4},
    "step   5/100 | loss 2.5000 | mem 812 MB")
  -- many ranks: the fullest device and its rank
  equal(progress.new{total = 100, tty = false}:format{step = 5, loss = 2.5, peak_mem_mb = 812.4,
                                                     rank_peak_mem_mb = {812.4, 2048, 900}},
    "step   5/100 | loss 2.5000 | mem 2.0 GB max (rank 1)")
  assert(s:find("\r\27%[Kval\n$"), s)
  out = sink()
  bar = progress.new{total = 100, out = out, tty = false}
  bar:update(r)
  bar:print("val")
  equal(out:text(), "step   5/100 | loss 2.5000 | lr 1.00e-03 | norm 0.750 | 12.3k tok/s | eta 1m15s\nval\n")
  equal(progress.duration(3725), "1h02m")
  equal(type(progress.isatty(1)), "boolean")
end)

-- ---- sampling ------------------------------------------------------------------------------

local function logits_of(list)
  local a = ffi.new("float[?]", #list)
  for i, v in ipairs(list) do a[i - 1] = v end
  return a, #list
end

test("choose: greedy, top-k, top-p, and the distribution", function()
  local a, V = logits_of {1.0, 3.0, 2.0, -1.0}
  equal(generate.choose(a, V, {temperature = 0}, 0.99), 1)
  equal(generate.choose(a, V, {top_k = 1}, 0.99), 1)
  equal(generate.choose(a, V, {top_p = 0.01}, 0.99), 1)
  -- softmax of the logits: quantiles of u give exactly the inverse CDF
  local p, z = {}, 0
  for i = 0, V - 1 do
    p[i] = math.exp(a[i])
    z = z + p[i]
  end
  local N, counts = 4000, {[0] = 0, 0, 0, 0}
  for k = 0, N - 1 do
    local id = generate.choose(a, V, {temperature = 1}, (k + 0.5) / N)
    counts[id] = counts[id] + 1
  end
  for i = 0, V - 1 do close(counts[i] / N, p[i] / z, {atol = 1 / N + 1e-9, rtol = 0}) end
  -- top-k 2: only ids 1 and 2, renormalised
  counts = {[0] = 0, 0, 0, 0}
  for k = 0, N - 1 do
    local id = generate.choose(a, V, {top_k = 2}, (k + 0.5) / N)
    counts[id] = counts[id] + 1
  end
  equal(counts[0] + counts[3], 0)
  close(counts[1] / N, p[1] / (p[1] + p[2]), {atol = 1 / N + 1e-9, rtol = 0})
  -- top-p 0.8 keeps ids 1 and 2 (0.665 + 0.245 >= 0.8)
  counts = {[0] = 0, 0, 0, 0}
  for k = 0, N - 1 do
    local id = generate.choose(a, V, {top_p = 0.8}, (k + 0.5) / N)
    counts[id] = counts[id] + 1
  end
  equal(counts[0] + counts[3], 0)
  -- temperature sharpens
  local hot = generate.choose(a, V, {temperature = 0.05}, 0.9)
  equal(hot, 1)
end)

local function tiny_model(arch, seed, init_std)
  lt.manual_seed(seed or 5)
  return models.build{arch = arch, n_layer = 2, n_head = 2, d_model = 16, vocab_size = 11, block_size = 12,
                      init_std = init_std}
end

test("generate: the KV cache gives the same tokens as recomputing", function()
  for _, arch in ipairs {"gpt2", "llama"} do
    local model = tiny_model(arch, 5, 0.5) -- large weights: greedy decoding that varies with the context
    -- within block_size (12) both see the whole context: the same tokens
    local greedy_cached, used = generate(model, {1, 2, 3}, {max_new_tokens = 9, temperature = 0})
    equal(used, true)
    local greedy_plain, used2 = generate(model, {1, 2, 3}, {max_new_tokens = 9, temperature = 0, cache = false})
    equal(used2, false)
    equal(#greedy_cached, 12)
    equal(greedy_cached, greedy_plain)
    -- past it, both go on (the cache restarts from the last half block, recomputing crops to the block)
    equal(#generate(model, {1, 2, 3}, {max_new_tokens = 30, temperature = 0}), 33)
    equal(#generate(model, {1, 2, 3}, {max_new_tokens = 30, temperature = 0, cache = false}), 33)
    local ids = generate(model, {1, 2, 3}, {max_new_tokens = 30, temperature = 0})
    for i = 1, 12 do equal(ids[i], greedy_cached[i]) end
    for _, id in ipairs(ids) do assert(id >= 0 and id < 11) end
    lt.manual_seed(9)
    local s1 = generate(model, {4}, {max_new_tokens = 8, temperature = 1, top_k = 5})
    lt.manual_seed(9)
    local s2 = generate(model, {4}, {max_new_tokens = 8, temperature = 1, top_k = 5, cache = false})
    equal(s1, s2)
    equal(model.training, true) -- the mode is restored
    model:eval()
    generate(model, {4}, {max_new_tokens = 2})
    equal(model.training, false)
  end
  fails("prompt is empty", generate, tiny_model("gpt2"), {})
  fails("temperature must be", generate, tiny_model("gpt2"), {1}, {temperature = -1})
end)

-- ---- the loop --------------------------------------------------------------------------------

-- A loader of fixed random batches (B, T) over vocab 11, with state.
local function fixed_loader(nbatches, B, Tn, seed)
  local batches = {}
  lt.manual_seed(seed or 3)
  for i = 1, nbatches do
    local w = lt.randint(0, 11, {B, Tn + 1})
    batches[i] = {w:narrow(1, 0, Tn):contiguous(), w:narrow(1, 1, Tn):contiguous()}
  end
  local L = {step = 0}
  function L:next()
    local b = batches[self.step % nbatches + 1]
    self.step = self.step + 1
    return b[1], b[2]
  end
  function L:state() return {step = self.step} end
  function L:set_state(s) self.step = s.step end
  return L, batches
end

local function sgd_cfg(extra)
  local c = {steps = 1, optimizer = "sgd", momentum = 0, weight_decay = 0, lr = 0.5, warmup = 0,
             schedule = "constant", grad_clip = 0, eval_every = 0}
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end

test("gradient accumulation: one step over k micro-batches is the step on their mean loss", function()
  local model = tiny_model("gpt2", 11)
  local loader, batches = fixed_loader(2, 3, 6)
  local r = train{model = model, data = loader, config = sgd_cfg{grad_accum = 2}, quiet = true}
  equal(r.tokens, 2 * 3 * 6)
  local ref = tiny_model("gpt2", 11)
  local _, l1 = ref:forward(batches[1][1], batches[1][2])
  local _, l2 = ref:forward(batches[2][1], batches[2][2])
  close(r.losses[1], (l1:item() + l2:item()) / 2, {rtol = 1e-6})
  local mean = (l1 + l2) * 0.5
  mean:backward()
  local got = model:state_dict()
  for name, p in pairs(ref:state_dict()) do
    local expect = lt.no_grad(function() return p - p.grad * 0.5 end)
    close(got[name], expect, {rtol = 1e-5, atol = 1e-6, msg = name})
  end
end)

test("clipping: the update of a clipped step has norm lr * grad_clip; the norm is the unclipped one", function()
  local model = tiny_model("gpt2", 12)
  local before = {}
  for name, p in pairs(model:state_dict()) do before[name] = p:clone() end
  local r = train{model = model, data = fixed_loader(1, 2, 5), config = sgd_cfg{grad_clip = 1e-3, lr = 1},
                  quiet = true, log = function(rec) assert(rec.grad_norm > 1e-3) end}
  local sq = 0
  for name, p in pairs(model:state_dict()) do
    if name ~= "lm_head.weight" then sq = sq + ((p - before[name]) ^ 2):sum():item() end
  end
  close(math.sqrt(sq), 1e-3, {rtol = 1e-3})
  assert(r.step == 1)
  -- without clipping the norm is reported and the update is larger
  model = tiny_model("gpt2", 12)
  local norm
  train{model = model, data = fixed_loader(1, 2, 5), config = sgd_cfg{grad_clip = 0}, quiet = true,
        log = function(rec) norm = rec.grad_norm end}
  assert(norm > 1e-3)
end)

test("schedule, evaluation, metrics.jsonl, samples and config in the run directory", function()
  local model = tiny_model("gpt2", 13)
  local run_dir = dir .. "/run_m"
  local recs = {}
  local tok = lt.tokenizer.char("abcdefghijk")
  local r = train{model = model, data = fixed_loader(3, 2, 6), val_data = fixed_loader(2, 2, 6, 8), tokenizer = tok,
                  config = {steps = 6, warmup = 2, lr = 1e-2, min_lr = 1e-3, eval_every = 3, eval_iters = 2,
                            sample_every = 3, sample_tokens = 5, run_dir = run_dir},
                  quiet = true, log = function(rec) recs[#recs + 1] = rec end}
  local sched = require("lutra.optim.schedule").cosine{lr = 1e-2, min_lr = 1e-3, warmup = 2, total = 6}
  local file = metrics.read(run_dir .. "/latest/metrics.jsonl")
  equal(#file, #recs)
  local steps, vals = {}, {}
  for _, rec in ipairs(file) do
    if rec.loss then
      steps[#steps + 1] = rec.step
      equal(rec.lr, sched(rec.step - 1))
      assert(rec.grad_norm > 0 and rec.tokens_per_s > 0, "grad_norm and tokens_per_s")
      -- the device's peak tensor memory: at least the model's parameters and their gradients
      assert(rec.peak_mem_mb >= 2 * model:num_parameters() * 4 / 2 ^ 20, "peak_mem_mb " .. tostring(rec.peak_mem_mb))
    else
      vals[#vals + 1] = rec.step
      assert(rec.val_loss > 0)
    end
  end
  equal(steps, {1, 2, 3, 4, 5, 6})
  equal(vals, {0, 3, 6})
  equal(#r.val_losses, 3)
  local f = assert(io.open(run_dir .. "/latest/samples.txt"))
  local samples = f:read("*a")
  f:close()
  assert(samples:find("---- step 3 ----") and samples:find("---- step 6 ----"), samples)
end)

test("loss_fn: a custom loss and extra metrics", function()
  local model = tiny_model("gpt2", 14)
  local seen = {}
  train{model = model, data = fixed_loader(2, 2, 4), quiet = true, config = {steps = 2, eval_every = 0, warmup = 0},
        loss_fn = function(m, batch)
          local _, loss = m:forward(batch.x, batch.y)
          return loss * 2, {aux = 0.25}
        end, log = function(rec) seen[#seen + 1] = rec end}
  equal(seen[1].aux, 0.25)
  equal(seen[1].rank_step_ms, nil) -- (one process: no per-rank lists)
  -- grad_accum 2: a mean stays the mean of the micro-batches', a declared sum adds them up
  seen = {}
  local calls = 0
  train{model = model, data = fixed_loader(2, 2, 4), quiet = true, config = {steps = 1, eval_every = 0, warmup = 0,
        grad_accum = 2}, log = function(rec) seen[#seen + 1] = rec end, loss_fn = function(m, batch)
          calls = calls + 1
          local _, loss = m:forward(batch.x, batch.y)
          return loss, {aux = calls, n = {lt.tensor(3), reduce = "sum"}}
        end}
  equal(seen[1].aux, 1.5)
  equal(seen[1].n, 6)
  fails("extra metric 'n' has reduce = max; use \"mean\" (the default) or \"sum\"", train, {model = model,
    data = fixed_loader(1, 1, 4), quiet = true, config = {steps = 1, eval_every = 0}, loss_fn = function(m, batch)
      return select(2, m:forward(batch.x, batch.y)), {n = {1, reduce = "max"}}
    end})
  fails("the loss must be a tensor", train, {model = model, data = fixed_loader(1, 1, 4), quiet = true,
    config = {steps = 1, eval_every = 0}, loss_fn = function() return "x" end})
end)

test("MFU: model FLOPs per token counted by hand (gpt2, moe), and the record's mfu from them", function()
  local mfu = require "lutra.train.mfu"
  -- gpt2, d 16, 2 layers, vocab 11, block 12, tied head: the parameters a token passes through
  local d, L, V, Tn = 16, 2, 11, 12
  local block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (4 * d * d + 4 * d) + (4 * d * d + d)
  local n = V * d + L * block + 2 * d -- wte, blocks, ln_f (wpe left out)
  local model = tiny_model("gpt2", 3)
  equal(mfu.flops_per_token(model), 6 * n + 12 * L * Tn * d)
  -- moe, 4 experts top-2 of d_ff 8: 2 of the 4 experts' weights
  lt.manual_seed(3)
  local moe = models.build{arch = "moe", n_layer = 1, n_head = 2, d_model = d, vocab_size = V, block_size = Tn,
                           n_experts = 4, top_k = 2, ffn_hidden = 8}
  local dense, experts = 0, 0
  for name, p in moe:named_parameters() do
    if name:match("%.mlp%.w_") then experts = experts + p:numel() else dense = dense + p:numel() end
  end
  equal(experts, 3 * 4 * 8 * d)
  equal(mfu.flops_per_token(moe), 6 * (dense + experts / 2) + 12 * 1 * Tn * d)
  equal(mfu.flops_per_token({}), nil)
  -- a run's records: mfu = tokens/s x FLOPs per token / the CPU's measured GEMM rate
  local recs = {}
  train{model = model, data = fixed_loader(2, 2, 6), quiet = true, config = {steps = 2, eval_every = 0, warmup = 0},
        log = function(rec) recs[#recs + 1] = rec end}
  local peak = mfu.peak_flops("cpu", "f32")
  assert(peak > 1e8, "a measured GEMM rate above 0.1 GFLOP/s: " .. peak)
  for _, rec in ipairs(recs) do
    if rec.loss then
      close(rec.mfu, rec.tokens_per_s * mfu.flops_per_token(model) / peak, {rtol = 1e-12, atol = 0, msg = "mfu"})
      assert(rec.mfu > 0 and rec.mfu < 1, "mfu " .. rec.mfu)
    end
  end
  equal(progress.new{total = 100, tty = false}:format{step = 5, loss = 2.5, mfu = 0.456, peak_mem_mb = 36},
    "step   5/100 | loss 2.5000 | MFU 45.6% | mem 36 MB")
end)

test("time split: the phases of a run add up to its wall time; the table at the end", function()
  local model = tiny_model("gpt2", 4)
  local r = train{model = model, data = fixed_loader(3, 2, 6), val_data = fixed_loader(2, 2, 6, 8), quiet = true,
                  config = {steps = 4, eval_every = 2, eval_iters = 1, warmup = 0, run_dir = dir .. "/split", ckpt_every = 2}}
  local split, sum = r.time_split, 0
  for _, phase in ipairs {"data", "forward", "backward", "optimizer", "evaluation", "checkpoint"} do
    assert(split[phase] and split[phase] > 0, "phase " .. phase .. ": " .. tostring(split[phase]))
  end
  for _, s in pairs(split) do sum = sum + s end
  -- the phases and "other" add up to the run's wall time: result.seconds, plus the last save's wait after it
  assert(sum >= r.seconds and sum - r.seconds <= (split.checkpoint or 0) + 0.05,
    string.format("split sum %.4f, run %.4f", sum, r.seconds))
  local t = require("lutra.train.timing").new()
  t:add("forward", 1.5)
  t:add("backward", 2.5)
  equal(t:lines(5), {"time split            seconds   share", "forward                  1.50   30.0%",
                     "backward                 2.50   50.0%", "other                    1.00   20.0%",
                     "total                    5.00  100.0%"})
end)

test("a given optimizer and its own schedule", function()
  local model = tiny_model("gpt2", 18)
  local S = require "lutra.optim.schedule"
  local sched = S.linear{lr = 0.01, min_lr = 0, warmup = 1, total = 4}
  local opt = require("lutra.optim").SGD(model, {lr = 0.01, schedule = sched})
  local lrs = {}
  train{model = model, data = fixed_loader(2, 2, 4), optimizer = opt, quiet = true,
        config = {steps = 4, eval_every = 0}, log = function(rec) lrs[#lrs + 1] = rec.lr end}
  equal(lrs, {sched(0), sched(1), sched(2), sched(3)})
  equal(opt.steps, 4)
end)

test("Ctrl-C stops after the current step and saves a checkpoint", function()
  pcall(ffi.cdef, "int raise(int sig);")
  local model = tiny_model("gpt2", 15)
  local run_dir = dir .. "/run_int"
  local calls = 0
  local r = train{model = model, data = fixed_loader(2, 2, 4), quiet = true,
                  config = {steps = 10, eval_every = 0, warmup = 0, run_dir = run_dir},
                  loss_fn = function(m, batch)
                    calls = calls + 1
                    if calls == 3 then ffi.C.raise(2) end -- SIGINT in the middle of step 3
                    local _, loss = m:forward(batch.x, batch.y)
                    return loss
                  end}
  equal(r.interrupted, true)
  equal(r.step, 3)
  equal(r.checkpoint, run_dir .. "/ckpt/step_000003")
  equal(require("lutra.ckpt").load(r.checkpoint).manifest.step, 3)
  equal(lt.C.lt_interrupt_pending(0), 0) -- disarmed and cleared
end)

test("memory stays flat across steps", function()
  local model = tiny_model("gpt2", 16)
  local loader = fixed_loader(2, 4, 8)
  local cfg = {steps = 30, eval_every = 0, warmup = 0}
  local live = {}
  lt.collectgarbage()
  train{model = model, data = loader, quiet = true, config = cfg,
        log = function(rec) live[rec.step] = lt.memory_stats().allocated end}
  equal(live[30], live[3])
end)

test("bad arguments", function()
  local model = tiny_model("gpt2", 17)
  fails("expected a table", train, nil)
  fails("model = must be a module", train, {model = {}, data = fixed_loader(1, 1, 4)})
  fails("data = must be a loader", train, {model = model, data = {}})
  fails("unknown optimizer", train, {model = model, data = fixed_loader(1, 1, 4), config = {optimizer = "adam"}})
  fails("grad_accum must be", train, {model = model, data = fixed_loader(1, 1, 4), config = {grad_accum = 0}})
  local stub_opt = {step = function() end, zero_grad = function() end, state = {}}
  fails("returned no loss", train, {model = {parameters = function() return {} end, forward = function() end},
                                    data = fixed_loader(1, 1, 4), optimizer = stub_opt,
                                    config = {steps = 1, eval_every = 0}, quiet = true})
end)

test("generate.text returns the one string; a warmup as long as the run is said on stderr", function()
  local model = tiny_model("gpt2", 11)
  local tok = lt.tokenizer.char("abcdefghijk")
  local n = select("#", generate.text(model, tok, "abc", {max_new_tokens = 3, temperature = 0}))
  equal(n, 1)
  local text = generate.text(model, tok, "abc", {max_new_tokens = 3, temperature = 0})
  equal(#text, 6)
  local said, stderr = {}, io.stderr
  io.stderr = {write = function(_, ...) for _, s in ipairs {...} do said[#said + 1] = s end end}
  local function run(c) train{model = tiny_model("gpt2", 11), data = fixed_loader(1, 1, 4), quiet = true, config = c} end
  local ok, err = pcall(function()
    run(sgd_cfg{steps = 2, warmup = 2, schedule = "cosine"})
    run(sgd_cfg{steps = 2, warmup = 5})
    run(sgd_cfg{steps = 3, warmup = 2, schedule = "cosine"})
  end)
  io.stderr = stderr
  assert(ok, err)
  equal(said, {"lutra: warning: warmup (2 steps) is not shorter than the run (2 steps): the cosine schedule runs "
    .. "without warmup; set warmup below steps\n", "lutra: warning: warmup (5 steps) is not shorter than the run "
    .. "(2 steps): the lr never reaches lr; set warmup below steps\n"})
end)

test("cleanup", function() os.execute("rm -rf " .. dir) end)
