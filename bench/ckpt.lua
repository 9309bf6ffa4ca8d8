-- bench/ckpt.lua — checkpoint figures: save and load MB/s, the lz4 ratio on trained weights
-- (fp32 and bf16) and Adam moments, and the time the training loop stalls per async save,
-- next to plain `dd` (with fsync) and `cp` + sync of the same bytes on the same disk.
--   lutra bench/ckpt.lua [--mb 256] [--steps 200] [--saves 4] [--every 10] [--dir /tmp/lutra_bench_ckpt]
--                        [--threads 2] [--level 0] [--layers 2] [--dim 128]
-- 1. Trains a small char-level GPT-2 (2 layers, d 128; tinyshakespeare bytes when
--    ../shared/data is there, else random tokens) for --steps AdamW steps, saves its
--    parameters (fp32, and bf16 copies) and Adam moments, and prints each lz4 ratio.
-- 2. Throughput: --mb MB of tensors shaped like trained weights (normal, std 0.02, fp32: a
--    stand-in, said so in the output; lz4 finds as little in them as in trained fp32),
--    saved (compress + write + fsync + rename) and loaded (read + decode + checksums; the
--    file is in the page cache, as right after a save), then the same raw bytes through dd
--    conv=fsync and cp + sync.
-- 3. Async: the training loop of 1 goes on for --saves * --every steps, saving model and
--    optimizer state asynchronously every --every steps; prints the median step time, the
--    stall per save (the time the save call blocks) and its ratio to a step.
local lt = require "lutra"
local optim = require "lutra.optim"
local ckpt = require "lutra.ckpt"
local ffi = require "ffi"
local util = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/util.lua")
local now, median = util.now, util.median

local a = util.options({mb = 256, steps = 200, saves = 4, every = 10, dir = "/tmp/lutra_bench_ckpt", threads = 2,
                        level = 0, layers = 2, dim = 128}, "ckpt bench")
lt.set_num_threads(a.threads)
lt.manual_seed(0)
os.execute("rm -rf " .. a.dir .. " && mkdir -p " .. a.dir)

local function sh(cmd)
  local t0 = now()
  local ok = os.execute(cmd)
  if ok ~= 0 and ok ~= true then error("bench: failed: " .. cmd) end
  return now() - t0
end
local function mbs(bytes, s) return bytes / 2 ^ 20 / s end
local rows = {}
local function row(what, bytes, secs, note)
  rows[#rows + 1] = string.format("| %-44s | %9.1f | %8.3f | %9.1f | %s |", what, bytes / 2 ^ 20, secs, mbs(bytes, secs),
    note or "")
end

-- ---- 1. a small model, trained ----------------------------------------------------------------
local V, T, B = 256, 64, 8
local model = lt.models.build {arch = "gpt2", n_layer = a.layers, n_head = 4, d_model = a.dim, vocab_size = V, block_size = T,
                               dropout = 0}
local named = {}
for name, p in model:named_parameters() do named[#named + 1] = {name = name, p = p} end
local params = model:parameters()
local opt = optim.AdamW(params, {lr = 1e-3, weight_decay = 0.1})
local text = io.open((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/../../shared/data/tinyshakespeare.txt", "rb")
local corpus = text and text:read("*a")
if text then text:close() end
local function batch()
  local x, y = {}, {}
  for b = 1, B do
    x[b], y[b] = {}, {}
    local at = corpus and math.random(1, #corpus - T - 1) or 0
    for t = 1, T do
      x[b][t] = corpus and corpus:byte(at + t - 1) or math.random(0, V - 1)
      y[b][t] = corpus and corpus:byte(at + t) or math.random(0, V - 1)
    end
  end
  return lt.tensor(x, {dtype = "i64"}), lt.tensor(y, {dtype = "i64"})
end
math.randomseed(1)
local fence_wait = 0 -- seconds step() waited in ckpt.fence since the last save
local function step()
  for _, p in ipairs(params) do if p.grad ~= nil then p.grad:free() end end
  opt:zero_grad(true)
  local x, y = batch()
  local loss = lt.tidy(function()
    local logits, l = model(x, y)
    logits:free()
    l:backward()
    return l:item()
  end)
  -- an async save in flight takes its copy of the weights while forward and backward run;
  -- the loop waits here, before they change, only for what is left of that copy
  local tf = now()
  ckpt.fence()
  fence_wait = fence_wait + (now() - tf)
  opt:step()
  return loss
end
local first, last
local t_train = now()
for s = 1, a.steps do
  last = step()
  if s == 1 then first = last end
end
t_train = now() - t_train

local function state_tensors(dtype)
  local list = {}
  for _, e in ipairs(named) do
    list[#list + 1] = {name = e.name, tensor = dtype and e.p:to(dtype) or e.p}
  end
  return list
end
local function moment_tensors()
  local list = {}
  for k, e in ipairs(named) do -- opt.keys[k] is parameter k's state key (its position: built from a list)
    local st = opt.state[opt.keys[k]]
    if st then
      list[#list + 1] = {name = "optim." .. e.name .. ".exp_avg", tensor = st.exp_avg}
      list[#list + 1] = {name = "optim." .. e.name .. ".exp_avg_sq", tensor = st.exp_avg_sq}
    end
  end
  return list
end
local ratios = {}
for _, case in ipairs {{"params fp32", state_tensors()}, {"params bf16", state_tensors("bf16")},
                       {"Adam moments fp32", moment_tensors()}} do
  ckpt.save(a.dir .. "/ratio/step_000001", {step = 1, tensors = case[2]}, {level = a.level})
  local s = ckpt.last_save()
  ratios[#ratios + 1] = string.format("| %-18s | %8.2f MB | %8.2f MB | %5.3fx |", case[1], s.raw / 2 ^ 20,
    s.compressed / 2 ^ 20, s.raw / s.compressed)
end

-- ---- 2. throughput ------------------------------------------------------------------------------
local per = 16 * 2 ^ 20 / 4 -- 16 MB tensors
local big = {}
for k = 1, math.max(1, math.floor(a.mb / 16)) do
  big[k] = {name = "w" .. k, tensor = lt.randn(per / 1024, 1024) * 0.02}
end
local total = #big * 16 * 2 ^ 20
local out = lt.empty(per / 1024, 1024)
for _, shuffle in ipairs {true, false} do
  local tag = shuffle and "byte-shuffled" or "plain"
  local t0 = now()
  ckpt.save(a.dir .. "/big/step_000001", {step = 1, tensors = big}, {level = a.level, shuffle = shuffle})
  local t_save = now() - t0
  local s = ckpt.last_save()
  row("ckpt.save, " .. tag .. " (lz4, fsync, rename)", total, t_save, string.format("ratio %.3fx", s.raw / s.compressed))
  t0 = now()
  local r = ckpt.load(a.dir .. "/big/step_000001")
  for _, e in ipairs(big) do r:read(e.name, nil, nil, out) end
  row("ckpt.load, " .. tag .. " (decode + checksums)", total, now() - t0, "page-cached file")
end
-- the same raw bytes, plainly
local raw = a.dir .. "/raw.bin"
do
  local f = assert(io.open(raw, "wb"))
  for _, e in ipairs(big) do
    f:write(ffi.string(ffi.cast("const char *", e.tensor:data_ptr()), 16 * 2 ^ 20))
  end
  f:close()
end
local t_dd = sh(string.format("dd if=%s of=%s/dd.bin bs=16M conv=fsync status=none", raw, a.dir))
row("dd bs=16M conv=fsync (raw bytes)", total, t_dd, "plain copy, no compression")
local t_cp = sh(string.format("cp %s %s/cp.bin && sync %s/cp.bin", raw, a.dir, a.dir))
row("cp + sync (raw bytes)", total, t_cp, "plain copy, no compression")
local t_cat = sh(string.format("cat %s/dd.bin > /dev/null", a.dir))
row("cat > /dev/null (read, cached)", total, t_cat, "plain read")

-- ---- 3. async saves in the training loop ---------------------------------------------------
local steps, stalls, bg = {}, {}, {}
local n_state = 0
for _, e in ipairs(state_tensors()) do n_state = n_state + e.tensor:numel() * 4 end
for _, e in ipairs(moment_tensors()) do n_state = n_state + e.tensor:numel() * 4 end
local k = 0
for sv = 1, a.saves do
  for _ = 1, a.every do
    local ts = now()
    step()
    steps[#steps + 1] = now() - ts
  end
  k = k + a.every
  local list = state_tensors()
  for _, e in ipairs(moment_tensors()) do list[#list + 1] = e end
  -- the stall of a save: its own call, plus the next step's wait at the fence
  if sv > 1 then stalls[#stalls] = stalls[#stalls] + fence_wait end
  fence_wait = 0
  local ts = now()
  ckpt.save(string.format("%s/async/step_%06d", a.dir, a.steps + k), {step = a.steps + k, tensors = list,
    extra = {loss = last}}, {async = true, keep = 2, level = a.level})
  stalls[#stalls + 1] = now() - ts
  if sv > 1 then bg[#bg + 1] = ckpt.last_save().seconds end
end
ckpt.wait()
bg[#bg + 1] = ckpt.last_save().seconds
local med_step, med_stall, med_bg = median(steps), median(stalls), median(bg)
-- a sync save of the same state, for comparison
local ts = now()
local list = state_tensors()
for _, e in ipairs(moment_tensors()) do list[#list + 1] = e end
ckpt.save(a.dir .. "/sync/step_000001", {step = 1, tensors = list}, {level = a.level})
local t_sync = now() - ts

print(string.format("# bench/ckpt.lua: %d threads, dir %s, lz4 level %d", a.threads, a.dir, a.level))
print(string.format("trained: gpt2 %dx%d char-level,", a.layers, a.dim) .. string.format(" %d AdamW steps on %s, loss %.3f -> %.3f (%.1f s)", a.steps,
  corpus and "tinyshakespeare" or "random tokens", first, last, t_train))
print("\n| state (trained)    |      raw    |   lz4       | ratio  |")
print("|--------------------|-------------|-------------|--------|")
for _, l in ipairs(ratios) do print(l) end
print(string.format("\nthroughput on %d MB of weight-like fp32 (normal, std 0.02: a stand-in for trained weights)", total / 2 ^ 20))
print("| what                                         |        MB |        s |      MB/s | note |")
print("|----------------------------------------------|-----------|----------|-----------|------|")
for _, l in ipairs(rows) do print(l) end
print(string.format("\nasync saves of model + Adam state (%.1f MB) every %d steps, %d saves:", n_state / 2 ^ 20, a.every,
  a.saves))
print(string.format("| median step %.1f ms | stall per save %.2f ms (%.1f%% of a step; %.2f%% of the %d steps between saves) "
  .. "| writer thread %.1f ms | sync save %.1f ms |", med_step * 1e3, med_stall * 1e3, 100 * med_stall / med_step,
  100 * med_stall / (med_step * a.every), a.every, med_bg * 1e3, t_sync * 1e3))
os.execute("rm -rf " .. a.dir)
