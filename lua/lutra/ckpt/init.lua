-- lutra.ckpt — sharded, atomic, optionally asynchronous checkpoints that reshard on load.
--
--   local ckpt = require "lutra.ckpt"
--   ckpt.save(dir, state, opts)   -- lutra.ckpt.format (format, atomicity, async)
--   ckpt.fence()                  -- an async save has copied the state: it may change now
--   ckpt.wait()                   -- the previous async save committed (errors raised here)
--   local r = ckpt.load(dir)      -- lutra.ckpt.reader: r:read, r:tensor, r:load_into, r:extra
--   ckpt.latest(run_dir)          -- newest valid checkpoint dir (falls back past bad ones)
--   ckpt.prune(run_dir, keep)     -- the newest `keep` step dirs stay (lutra.ckpt.format)
--   ckpt.validate(dir)            -- true, or false and why
--   ckpt.ls(dir), ckpt.inspect(dir, {tensors = true})   -- tables (lutra.ckpt.cli)
--   ckpt.save_weights(dir, model:state_dict(), {model = cfg})   -- a model alone, no optimizer
--   local w = ckpt.load_weights(dir)  -- {step =, config =, model = name -> whole tensor}
local format = require "lutra.ckpt.format"
local reader = require "lutra.ckpt.reader"
local ckpt_files = require "lutra.ckpt.files"

local M = {
  save = format.save, wait = format.wait, fence = format.fence, busy = format.busy, load = reader.load, latest = reader.latest,
  prune = format.prune, validate = reader.validate, steps = ckpt_files.steps, FORMAT = format.FORMAT,
  VERSION = format.VERSION,
}

-- Statistics of the last save that finished: {dir, raw, compressed, seconds, stall, copied}.
function M.last_save() return format.last end

-- Saves a model's weights (name -> tensor) and a config as the checkpoint dir: step 0 unless
-- opts.step, no optimizer state; opts.extra as the rank's extra state. Returns dir.
function M.save_weights(dir, weights, config, opts)
  opts = opts or {}
  local names, tensors = {}, {}
  for name in pairs(weights) do names[#names + 1] = name end
  table.sort(names)
  for i, name in ipairs(names) do tensors[i] = {name = name, tensor = weights[name]} end
  return format.save(dir, {step = opts.step or 0, config = config, tensors = tensors, extra = opts.extra})
end

-- The model part of the checkpoint dir, whatever layout saved it: {step =, config =, model =
-- name -> whole tensor}. Parameters are saved once: a tied head is the embedding itself.
function M.load_weights(dir)
  local r = reader.load(dir)
  local weights = require("lutra.ckpt.train_state").model_state(r)
  if weights["lm_head.weight"] == nil then weights["lm_head.weight"] = weights["wte.weight"] end
  return {step = r.manifest.step, config = r.manifest.config, model = weights}
end

function M.ls(dir) return require("lutra.ckpt.cli").ls(dir) end
function M.inspect(dir, opts) return require("lutra.ckpt.cli").inspect(dir, opts) end

return M
