-- np: 2 4
-- nn.MoE layers under tensor parallel (lutra.dist.tp: each expert's hidden dim cut over tp) and
-- expert parallel x tensor parallel (lutra.dist.ep inside each tp coordinate), against one
-- process on the same global batch (computed on every rank, in this process):
--   - a small f64 zoo "moe" model (8 experts, 2 layers): step 1's loss, balance losses, gradient
--     norm and every gathered gradient, every loss of 3 SGD steps and the final weights, to 1e-9
--     relative; top-2 dropless, top-2 with capacity factor 1, top-1 GELU experts with a shared
--     expert, SwiGLU experts with a gated shared expert;
--   - checkpoints: saved from the layout and loaded whole, saved whole and loaded into the
--     layout's shards: bitwise;
--   - lt.train (AdamW, clipping, 2 micro-batches, a shared expert): 6 f64 steps to 1e-9 under
--     tp 2 with sequence parallel (np 2) or dp 2 x tp 2 x ep 2 with ZeRO 1 (np 4), and its
--     checkpoint at step 3 resumed by one process as the straight run;
--   - f32 step 1 (tp 2; dp 2 x tp 2 x ep 2, with and without sequence parallel): the loss, norm and
--     every gathered gradient within layout_helpers' f32 rounding bound.
-- Layouts: np 2: tp 2, with and without sequence parallel; np 4: dp 2 x tp 2, dp 2 x tp 2 x ep 2
-- (with sequence parallel, ZeRO 1, ZeRO 2 with sequence parallel, ZeRO 3), dp 2 x tp 2 with ZeRO 3.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local spec = require "lutra.dist.spec"
local ckpt = require "lutra.ckpt"
local testing = require "lutra.testing"
local ffi = require "ffi"

comm.init()
local world, N, R = comm.world, comm.size(), comm.rank()
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/dist/") .. "layout_helpers.lua")

local LAYOUTS = {[2] = {{tp = 2}, {tp = 2, sequence_parallel = true}},
                 [4] = {{dp = 2, tp = 2}, {dp = 2, tp = 2, ep = 2}, {dp = 2, tp = 2, ep = 2, sequence_parallel = true},
                        {dp = 2, tp = 2, ep = 2, zero = 1}, {dp = 2, tp = 2, ep = 2, zero = 2, sequence_parallel = true},
                        {dp = 2, tp = 2, zero = 3}, {dp = 2, tp = 2, ep = 2, zero = 3}}}
if not LAYOUTS[N] then testing.skip("test_moe_tp runs on 2 or 4 ranks, not " .. N) end

local BATCH, T, VOCAB, STEPS, LR = 4, 4, 32, 3, 0.5
local REL = H.F64_REL

local function build(extra)
  lt.manual_seed(1234)
  local cfg = {arch = "moe", n_layer = 2, d_model = 16, n_head = 2, n_kv_head = 2, ffn_hidden = 24, vocab_size = VOCAB,
               block_size = T, dropout = 0, dtype = "f64", n_experts = 8, top_k = 2, aux_loss_coef = 0.5,
               z_loss_coef = 0.1}
  for k, v in pairs(extra or {}) do cfg[k] = v end
  return lt.models.build(cfg)
end

local batches = {}
lt.manual_seed(99)
for s = 1, STEPS do batches[s] = {x = lt.randint(0, VOCAB, {BATCH, T}), y = lt.randint(0, VOCAB, {BATCH, T})} end

local function loss_fn(m, b)
  local _, l = m:forward(b.x, b.y)
  return l
end

local function moe_layers(model)
  local out = {}
  for _, m in ipairs(model:modules()) do
    if getmetatable(m) == lt.nn.MoE then out[#out + 1] = m end
  end
  return out
end

local function bytes_of(t)
  t = t:contiguous()
  return ffi.string(ffi.cast("const char *", t:data_ptr()), t:numel() * 8)
end

-- One process: step 1's loss, balance losses and grads, every step's loss, the final weights.
local function reference(extra)
  local model = build(extra)
  local opt = lt.optim.SGD(model, {lr = LR})
  local ref = {losses = {}, grads = {}, balance = {}, params = {}, names = {}}
  for s, b in ipairs(batches) do
    opt:zero_grad()
    local loss = loss_fn(model, b)
    ref.losses[s] = loss:item()
    loss:backward()
    if s == 1 then
      local sq = 0
      for name, p in model:named_parameters() do
        ref.grads[name] = p.grad:clone()
        sq = sq + (p.grad * p.grad):sum():item()
      end
      ref.norm = math.sqrt(sq)
      for i, m in ipairs(moe_layers(model)) do ref.balance[i] = m.balance_loss:item() end
    end
    opt:step()
  end
  for name, p in model:named_parameters() do
    ref.names[#ref.names + 1] = name
    ref.params[name] = p:detach():clone()
  end
  return ref, model
end

-- This rank's rows of a global batch.
local function local_batch(b, mesh)
  local per = BATCH / mesh.dp_size
  local function rows(t) return t:narrow(0, mesh.dp_rank * per, per):contiguous() end
  return {x = rows(b.x), y = rows(b.y)}
end

local function dropped(model)
  local n = 0
  for _, m in ipairs(moe_layers(model)) do n = n + m.dropped end
  local t = lt.tensor({n}, {dtype = "f64"})
  world:all_reduce(t, "sum")
  return t:item()
end

-- {name, tensor} pairs as something with named_parameters() (what optimizers take)
local function as_module(named)
  return {named_parameters = function()
    local i = 0
    return function()
      i = i + 1
      if named[i] then return named[i][1], named[i][2] end
    end
  end}
end

-- The layout's run against the reference. Returns par (trained) and the mesh.
local function run_layout(layout, extra, ref, what)
  local mesh = lt.dist.init(layout)
  local model = build(extra)
  local worst = 0
  local par = lt.dist.parallelize(model, mesh,
    {optimizer = function(named) return lt.optim.SGD(as_module(named), {lr = LR}) end})
  -- the experts are cut over tp (and ep): every rank holds 1/(tp ep) of them (ZeRO 3: less)
  local m1 = moe_layers(model)[1]
  if layout.zero ~= 3 then
    testing.assert_equal(m1.w_up:size(1), 24 / mesh.tp_size, what .. ": local expert hidden size")
    testing.assert_equal(m1.w_down:size(0), 8 / (layout.ep or 1), what .. ": local experts")
  end
  for s, b in ipairs(batches) do
    par:zero_grad()
    local loss = par:forward_backward({local_batch(b, mesh)}, loss_fn)
    local norm = par:finish(0)
    worst = math.max(worst, H.assert_rel_number(loss, ref.losses[s], REL, what .. " step " .. s .. " loss"))
    if s == 1 then
      worst = math.max(worst, H.assert_rel_number(norm, ref.norm, REL, what .. " gradient norm"))
      for i, m in ipairs(moe_layers(model)) do
        worst = math.max(worst, H.assert_rel_number(m.balance_loss:item(), ref.balance[i], REL,
          what .. " layer " .. i .. " balance loss"))
      end
      if extra and extra.capacity_factor then assert(dropped(model) > 0, what .. ": nothing dropped") end
      local entries, opt = {}, par.optimizer
      for k, key in ipairs(opt.keys) do
        local p = opt.params[k]
        assert(p.grad ~= nil, what .. ": no gradient for " .. tostring(key))
        entries[#entries + 1] = {name = tostring(key), tensor = spec.copy(p.grad, p)}
      end
      local names, shapes = H.global_names(entries, world)
      local grads = H.gather_entries(entries, names, shapes, world)
      for name, g in pairs(ref.grads) do
        worst = math.max(worst, H.assert_rel(grads[name], g, REL, what .. " gradient of " .. name))
      end
    end
    par.optimizer:step()
    par:after_step()
  end
  local got = H.gather(par, ref.names, ref.params, world)
  for _, name in ipairs(ref.names) do
    worst = math.max(worst, H.assert_rel(got[name], ref.params[name], REL, what .. " weight " .. name))
  end
  if R == 0 then print(string.format("  %-44s f64 worst rel diff %.1e (allowed %.0e)", what, worst, REL)) end
  return par, mesh
end

local function layout_name(l)
  return string.format("dp%d tp%d ep%d%s%s", l.dp or 1, l.tp, l.ep or 1, l.sequence_parallel and " sp" or "",
    l.zero and " zero" .. l.zero or "")
end

local CONFIGS = {{name = "dropless"}, {name = "capacity 1.0", extra = {capacity_factor = 1.0}},
                 {name = "top-1 gelu, a shared expert", extra = {top_k = 1, mlp = "gelu", n_shared_experts = 1}},
                 {name = "gated shared expert", extra = {n_shared_experts = 1, shared_expert_gate = true}}}

local trained = {} -- layout name -> {par =, mesh =, ref =, ref_model =} (dropless)
for _, c in ipairs(CONFIGS) do
  local ref, ref_model
  for _, layout in ipairs(LAYOUTS[N]) do
    local name = layout_name(layout)
    test(c.name .. ", " .. name .. ": step 1 and 3 SGD steps equal one process (f64)", function()
      if not ref then ref, ref_model = reference(c.extra) end
      local par, mesh = run_layout(layout, c.extra, ref, c.name .. " " .. name)
      if c.extra == nil then trained[name] = {par = par, mesh = mesh, ref = ref, ref_model = ref_model} end
    end)
  end
end

-- ---- checkpoints: the layout's shards <-> one process, bitwise ----------------------------------

local root = H.job_dir(world, "moe_tp_ckpt")
local function barrier() world:all_reduce(lt.zeros(1), "sum") end

-- Whether local tensor t holds the boxes of whole tensor want that its spec names, bitwise.
local function same_pieces(t, want)
  for _, box in ipairs(spec.boxes(t)) do
    local a, b = t, want
    for d = 0, t.ndim - 1 do
      a = a:narrow(d, box.local_offset[d + 1], box.shape[d + 1])
      b = b:narrow(d, box.offset[d + 1], box.shape[d + 1])
    end
    if bytes_of(a) ~= bytes_of(b) then return false end
  end
  return true
end

for _, layout in ipairs(LAYOUTS[N]) do
  local lname = layout_name(layout)
  test("checkpoint saved at " .. lname .. " loads whole bitwise, and one process's into " .. lname, function()
    local tr = assert(trained[lname], "no " .. lname .. " run")
    if R == 0 then os.execute("rm -rf '" .. root .. "' && mkdir -p '" .. root .. "'") end
    barrier()
    -- layout -> one process
    local dir = root .. "/from_layout"
    local entries = {}
    for name, p in tr.par.model:named_parameters() do entries[#entries + 1] = {name = name, tensor = p} end
    ckpt.save(dir, {step = STEPS, tensors = entries}, {world = world})
    ckpt.wait()
    barrier()
    local whole = build({})
    local into, names = {}, {}
    for name, p in whole:named_parameters() do into[#into + 1], names[#names + 1] = {name = name, tensor = p}, name end
    ckpt.load(dir):load_into(into)
    local got = H.gather(tr.par, names, tr.ref.params, world)
    for _, e in ipairs(into) do
      assert(bytes_of(e.tensor) == bytes_of(got[e.name]), lname .. " -> one process: " .. e.name .. " differs")
    end
    -- one process -> the layout's shards (each rank saves its own copy of the whole model)
    local dir1 = string.format("%s/whole_rank%d", root, R)
    local src = {}
    for name, p in tr.ref_model:named_parameters() do src[#src + 1] = {name = name, tensor = p} end
    ckpt.save(dir1, {step = STEPS, tensors = src})
    ckpt.wait()
    local sharded = build({})
    lt.dist.parallelize(sharded, tr.mesh, {optimizer = function(named) return lt.optim.SGD(as_module(named), {lr = LR}) end})
    local targets, n_cut = {}, 0
    -- experts are ZeRO 3 shards without ep; with ep they stay whole per rank (their tp and ep cut)
    local whole_experts = layout.zero ~= 3 or (layout.ep or 1) > 1
    for name, p in sharded:named_parameters() do
      lt.no_grad(function() p:fill_(0) end)
      targets[#targets + 1] = {name = name, tensor = p}
    end
    ckpt.load(dir1):load_into(targets)
    local by_name = {}
    for _, e in ipairs(src) do by_name[e.name] = e.tensor end
    for _, e in ipairs(targets) do
      if e.name:match("%.w_[a-z]+$") and whole_experts then
        n_cut = n_cut + 1
        assert(e.tensor:numel() * layout.tp * (layout.ep or 1) == by_name[e.name]:numel(),
          "one process -> " .. lname .. ": " .. e.name .. " is not cut over tp and ep")
      end
      assert(same_pieces(e.tensor, by_name[e.name]), "one process -> " .. lname .. ": " .. e.name .. " differs")
    end
    if whole_experts then testing.assert_equal(n_cut, 2 * 3, "expert tensors (2 layers x w_gate, w_up, w_down)") end
    barrier()
    if R == 0 then os.execute("rm -rf '" .. root .. "'") end
  end)
end

-- ---- through the trainer (lt.train: AdamW, clipping, 2 micro-batches, the data loader's dp rows) --

local corpus = string.format("%s/lutra_moe_tp_corpus_%d_%d.txt", os.getenv("TMPDIR") or "/tmp", R, N)
testing.word_corpus(corpus, {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"}, 2000, 12345)
local tok = lt.tokenizer.char(assert(io.open(corpus)):read("*a"))
local TB, TT = 8, 8
local function loader()
  return lt.data.text(corpus, tok, {seq_len = TT, batch = TB, seed = 3, cache = corpus .. ".bin", quiet = true})
end
local function zoo_cfg()
  return {arch = "moe", n_layer = 2, d_model = 16, n_head = 2, n_kv_head = 2, ffn_hidden = 24, n_experts = 4,
          vocab_size = tok.vocab_size, block_size = TT, dropout = 0, dtype = "f64", aux_loss_coef = 0.5,
          n_shared_experts = 1}
end
local function train_cfg(parallel, steps, run_dir, resume)
  return {steps = steps, lr = 1e-2, warmup = 0, schedule = "constant", grad_clip = 0.5, weight_decay = 0.1,
          grad_accum = 2, eval_every = 0, log_every = 1, run_dir = run_dir or "", parallel = parallel,
          ckpt_every = run_dir and 3 or nil, resume = resume or ""}
end
local TRAIN_LAYOUT = N == 2 and {tp = 2, sequence_parallel = true} or {dp = 2, tp = 2, ep = 2, zero = 1}

test("lt.train, " .. layout_name(TRAIN_LAYOUT) .. ": 6 AdamW steps equal one process (f64), and its checkpoint "
  .. "resumes in one process as a straight run", function()
  local what = "lt.train " .. layout_name(TRAIN_LAYOUT)
  local base = H.job_dir(world, "moe_tp_train")
  if R == 0 then os.execute("rm -rf '" .. base .. "' && mkdir -p '" .. base .. "'") end
  barrier()
  local function run(parallel, steps, run_dir, until_step, resume)
    lt.manual_seed(7)
    local model = lt.models.build(zoo_cfg())
    local r = lt.train{model = model, data = loader(), config = train_cfg(parallel, steps, run_dir, resume),
                       quiet = true, no_interrupt = true, until_step = until_step}
    return r, model
  end
  local ref, ref_model = run(nil, 6)
  local names, want = {}, {}
  for name, p in ref_model:named_parameters() do names[#names + 1], want[name] = name, p end
  local r = run(TRAIN_LAYOUT, 6)
  H.compare_losses(r.losses, ref.losses, REL, what)
  local got = H.gather(r.parallel, names, want, world)
  for _, name in ipairs(names) do H.assert_rel(got[name], want[name], REL, what .. " weight " .. name) end
  -- the layout, 3 steps, saved; resumed by one process (each rank its own run) to step 6
  run(TRAIN_LAYOUT, 6, base .. "/layout", 3)
  ckpt.wait()
  barrier()
  local resumed, one = run(nil, 6, base .. "/one_" .. R, nil, base .. "/layout/ckpt/step_000003")
  testing.assert_equal(#resumed.losses, 3, "steps run after the resume")
  for name, p in one:named_parameters() do H.assert_rel(p, want[name], REL, what .. " -> one process: " .. name) end
  barrier()
  if R == 0 then os.execute("rm -rf '" .. base .. "'") end
end)

-- f32, step 1 up to the optimizer: every gathered gradient within the f32 rounding bound of
-- layout_helpers.lua, against one process on the same global batch (tp2; and ep2 x tp2 on 4 ranks).
local F32_LAYOUTS = N == 2 and {{tp = 2}} or {{dp = 2, tp = 2, ep = 2}, {dp = 2, tp = 2, ep = 2, sequence_parallel = true}}
for _, layout in ipairs(F32_LAYOUTS) do
  test("f32 step 1 under " .. layout_name(layout) .. ": loss, norm and every gradient within the f32 bound", function()
    local cfg = zoo_cfg()
    cfg.dtype = "f32"
    lt.manual_seed(7)
    local m32 = lt.models.build(cfg)
    local x, y = loader():next()
    local _, loss = m32:forward(x, y)
    loss:backward()
    local ref32, sq = {loss = loss:item(), grads = {}}, 0
    for name, p in m32:named_parameters() do
      ref32.grads[name] = p.grad:double()
      sq = sq + (ref32.grads[name] * ref32.grads[name]):sum():item()
    end
    ref32.norm = math.sqrt(sq)
    lt.manual_seed(7)
    local l1, norm, grads = H.step1(lt.models.build(cfg), layout, loader(), world)
    local worst, n = H.compare_step1(l1, norm, grads, ref32, H.f32_tolerance(cfg, TB * TT),
      layout_name(layout) .. " f32 step 1")
    if R == 0 then print(string.format("  %s f32 step 1: %d gradients, worst rel diff %.1e", layout_name(layout), n, worst)) end
  end)
end
