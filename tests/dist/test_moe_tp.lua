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

comm.init()
local world, N, R = comm.world, comm.size(), comm.rank()
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/dist/") .. "layout_helpers.lua")

local LAYOUTS = {[2] = {{tp = 2}, {tp = 2, sequence_parallel = true}},
                 [4] = {{dp = 2, tp = 2}, {dp = 2, tp = 2, ep = 2}, {dp = 2, tp = 2, ep = 2, sequence_parallel = true},
                        {dp = 2, tp = 2, ep = 2, zero = 1}, {dp = 2, tp = 2, ep = 2, zero = 2, sequence_parallel = true},
                        {dp = 2, tp = 2, zero = 3}, {dp = 2, tp = 2, ep = 2, zero = 3}}}
if not LAYOUTS[N] then testing.skip("test_moe_tp runs on 2 or 4 ranks, not " .. N) end

local MH = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/dist/") .. "moe_helpers.lua")(world, H)
local build, batches, moe_layers, bytes_of = MH.build, MH.batches, MH.moe_layers, MH.bytes_of
local reference = MH.reference
local REL = H.F64_REL

-- The layout's run against the reference (moe_helpers.lua); the experts are cut over tp (and ep):
-- every rank holds 1/(tp ep) of them (ZeRO 3: less). Returns par (trained) and the mesh.
local function run_layout(layout, extra, ref, what)
  return MH.run_layout(layout, extra, ref, what, {built = function(model, mesh)
    local m1 = moe_layers(model)[1]
    if layout.zero ~= 3 then
      testing.assert_equal(m1.w_up:size(1), 24 / mesh.tp_size, what .. ": local expert hidden size")
      testing.assert_equal(m1.w_down:size(0), 8 / (layout.ep or 1), what .. ": local experts")
    end
  end})
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
    MH.layout_to_whole(tr.par, tr.ref, root .. "/from_layout", lname)
    -- one process -> the layout's shards
    local targets, by_name = MH.whole_to_layout(tr.ref_model, tr.mesh, root)
    local n_cut = 0
    -- experts are ZeRO 3 shards without ep; with ep they stay whole per rank (their tp and ep cut)
    local whole_experts = layout.zero ~= 3 or (layout.ep or 1) > 1
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

local data = MH.text_data("moe_tp")
local tok, TB, TT, loader = data.tok, data.TB, data.TT, data.loader
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
    MH.f32_step1(cfg, layout, loader, TB * TT, layout_name(layout))
  end)
end
