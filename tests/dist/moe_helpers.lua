-- moe_helpers.lua — what the MoE layout tests (test_ep, test_moe_tp, test_moe_pp) share (not a test
-- file itself): the global batches, a small f64 zoo "moe" model, one process's reference run, the
-- rows of a batch a dp rank takes, and counts over the world.
--   local MH = dofile(dir .. "moe_helpers.lua")(world, H)    -- H: layout_helpers.lua's table
local lt = require "lutra"
local ffi = require "ffi"
local spec = require "lutra.dist.spec"
local ckpt = require "lutra.ckpt"
local testing = require "lutra.testing"

return function(world, H)
  local M = {BATCH = 4, T = 4, VOCAB = 32, STEPS = 3, LR = 0.5}
  local BATCH, T, VOCAB = M.BATCH, M.T, M.VOCAB

  -- The small f64 model of these tests (8 experts top-2, 2 layers, balance and z losses), extra's
  -- keys over it.
  function M.build(extra)
    lt.manual_seed(1234)
    local cfg = {arch = "moe", n_layer = 2, d_model = 16, n_head = 2, n_kv_head = 2, ffn_hidden = 24, vocab_size = VOCAB,
                 block_size = T, dropout = 0, dtype = "f64", n_experts = 8, top_k = 2, aux_loss_coef = 0.5,
                 z_loss_coef = 0.1}
    for k, v in pairs(extra or {}) do cfg[k] = v end
    return lt.models.build(cfg)
  end

  -- STEPS global batches (BATCH, T), the same on every rank
  M.batches = {}
  lt.manual_seed(99)
  for s = 1, M.STEPS do M.batches[s] = {x = lt.randint(0, VOCAB, {BATCH, T}), y = lt.randint(0, VOCAB, {BATCH, T})} end

  function M.loss_fn(m, b)
    local _, l = m:forward(b.x, b.y)
    return l
  end

  -- The model's MoE layers, in order.
  function M.moe_layers(model)
    local out = {}
    for _, m in ipairs(model:modules()) do
      if getmetatable(m) == lt.nn.MoE then out[#out + 1] = m end
    end
    return out
  end

  -- The bytes of an f64 tensor (bitwise comparisons).
  function M.bytes_of(t)
    t = t:contiguous()
    return ffi.string(ffi.cast("const char *", t:data_ptr()), t:numel() * 8)
  end

  -- One process, SGD over the batches: step 1's loss, balance losses and grads, every step's loss,
  -- the final weights; and the model.
  function M.reference(extra)
    local model = M.build(extra)
    local opt = lt.optim.SGD(model, {lr = M.LR})
    local ref = {losses = {}, grads = {}, balance = {}, params = {}, names = {}}
    for s, b in ipairs(M.batches) do
      opt:zero_grad()
      local loss = M.loss_fn(model, b)
      ref.losses[s] = loss:item()
      loss:backward()
      if s == 1 then
        local sq = 0
        for name, p in model:named_parameters() do
          ref.grads[name] = p.grad:clone()
          sq = sq + (p.grad * p.grad):sum():item()
        end
        ref.norm = math.sqrt(sq)
        for i, m in ipairs(M.moe_layers(model)) do ref.balance[i] = m.balance_loss:item() end
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
  function M.local_batch(b, mesh)
    local per = BATCH / mesh.dp_size
    local function rows(t) return t:narrow(0, mesh.dp_rank * per, per):contiguous() end
    return {x = rows(b.x), y = rows(b.y)}
  end

  -- The sum over the world of count(layer) over the model's MoE layers.
  function M.world_sum(model, count)
    local n = 0
    for _, m in pairs(M.moe_layers(model)) do n = n + count(m) end
    local t = lt.tensor({n}, {dtype = "f64"})
    world:all_reduce(t, "sum")
    return t:item()
  end

  -- The slots the capacity dropped, over the world.
  function M.dropped(model) return M.world_sum(model, function(m) return m.dropped end) end

  -- The gradients par's optimizer steps with (ZeRO: this rank's shards), gathered whole, against
  -- ref.grads at rel; returns the worst relative difference.
  function M.compare_grads(par, ref, rel, what)
    local entries, opt = {}, par.optimizer
    for k, key in ipairs(opt.keys) do
      local p = opt.params[k]
      assert(p.grad ~= nil, what .. ": no gradient for " .. tostring(key))
      entries[#entries + 1] = {name = tostring(key), tensor = spec.copy(p.grad, p)}
    end
    local names, shapes = H.global_names(entries, world)
    local grads = H.gather_entries(entries, names, shapes, world)
    local worst = 0
    for name, g in pairs(ref.grads) do
      assert(grads[name] ~= nil, what .. ": no gathered gradient of " .. name)
      worst = math.max(worst, H.assert_rel(grads[name], g, rel, what .. " gradient of " .. name))
    end
    return worst
  end

  -- par's weights, gathered whole, against ref.params at rel; returns the worst relative difference.
  function M.compare_weights(par, ref, rel, what)
    local got, worst = H.gather(par, ref.names, ref.params, world), 0
    for _, name in ipairs(ref.names) do
      worst = math.max(worst, H.assert_rel(got[name], ref.params[name], rel, what .. " weight " .. name))
    end
    return worst
  end

  -- A layout's SGD run over the batches against ref (M.reference(extra)), at 1e-9 in f64: every
  -- step's loss; at step 1 the gradient norm, each layer's balance loss, the drops when
  -- extra.capacity_factor, every gathered gradient; the final weights. checks.built(model, mesh)
  -- and checks.step1(model), when given, add the test's own. Returns par (trained) and the mesh.
  function M.run_layout(layout, extra, ref, what, checks)
    local rel = H.F64_REL
    local mesh = lt.dist.init(layout)
    local model = M.build(extra)
    local worst = 0
    local par = lt.dist.parallelize(model, mesh,
      {optimizer = function(named) return lt.optim.SGD(H.as_module(named), {lr = M.LR}) end})
    if checks and checks.built then checks.built(model, mesh) end
    for s, b in ipairs(M.batches) do
      par:zero_grad()
      local loss = par:forward_backward({M.local_batch(b, mesh)}, M.loss_fn)
      local norm = par:finish(0)
      worst = math.max(worst, H.assert_rel_number(loss, ref.losses[s], rel, what .. " step " .. s .. " loss"))
      if s == 1 then
        worst = math.max(worst, H.assert_rel_number(norm, ref.norm, rel, what .. " gradient norm"))
        for i, m in ipairs(M.moe_layers(model)) do
          worst = math.max(worst, H.assert_rel_number(m.balance_loss:item(), ref.balance[i], rel,
            what .. " layer " .. i .. " balance loss"))
        end
        if extra and extra.capacity_factor then assert(M.dropped(model) > 0, what .. ": nothing dropped") end
        if checks and checks.step1 then checks.step1(model) end
        worst = math.max(worst, M.compare_grads(par, ref, rel, what))
      end
      par.optimizer:step()
      par:after_step()
    end
    worst = math.max(worst, M.compare_weights(par, ref, rel, what))
    if world.rank == 0 then print(string.format("  %-44s f64 worst rel diff %.1e (allowed %.0e)", what, worst, rel)) end
    return par, mesh
  end

  -- f32, step 1 up to the optimizer under layout, against one process on loader's first global
  -- batch: the loss, norm and every gathered gradient within layout_helpers' f32 rounding bound
  -- (tokens: the batch's). cfg: an f32 model's config.
  function M.f32_step1(cfg, layout, loader, tokens, what)
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
    local worst, n = H.compare_step1(l1, norm, grads, ref32, H.f32_tolerance(cfg, tokens), what .. " f32 step 1")
    if world.rank == 0 then print(string.format("  %s f32 step 1: %d gradients, worst rel diff %.1e", what, n, worst)) end
  end

  -- lt.train's data: a word corpus of this rank's own file (name, rank, ranks), its char tokenizer,
  -- and a loader of (8, 8) global batches.
  function M.text_data(name)
    local corpus = string.format("%s/lutra_%s_corpus_%d_%d.txt", os.getenv("TMPDIR") or "/tmp", name, world.rank,
      world.size)
    testing.word_corpus(corpus, {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"}, 2000, 12345)
    local tok = lt.tokenizer.char(assert(io.open(corpus)):read("*a"))
    local d = {tok = tok, TB = 8, TT = 8, corpus = corpus}
    function d.loader()
      return lt.data.text(corpus, tok, {seq_len = d.TT, batch = d.TB, seed = 3, cache = corpus .. ".bin", quiet = true})
    end
    return d
  end

  -- A layout's checkpoint loaded whole, bitwise: par's parameters saved under the world into dir,
  -- loaded into a fresh whole model, each equal to what H.gather gathers; returns the loaded
  -- {name =, tensor =} list.
  function M.layout_to_whole(par, ref, dir, what)
    local entries = {}
    for name, p in par.model:named_parameters() do entries[#entries + 1] = {name = name, tensor = p} end
    ckpt.save(dir, {step = M.STEPS, tensors = entries}, {world = world})
    ckpt.wait()
    world:all_reduce(lt.zeros(1), "sum")
    local into, names = {}, {}
    for name, p in M.build({}):named_parameters() do into[#into + 1], names[#names + 1] = {name = name, tensor = p}, name end
    ckpt.load(dir):load_into(into)
    local got = H.gather(par, names, ref.params, world)
    for _, e in ipairs(into) do
      assert(M.bytes_of(e.tensor) == M.bytes_of(got[e.name]), what .. " -> one process: " .. e.name .. " differs")
    end
    return into
  end

  -- One process's checkpoint loaded into a layout's pieces: model's parameters saved whole (each
  -- rank its own copy, under root), loaded into a fresh model parallelized on mesh (zeroed
  -- first). Returns the loaded {name =, tensor =} list and name -> the whole source tensor.
  function M.whole_to_layout(model, mesh, root)
    local dir = string.format("%s/whole_rank%d", root, world.rank)
    local src, by_name = {}, {}
    for name, p in model:named_parameters() do src[#src + 1], by_name[name] = {name = name, tensor = p}, p end
    ckpt.save(dir, {step = M.STEPS, tensors = src})
    ckpt.wait()
    local par = lt.dist.parallelize(M.build({}), mesh,
      {optimizer = function(named) return lt.optim.SGD(H.as_module(named), {lr = M.LR}) end})
    local targets = {}
    for name, p in par.model:named_parameters() do
      lt.no_grad(function() p:fill_(0) end)
      targets[#targets + 1] = {name = name, tensor = p}
    end
    ckpt.load(dir):load_into(targets)
    return targets, by_name
  end

  return M
end
