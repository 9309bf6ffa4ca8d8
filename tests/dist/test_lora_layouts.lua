-- np: 2 4
-- LoRA under tensor parallelism (lutra.lora.tp) and the other layouts: the parallel LoRA
-- layers against lora.LoRALinear (values, grads of the input and the adapters, dropout
-- masks, split_fused row blocks, sequence parallel; in f64), then small gpt2 and llama LoRA
-- models under {tp}, {dp, tp}, {dp, tp, zero 1 | 3}, {dp, zero 1 | 3}, {tp, sequence_parallel},
-- {pp}, {tp, pp}, and with LoRA dropout 0.1 under tp (the masks of one process; data
-- parallelism draws other masks) against the same LoRA model on one process in this process
-- (layout_helpers.lua says why these two comparisons):
--   - f64: 10 AdamW steps with clipping through lutra.train; every step's loss and every
--     gathered adapter to 1e-9 relative, base weights bitwise unchanged;
--   - f32: step 1 up to the optimizer; the loss, the global gradient norm and every gathered
--     adapter gradient within the f32 rounding bound of layout_helpers.f32_tolerance.
-- Then merge / unmerge / disable / merge_and_unload, lora.save (the files of one process)
-- and lora.load under tp, specs.
local lt = require "lutra"
local testing = require "lutra.testing"
local comm = require "lutra.dist.comm"
local spec = require "lutra.dist.spec"
local tp = require "lutra.dist.tp"
local tp_ops = require "lutra.dist.tp_ops"
local lora = require "lutra.lora"
local lora_tp = require "lutra.lora.tp"
local nn = lt.nn

comm.init()
local N, R = comm.size(), comm.rank()
local world = comm.world
local group = comm.split(0, R, "tp")

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/dist/") .. "layout_helpers.lua")

local function close(a, e, msg, atol)
  testing.assert_close(a, e, {rtol = 1e-5, atol = atol or 1e-6, msg = msg})
end

-- The layer cases and the merge tests run in f64: the tp pieces against the whole layer or
-- model to 1e-9 of the tensor's scale (one forward/backward in f64 agrees to ~1e-15).
local worst_layer = 0
local function close64(a, e, msg)
  assert(a.dtype == "f64" and e.dtype == "f64", msg .. ": the layer cases are f64")
  worst_layer = math.max(worst_layer, H.assert_rel(a, e, H.F64_REL, msg))
end

local leaf = H.leaf

-- A LoRALinear over a fresh Linear(inf, out) with random B (B starts at zero: its A
-- gradient would be zero).
local Holder = nn.Module:extend("Holder")
local function lora_linear(inf, out, opts)
  local holder = Holder()
  holder.lin = nn.Linear(inf, out)
  lora.apply(holder, {targets = {"lin"}, r = opts.r or 3, alpha = 6, dropout = opts.dropout or 0})
  holder:to("f64")
  local m = holder.lin
  if opts.blocks then m:set_blocks(opts.blocks) end
  lt.no_grad(function() m.lora_B.weight:normal_(0, 0.5) end)
  return m
end

-- ---- layers ---------------------------------------------------------------------------------

local function column_case(input, dropout, blocks)
  lt.manual_seed(11)
  local out = 6 * N
  local full = lora_linear(8, out, {dropout = dropout, blocks = blocks})
  -- this rank's rows: two pieces (as qkv's), uneven
  local half = out / 2
  local a0, ac = tp_ops.range(half, N, R)
  local pieces = {{a0, ac}, {half + a0, ac}}
  local col = lora_tp.ColumnParallelLoRALinear(full, group, pieces, {input = input})
  local T = 2 * N
  local x, gy = lt.randn(3, T, 8):double(), lt.randn(3, T, out):double()
  local xr = leaf(x)
  lt.manual_seed(5)
  local yr = full(xr)
  ;(yr * gy):sum():backward()
  local xt = leaf(input == "gather" and x:narrow(1, R * 2, 2) or x)
  lt.manual_seed(5)
  local yt = col(xt)
  local take = function(t, dim) return lt.cat({t:narrow(dim, a0, ac), t:narrow(dim, half + a0, ac)}, dim) end
  ;(yt * take(gy, 2)):sum():backward()
  close64(yt, take(yr, 2), "y")
  close64(xt.grad, input == "gather" and xr.grad:narrow(1, R * 2, 2) or xr.grad, "x.grad")
  close64(col.lora_A.weight.grad, full.lora_A.weight.grad, "lora_A.grad (summed over the ranks)")
  close64(col.lora_B.weight.grad, take(full.lora_B.weight.grad, 0), "lora_B.grad")
  assert(col.weight.grad == nil and not col.weight.requires_grad, "the base weight stays frozen")
  -- this rank's piece of the update
  close64(col:delta(), take(full:delta(), 0), "delta")
  if R == 0 then print(string.format("  layers so far: worst rel diff %.1e (allowed %.0e)", worst_layer, H.F64_REL)) end
end

test("ColumnParallelLoRALinear (copy in): y, grads of x, A (summed), B (rows), delta", function()
  column_case("copy", 0)
end)

test("ColumnParallelLoRALinear (sequence-parallel gather in), dropout 0.3: the masks of one process", function()
  column_case("gather", 0.3)
end)

test("ColumnParallelLoRALinear with split_fused row blocks: the mask cut as the rows", function()
  column_case("copy", 0, {{0, 3 * N}, {3 * N + 1, 2 * N}})
end)

local function row_case(output, dropout)
  lt.manual_seed(12)
  local inf = 3 * N + 1
  local full = lora_linear(inf, 5, {dropout = dropout})
  local lo, cnt = tp_ops.range(inf, N, R)
  local row = lora_tp.RowParallelLoRALinear(full, group, {{lo, cnt}}, {output = output})
  local T = 2 * N
  local x, gy = lt.randn(4, T, inf):double(), lt.randn(4, T, 5):double()
  local xr, xt = leaf(x), leaf(x:narrow(2, lo, cnt))
  lt.manual_seed(5)
  local yr = full(xr)
  ;(yr * gy):sum():backward()
  lt.manual_seed(5)
  local yt = row(xt)
  local scatter = output == "reduce_scatter"
  local function mine(t) return scatter and t:narrow(1, R * 2, 2) or t end
  ;(yt * mine(gy)):sum():backward()
  close64(yt, mine(yr), "y")
  close64(xt.grad, xr.grad:narrow(2, lo, cnt), "x.grad")
  close64(row.lora_A.weight.grad, full.lora_A.weight.grad:narrow(1, lo, cnt), "lora_A.grad (columns)")
  close64(row.lora_B.weight.grad, full.lora_B.weight.grad, "lora_B.grad (whole)")
  assert(row.bias.grad == nil and not row.bias.requires_grad, "the base bias stays frozen")
  close64(row:delta(), full:delta():narrow(1, lo, cnt), "delta")
  if R == 0 then print(string.format("  layers so far: worst rel diff %.1e (allowed %.0e)", worst_layer, H.F64_REL)) end
end

test("RowParallelLoRALinear (all-reduce out), dropout 0.3: y, grads, delta", function() row_case("reduce", 0.3) end)

test("RowParallelLoRALinear (sequence-parallel reduce-scatter out): B's grad summed over tokens", function()
  row_case("reduce_scatter", 0)
end)

-- ---- the trainer's layouts --------------------------------------------------------------------

local LAYOUTS = {
  [2] = {{tp = 2}, {tp = 2, sequence_parallel = true}, {dp = 2, zero = 1}, {dp = 2, zero = 3}, {pp = 2},
         {tp = 2, lora_dropout = 0.1}, {tp = 2, sequence_parallel = true, lora_dropout = 0.1}},
  [4] = {{tp = 4}, {dp = 2, tp = 2}, {dp = 2, tp = 2, zero = 1}, {dp = 4, zero = 1}, {dp = 4, zero = 3},
         {dp = 2, tp = 2, zero = 3}, {dp = 2, tp = 2, sequence_parallel = true}, {tp = 2, pp = 2},
         {tp = 4, sequence_parallel = true, lora_dropout = 0.1}},
}

local dir = os.getenv("TMPDIR") or "/tmp"
local path = string.format("%s/lutra_lora_layouts_%d_%d.txt", dir, R, N)
testing.word_corpus(path,
  {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home", "big", "red"}, 3000, 4321)
local tok = lt.tokenizer.char(assert(io.open(path)):read("*a"))
local function loader()
  return lt.data.text(path, tok, {seq_len = 16, batch = 8, seed = 3, cache = path .. ".bin", quiet = true})
end

local function model_cfg(arch, dtype)
  return {arch = arch, n_layer = 2, n_head = 4, n_kv_head = (arch == "llama" and N == 2) and 2 or 4, d_model = 32,
          vocab_size = 64, block_size = 16, dropout = 0, dtype = dtype}
end

-- random_B: B drawn instead of zero (LoRA's init), so that A's gradient is not zero at
-- step 1 (the f32 step-1 checks; the seed is the same on one process and under a layout)
local function build(arch, dropout, dtype, random_B)
  lt.manual_seed(7)
  local model = lt.models.build(model_cfg(arch, dtype))
  assert(tok.vocab_size <= 64)
  lora.apply(model, {targets = "all-linear", r = 4, alpha = 8, dropout = dropout or 0})
  if random_B then
    lt.no_grad(function()
      for _, l in ipairs(lora.layers(model)) do l[2].lora_B.weight:normal_(0, 0.1) end
    end)
  end
  return model
end

local function train_cfg(parallel)
  return {steps = 10, lr = 1e-2, warmup = 0, schedule = "constant", grad_clip = 1.0, weight_decay = 0.1,
          eval_every = 0, log_every = 1, run_dir = "", parallel = parallel}
end

local function named(model)
  local params, names = {}, {}
  for name, p in model:named_parameters() do
    names[#names + 1] = name
    params[name] = p
  end
  return params, names
end

-- one process, f64, 10 steps: losses, final parameters, initial parameters
local reference = {}
local function reference_run(arch, dropout)
  local key = arch .. (dropout or 0)
  if reference[key] then return reference[key] end
  local initial = named(build(arch, dropout, "f64"))
  local model = build(arch, dropout, "f64")
  local r = lt.train{model = model, data = loader(), config = train_cfg(nil), quiet = true, no_interrupt = true}
  local params, names = named(model)
  reference[key] = {losses = r.losses, params = params, names = names, initial = initial}
  return reference[key]
end

-- one process, f32, step 1 on the whole global batch: loss, gradient norm, adapter gradients
local reference1 = {}
local function reference_step1(arch, dropout)
  local key = arch .. (dropout or 0)
  if reference1[key] then return reference1[key] end
  local model = build(arch, dropout, "f32", true)
  local x, y = loader():next()
  local _, loss = model:forward(x, y)
  loss:backward()
  local grads, sq = {}, 0
  for name, p in model:named_parameters() do
    if p.requires_grad then
      grads[name] = p.grad:double()
      sq = sq + (grads[name] * grads[name]):sum():item()
    end
  end
  reference1[key] = {loss = loss:item(), norm = math.sqrt(sq), grads = grads}
  return reference1[key]
end

local function layout_name(l)
  local parts = {}
  for _, k in ipairs {"dp", "tp", "pp", "zero", "sequence_parallel", "lora_dropout"} do
    if l[k] ~= nil then parts[#parts + 1] = k == "sequence_parallel" and "sp" or (k .. "=" .. tostring(l[k])) end
  end
  return table.concat(parts, " ")
end

local function parallel_of(layout)
  local parallel = {bucket_mb = 0.001}
  for k, v in pairs(layout) do
    if k ~= "lora_dropout" then parallel[k] = v end
  end
  return parallel
end

local function f64_equivalence(arch, layout)
  local ref = reference_run(arch, layout.lora_dropout)
  local model = build(arch, layout.lora_dropout, "f64")
  local r = lt.train{model = model, data = loader(), config = train_cfg(parallel_of(layout)), quiet = true,
                     no_interrupt = true}
  testing.assert_equal(#r.losses, 10)
  local what = arch .. " " .. layout_name(layout) .. " f64"
  local worst = H.compare_losses(r.losses, ref.losses, H.F64_REL, what)
  local got = H.gather(r.parallel, ref.names, ref.params, world)
  local adapters = 0
  for _, name in ipairs(ref.names) do
    local a, b = got[name], ref.params[name]
    if name:find("%.lora_[AB]%.weight$") then
      adapters = adapters + 1
      worst = math.max(worst, H.assert_rel(a, b, H.F64_REL, what .. ": " .. name .. " after 10 steps"))
    else
      local init = ref.initial[name]
      assert((a - init):abs():max():item() == 0, name .. ": the base weight changed under the layout")
      assert((b - init):abs():max():item() == 0, name .. ": the base weight changed on one process")
    end
  end
  assert(adapters == 2 * 4 * 2 + (arch == "llama" and 2 * 2 or 0), "adapters compared: " .. adapters)
  -- the adapters moved (the comparison is not of two untouched inits)
  local moved = got["blocks.0.mlp.proj.lora_B.weight"]:abs():max():item()
  assert(moved > 1e-3, "lora_B did not train: " .. moved)
  if R == 0 then
    print(string.format("  %s %-30s f64 loss %.6f -> %.6f, worst rel diff %.1e (allowed %.0e)", arch,
      layout_name(layout), r.losses[1], r.losses[10], worst, H.F64_REL))
  end
end

local function f32_step1(arch, layout)
  local ref = reference_step1(arch, layout.lora_dropout)
  local tol = H.f32_tolerance(model_cfg(arch), 8 * 16)
  local model = build(arch, layout.lora_dropout, "f32", true)
  local loss, norm, grads = H.step1(model, parallel_of(layout), loader(), world)
  local what = arch .. " " .. layout_name(layout) .. " f32 step 1"
  local worst, n = H.compare_step1(loss, norm, grads, ref, tol, what)
  assert(n == 2 * 4 * 2 + (arch == "llama" and 2 * 2 or 0), "adapter gradients compared: " .. n)
  local a = ref.grads["blocks.0.attn.qkv.lora_A.weight"]:abs():max():item()
  assert(a > 1e-4, "A's gradient is (nearly) zero at step 1: " .. a)
  if R == 0 then
    print(string.format("  %s %-30s f32 step 1: %d gradients, worst rel diff %.1e (f32 bound %.1e)", arch,
      layout_name(layout), n, worst, tol))
  end
end

for _, arch in ipairs {"gpt2", "llama"} do
  for _, layout in ipairs(LAYOUTS[N] or {}) do
    local only = os.getenv("LUTRA_TEST_LAYOUT") -- one layout by hand: LUTRA_TEST_LAYOUT="dp=2 tp=2"
    if only == nil or only == layout_name(layout) then
      test(string.format("LoRA %s %s f64: 10 AdamW steps equal one process to 1e-9; the base unchanged", arch,
        layout_name(layout)), function() f64_equivalence(arch, layout) end)
      test(string.format("LoRA %s %s f32: step-1 loss, gradient norm and adapter gradients equal one process", arch,
        layout_name(layout)), function() f32_step1(arch, layout) end)
    end
  end
end

-- ---- merge / unmerge / disable under tp ---------------------------------------------------------

local function randomized(arch, opts, adapter_seed, zero_b)
  lt.manual_seed(21)
  local model = lt.models.build{arch = arch, n_layer = 2, n_head = 4, n_kv_head = N == 2 and 2 or 4, d_model = 32,
    vocab_size = 64, block_size = 16, dropout = 0, dtype = "f64"}
  if adapter_seed then lt.manual_seed(adapter_seed) end -- (the same base, other adapters)
  lora.apply(model, opts or {targets = "all-linear", r = 4, alpha = 8})
  lt.no_grad(function()
    for _, l in ipairs(lora.layers(model)) do
      if not zero_b then l[2].lora_B.weight:normal_(0, 0.3) end
    end
  end)
  model:eval()
  return model
end

local function same_files(a, b)
  local st = require "lutra.ckpt.safetensors"
  local ta, tb = st.load(a .. "/adapter_model.safetensors"), st.load(b .. "/adapter_model.safetensors")
  local n = 0
  for k, v in pairs(ta) do
    assert(tb[k] ~= nil, k .. " missing from " .. b)
    testing.assert_close(v, tb[k], {atol = 0, rtol = 0, msg = k})
    n = n + 1
  end
  for k in pairs(tb) do assert(ta[k] ~= nil, k .. " missing from " .. a) end
  local ca, cb = assert(io.open(a .. "/adapter_config.json")):read("*a"), assert(io.open(b .. "/adapter_config.json"))
    :read("*a")
  testing.assert_equal(ca, cb, "adapter_config.json")
  return n
end

for k, case in ipairs {{"gpt2", nil}, {"llama", {targets = {"q_proj", "v_proj", "down_proj"}, r = 2, alpha = 4}},
                       {"gpt2", {targets = {"attn%.qkv$", "lm_head$"}, r = 2, alpha = 4}}} do
  local arch, opts = case[1], case[2]
  local what = opts and table.concat(opts.targets, ", ") or "all-linear"
  test(string.format("merge under tp (%s, %s) = the one-process merge; unmerge, disable, merge_and_unload", arch,
    what), function()
    local one = randomized(arch, opts)
    local model = randomized(arch, opts)
    tp.parallelize(model, group)
    local idx = lt.randint(0, 64, {2, 16})
    local function logits(m, gathered)
      return lt.no_grad(function()
        local y = m(idx)
        return gathered and tp.gather_logits(m, y) or y
      end)
    end
    local base_one = lora.disable(one, logits, one)
    local base_tp = lora.disable(model, logits, model, true)
    close64(base_tp, base_one, "disabled logits")
    local y_one = logits(one)
    local y_tp = logits(model, true)
    close64(y_tp, y_one, "adapter logits")
    assert((y_one - base_one):abs():max():item() > 1e-3, "the adapters change the logits")
    lora.merge(one)
    lora.merge(model)
    local params_one = named(one)
    for name, p in model:named_parameters() do
      if not name:find("lora_") then
        close64(tp.gather(model, p), params_one[name], name .. " merged")
      end
    end
    -- (= y_one but for a tied lm_head's adapter: merged into the shared weight, it moves wte too)
    local merged_one = logits(one)
    close64(logits(model, true), merged_one, "merged logits")
    lora.unmerge(model)
    close64(logits(model, true), y_one, "unmerged logits")
    local names = {}
    for _, l in ipairs(lora.layers(model)) do names[#names + 1] = l[1] end
    testing.assert_equal(#names, #lora.layers(one))
    -- lora.save gathers the adapters: the files of one process
    local saved_tp, saved_one = string.format("%s/lutra_lora_tp_save_%d_%d", dir, N, k),
      string.format("%s/lutra_lora_one_save_%d_%d_%d", dir, N, k, R)
    lora.save(saved_tp, model)
    lora.save(saved_one, lora.unmerge(one))
    assert(same_files(saved_tp, saved_one) > 0)
    lora.merge(one)
    -- lora.load into a tensor-parallel model (other A, zero B before) puts each rank's pieces in
    local fresh = randomized(arch, opts, 99, true)
    tp.parallelize(fresh, group)
    lora.load(saved_one, fresh)
    close64(logits(fresh, true), y_one, "logits after lora.load under tp")
    if opts and opts.targets[1] == "q_proj" then -- q and v blocks in the file, one adapter on qkv here
      local other = randomized(arch, {targets = {"attn%.qkv$", "mlp%.proj$"}, r = 2, alpha = 4}, 99, true)
      tp.parallelize(other, group)
      testing.assert_error("other row blocks", function() lora.load(saved_one, other) end)
    end
    lora.merge_and_unload(model)
    testing.assert_equal(#lora.layers(model), 0)
    close64(logits(model, true), merged_one, "merge_and_unload logits")
    if R == 0 then print(string.format("  merge tests so far: worst rel diff %.1e (allowed %.0e)", worst_layer, H.F64_REL)) end
  end)
end

test("a frozen base stays frozen under tp: only the adapters require grad", function()
  local model = randomized("llama", {targets = {"mlp%.up$"}, r = 2})
  tp.parallelize(model, group)
  for name, p in model:named_parameters() do
    assert(p.requires_grad == (name:find("lora_") ~= nil), name .. " requires_grad " .. tostring(p.requires_grad))
  end
end)

test("specs: B of qkv is this rank's q, k, v head rows; A of proj its columns; the whole copies dup on ranks > 0",
  function()
  local model = randomized("llama") -- d_model 32, 4 heads of 8, n_kv_head 2 (np 2) or 4
  local Hkv = N == 2 and 2 or 4
  tp.parallelize(model, group)
  local attn = model.blocks[1].attn
  local qA, qB = attn.qkv.lora_A.weight, attn.qkv.lora_B.weight
  local pA, pB = attn.proj.lora_A.weight, attn.proj.lora_B.weight
  local s = spec.get(qA)
  testing.assert_equal(s.global, {4, 32})
  testing.assert_equal(s.dup, R > 0)
  s = spec.get(pB)
  testing.assert_equal(s.global, {32, 4})
  testing.assert_equal(s.dup, R > 0)
  local q, kv = 32 / N, Hkv * 8 / N
  local boxes = spec.boxes(qB)
  testing.assert_equal(#boxes, 3)
  testing.assert_equal(spec.get(qB).global, {32 + 2 * Hkv * 8, 4})
  testing.assert_equal(boxes[1].offset, {R * q, 0})
  testing.assert_equal(boxes[2].offset, {32 + R * kv, 0})
  testing.assert_equal(boxes[3].offset, {32 + Hkv * 8 + R * kv, 0})
  testing.assert_equal(boxes[3].local_offset, {q + kv, 0})
  s = spec.get(pA)
  testing.assert_equal(s.global, {4, 32})
  testing.assert_equal(s.offset, {0, R * 32 / N})
  testing.assert_equal(s.dup, false)
  -- tp.gather puts the pieces together: the full B of qkv equals one process's
  local one = randomized("llama")
  close(tp.gather(model, qB), one.blocks[1].attn.qkv.lora_B.weight, "gathered qkv lora_B", 0)
  close(tp.gather(model, pA), one.blocks[1].attn.proj.lora_A.weight, "gathered proj lora_A", 0)
end)
