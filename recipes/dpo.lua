-- recipes/dpo.lua — preference-tune a model with DPO (or IPO / hinge), LoRA by default.
--
--   ./build/lutra recipes/pretrain.lua --run_dir=runs/pretrain --ckpt_every=2000
--   ./build/lutra recipes/dpo.lua --model=runs/pretrain/ckpt/step_002000 \
--       --tokenizer=runs/pretrain/tokenizer.json
--   ./build/lutra recipes/dpo.lua --model=runs/sft/model --mode=full --loss=ipo --beta=0.5
-- Data: JSONL pairs {"prompt", "chosen", "rejected"} (recipes/data/make_sft_data.lua). A model
-- directory brings its chat template; a checkpoint gets prompt + response as plain text. A
-- bad line is an error naming the file, line and field (lutra/sft/jsonl.lua); a pair with an
-- empty response or chosen == rejected too, or left out and counted with --on_bad_pair=skip.
-- Reference "auto": the base with the adapters off (LoRA; no second copy) or a frozen copy
-- (full); "precomputed": its log-probs once, up front. Prints the held-out reward accuracy
-- before and after; saves the adapters (PEFT's layout; LoRA) and the (merged) model directory.
local lt = require "lutra"
local config = lt.config
local dpo, lora, optim, modeldir = lt.dpo, lt.lora, lt.optim, lt.sft.modeldir

local data = ((arg and arg[0] or ""):match("^(.*/)[^/]+$") or "recipes/") .. "data/" -- found from any directory
local cfg = config {
  model = "runs/sft/model",           -- a model directory, or a trainer checkpoint (give --tokenizer)
  tokenizer = "",                     -- tokenizer.json, for a checkpoint
  cast = false,                        -- load bf16/f16 weights into the f32 model (lossless; refused without)
  ignore_key = "",                     -- config.json keys lutra does not know, accepted as harmless (KEY,KEY)
  template = "auto",                  -- auto: the model directory's; "none": plain text; or chatml, llama3
  train_data = data .. "dpo_train.jsonl", val_data = data .. "dpo_val.jsonl", -- shipped next to this recipe
  val_limit = 0,                      -- 0: every held-out pair
  on_bad_pair = config.one_of({"error", "skip"}, "error"), -- a pair with an empty response or chosen == rejected
  mode = config.one_of({"lora", "full"}, "lora"),
  lora = {r = 8, alpha = 16, dropout = config.number(0), rslora = false, targets = "all-linear"},
  reference = config.one_of({"auto", "copy", "lora", "precomputed"}, "auto"),
  loss = config.one_of({"sigmoid", "ipo", "hinge"}, "sigmoid"), beta = config.number(0.1),
  label_smoothing = config.number(0),
  batch = 8, steps = 300, lr = config.number(0), -- 0: 2e-3 with LoRA, 2e-4 full
  warmup = 10, grad_clip = config.number(1), eval_every = 100, log_every = 25,
  out = "runs/dpo", seed = 1, threads = 0,
  -- a step whose loss or gradient norm is nan or inf: stop before its update (nothing is saved),
  -- or skip it (at most nonfinite_max_skips in a row); lutra/train/nonfinite.lua
  nonfinite = config.one_of({"stop", "skip"}, "stop"), nonfinite_max_skips = 10,
}
if cfg.threads > 0 then lt.set_num_threads(cfg.threads) end
lt.manual_seed(cfg.seed)

-- ---- model, data -------------------------------------------------------------------------------
local model, tok, info = modeldir.load(cfg.model, {tokenizer = cfg.tokenizer ~= "" and cfg.tokenizer or nil,
                                                  allow_cast = cfg.cast, ignore_keys = cfg.ignore_key,
                                                  template = cfg.template ~= "auto" and cfg.template or nil})
local template = cfg.template
if template == "auto" then template = info.format == "checkpoint" and "none" or info.template end
local max_len = model.cfg.block_size + 1 -- inputs are all tokens but the last
local train, tstat = dpo.load(cfg.train_data, tok, {template = template, max_len = max_len,
                                                    on_bad_pair = cfg.on_bad_pair})
local val, vstat = dpo.load(cfg.val_data, tok, {template = template, max_len = max_len, on_bad_pair = cfg.on_bad_pair,
                                                limit = cfg.val_limit > 0 and cfg.val_limit or nil})
print(string.format("model: %s (%s), %s; template: %s", cfg.model, info.format, model:extra_repr(),
                    type(template) == "table" and template.name or tostring(template)))
print(string.format("data: %d train pairs (%d truncated), %d held-out (%d truncated)", tstat.n, tstat.truncated,
                    vstat.n, vstat.truncated))
if tstat.skipped + vstat.skipped > 0 then
  print(string.format("data: skipped %d train and %d held-out pairs with an empty response or chosen == rejected",
                      tstat.skipped, vstat.skipped))
end

-- ---- adapters, reference ---------------------------------------------------------------------
local params
if cfg.mode == "lora" then
  local l = cfg.lora
  local targets = l.targets == "all-linear" and "all-linear" or {l.targets}
  lora.apply(model, {targets = targets, r = l.r, alpha = l.alpha, dropout = l.dropout, rslora = l.rslora})
  local trainable, _, analytic = lora.count(model)
  print("lora: " .. lora.summary(model))
  print(string.format("lora: %d layers, analytic sum r*(in+out) = %d: %s", #lora.layers(model), analytic,
                      trainable == analytic and "equal" or "DIFFERENT"))
  params = lora.param_groups(model, {weight_decay = 0})
else
  params = model
end
local kind = cfg.reference
if kind == "auto" then kind = cfg.mode == "lora" and "lora" or "copy" end
if kind == "lora" and cfg.mode ~= "lora" then error("dpo: --reference=lora needs --mode=lora") end
local live = (kind == "lora" or (kind == "precomputed" and cfg.mode == "lora")) and "lora" or "copy"
local ref = dpo.reference[live](model)
print("reference: " .. (live == "lora" and "the base model (adapters off)" or "a frozen copy"))
if kind == "precomputed" then -- every pair's log-probs once; the val pairs are numbered after the train ones
  local c0, all = os.clock(), {unpack(train)}
  for i, p in ipairs(val) do
    p.index = #train + i
    all[#all + 1] = p
  end
  ref = dpo.reference.precomputed(dpo.precompute(ref, all, {batch = cfg.batch}))
  print(string.format("reference: log-probs of %d pairs precomputed in %.1f s", #all, os.clock() - c0))
end

-- ---- train --------------------------------------------------------------------------------------
local lo = {beta = cfg.beta, loss = cfg.loss, label_smoothing = cfg.label_smoothing}
local function report(what, m)
  print(string.format("%s: reward_accuracy=%.4f margin=%.4f loss=%.4f chosen_reward=%.4f rejected_reward=%.4f "
    .. "chosen_logp=%.3f rejected_logp=%.3f logp_accuracy=%.4f", what, m.accuracy, m.margin, m.loss, m.chosen_reward,
    m.rejected_reward, m.chosen_logp, m.rejected_logp, m.logp_accuracy))
end
local eval_opts = {batch = cfg.batch, beta = cfg.beta, loss = cfg.loss, label_smoothing = cfg.label_smoothing}
local before = dpo.evaluate(model, val, ref, eval_opts)
report("held-out before", before)

local lr = cfg.lr > 0 and cfg.lr or (cfg.mode == "lora" and 2e-3 or 2e-4)
local sched = optim.schedule.cosine{lr = lr, min_lr = lr / 10, warmup = math.min(cfg.warmup, cfg.steps - 1),
                                    total = cfg.steps}
local opt = optim.AdamW(params, {betas = {0.9, 0.99}, weight_decay = 0, schedule = sched})
local order, pos = {}, 1
local function next_indices()
  local idx = {}
  for _ = 1, cfg.batch do
    if pos > #order or #order == 0 then
      order = {}
      for i = 1, #train do order[i] = i end
      for i = #order, 2, -1 do
        local j = math.floor(lt.rand(1):item() * i) + 1
        order[i], order[j] = order[j], order[i]
      end
      pos = 1
    end
    idx[#idx + 1] = order[pos]
    pos = pos + 1
  end
  return idx
end
model:train()
local now = lt.now
local t0, tokens = now(), 0
local nonfinite, skips = lt.train.nonfinite, 0
for step = 1, cfg.steps do
  local m = lt.tidy(function()
    local batch = dpo.collate(train, next_indices())
    tokens = tokens + batch.x:numel()
    opt:zero_grad()
    local loss, m = dpo.step(model, batch, ref, lo)
    loss:backward()
    if cfg.grad_clip > 0 then m.norm = optim.clip_grad_norm(opt.params, cfg.grad_clip) end
    local event = nonfinite.check(step, m.loss, m.norm or optim.grad_norm(opt.params), model)
    if event then
      skips = skips + 1
      if cfg.nonfinite == "stop" or skips > cfg.nonfinite_max_skips then
        error(string.format("dpo: %s; stopped before the optimizer step, saving nothing (%s)", nonfinite.describe(event),
          cfg.nonfinite == "stop" and "--nonfinite=skip skips such steps"
          or string.format("the %d steps before it were skipped already", cfg.nonfinite_max_skips)), 0)
      end
      print(string.format("%s; step skipped (nonfinite=skip: %d in a row)", nonfinite.describe(event), skips))
    else
      skips = 0
      opt:step()
    end
    return m
  end)
  if step % cfg.log_every == 0 or step == 1 or step == cfg.steps then
    print(string.format("step %d/%d | loss %.4f | acc %.2f | margin %.3f | lr %.2e", step, cfg.steps, m.loss,
                        m.accuracy, m.margin, opt.param_groups[1].last_lr))
  end
  if cfg.eval_every > 0 and step % cfg.eval_every == 0 and step < cfg.steps then
    report("held-out step " .. step, dpo.evaluate(model, val, ref, eval_opts))
  end
end
local secs = now() - t0
local after = dpo.evaluate(model, val, ref, eval_opts)
report("held-out after", after)
print(string.format("trained %d steps in %.1f s, %.0f tokens/s", cfg.steps, secs, tokens / secs))
print(string.format("reward_accuracy before=%.4f after=%.4f", before.accuracy, after.accuracy))

-- ---- save --------------------------------------------------------------------------------------
os.execute("mkdir -p '" .. cfg.out .. "'")
if cfg.mode == "lora" then
  lora.save(cfg.out .. "/adapter", model)
  print("saved the adapters to " .. cfg.out .. "/adapter (adapter_model.safetensors, adapter_config.json)")
  lora.merge_and_unload(model) -- and the merged model, for lutra chat / generate
end
local saved = modeldir.save(cfg.out .. "/model", model, tok, {template = template ~= "none" and template or nil})
print("saved the model to " .. saved)
