-- lutra.dist.inspect — what piece of a global tensor a local tensor is, for the REPL.
--
--   lutra.dist.shard_info(t)
--   --> {shape = {2, 3}, global = {8, 3}, offset = {2, 0}, dup = false, sharded = true, rank = 1}
--
-- The table prints as one line in the REPL:
--   rank 1: local (2, 3) of global (8, 3) at offset (2, 0)
-- A tensor without a shard spec (lutra.dist.spec) is whole: global = shape, offset 0.
local spec = require "lutra.dist.spec"
local errors = require "lutra.errors"
local ops = require "lutra.ops"

local M = {}

local function dims(list) return "(" .. table.concat(list, ", ") .. ")" end

local Info = {}
Info.__index = Info
function Info.__tostring(info)
  local s = (info.rank and "rank " .. info.rank .. ": " or "") .. "local " .. dims(info.shape)
  if not info.sharded then return s .. " (whole tensor, not sharded)" end
  s = s .. " of global " .. dims(info.global) .. " at offset " .. dims(info.offset)
  if info.dup then s = s .. " (a copy: another rank owns it)" end
  return s
end

local function world_rank()
  local comm = package.loaded["lutra.dist.comm"]
  if type(comm) == "table" and comm.initialized and comm.initialized() and comm.size() > 1 then return comm.rank() end
  return nil
end

function M.shard_info(t)
  if not ops.is_tensor(t) then errors.raise("shard_info: expected a tensor, got " .. type(t)) end
  local shape = {}
  for i = 1, t.ndim do shape[i] = t:size(i - 1) end
  local s = spec.get(t)
  local info = {shape = shape, rank = world_rank(), sharded = s ~= nil}
  if s then
    info.global, info.offset, info.dup = {unpack(s.global)}, {unpack(s.offset)}, s.dup
  else
    info.global, info.offset, info.dup = {unpack(shape)}, {}, false
    for i = 1, #shape do info.offset[i] = 0 end
  end
  return setmetatable(info, Info)
end

return M
