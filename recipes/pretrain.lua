-- recipes/pretrain.lua — pretrain a GPT on a text file, on the CPU in a few minutes.
--
--   ./build/lutra recipes/pretrain.lua                          -- the defaults: char-level GPT-2
--   ./build/lutra recipes/pretrain.lua --data=corpus.txt --tokenizer=bpe --vocab=4096
--   ./build/lutra recipes/pretrain.lua --model.arch=llama --model.n_kv_head=2 --steps=1000
--   ./build/lutra recipes/pretrain.lua --model.arch=moe --model.n_experts=4   -- Mixtral-like experts
--   ./build/lutra recipes/pretrain.lua --resume=auto           -- continue the last run
--   ./build/lutra recipes/pretrain.lua --help                  -- every option
--
-- Data: any text file (--data); by default the fortune cookies of Debian's `fortunes`
-- package, joined into runs/data/fortunes.txt (recipes/data/fortunes.lua). The text is
-- tokenized once (char-level, or byte-level BPE trained on it) into a token file; the
-- tokenizer and the token file are cached under the run directory (run_dir/cache, or
-- --cache_dir), never beside the text, so a read-only data folder works. A cached token file
-- is verified when reused and tokenized again when damaged. The first 90% is train, the rest val.
--
-- The defaults (2000 steps of 12 x 64 characters: 1.5M tokens) take about a minute on an
-- idle 2-core CPU, and the val loss falls from 4.75 (uniform over the corpus's 113
-- characters and the 3 chat special tokens) to about 2.01; the sample at the end has words,
-- lines and "-- author" tags. The model is saved as a model directory, runs/pretrain/model
-- (recipes/sft.lua fine-tunes it; `lutra generate runs/pretrain/model --prompt ...`).
-- nanoGPT's CPU baby run, as
-- ../shared/peers/torch_charlm.py does it (4 layers, 4 heads, 128 dim, block 64, batch 12,
-- 2000 iterations, AdamW 1e-3 with warmup 100 and cosine to 1e-4, betas 0.9/0.99, wd 0.1
-- on every matrix, clip 1.0, eval every 250 on 50 batches):
--   ./build/lutra recipes/pretrain.lua --data=tinyshakespeare.txt --steps=2000 --warmup=100 \
--       --eval_every=250 --eval_iters=50 --no_decay=matrices
-- Ctrl-C stops after the current step and saves a checkpoint; --resume=auto continues.
local lt = require "lutra"
local config = lt.config

local cfg = config {
  data = "",                          -- a text file; "" = the fortunes corpus (recipes/data/fortunes.lua)
  data_dir = "runs/data",             -- where the default corpus is written
  cache_dir = "",                     -- the tokenizer and token file of the data; "" = run_dir/cache
  tokenizer = config.one_of({"char", "bpe"}, "char"),
  vocab = 1024,                       -- BPE vocabulary size
  model = {
    arch = config.one_of({"gpt2", "llama", "moe"}, "gpt2"),
    n_layer = 4, n_head = 4, n_kv_head = 0, -- 0: as many as n_head (llama: GQA below it)
    d_model = 128, block_size = 64, dropout = config.number(0),
    -- mixture of experts (arch moe, or any arch with n_experts > 0; lutra/nn/moe.lua): 0 = the arch's
    -- (moe: 8 experts, top-2); capacity_factor 0 = dropless; the aux losses join the training loss
    n_experts = 0, top_k = 0, capacity_factor = config.number(0), n_shared_experts = 0,
    aux_loss_coef = config.optional("number"), z_loss_coef = config.optional("number"),
  },
  batch = 12, grad_accum = 1, steps = 2000, seed = 1337,
  optimizer = config.one_of({"adamw", "lion", "sgd", "adafactor", "lamb"}, "adamw"),
  lr = 1e-3, min_lr = 1e-4, warmup = 100, schedule = config.one_of({"cosine", "linear", "constant", "wsd"}, "cosine"),
  betas = {0.9, 0.99}, weight_decay = 0.1, grad_clip = config.number(1),
  no_decay = config.one_of({"default", "matrices"}, "default"), -- matrices: decay embeddings too (nanoGPT)
  precision = config.one_of({"fp32", "bf16", "fp16"}, "fp32"), -- bf16/fp16: mixed (lutra/train/precision.lua)
  eval_every = 250, eval_iters = 20,
  sample_every = 0, sample_tokens = 300, sample_prompt = "", temperature = 0.8, top_k = 0, top_p = 0.95,
  log_every = 1, print_every = 0, run_dir = "runs/pretrain", ckpt_every = 0, ckpt_keep = 2, resume = "",
  -- a step whose loss or gradient norm is nan or inf: stop the run, skip the step, or roll back to
  -- the last checkpoint (lutra/train/nonfinite.lua)
  nonfinite = config.one_of({"stop", "skip", "rollback"}, "stop"), nonfinite_max_skips = 10,
  nonfinite_max_rollbacks = 3,
  -- what a run shows (lutra/train/init.lua): TensorBoard's events in run_dir/runs/ID, histograms of the
  -- weights and gradients every N steps (0: none), a profile of steps "N-M" (trace.json and a table)
  log_tensorboard = true, histogram_every = 0, profile = "",
  threads = 0,                        -- 0: the default (OMP_NUM_THREADS or all cores)
  device = "auto",                    -- auto: cuda:(local rank) when there is a GPU, else cpu; or cpu, cuda, cuda:K
  -- under `lutra launch -n N`: --parallel.dp=2 --parallel.tp=2, pp (stages), zero (1-3), ep (experts), schedule,
  -- micro_batches, sequence_parallel, bucket_mb, timeout (every key: lua/lutra/dist/mesh.lua)
  parallel = lt.dist.defaults(),
}

if cfg.threads > 0 then lt.set_num_threads(cfg.threads) end
local mesh = lt.dist.init(cfg.parallel) -- a world of one without a launcher
local main = mesh.rank == 0
local print = main and print or function() end -- rank 0 speaks for the job
print(cfg:dump())
if mesh.size > 1 then print(string.format("parallel: %d ranks, %s", mesh.size, mesh:layout())) end

-- ---- data ---------------------------------------------------------------------------------
-- rank 0 writes the corpus, tokenizer and token file; the others wait, then read them (lt.dist.once)
local function prepare()
  local text_path = cfg.data
  if text_path == "" then
    local here = (arg and arg[0] or ""):match("^(.*)/[^/]+$") or "recipes"
    local make = dofile(here .. "/data/fortunes.lua")
    local path, err = make(cfg.data_dir .. "/fortunes.txt")
    if not path then
      io.stderr:write("pretrain: ", err, "\n")
      os.exit(1)
    end
    text_path = path
  end
  -- caches go under the run directory (lt.data.cache_dir: the user's cache when there is none)
  local cache_dir = lt.data.cache_dir(cfg.cache_dir ~= "" and cfg.cache_dir
                                      or cfg.run_dir ~= "" and cfg.run_dir .. "/cache" or nil)
  -- the chat special tokens have ids from the start, so that recipes/sft.lua can fine-tune on ChatML
  local tok = lt.tokenizer.load_or_train(text_path, {kind = cfg.tokenizer, vocab = cfg.vocab, dir = cache_dir,
                                                     special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}})
  local data = lt.data.text(text_path, tok, {seq_len = cfg.model.block_size, batch = cfg.batch, seed = cfg.seed,
                                             cache_dir = cache_dir})
  return text_path, tok, data
end
local text_path, tok, data = lt.dist.once(prepare)
print(string.format("data: %s, %s tokenizer (%d tokens), %d train / %d val tokens", text_path, tok.kind,
                    tok.vocab_size, data.ntokens, data.file.count - data.ntokens))

-- ---- model -----------------------------------------------------------------------------------
lt.manual_seed(cfg.seed)
local m = cfg.model
local function positive(v) return v > 0 and v or nil end
local model = lt.models.build{arch = m.arch, n_layer = m.n_layer, n_head = m.n_head,
                              n_kv_head = positive(m.n_kv_head), d_model = m.d_model,
                              block_size = m.block_size, dropout = m.dropout, vocab_size = tok.vocab_size,
                              n_experts = positive(m.n_experts), top_k = positive(m.top_k),
                              capacity_factor = positive(m.capacity_factor),
                              n_shared_experts = positive(m.n_shared_experts), aux_loss_coef = m.aux_loss_coef,
                              z_loss_coef = m.z_loss_coef}
local device = cfg.device == "auto" and lt.dist.default_device() or cfg.device
model:to(device) -- the trainer brings each batch to the model's device
local nparams = 0
for _, p in ipairs(model:parameters()) do nparams = nparams + p:numel() end
print(string.format("model: %s, %d layers, %d heads, d_model %d%s: %.2fM parameters, on %s", m.arch, m.n_layer,
                    m.n_head, m.d_model, model.cfg.n_experts and string.format(", %d experts top-%d",
                    model.cfg.n_experts, model.cfg.top_k) or "", nparams / 1e6, device))

-- ---- train ----------------------------------------------------------------------------------
local result = lt.train{model = model, data = data, config = cfg, tokenizer = tok}

local first = result.losses[1]
print(string.format("trained %d steps in %.1f s: loss %s -> %s, val loss %s, %.0f tokens/s (training steps)",
                    result.step, result.seconds, first and string.format("%.4f", first) or "-",
                    result.loss and string.format("%.4f", result.loss) or "-",
                    result.val_loss and string.format("%.4f", result.val_loss) or "-", result.tokens_per_s))
if result.val_loss then
  print(string.format("final_val=%.4f seconds=%.1f tokens_per_s=%.1f", result.val_loss, result.seconds,
                      result.tokens_per_s))
end

-- ---- the model directory (weights, config, tokenizer: what recipes/sft.lua and `lutra chat` load) ----
-- (layouts that shard the weights, tp / pp / zero 3, leave that to sharded checkpoints)
if main and cfg.run_dir ~= "" and model:can_save_whole() then
  print("model: saved to " .. lt.sft.modeldir.save(cfg.run_dir .. "/model", model, tok))
end

-- ---- a sample ----------------------------------------------------------------------------
-- A tensor-parallel model samples on every rank in step (the same draws); pipeline stages,
-- ZeRO 3 shards and expert-parallel ranks (some of the experts each) do not generate.
if mesh.pp_size > 1 or mesh.zero == 3 or mesh.ep_size > 1 or (mesh.tp_size == 1 and not main) then return end
if mesh.tp_size > 1 then lt.manual_seed(cfg.seed + 1) end -- the same generator on every rank
local text = lt.generate.text(model, tok, cfg.sample_prompt, {max_new_tokens = cfg.sample_tokens,
                                                             temperature = cfg.temperature, top_k = cfg.top_k,
                                                             top_p = cfg.top_p})
print("---- sample ----\n" .. text .. "\n----------------")
