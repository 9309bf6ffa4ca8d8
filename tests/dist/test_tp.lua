-- np: 2 4
-- Tensor parallelism (lutra.dist.tp) over the whole world as the tp group: each layer
-- against its unsharded counterpart (forward values, gradients of inputs and weights), the
-- vocab-parallel cross-entropy against F.cross_entropy (ignore_index, uneven vocab), then
-- small gpt2 and llama models against the single-process model trained in the same process
-- on the same batches, with and without sequence parallelism: 10 AdamW steps in f64 to 1e-9
-- relative, step 1 in f32 within the f32 rounding bound (layout_helpers.lua); gradients of
-- gradients (a gradient penalty) through column -> row parallel layers in f64.
local lt = require "lutra"
local testing = require "lutra.testing"
local comm = require "lutra.dist.comm"
local spec = require "lutra.dist.spec"
local tp = require "lutra.dist.tp"
local L = require "lutra.dist.tp_layers"
local tp_ops = require "lutra.dist.tp_ops"
local nn, F, optim, models = lt.nn, lt.F, lt.optim, lt.models

comm.init()
local group = comm.split(0, comm.rank(), "tp")
local n, r = group.size, group.rank

local TOL = {rtol = 1e-5, atol = 1e-6}

local function close(a, e, msg, tol)
  tol = tol or TOL
  testing.assert_close(a, e, {rtol = tol.rtol, atol = tol.atol, msg = msg})
end

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/dist/") .. "layout_helpers.lua")
local leaf = H.leaf

-- ---- layers --------------------------------------------------------------------------------

test("ColumnParallelLinear (copy in): values and grads of input, weight, bias; uneven rows", function()
  local out = 4 * n + 2 -- uneven for 4 ranks
  local lin = nn.Linear(8, out)
  local lo, cnt = tp_ops.range(out, n, r)
  local col = L.ColumnParallelLinear(lin, group, {{lo, cnt}})
  local x = lt.randn(3, 5, 8)
  local gy = lt.randn(3, 5, out)
  local xr, xt = leaf(x), leaf(x)
  local yr = lin(xr)
  ;(yr * gy):sum():backward()
  local yt = col(xt)
  ;(yt * gy:narrow(2, lo, cnt)):sum():backward()
  close(yt, yr:narrow(2, lo, cnt), "y")
  close(xt.grad, xr.grad, "x.grad")
  close(col.weight.grad, lin.weight.grad:narrow(0, lo, cnt), "weight.grad")
  close(col.bias.grad, lin.bias.grad:narrow(0, lo, cnt), "bias.grad")
end)

test("ColumnParallelLinear (sequence-parallel gather in)", function()
  local T = 2 * n
  local Tl = T / n
  local lin = nn.Linear(6, 2 * n)
  local lo, cnt = tp_ops.range(2 * n, n, r)
  local col = L.ColumnParallelLinear(lin, group, {{lo, cnt}}, {input = "gather"})
  local x = lt.randn(2, T, 6)
  local gy = lt.randn(2, T, 2 * n)
  local xr, xt = leaf(x), leaf(x:narrow(1, r * Tl, Tl))
  ;(lin(xr) * gy):sum():backward()
  local yt = col(xt)
  ;(yt * gy:narrow(2, lo, cnt)):sum():backward()
  close(yt, lin(x):narrow(2, lo, cnt), "y")
  close(xt.grad, xr.grad:narrow(1, r * Tl, Tl), "x.grad")
  close(col.weight.grad, lin.weight.grad:narrow(0, lo, cnt), "weight.grad")
end)

test("RowParallelLinear (all-reduce out): values and grads; bias added once", function()
  local inf = 3 * n + 1
  local lin = nn.Linear(inf, 5)
  local lo, cnt = tp_ops.range(inf, n, r)
  local row = L.RowParallelLinear(lin, group, {{lo, cnt}})
  local x = lt.randn(4, 3, inf)
  local gy = lt.randn(4, 3, 5)
  local xr, xt = leaf(x), leaf(x:narrow(2, lo, cnt))
  local yr = lin(xr)
  ;(yr * gy):sum():backward()
  local yt = row(xt)
  ;(yt * gy):sum():backward()
  close(yt, yr, "y")
  close(xt.grad, xr.grad:narrow(2, lo, cnt), "x.grad")
  close(row.weight.grad, lin.weight.grad:narrow(1, lo, cnt), "weight.grad")
  close(row.bias.grad, lin.bias.grad, "bias.grad")
end)

test("RowParallelLinear (sequence-parallel reduce-scatter out)", function()
  local T, inf = 3 * n, 2 * n
  local Tl = T / n
  local lin = nn.Linear(inf, 4)
  local lo, cnt = tp_ops.range(inf, n, r)
  local row = L.RowParallelLinear(lin, group, {{lo, cnt}}, {output = "reduce_scatter"})
  local x = lt.randn(2, T, inf)
  local gy = lt.randn(2, T, 4)
  local xr, xt = leaf(x), leaf(x:narrow(2, lo, cnt))
  local yr = lin(xr)
  ;(yr * gy):sum():backward()
  local yt = row(xt)
  ;(yt * gy:narrow(1, r * Tl, Tl)):sum():backward()
  close(yt, yr:narrow(1, r * Tl, Tl), "y")
  close(xt.grad, xr.grad:narrow(2, lo, cnt), "x.grad")
  close(row.weight.grad, lin.weight.grad:narrow(1, lo, cnt), "weight.grad")
  local gb = row.bias.grad:clone() -- this rank's tokens only: summed over tp, the full grad
  group:all_reduce(gb, "sum")
  close(gb, lin.bias.grad, "bias.grad summed")
end)

test("gradients of gradients through column -> row parallel layers (f and g, and the sequence-parallel pair)", function()
  local F64 = {rtol = 1e-9, atol = 1e-12}
  for _, sp in ipairs {false, true} do
    local T = 2 * n
    local Tl = T / n
    local lin1, lin2 = nn.Linear(6, 3 * n + 1), nn.Linear(3 * n + 1, 5)
    lin1:to("f64")
    lin2:to("f64")
    local lo, cnt = tp_ops.range(3 * n + 1, n, r)
    local col = L.ColumnParallelLinear(lin1, group, {{lo, cnt}}, sp and {input = "gather"} or nil)
    local row = L.RowParallelLinear(lin2, group, {{lo, cnt}}, sp and {output = "reduce_scatter"} or nil)
    local x, w = lt.randn(2, T, 6):to("f64"), lt.randn(2, T, 5):to("f64")
    -- the penalty ||dL/dx||^2 of L = sum(w y^3), and its gradients with respect to the weights
    local function penalty(f, xx, ww)
      local y = f(xx)
      local gx = lt.autograd.grad((ww * y * y * y):sum(), xx, nil, {create_graph = true})
      return (gx * gx):sum()
    end
    local want = lt.autograd.grad(penalty(function(a) return lin2(lin1(a):tanh()) end, leaf(x), w),
      {lin1.weight, lin1.bias, lin2.weight})
    local mine = sp and function(t) return t:narrow(1, r * Tl, Tl) end or function(t) return t end
    local got = lt.autograd.grad(penalty(function(a) return row(col(a):tanh()) end, leaf(mine(x)), mine(w)),
      {col.weight, col.bias, row.weight})
    local what = sp and "sequence parallel: " or ""
    close(got[1], want[1]:narrow(0, lo, cnt), what .. "column weight", F64)
    close(got[2], want[2]:narrow(0, lo, cnt), what .. "column bias", F64)
    close(got[3], want[3]:narrow(1, lo, cnt), what .. "row weight", F64)
  end
end)

test("VocabParallelEmbedding: ids outside the shard are zeroed; uneven vocab", function()
  local V = 4 * n + 3
  local emb = nn.Embedding(V, 6)
  local lo, cnt = tp_ops.range(V, n, r)
  local vpe = L.VocabParallelEmbedding(emb, group, lo, cnt)
  local ids = lt.randint(0, V, {3, 7})
  local gy = lt.randn(3, 7, 6)
  local yr = emb(ids)
  ;(yr * gy):sum():backward()
  local yt = vpe(ids)
  ;(yt * gy):sum():backward()
  close(yt, yr, "y")
  close(vpe.weight.grad, emb.weight.grad:narrow(0, lo, cnt), "weight.grad")
end)

test("vocab-parallel cross-entropy = F.cross_entropy on the gathered logits (ignore_index, f32/f64)", function()
  for _, dt in ipairs {"f32", "f64"} do
    for _, V in ipairs {8 * n, 8 * n + 3} do
      local logits = lt.randn(3, 5, V, {dtype = dt}) * 3
      local targets = lt.randint(0, V, {3, 5})
      targets[{0, 1}] = -100
      targets[{2, 4}] = -100
      local lo, cnt = tp_ops.range(V, n, r)
      for _, reduction in ipairs {"mean", "sum"} do
        local lr, lt_ = leaf(logits), leaf(logits:narrow(2, lo, cnt))
        local ref = F.cross_entropy(lr, targets, {ignore_index = -100, reduction = reduction})
        ref:backward()
        local loss = tp.cross_entropy(lt_, targets, group, lo, V, {ignore_index = -100, reduction = reduction})
        loss:backward()
        local what = string.format("%s V=%d %s", dt, V, reduction)
        close(loss, ref, what .. " loss")
        close(lt_.grad, lr.grad:narrow(2, lo, cnt), what .. " grad")
      end
    end
  end
  -- bf16 logits: computed in f32, the loss f32 as F.cross_entropy's, the grad bf16
  local logits = (lt.randn(4, 6 * n) * 3):to("bf16")
  local targets = lt.tensor({1, 6 * n - 1, -100, 2}, {dtype = "i64"})
  local lo, cnt = tp_ops.range(6 * n, n, r)
  local lr, lt_ = leaf(logits), leaf(logits:narrow(1, lo, cnt))
  local ref = F.cross_entropy(lr, targets)
  ref:backward()
  local loss = tp.cross_entropy(lt_, targets, group, lo, 6 * n)
  loss:backward()
  testing.assert_equal(loss.dtype, ref.dtype)
  close(loss, ref, "bf16 loss")
  testing.assert_equal(lt_.grad.dtype, "bf16")
  close(lt_.grad:to("f32"), lr.grad:narrow(1, lo, cnt):to("f32"), "bf16 grad", {rtol = 1e-2, atol = 1e-3})
  testing.assert_error("outside [0, 16)", tp.cross_entropy, lt.randn(2, 8), lt.tensor({1, 16}, {dtype = "i64"}),
    group, 0, 16)
end)

test("split_seq / gather_seq: a round trip, and T that does not divide is an error", function()
  local x = leaf(lt.randn(2, 2 * n, 3))
  local y = tp_ops.gather_seq(tp_ops.split_seq(x, group), group)
  close(y, x, "round trip")
  ;(y * 2):sum():backward()
  close(x.grad, lt.full({2, 2 * n, 3}, 2 * n), "grad: every rank's piece, summed over ranks")
  testing.assert_error("sequence length " .. (2 * n + 1), tp_ops.split_seq, lt.randn(2, 2 * n + 1, 3), group)
end)

test("gather_seq_whole: the gathered sequence, its whole gradient taken back as this rank's piece", function()
  local x = leaf(lt.randn(2, 2 * n, 3))
  local y = tp_ops.gather_seq_whole(tp_ops.split_seq(x, group), group)
  close(y, x, "round trip")
  ;(y * y):sum():backward() -- the same whole gradient 2 y on every rank: counted once, not n times
  close(x.grad, x:detach() * 2, "grad")
end)

-- ---- whole models ---------------------------------------------------------------------------

local function cfg_of(arch, dt)
  local cfg = {arch = arch, n_layer = 2, d_model = 32, n_head = 4, vocab_size = 64, block_size = 16, dropout = 0,
               dtype = dt}
  if arch == "llama" then cfg.n_kv_head = n == 2 and 2 or 4 end
  return cfg
end

-- The global grad norm of a tp model: each shard once (dup copies skipped), summed over tp.
local function clip_tp(model, max_norm)
  local sq = 0
  for _, p in ipairs(model:parameters()) do
    if p.grad ~= nil and spec.owned(p) then
      local v = p.grad:norm():item()
      sq = sq + v * v
    end
  end
  local t = lt.tensor({sq}, {dtype = "f64"})
  group:all_reduce(t, "sum")
  local norm = math.sqrt(t:item())
  local coef = max_norm / (norm + 1e-6)
  if coef < 1 then
    lt.no_grad(function()
      for _, p in ipairs(model:parameters()) do
        if p.grad ~= nil then p.grad:mul_(coef) end
      end
    end)
  end
  return norm
end

-- Whole models (layout_helpers.lua says why): in f64, 10 AdamW steps with clipping, every
-- step's loss and gradient norm and the final parameters within 1e-9 relative of one
-- process; in f32, step 1 (loss, gradient norm, every gradient) within the f32 bound.
local function equivalence(arch, sp, dt, overrides)
  local cfg = cfg_of(arch, dt)
  for k, v in pairs(overrides or {}) do cfg[k] = v end
  local steps = dt == "f64" and 10 or 1
  local tol = dt == "f64" and H.F64_REL or H.f32_tolerance(cfg, 4 * 16)
  lt.manual_seed(1)
  local ref = models.build(cfg)
  lt.manual_seed(1)
  local model = models.build(cfg)
  local names = {}
  for name in model:named_parameters() do names[#names + 1] = name end
  tp.parallelize(model, group, {sequence_parallel = sp})
  local refs = {}
  for name, p in ref:named_parameters() do refs[name] = p end
  local i = 0
  for name in model:named_parameters() do
    i = i + 1
    testing.assert_equal(name, names[i], "parameter names stay global")
  end
  lt.manual_seed(2)
  local batches = {}
  for s = 1, steps do
    local x, y = lt.randint(0, cfg.vocab_size, {4, 16}), lt.randint(0, cfg.vocab_size, {4, 16})
    y[{s % 4, {0, 3}}] = -100
    batches[s] = {x, y}
  end
  local opt_r = optim.AdamW(ref, {lr = 1e-2, weight_decay = 0.1})
  local opt_t = optim.AdamW(model, {lr = 1e-2, weight_decay = 0.1})
  local what = arch .. " " .. dt .. (sp and " sequence-parallel" or "")
  if overrides then what = what .. " " .. testing.show(overrides) end
  local worst = 0
  for s = 1, steps do
    local x, y = batches[s][1], batches[s][2]
    local rng = lt.get_rng_state() -- the same dropout masks for both models
    opt_r:zero_grad()
    local _, loss_r = ref(x, y)
    loss_r:backward()
    lt.set_rng_state(rng)
    opt_t:zero_grad()
    local logits, loss_t = model(x, y)
    testing.assert_equal(logits:size(2), select(2, tp_ops.range(cfg.vocab_size, n, r)), "logits are vocab shards")
    loss_t:backward()
    tp.sync_grads(model)
    for name, p in model:named_parameters() do
      worst = math.max(worst, H.assert_rel(tp.gather(model, p, p.grad), refs[name].grad, tol,
        string.format("%s step %d gradient of %s", what, s, name)))
    end
    local norm_r = optim.clip_grad_norm(ref, 1.0)
    local norm_t = clip_tp(model, 1.0)
    worst = math.max(worst, H.assert_rel_number(loss_t:item(), loss_r:item(), tol, string.format("%s loss at step %d",
      what, s)), H.assert_rel_number(norm_t, norm_r, tol, string.format("%s gradient norm at step %d", what, s)))
    opt_r:step()
    opt_t:step()
  end
  if dt == "f64" then
    for name, p in model:named_parameters() do
      worst = math.max(worst, H.assert_rel(tp.gather(model, p), refs[name], tol, what .. " parameter " .. name))
    end
  end
  if r == 0 then
    print(string.format("  %-40s %d step(s): worst rel diff %.1e (allowed %.1e)", what, steps, worst, tol))
  end
end

for _, arch in ipairs {"gpt2", "llama"} do
  test(arch .. " f32: step 1 under tp (loss, gradient norm, gradients) equals one process", function()
    equivalence(arch, false, "f32")
  end)
  test(arch .. " f32: the same with sequence parallelism", function() equivalence(arch, true, "f32") end)
end

-- f64: 10 AdamW steps to 1e-9; with dropout (the masks of one process), uneven vocab and ffn_hidden
test("gpt2 f64: sequence parallel, dropout 0.1, uneven vocab (61) and ffn_hidden (98)", function()
  equivalence("gpt2", true, "f64", {vocab_size = 61, ffn_hidden = 98, dropout = 0.1})
end)
test("gpt2 f64: without sequence parallelism", function() equivalence("gpt2", false, "f64") end)
test("llama f64: dropout 0.1, without and with sequence parallelism", function()
  equivalence("llama", false, "f64", {dropout = 0.1})
  equivalence("llama", true, "f64", {dropout = 0.1})
end)

test("parallelize: local heads, specs, tied embeddings", function()
  lt.manual_seed(1)
  local model = models.build(cfg_of("gpt2"))
  tp.parallelize(model, group)
  local attn = model.blocks[1].attn
  testing.assert_equal({attn.n_head, attn.n_kv_head}, {4 / n, 4 / n})
  assert(rawequal(model.lm_head.weight, model.wte.weight), "the tie is kept")
  local s = spec.get(model.blocks[1].attn.qkv.weight)
  testing.assert_equal(s.global, {96, 32})
  testing.assert_equal(#s.pieces, 3)
  testing.assert_equal(s.pieces[2].offset, {32 + r * 32 / n, 0})
  testing.assert_equal(spec.get(model.blocks[1].mlp.proj.weight).offset, {0, r * 128 / n})
  testing.assert_equal(spec.get(model.ln_f.weight).dup, r > 0)
  testing.assert_equal(spec.get(model.wte.weight).offset, {r * 64 / n, 0})
  testing.assert_error("already tensor-parallel", tp.parallelize, model, group)
end)

test("parallelize: heads that do not divide are an error naming the numbers", function()
  lt.manual_seed(1)
  local bad = models.build {arch = "gpt2", n_layer = 1, d_model = 8 * (n + 1), n_head = n + 1, vocab_size = 64,
                            block_size = 16}
  testing.assert_error(string.format("n_head %d is not divisible by the tensor-parallel size %d", n + 1, n),
    tp.parallelize, bad, group)
  local gqa = models.build {arch = "llama", n_layer = 1, d_model = 32, n_head = 4, n_kv_head = 1, vocab_size = 64,
                            block_size = 16}
  testing.assert_error(string.format("n_kv_head 1 is not divisible by the tensor-parallel size %d", n),
    tp.parallelize, gqa, group)
  testing.assert_error("expected a process group", tp.parallelize, gqa, {})
end)
