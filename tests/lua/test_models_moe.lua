-- The model zoo's mixture-of-experts layout (arch = "moe", or n_experts on any arch): the
-- config, parameter counts, initialisation, the loss with the layers' aux losses in training
-- mode (the cross-entropy alone in eval), a few training steps lowering the loss, the default
-- loss_fn's metrics, a model directory round trip, and a one-stage pipeline.
local lt = require "lutra"
local models = require "lutra.models"
local T = require "lutra.testing"
local close, equal, fails = T.assert_close, T.assert_equal, T.assert_error

local function small(extra)
  local cfg = {arch = "moe", n_layer = 2, n_head = 4, n_kv_head = 2, d_model = 32, vocab_size = 64, block_size = 16,
               n_experts = 4}
  for k, v in pairs(extra or {}) do cfg[k] = v end
  return cfg
end

test("config: arch moe is Llama with 8 experts top-2; n_experts makes any arch's MLPs MoE; errors name the key",
  function()
    local c = models.config {arch = "moe"}
    equal({c.n_experts, c.top_k, c.mlp, c.norm, c.pos, c.bias}, {8, 2, "swiglu", "rmsnorm", "rope", false})
    local m = models.build(small {top_k = 1, capacity_factor = 1.5, n_shared_experts = 1, aux_loss_coef = 0.1,
                                  z_loss_coef = 0.001, norm_topk_prob = false})
    local moe = m.blocks[1].mlp
    assert(rawequal(getmetatable(moe), lt.nn.MoE), "an nn.MoE")
    equal({moe.n_experts, moe.top_k, moe.capacity_factor, moe.n_shared_experts, moe.aux_loss_coef, moe.z_loss_coef,
           moe.norm_topk_prob, moe.activation, moe.d_ff}, {4, 1, 1.5, 1, 0.1, 0.001, false, "swiglu", 96})
    local g = models.build {arch = "gpt2", n_layer = 1, n_head = 2, d_model = 16, vocab_size = 10, block_size = 8,
                            n_experts = 3}
    equal({g.blocks[1].mlp.activation, g.blocks[1].mlp.d_ff, g.blocks[1].mlp.top_k}, {"gelu", 64, 2})
    fails("models.build: top_k applies to mixture-of-experts layers: set n_experts too",
      function() models.build {arch = "llama", top_k = 2} end)
    fails("models.build: top_k (5) must be at most n_experts (4)", function() models.build(small {top_k = 5}) end)
    fails("models.build: n_experts must be a positive integer, got 0", function() models.build(small {n_experts = 0}) end)
    fails("models.build: capacity_factor must be a positive number", function() models.build(small {capacity_factor = -1}) end)
    fails("models.build: aux_loss_coef must be a number >= 0", function() models.build(small {aux_loss_coef = "x"}) end)
    fails("models.build: n_shared_experts must be an integer >= 0", function() models.build(small {n_shared_experts = 0.5}) end)
    fails("unknown key 'n_expert' (did you mean 'n_experts'?)", function() models.build(small {n_expert = 2}) end)
  end)

test("size: the parameter count of an MoE config is the built model's", function()
  local size = require "lutra.models.size"
  for _, cfg in ipairs {small(), small {n_shared_experts = 2, ffn_hidden = 40},
                        {arch = "gpt2", n_layer = 2, n_head = 2, d_model = 16, vocab_size = 10, block_size = 8,
                         n_experts = 3, n_shared_experts = 1}} do
    local m = models.build(cfg)
    local _, total = size.parameters(m.cfg)
    equal(total, m:num_parameters(), cfg.arch)
  end
end)

test("init: experts N(0, 0.02), w_down and the shared proj 0.02 / sqrt(2 n_layer), router N(0, 0.02)", function()
  lt.manual_seed(5)
  local L = 4
  local m = models.build {arch = "moe", n_layer = L, n_head = 4, d_model = 128, vocab_size = 64, block_size = 16,
                          n_experts = 4, n_shared_experts = 1, ffn_hidden = 256}
  for name, p in m:named_parameters() do
    if name:find("mlp") then
      local want = (name:find("w_down$") or name:find("shared%.proj")) and 0.02 / math.sqrt(2 * L) or 0.02
      close(p:std():item(), want, {rtol = 0.08, atol = 0, msg = name})
    end
  end
end)

test("loss: cross-entropy + the sum of the layers' aux losses in training mode, the cross-entropy in eval", function()
  lt.manual_seed(1)
  local m = models.build(small {dtype = "f64", z_loss_coef = 0.01})
  local idx = lt.randint(64, {2, 16})
  local logits, loss = m(idx, idx)
  local ce = lt.F.cross_entropy(logits, idx):item()
  local aux = 0
  for _, b in ipairs(m.blocks) do aux = aux + b.mlp.aux_loss:item() end
  assert(aux > 0.02, "two layers of aux losses near 0.01 each, plus z-losses")
  close(loss:item(), ce + aux, {rtol = 1e-14, atol = 0})
  close(m.lm_loss:item(), ce, {rtol = 0, atol = 0})
  close(m.aux_loss:item(), aux, {rtol = 1e-14, atol = 0})
  -- the aux losses' gradient reaches the routers
  loss:backward()
  assert(m.blocks[1].mlp.router.weight.grad:abs():sum():item() > 0)
  m:eval()
  local _, eval_loss = m(idx, idx)
  close(eval_loss:item(), ce, {rtol = 1e-14, atol = 0})
  equal(rawget(m, "aux_loss"), nil)
end)

test("training: a few SGD steps on one batch lower the loss; the default loss_fn reports lm_loss and aux_loss", function()
  lt.manual_seed(0)
  local m = models.build(small())
  local idx = lt.randint(64, {4, 16})
  local first, last
  for step = 1, 30 do
    local _, loss = m(idx, idx)
    if step == 1 then first = loss:item() end
    last = loss:item()
    m:zero_grad()
    loss:backward()
    lt.no_grad(function()
      for _, p in ipairs(m:parameters()) do p:sub_(p.grad * 0.5) end
    end)
  end
  assert(last < first - 1, string.format("moe: loss %.3f -> %.3f", first, last))
  local loss, metrics = require("lutra.train.batch").default_loss(m, {x = idx, y = idx})
  close(metrics.lm_loss + metrics.aux_loss, loss:item(), {rtol = 1e-6, atol = 0})
end)

test("a model directory (lutra's format: a shared expert without Qwen2-MoE's gate has no Hugging Face layout) gives "
  .. "back the same logits", function()
  lt.manual_seed(2)
  local m = models.build(small {n_shared_experts = 1})
  m:eval()
  local idx = lt.randint(64, {1, 8})
  local want = m(idx)
  local dir = os.tmpname()
  os.remove(dir)
  local tok = lt.tokenizer.char("abcdefghij")
  lt.sft.modeldir.save(dir, m, tok, {format = "lutra"})
  local m2 = lt.sft.modeldir.load(dir)
  m2:eval()
  close(m2(idx), want, {rtol = 0, atol = 0})
  os.execute("rm -rf '" .. dir .. "'")
  fails("hf: this mixture-of-experts model has no Hugging Face form: shared experts without shared_expert_gate", function()
    require("lutra.hf.families").family_of(m.cfg)
  end)
end)

test("a one-stage pipeline trains MoE layers with their aux losses, as the model's forward (f64)", function()
  local cfg = small {dtype = "f64", z_loss_coef = 0.1, aux_loss_coef = 0.5}
  lt.manual_seed(3)
  local ref = models.build(cfg)
  lt.manual_seed(3)
  local m = models.build(cfg)
  lt.manual_seed(4)
  local micro = {}
  for i = 1, 2 do micro[i] = {x = lt.randint(0, 64, {2, 8}), y = lt.randint(0, 64, {2, 8})} end
  -- one process: each micro-batch's lm + aux, scaled by 1/2 (the micro loss itself does not reach
  -- the sum without its aux losses: they are the test's point)
  local want, aux_sum = 0, 0
  for _, b in ipairs(micro) do
    local _, loss = ref(b.x, b.y)
    assert(ref.aux_loss:item() > 0, "the reference has aux losses")
    want, aux_sum = want + loss:item(), aux_sum + ref.aux_loss:item()
    local scaled = loss * 0.5
    scaled:backward()
  end
  local st = require("lutra.dist.pp").parallelize(m, lt.dist.init{}.pp, {micro_batches = 2})
  local sum = st:train_step(micro, 0.5)
  close(sum, want, {rtol = 1e-12, atol = 0})
  -- the default loss: lm_loss and aux_loss reported, the model's loss lm + aux
  st.model:zero_grad()
  local _, acc = st:train_step(micro, 0.5, require("lutra.train.batch").default_loss)
  local ex = require("lutra.train.extras").values(acc)
  close(ex.aux_loss, aux_sum / 2, {rtol = 1e-12, atol = 0})
  close(ex.lm_loss + ex.aux_loss, want / 2, {rtol = 1e-12, atol = 0})
  local got = {}
  for name, p in st.model:named_parameters() do got[name] = p end
  for name, p in ref:named_parameters() do close(got[name].grad, p.grad, {rtol = 1e-10, atol = 1e-14}) end
  -- a loss_fn that does not take the model's loss would leave this stage's aux losses out
  fails("pp: the model has MoE layers: loss_fn must take the model's loss", function()
    st:train_step(micro, 0.5, function(model, b) return model.loss(model, model(b.x), b.y) end)
  end)
end)
