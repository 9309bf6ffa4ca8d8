-- lutra.ckpt — sharded, atomic, optionally asynchronous checkpoints that reshard on load.
--
--   local ckpt = require "lutra.ckpt"
--   ckpt.save(dir, state, opts)   -- lutra.ckpt.format (format, atomicity, async)
--   ckpt.fence()                  -- an async save has copied the state: it may change now
--   ckpt.wait()                   -- the previous async save committed (errors raised here)
--   local r = ckpt.load(dir)      -- lutra.ckpt.reader: r:read, r:tensor, r:load_into, r:extra
--   ckpt.latest(run_dir)          -- newest valid checkpoint dir (falls back past bad ones)
--   ckpt.prune(run_dir, keep)
--   ckpt.validate(dir)            -- true, or false and why
--   ckpt.ls(dir), ckpt.inspect(dir, {tensors = true})   -- tables (lutra.ckpt.cli)
local format = require "lutra.ckpt.format"
local reader = require "lutra.ckpt.reader"

local M = {
  save = format.save, wait = format.wait, fence = format.fence, busy = format.busy, load = reader.load, latest = reader.latest,
  prune = reader.prune, validate = reader.validate, steps = reader.steps, FORMAT = format.FORMAT,
  VERSION = format.VERSION,
}

-- Statistics of the last save that finished: {dir, raw, compressed, seconds, stall, copied}.
function M.last_save() return format.last end

function M.ls(dir) return require("lutra.ckpt.cli").ls(dir) end
function M.inspect(dir, opts) return require("lutra.ckpt.cli").inspect(dir, opts) end

return M
