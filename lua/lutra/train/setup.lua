-- lutra.train.setup — what the trainer builds from its config before the first step: the
-- optimizer, the lr schedule, the parallel layout (config.parallel: lutra/dist/mesh.lua) and
-- the val loader.
local errors = require "lutra.errors"
local schedule_mod = require "lutra.optim.schedule"

local raise = errors.raise

local M = {}

-- cfg value with a default (config tables from lutra.config are plain tables).
function M.getter(cfg, defaults)
  return function(key)
    local v = cfg[key]
    if v == nil then v = defaults[key] end
    return v
  end
end

-- The ranges of the trainer's numeric settings, {low, high} inclusive: a value outside (or not a
-- finite number) is an error naming the key before anything runs; a learning rate of inf or a clip
-- of nan would otherwise train on NaN to the end and save the result.
local RANGES = {
  steps = {0, math.huge}, grad_accum = {1, math.huge}, grad_clip = {0, math.huge}, lr = {0, math.huge},
  min_lr = {0, math.huge}, warmup = {0, math.huge}, decay_frac = {0, 1}, weight_decay = {0, math.huge},
  eps = {0, math.huge}, momentum = {0, 1}, eval_every = {0, math.huge}, eval_iters = {0, math.huge},
  sample_every = {0, math.huge}, sample_tokens = {0, math.huge}, temperature = {0, math.huge},
  top_k = {0, math.huge}, top_p = {0, 1}, log_every = {0, math.huge}, print_every = {0, math.huge},
  ckpt_every = {0, math.huge}, ckpt_keep = {0, math.huge},
}

local function check_range(key, v, low, high)
  if type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge or v < low or v > high then
    local range = high == math.huge and (">= " .. low) or string.format("in [%s, %s]", low, high)
    raise(string.format("train: config.%s must be a finite number %s, got %s", key, range, tostring(v)))
  end
end

-- Checks every numeric setting against its range, and betas (two numbers in [0, 1)).
function M.check_ranges(get)
  for key, r in pairs(RANGES) do check_range(key, get(key), r[1], r[2]) end
  local betas = get "betas"
  if type(betas) ~= "table" or #betas ~= 2 then raise("train: config.betas must be a list of two numbers") end
  for i = 1, 2 do
    check_range("betas[" .. i .. "]", betas[i], 0, 1)
    if betas[i] == 1 then raise("train: config.betas[" .. i .. "] must be below 1, got 1") end
  end
end

function M.params_of(model)
  local ps = model:parameters()
  if type(ps) ~= "table" then raise("train: model:parameters() must return a list of tensors") end
  return ps
end

-- The lr schedule of the config. A warmup as long as the run is left out of a decaying
-- schedule (it would leave no steps to decay over); when the config gave it (cfg.warmup), a
-- warning on stderr says so, as it does for a constant schedule that never reaches lr.
function M.schedule(get, cfg)
  local kind = get "schedule"
  if type(kind) ~= "string" then return kind end -- a function or schedule object
  local opts = {kind = kind, lr = get "lr", warmup = get "warmup"}
  local steps, given = get "steps", cfg ~= nil and cfg.warmup ~= nil
  if given and steps > 0 and opts.warmup >= steps then
    io.stderr:write(string.format("lutra: warning: warmup (%d steps) is not shorter than the run (%d steps): %s; "
      .. "set warmup below steps\n", opts.warmup, steps, kind == "constant" and "the lr never reaches lr"
      or "the " .. kind .. " schedule runs without warmup"))
  end
  if kind ~= "constant" then
    opts.min_lr, opts.total = get "min_lr", steps
    if opts.total <= opts.warmup then opts.warmup = 0 end
  end
  if kind == "wsd" then opts.decay_frac = get "decay_frac" end
  return schedule_mod.make(opts)
end

function M.optimizer(model, get)
  local optim = require "lutra.optim"
  local name = get "optimizer"
  local no_decay = nil
  local nd = get "no_decay"
  if nd == "matrices" then no_decay = {} end -- decay every matrix, embeddings too (nanoGPT, the peer)
  -- bf16/fp16: a model built in bf16/f16 gets f32 master copies in the optimizer (f32 ones need none)
  local prec = get "precision"
  local master = (prec == "bf16" or prec == "fp16") or nil
  if name == "adamw" then
    local b = get "betas"
    return optim.AdamW(model, {lr = get "lr", betas = {b[1], b[2]}, eps = get "eps", weight_decay = get "weight_decay",
                               no_decay = no_decay, master_weights = master})
  elseif name == "lion" then
    local b = get "betas"
    return optim.Lion(model, {lr = get "lr", betas = {b[1], b[2]}, weight_decay = get "weight_decay",
                              no_decay = no_decay, master_weights = master})
  elseif name == "adafactor" then -- as transformers' Trainer's optim "adafactor": the config's lr and schedule
    return optim.Adafactor(model, {lr = get "lr", relative_step = false, scale_parameter = false,
                                   weight_decay = get "weight_decay", no_decay = no_decay, master_weights = master})
  elseif name == "lamb" then
    local b = get "betas"
    return optim.LAMB(model, {lr = get "lr", betas = {b[1], b[2]}, eps = get "eps", weight_decay = get "weight_decay",
                              no_decay = no_decay, master_weights = master})
  elseif name == "sgd" then
    return optim.SGD(model, {lr = get "lr", momentum = get "momentum", weight_decay = get "weight_decay",
                             no_decay = no_decay, master_weights = master})
  end
  raise("train: unknown optimizer '" .. tostring(name) .. "' (adamw, sgd, lion, adafactor, lamb)")
end

-- The data of a plain config table (numbers, strings, booleans, tables of them), for the
-- checkpoint's manifest; functions and other values are left out.
function M.plain_copy(v, depth)
  depth = depth or 0
  if type(v) ~= "table" or depth > 8 then return v end
  local out = {}
  for k, x in pairs(v) do
    local t = type(x)
    if (type(k) == "string" or type(k) == "number") and (t == "number" or t == "string" or t == "boolean") then
      out[k] = x
    elseif t == "table" and getmetatable(x) == nil then
      out[k] = M.plain_copy(x, depth + 1)
    end
  end
  return out
end

-- A list of {name, tensor} pairs (this rank's parameters or shards) as something with
-- named_parameters(), so that the optimizer's weight-decay groups see the global names.
local function as_module(named)
  if type(named) == "table" and type(named.named_parameters) == "function" then return named end
  return {named_parameters = function()
    local i = 0
    return function()
      i = i + 1
      local e = named[i]
      if e then return e[1], e[2] end
    end
  end}
end

-- The mesh of args.mesh or config.parallel (nil: a single process).
local function mesh_of(args, cfg)
  local mesh = args.mesh
  if mesh == nil and cfg.parallel ~= nil then mesh = require("lutra.dist").init(cfg.parallel) end
  return mesh
end

-- Under a layout of many ranks: the trainer's mesh, its rows of the data, the parallelized
-- model and the optimizer over this rank's shards (run.par, run.opt, run.params).
function M.parallel(run, args, cfg)
  local mesh = mesh_of(args, cfg)
  if not (mesh and mesh.size > 1) then return end
  if args.optimizer then
    raise("train: with a parallel layout the optimizer is built over this rank's shards: give its settings "
      .. "in the config (optimizer, lr, betas, weight_decay, ...) rather than optimizer =")
  end
  run.mesh = mesh
  local data, get = run.data, run.get
  -- each data-parallel rank reads its own rows of the global batch
  if mesh.dp_size > 1 and data.dp_size == 1 and type(data.with) == "function" then
    data = data:with{dp_rank = mesh.dp_rank, dp_size = mesh.dp_size}
    run.data = data
  end
  run.par = require("lutra.dist").parallelize(run.model, mesh,
    {optimizer = function(named) return M.optimizer(as_module(named), get) end, local_batch = data.local_batch})
  run.opt = run.par.optimizer
  run.params = run.par:parameters()
end

-- The val loader: val_data =, else the train loader's val split (when evaluating); a
-- data-parallel rank reads its own rows of it.
function M.val_loader(run, val)
  local data, mesh = run.data, run.mesh
  if val == nil and type(data.with) == "function" and run.get "eval_every" > 0 then
    local ok, v = pcall(data.with, data, {split = "val"})
    if ok then val = v end
  elseif mesh and val and mesh.dp_size > 1 and val.dp_size == 1 and type(val.with) == "function" then
    val = val:with{dp_rank = mesh.dp_rank, dp_size = mesh.dp_size}
  end
  return val
end

return M
