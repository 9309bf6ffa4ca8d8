-- recipes/sft.lua — supervised fine-tuning of a pretrained model on chats, on the CPU in minutes.
--
--   ./build/lutra recipes/pretrain.lua                 -- first: writes runs/pretrain/model
--   ./build/lutra recipes/sft.lua                      -- fine-tunes it: runs/sft/model
--   ./build/lutra recipes/sft.lua --lora=true --lr=3e-3  -- LoRA adapters only (merged into the saved model)
--   ./build/lutra chat runs/sft/model                  -- talk to it
--
-- Data: JSONL chats ({"messages": [...]} or {"prompt", "completion"}; by default the
-- synthetic ones of recipes/data/make_sft_data.lua), rendered by a chat template (the model
-- directory's own Jinja chat_template, run by lutra.jinja, else ChatML; --template to pick one of
-- lutra's instead), truncated to max_len tokens (counted), packed several per row of seq_len
-- tokens (positions restart and attention stays inside each chat). Only assistant tokens carry
-- loss. A bad line is an error naming the file, line and field (lutra/sft/jsonl.lua: CRLF
-- line ends and blank lines are accepted, a BOM is not). The held-out loss per assistant
-- token is measured before and after training.
local lt = require "lutra"
local config = lt.config
local sft, modeldir, ev, templates = lt.sft.data, lt.sft.modeldir, lt.sft.eval, lt.sft.templates

local data = ((arg and arg[0] or ""):match("^(.*/)[^/]+$") or "recipes/") .. "data/" -- found from any directory
local cfg = config {
  model = "runs/pretrain/model",       -- a model directory, or a trainer checkpoint (with --tokenizer)
  tokenizer = "",                      -- tokenizer.json for a checkpoint
  cast = false,                        -- load bf16/f16 weights into the f32 model (lossless; refused without)
  ignore_key = "",                     -- config.json keys lutra does not know, accepted as harmless (KEY,KEY)
  template = config.one_of({"auto", "chatml", "llama3"}, "auto"), -- auto: the model directory's (else ChatML)
  train_data = data .. "sft_train.jsonl", val_data = data .. "sft_val.jsonl", -- shipped next to this recipe
  max_len = 0, seq_len = 0,            -- 0: the model's block_size
  pack = true, on_empty = config.one_of({"error", "warn"}, "error"),
  batch = 8, grad_accum = 1, steps = 400, seed = 1337,
  lr = 1e-3, min_lr = 1e-4, warmup = 20, schedule = config.one_of({"cosine", "linear", "constant"}, "cosine"),
  betas = {0.9, 0.99}, weight_decay = 0.0, grad_clip = config.number(1),
  lora = false, lora_r = 8, lora_alpha = 16, lora_dropout = config.number(0), lora_targets = "all-linear",
  eval_answers = 100,                  -- held-out single-exchange chats answered greedily (exact match)
  eval_every = 0, eval_iters = 10, log_every = 1, print_every = 0,
  run_dir = "runs/sft", out = "",      -- out: the model directory written; "" = run_dir/model
  ckpt_every = 0,                      -- rollback (below) needs checkpoints to go back to
  -- a step whose loss or gradient norm is nan or inf: stop, skip it, or roll back (lutra/train/nonfinite.lua)
  nonfinite = config.one_of({"stop", "skip", "rollback"}, "stop"), nonfinite_max_skips = 10,
  nonfinite_max_rollbacks = 3,
  -- what a run shows (lutra/train/init.lua): TensorBoard's events in run_dir/runs/ID, histograms of the
  -- weights and gradients every N steps (0: none), a profile of steps "N-M" (trace.json and a table)
  log_tensorboard = true, histogram_every = 0, profile = "",
  threads = 0,
}
if cfg.threads > 0 then lt.set_num_threads(cfg.threads) end
print(cfg:dump())

-- ---- model and data -------------------------------------------------------------------------
lt.manual_seed(cfg.seed)
local model, tok, info = modeldir.load(cfg.model, {tokenizer = cfg.tokenizer ~= "" and cfg.tokenizer or nil,
                                                  allow_cast = cfg.cast, ignore_keys = cfg.ignore_key,
                                                  template = cfg.template ~= "auto" and cfg.template or nil})
local block = model.cfg.block_size
print(string.format("model: %s (%s format), %s, %.2fM parameters", cfg.model, info.format, model:extra_repr(),
                    model:num_parameters() / 1e6))
local template = templates.get(info.template)
local max_len = cfg.max_len > 0 and cfg.max_len or block
local seq_len = cfg.seq_len > 0 and cfg.seq_len or block
local function load(path)
  local examples, report = sft.load_jsonl(path, {tokenizer = tok, template = template, max_len = max_len})
  print(string.format("data: %s: %s", path, sft.describe(report)))
  return examples, report
end
local train_ex = load(cfg.train_data)
local val_ex = load(cfg.val_data)
local rows = cfg.pack and sft.pack(train_ex, seq_len) or sft.pad(train_ex, seq_len)
local val_rows = sft.pad(val_ex, seq_len) -- one chat per row: the plain reference
print(string.format("rows: %d train rows of %d tokens (%s, %.0f%% filled), %d val rows", #rows, seq_len,
                    cfg.pack and "packed" or "one chat each", 100 * sft.fill_ratio(rows), #val_rows))
local loader = sft.loader(rows, {batch = cfg.batch, seed = cfg.seed})
local val_loader = sft.loader(val_rows, {batch = cfg.batch, seed = cfg.seed + 1})

-- ---- LoRA (optional) ------------------------------------------------------------------------
local optimizer, lora = nil, nil
if cfg.lora then
  lora = lt.lora
  lora.apply(model, {targets = cfg.lora_targets, r = cfg.lora_r, alpha = cfg.lora_alpha, dropout = cfg.lora_dropout})
  print("lora: " .. lora.summary(model))
  optimizer = lt.optim.AdamW(lora.param_groups(model), {lr = cfg.lr, betas = cfg.betas,
                                                         weight_decay = cfg.weight_decay})
end

-- ---- before, train, after ---------------------------------------------------------------------
local before, n_val = sft.evaluate(model, val_rows, {batch = cfg.batch})
local right0, n_q = ev.exact_match(model, tok, template, cfg.val_data, {limit = cfg.eval_answers})
print(string.format("held-out assistant-token loss before: %.4f (%d tokens); exact answers %d/%d", before, n_val,
                    right0, n_q))
local function loss_fn(m, batch) return sft.loss(m, batch, {on_empty = cfg.on_empty}) end
lt.reset_peak_memory_stats("cpu")
local result = lt.train{model = model, data = loader, val_data = val_loader, config = cfg, loss_fn = loss_fn,
                        optimizer = optimizer, tokenizer = tok}
local after = sft.evaluate(model, val_rows, {batch = cfg.batch})
local loss_tokens = 0
for _, r in ipairs(rows) do loss_tokens = loss_tokens + r.n_loss end
print(string.format("trained %d steps in %.1f s: %.0f tokens/s (%d-token rows), peak tensor memory %.1f MB, "
                    .. "train loss %s -> %s",
                    result.step, result.seconds, result.tokens_per_s, seq_len, lt.memory_stats("cpu").peak / 2 ^ 20,
                    result.losses[1] and string.format("%.4f", result.losses[1]) or "-",
                    result.loss and string.format("%.4f", result.loss) or "-"))
local right1 = ev.exact_match(model, tok, template, cfg.val_data, {limit = cfg.eval_answers})
print(string.format("held-out assistant-token loss after: %.4f (before %.4f); exact answers %d/%d (before %d/%d)",
                    after, before, right1, n_q, right0, n_q))
print(string.format("sft_val_before=%.4f sft_val_after=%.4f tokens_per_s=%.1f", before, after, result.tokens_per_s))

-- ---- save, and a few answers ------------------------------------------------------------------
if lora then lora.merge_and_unload(model) end
local out = cfg.out ~= "" and cfg.out or (cfg.run_dir ~= "" and cfg.run_dir .. "/model" or "")
if out ~= "" then print("model: saved to " .. modeldir.save(out, model, tok, {template = template})) end
for _, q in ipairs {"3+4?", "upper: moon", "reverse: star", "capital of peru", "hello"} do
  print(string.format("  user: %-16s assistant: %s", q, ev.reply(model, tok, template, {{role = "user", content = q}})))
end
