-- recipes/custom_arch.lua — a nonstandard model trained by the same loop as pretrain.lua:
-- a GPT whose feed-forward layers are mixtures of experts (recipes/lib/moe.lua, a few lines of
-- topk, argsort, index_select, F.grouped_linear and index_add): each token is routed to the
-- top_k of n_experts GELU MLPs, mixed by softmax gates over the chosen ones, each expert
-- computing only for its own tokens, and a Switch-style load-balancing loss (E * sum_e f_e *
-- P_e; 1 when the routing is uniform) is added to the LM loss through a custom loss_fn.
-- (The built-in layer is one line: block.mlp = lt.nn.MoE{d_model =, d_ff =, n_experts =, top_k =};
-- the model zoo's arch = "moe" is Mixtral's layout.)
--
--   ./build/lutra recipes/custom_arch.lua                        -- the defaults: a minute or two
--   ./build/lutra recipes/custom_arch.lua --data=corpus.txt --moe.n_experts=8 --moe.top_k=1
--   ./build/lutra recipes/custom_arch.lua --help                 -- every option
--
-- Data as pretrain.lua: any text file (--data), by default Debian's fortune cookies,
-- char-level tokens, 90% train / 10% val. The model is lutra's gpt2 with each block's
-- mlp replaced by an MoE layer: nothing else changes, and lutra.train runs it as it
-- runs any model. The progress line shows the total loss (LM + aux_coef * aux); the
-- metrics (runs/custom_arch/latest/metrics.jsonl) also have lm_loss and aux_loss per step, and
-- the val loss is the LM loss alone. The routing share of each expert is printed at the end.
--
-- The defaults (600 steps of 12 x 64 characters, 0.58M parameters, 0.35M active per token)
-- take about 40 s on a 2-core CPU (37.6 s measured, shared with other jobs): the val loss falls
-- from 4.71 to about 2.44, the aux loss stays near 1.02 (balanced), and each expert gets 17-33%
-- of the tokens.
local lt = require "lutra"
local config = lt.config

local here = (arg and arg[0] or ""):match("^(.*)/[^/]+$") or "recipes"
local MoE = dofile(here .. "/lib/moe.lua")

local cfg = config {
  data = "",                          -- a text file; "" = the fortunes corpus (recipes/data/fortunes.lua)
  data_dir = "runs/data",
  model = {n_layer = 3, n_head = 4, d_model = 96, block_size = 64},
  moe = {n_experts = 4, top_k = 2, hidden = 192}, -- hidden: each expert's width
  aux_coef = 0.01,                    -- the weight of the load-balancing loss
  batch = 12, steps = 600, seed = 1337,
  lr = 2e-3, min_lr = 2e-4, warmup = 40, weight_decay = 0.1, grad_clip = config.number(1),
  eval_every = 200, eval_iters = 10, sample_tokens = 200, temperature = 0.8,
  log_every = 1, print_every = 0, run_dir = "runs/custom_arch", threads = 0,
}
if cfg.threads > 0 then lt.set_num_threads(cfg.threads) end
print(cfg:dump())

-- ---- data ---------------------------------------------------------------------------------
local text_path = cfg.data
if text_path == "" then
  local path, err = dofile(here .. "/data/fortunes.lua")(cfg.data_dir .. "/fortunes.txt")
  if not path then
    io.stderr:write("custom_arch: ", err, "\n")
    os.exit(1)
  end
  text_path = path
end
local cache_dir = lt.data.cache_dir(cfg.run_dir ~= "" and cfg.run_dir .. "/cache" or nil) -- never beside the text
local tok = lt.tokenizer.load_or_train(text_path, {kind = "char", dir = cache_dir})
local data = lt.data.text(text_path, tok, {seq_len = cfg.model.block_size, batch = cfg.batch, seed = cfg.seed,
                                           cache_dir = cache_dir})
print(string.format("data: %s, %d chars, %d train / %d val tokens", text_path, tok.vocab_size, data.ntokens,
                    data.file.count - data.ntokens))

-- ---- model: gpt2 with MoE feed-forward layers ----------------------------------------------------
lt.manual_seed(cfg.seed)
local m, e = cfg.model, cfg.moe
local model = lt.models.build{arch = "gpt2", n_layer = m.n_layer, n_head = m.n_head, d_model = m.d_model,
                              block_size = m.block_size, vocab_size = tok.vocab_size}
for _, block in ipairs(model.blocks) do
  block.mlp = MoE{d_model = m.d_model, n_experts = e.n_experts, top_k = e.top_k, hidden = e.hidden,
                  resid_std = 0.02 / math.sqrt(2 * m.n_layer)}
end
local nparams = model:num_parameters()
local per_expert = 2 * m.d_model * e.hidden + e.hidden + m.d_model
local active = nparams - m.n_layer * (e.n_experts - e.top_k) * per_expert
print(string.format("model: gpt2 + MoE, %d layers, d_model %d, %d experts (top-%d, hidden %d): %.2fM parameters, "
                    .. "%.2fM active per token", m.n_layer, m.d_model, e.n_experts, e.top_k, e.hidden, nparams / 1e6,
                    active / 1e6))

-- ---- the loss: LM + aux_coef * mean over layers of the balance loss ------------------------------
local function loss_fn(model_, batch)
  local _, lm = model_:forward(batch.x, batch.y)
  if not model_.training then return lm end -- evaluation: the LM loss alone
  local aux = MoE.aux_loss_of(model_)
  return lm + aux * cfg.aux_coef, {lm_loss = lm:item(), aux_loss = aux:item()}
end

local aux_log = {}
local result = lt.train{model = model, data = data, config = cfg, tokenizer = tok, loss_fn = loss_fn,
                        log = function(r) if r.aux_loss then aux_log[#aux_log + 1] = r end end}

-- ---- summary ---------------------------------------------------------------------------------
local function mean_of(key, from, to)
  local s, n = 0, 0
  for i = math.max(from, 1), math.min(to, #aux_log) do s, n = s + aux_log[i][key], n + 1 end
  return n > 0 and s / n or 0 / 0
end
local n = #aux_log
print(string.format("trained %d steps in %.1f s, %.0f tokens/s", result.step, result.seconds, result.tokens_per_s))
if n > 0 then
  print(string.format("lm loss %.4f -> %.4f (first 10 steps -> last 10 steps: %.4f -> %.4f)", aux_log[1].lm_loss,
                      aux_log[n].lm_loss, mean_of("lm_loss", 1, 10), mean_of("lm_loss", n - 9, n)))
  print(string.format("aux loss %.4f -> %.4f (first 10 -> last 10: %.4f -> %.4f; 1 = balanced)", aux_log[1].aux_loss,
                      aux_log[n].aux_loss, mean_of("aux_loss", 1, 10), mean_of("aux_loss", n - 9, n)))
end
if result.val_loss then print(string.format("final_val=%.4f", result.val_loss)) end

-- how the experts share the tokens of one val batch, per layer (fractions of the top-k assignments):
-- each MoE layer keeps its last forward's slots per expert
lt.no_grad(function() model:forward(data:with{split = "val"}:next()) end)
for i, block in ipairs(model.blocks) do
  local counts, total = block.mlp.counts, 0
  for _, c in ipairs(counts) do total = total + c end
  local share = {}
  for j, c in ipairs(counts) do share[j] = string.format("%.2f", c / total) end
  print(string.format("layer %d routing share: %s", i, table.concat(share, " ")))
end

print("---- sample ----\n" .. lt.generate.text(model, tok, "", {max_new_tokens = cfg.sample_tokens,
                                                             temperature = cfg.temperature}) .. "\n----------------")
