-- np: 2 4
-- Context parallel (lutra.dist.cp, ring attention in lutra.dist.cp_attention) against one
-- process in f64 to 1e-9 relative (layout_helpers.lua says why f64): ring attention alone
-- against F.scaled_dot_product_attention (outputs, gradients of q, k, v; GQA; packed
-- segments; f32 and bf16 within their rounding), then small llama (RoPE, GQA) and gpt2
-- (learned positions) models: the step-1 loss and every parameter's gradient, and the losses
-- of 3 AdamW steps, over the world as the cp group (cp2 at np2, cp4 at np4), with packed
-- segments; and through the trainer's lutra.dist.parallelize: cp2 and cp2 zero 2/3 (np2), cp2 x
-- dp2, cp4, cp2 x tp2, cp2 x dp2 zero 1, cp2 x pp2 (np4), f32 step 1 too. Then the mesh,
-- refusals, and checkpoints across layouts.
local lt = require "lutra"
local testing = require "lutra.testing"
local comm = require "lutra.dist.comm"
local cp = require "lutra.dist.cp"
local cp_attention = require "lutra.dist.cp_attention"
local tp = require "lutra.dist.tp"
local F, optim, models = lt.F, lt.optim, lt.models

comm.init()
local world = comm.world
local group = comm.split(0, comm.rank(), "cp")
local n, r = group.size, group.rank

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/dist/") .. "layout_helpers.lua")
local REL = H.F64_REL

-- A copy of t, a leaf that requires grad.
local function leaf(t)
  t = t:detach():clone()
  t.requires_grad = true
  return t
end

-- (B, T) packed rows: documents of lengths 5, 7, ... cut at T: ids and in-document positions.
local function packed_rows(B, T)
  local seg, pos = {}, {}
  for b = 1, B do
    seg[b], pos[b] = {}, {}
    local id, start, len = 0, 0, 3 + b
    for t = 0, T - 1 do
      if t - start >= len then id, start, len = id + 1, t, len + 2 end
      seg[b][t + 1], pos[b][t + 1] = id, t - start
    end
  end
  return lt.tensor(seg, {dtype = "i64"}), lt.tensor(pos, {dtype = "i64"})
end

local function avg(t, g)
  t = t:clone()
  g:all_reduce(t, "avg")
  return t
end

-- ---- ring attention alone -------------------------------------------------------------------

-- f64: to 1e-9; f32 within the f32 rounding bound of sums of T terms through ~4 reductions
-- (2 T u 4): the fused kernel per chunk pair (f32 and bf16 without segments or windows), or the
-- plain-op path (f64, packed segments, sliding windows).
for _, case in ipairs {{Hkv = 4}, {Hkv = 2}, {Hkv = 1, packed = true}, {Hkv = 2, packed = true},
                       {Hkv = 4, dt = "f32"}, {Hkv = 2, dt = "f32"}, {Hkv = 1, dt = "f32"}, {Hkv = 2, dt = "bf16"},
                       {Hkv = 2, window = 5}, {Hkv = 2, window = 3, dt = "f32"},
                       {Hkv = 1, window = 4, packed = true}} do
  local dt = case.dt or "f64"
  test(string.format("ring attention = unsplit attention (cp%d, %s, H 4, Hkv %d%s%s): y, dq, dk, dv", n, dt,
    case.Hkv, case.packed and ", packed segments" or "", case.window and ", window " .. case.window or ""), function()
    local B, T, Hq, D = 2, 8 * n, 4, 8
    -- bf16: against f32 attention on the same bf16 inputs, within a few bf16 roundings (2^-8) of
    -- the results (the kernel sums in f32; measured ~1e-3)
    local REL = dt == "f64" and REL or dt == "f32" and 2 * T * 2 ^ -24 * 4 or 4 * 2 ^ -8
    local ref_dt = dt == "bf16" and "f32" or dt
    lt.manual_seed(7)
    local q = lt.randn(B, T, Hq, D):to(dt)
    local k, v = lt.randn(B, T, case.Hkv, D):to(dt), lt.randn(B, T, case.Hkv, D):to(dt)
    local gy = lt.randn(B, T, Hq, D):to(dt)
    local seg = case.packed and packed_rows(B, T) or nil
    local qr, kr, vr = leaf(q:to(ref_dt)), leaf(k:to(ref_dt)), leaf(v:to(ref_dt))
    local yr = F.scaled_dot_product_attention {qr, kr, vr, causal = true, segment_ids = seg, window = case.window}
    ;(yr * gy:to(ref_dt)):sum():backward()
    local part = cp.split({x = lt.zeros(B, T, {dtype = "i64"}), segments = seg}, group)
    local qt, kt, vt = leaf(cp.take(q, r, n)), leaf(cp.take(k, r, n)), leaf(cp.take(v, r, n))
    local yt = cp_attention.attention(qt, kt, vt, part.cp, nil, case.window)
    ;(yt * cp.take(gy, r, n)):sum():backward()
    H.assert_rel(yt, cp.take(yr, r, n), REL, "y")
    H.assert_rel(qt.grad, cp.take(qr.grad, r, n), REL, "dq")
    H.assert_rel(kt.grad, cp.take(kr.grad, r, n), REL, "dk")
    H.assert_rel(vt.grad, cp.take(vr.grad, r, n), REL, "dv")
  end)
end

test("the split: rank i holds chunks i and 2cp-1-i, positions global; bad lengths named", function()
  local x = lt.arange(0, 4 * n):reshape(1, 4 * n):to("i64")
  local part = cp.split({x = x, y = x}, group)
  local want = cp.indices(r, n, 2)
  testing.assert_equal(#want, 4)
  for i, g in ipairs(want) do
    testing.assert_equal(part.x[{0, i - 1}]:item(), g, "token " .. i)
    testing.assert_equal(part.positions[{0, i - 1}]:item(), g, "position " .. i)
  end
  testing.assert_equal(want[1], 2 * r)
  testing.assert_equal(want[3], 2 * (2 * n - 1 - r))
  testing.assert_error("does not split into 2 * cp", cp.split, {x = lt.zeros(1, 4 * n + 2, {dtype = "i64"})}, group)
end)

-- ---- whole models -----------------------------------------------------------------------------

local function cfg_of(arch)
  local cfg = {arch = arch, n_layer = 2, d_model = 32, n_head = 4, vocab_size = 64, block_size = 16, dropout = 0,
               dtype = "f64"}
  if arch == "llama" then cfg.n_kv_head = 2 end
  return cfg
end

local function batches_of(cfg, steps, packed)
  lt.manual_seed(2)
  local out = {}
  for s = 1, steps do
    local x, y = lt.randint(0, cfg.vocab_size, {4, 16}), lt.randint(0, cfg.vocab_size, {4, 16})
    -- ignored targets: uneven over the cp ranks (their counts are all-reduced), even over dp
    -- halves and pipeline micro-batches of 2 rows (data parallel and pipelines average their
    -- parts' means: one process's mean only with equal counts)
    y[{s % 2, {0, 4 + s}}] = -100
    y[{s % 2 + 2, {0, 4 + s}}] = -100
    local b = {x = x, y = y}
    if packed then b.segments, b.positions = packed_rows(4, 16) end
    out[s] = b
  end
  return out
end

local function opts_of(b) return (b.positions or b.segments or b.cp) and
  {positions = b.positions, segments = b.segments, cp = b.cp} or nil end

-- One process and cp over the world, the same 3 AdamW steps: the step-1 loss and gradients,
-- every step's loss (averaged over cp: lutra.dist.cp's loss is the rank's scaled part).
local function equivalence(arch, packed, overrides)
  local cfg = cfg_of(arch)
  for key, v in pairs(overrides or {}) do cfg[key] = v end
  local steps = 3
  lt.manual_seed(1)
  local ref = models.build(cfg)
  lt.manual_seed(1)
  local model = models.build(cfg)
  local batches = batches_of(cfg, steps, packed)
  local opt_r = optim.AdamW(ref, {lr = 1e-2, weight_decay = 0.1})
  local opt_t = optim.AdamW(model, {lr = 1e-2, weight_decay = 0.1})
  local refs = {}
  for name, p in ref:named_parameters() do refs[name] = p end
  local what = string.format("%s cp%d%s", arch, n, packed and " packed" or "")
  local got, want = {}, {}
  for s = 1, steps do
    local b = batches[s]
    opt_r:zero_grad()
    local _, loss_r = ref(b.x, b.y, opts_of(b))
    loss_r:backward()
    opt_t:zero_grad()
    local part = cp.split(b, group)
    local _, loss_t = model(part.x, part.y, opts_of(part))
    loss_t:backward()
    for name, p in model:named_parameters() do
      local g = avg(p.grad, group)
      if s == 1 then H.assert_rel(g, refs[name].grad, REL, what .. " step-1 gradient of " .. name) end
      p.grad:copy_(g)
    end
    want[s], got[s] = loss_r:item(), avg(loss_t:detach(), group):item()
    opt_r:step()
    opt_t:step()
  end
  H.compare_losses(got, want, REL, what)
end

test("llama (RoPE, GQA): cp over the world = one process, f64", function() equivalence("llama") end)
test("gpt2 (learned positions): cp over the world = one process, f64", function() equivalence("gpt2") end)
test("llama with packed segments: cp over the world = one process, f64", function() equivalence("llama", true) end)
test("gpt2 with packed segments: cp over the world = one process, f64", function() equivalence("gpt2", true) end)
test("llama with a sliding window (one layer of two): cp over the world = one process, f64", function()
  equivalence("llama", false, {sliding_window = 5, layer_types = {"sliding_attention", "full_attention"}})
end)

-- ---- through the trainer's lutra.dist.parallelize ---------------------------------------------

-- parallelize's optimizer factory: AdamW with opts over its {name, tensor} pairs
local function adamw_of(opts)
  return function(named)
    return optim.AdamW({named_parameters = function()
      local i = 0
      return function()
        i = i + 1
        if named[i] then return named[i][1], named[i][2] end
      end
    end}, opts)
  end
end

-- The layout's mesh, 3 AdamW steps with clipping through parallelize (the default loss: the model
-- reads the context parallelize sets on it): the step-1 loss, gradient norm and every gradient
-- (not under ZeRO: shards), every step's loss and norm, and the parameters after the steps (not
-- under tp), against one process on the global batch (f32: step 1, within the f32 rounding bound
-- of layout_helpers.lua).
local function par_equivalence(arch, layout, packed, dt)
  local mesh = lt.dist.init(layout)
  local cfg = cfg_of(arch)
  cfg.dtype = dt or "f64"
  local steps = dt == "f32" and 1 or 3
  local REL = dt == "f32" and H.f32_tolerance(cfg, 4 * 16) or REL
  lt.manual_seed(1)
  local ref = models.build(cfg)
  lt.manual_seed(1)
  local model = models.build(cfg)
  local batches = batches_of(cfg, steps, packed)
  local adamw = {lr = 1e-2, weight_decay = 0.1}
  local opt_r = optim.AdamW(ref, adamw)
  local par = lt.dist.parallelize(model, mesh, {optimizer = adamw_of(adamw)})
  local refs = {}
  for name, p in ref:named_parameters() do refs[name] = p end
  local what = string.format("%s %s %s%s", arch, cfg.dtype, mesh:layout(), packed and " packed" or "")
  local rows = 4 / mesh.dp_size
  local got, want = {}, {}
  for s = 1, steps do
    local b = batches[s]
    opt_r:zero_grad()
    local _, loss_r = ref(b.x, b.y, opts_of(b))
    loss_r:backward()
    local mine = {}
    for key, t in pairs(b) do mine[key] = t:narrow(0, mesh.dp_rank * rows, rows):contiguous() end
    par:zero_grad()
    local loss = par:forward_backward({mine}, packed and function(m, batch)
      local _, l = m:forward(batch.x, batch.y, {positions = batch.positions, segments = batch.segments})
      return l
    end or require("lutra.train.batch").default_loss)
    local norm = par:finish(1.0)
    local norm_r = optim.clip_grad_norm(ref, 1.0)
    H.assert_rel_number(norm, norm_r, REL, what .. " gradient norm at step " .. s)
    if s == 1 and mesh.zero == 0 then -- (ZeRO: gradient shards; its parameters are compared below)
      local count = 0
      for name, p in par.model:named_parameters() do -- (pipeline: this stage's; a tied copy's name skipped)
        if refs[name] then
          local g = mesh.tp_size > 1 and tp.gather(model, p, p.grad) or p.grad
          H.assert_rel(g, refs[name].grad, REL, what .. " step-1 gradient (clipped) of " .. name)
          count = count + 1
        end
      end
      assert(count > 0, what .. ": no gradient compared")
    end
    want[s], got[s] = loss_r:item(), loss
    opt_r:step()
    par.optimizer:step()
    par:after_step()
  end
  H.compare_losses(got, want, REL, what)
  if mesh.tp_size == 1 and dt ~= "f32" then -- the parameters after the steps
    local params = {}
    if mesh.zero == 3 then
      params = par.zero:full_parameters()
    else
      for name, p in par.model:named_parameters() do params[name] = p end
    end
    for name, p in pairs(refs) do
      if params[name] or mesh.pp_size == 1 then H.assert_rel(params[name], p, REL, what .. " parameter " .. name) end
    end
  end
end

local layouts = n == 4 and {{cp = 2}, {cp = 4}, {cp = 2, tp = 2}, {cp = 2, zero = 1},
  {cp = 2, pp = 2, micro_batches = 2}, {cp = 2, tp = 2, sequence_parallel = true}} or
  {{cp = 2}, {cp = 2, zero = 2}, {cp = 2, zero = 3}}
for _, layout in ipairs(layouts) do
  local other = n / layout.cp
  local name = string.format("cp%d%s%s", layout.cp,
    other == 1 and "" or layout.tp and " x tp" .. other or layout.pp and " x pp" .. other or " x dp" .. other,
    (layout.zero and " zero " .. layout.zero or "") .. (layout.sequence_parallel and " sequence-parallel" or ""))
  test("llama " .. name .. " through parallelize = one process, f64", function() par_equivalence("llama", layout) end)
  test("gpt2 " .. name .. " through parallelize = one process, f64", function() par_equivalence("gpt2", layout) end)
  test("llama " .. name .. " packed, through parallelize = one process, f64", function()
    par_equivalence("llama", layout, true)
  end)
  test("llama " .. name .. " through parallelize = one process, f32 step 1 (the fused ring)", function()
    par_equivalence("llama", layout, false, "f32")
  end)
end

test("the mesh: cp between tp and dp (Megatron's order), dp_cp, and refusals", function()
  local mesh = lt.dist.init{cp = 2}
  testing.assert_equal(mesh.cp_size, 2)
  testing.assert_equal(mesh.dp_size, n / 2)
  testing.assert_equal(mesh.cp_rank, r % 2)
  testing.assert_equal(mesh.dp_rank, math.floor(r / 2))
  testing.assert_equal(mesh.cp.ranks[1], r - r % 2, "cp ranks are neighbours")
  testing.assert_equal(mesh.cp.size, 2)
  testing.assert_equal(mesh.dp_cp.size, n)
  testing.assert_error("cp must be a positive integer", lt.dist.init, {cp = 0})
  testing.assert_error("cp 3", lt.dist.init, {cp = 3})
  if n == 4 then
    local m2 = lt.dist.init{cp = 2, tp = 2}
    testing.assert_equal(m2.tp.ranks[1], r - r % 2, "tp ranks are neighbours")
    testing.assert_equal(m2.cp.ranks[2] - m2.cp.ranks[1], 2, "cp ranks are tp apart")
    testing.assert_equal(m2.dp_cp.size, 2)
  end
end)

test("a loss_fn whose forward runs no ring attention is refused by name", function()
  local mesh = lt.dist.init{cp = n}
  local model = models.build(cfg_of("llama"))
  local par = lt.dist.parallelize(model, mesh, {})
  local b = batches_of(cfg_of("llama"), 1)[1]
  testing.assert_error("did not", par.forward_backward, par, {b}, function(m, batch)
    return m.lm_head.weight:sum() + batch.x:size(1) * 0
  end)
end)

-- ---- checkpoints --------------------------------------------------------------------------------

local ADAMW = {lr = 1e-2, weight_decay = 0.1}

-- A llama trained `steps` steps under a layout through parallelize: model, par, mesh.
local function layout_run(layout, steps)
  local mesh = lt.dist.init(layout)
  local cfg = cfg_of("llama")
  lt.manual_seed(1)
  local model = models.build(cfg)
  local par = lt.dist.parallelize(model, mesh, {optimizer = adamw_of(ADAMW)})
  local rows = 4 / mesh.dp_size
  for _, b in ipairs(batches_of(cfg, steps)) do
    local mine = {}
    for key, t in pairs(b) do mine[key] = t:narrow(0, mesh.dp_rank * rows, rows):contiguous() end
    par:zero_grad()
    par:forward_backward({mine}, require("lutra.train.batch").default_loss)
    par:finish(1.0)
    par.optimizer:step()
    par:after_step()
  end
  return model, par, mesh
end

local function named_of(model)
  local list = {}
  for name, p in model:named_parameters() do list[#list + 1] = {name = name, tensor = p} end
  return list
end

-- two gathered states (layout_helpers.gather_state) bitwise equal
local function same_state(a, b, what)
  testing.assert_equal(table.concat(a[2], " "), table.concat(b[2], " "), what .. ": the state's names")
  for _, name in ipairs(a[2]) do
    local x, y = a[1][name], b[1][name]
    testing.assert_equal(table.concat(x.shape, ","), table.concat(y.shape, ","), what .. ": " .. name)
    testing.assert_equal((x - y):abs():max():item(), 0, what .. ": " .. name .. " differs")
  end
  testing.assert_equal(a[3], b[3], what .. ": the optimizer's numbers")
end

test("checkpoints: cp zero 3 -> one process -> cp zero 1, bitwise (the state does not depend on cp)", function()
  local ckpt, ts = require "lutra.ckpt", require "lutra.ckpt.train_state"
  local base = world:all_gather_text(r == 0 and os.tmpname() or "")[1] -- (rank 0's temporary name)
  local dir = base .. ".ckpt"
  local model, par, mesh = layout_run({cp = 2, zero = 3}, 2)
  local saved = {H.gather_state(model, par.optimizer, world)}
  local tensors, oextra = ts.collect(named_of(model), par.optimizer)
  ckpt.save(dir, {step = 2, layout = {dp = mesh.dp_size, cp = 2, zero = 3}, tensors = tensors,
                  extra = {optim = oextra}}, {world = world})
  ckpt.wait()
  world:barrier()
  -- one process on every rank: the whole state
  lt.manual_seed(5)
  local single = models.build(cfg_of("llama"))
  local opt = optim.AdamW(single, ADAMW)
  ts.restore(ckpt.load(dir), named_of(single), opt)
  same_state({H.gather_state(single, opt, world)}, saved, "cp2 zero 3 -> one process")
  -- and into another layout: cp over the world, ZeRO 1
  local m3, p3 = layout_run({cp = n, zero = 1}, 0)
  ts.restore(ckpt.load(dir), named_of(m3), p3.optimizer)
  same_state({H.gather_state(m3, p3.optimizer, world)}, saved, "cp2 zero 3 -> cp" .. n .. " zero 1")
  world:barrier()
  if r == 0 then
    os.execute("rm -rf '" .. dir .. "'")
    os.remove(base)
  end
end)
