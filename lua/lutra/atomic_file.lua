-- lutra.atomic_file — how the Lua library writes files: through the C core's
-- lt_write_file_atomic and lt_append_file_* (lutra.h, "files written safely"), never io.open.
--
--   local atomic_file = require "lutra.atomic_file"
--   local ok, err = atomic_file.write("runs/x/config.json", text)  -- temporary, fsync, rename
--   local log = assert(atomic_file.append("runs/x/metrics.jsonl"))   -- {truncate = true}: start empty
--   log:write("line\n"); log:close()
--
-- A whole file goes to a temporary beside the path and is renamed over it: a reader, or a run
-- killed at any moment, sees the old file or the new one; a symbolic link planted at the path
-- is replaced (said on stderr), never written through. An appended file is opened without
-- following links: a link planted there is replaced by a fresh regular file. Failures return
-- nil and a message that names the path and the reason ("cannot write runs/x/config.json: no
-- space left on device"), as io.open does, for the caller to raise in its own words.
local lt = require "lutra.ffi"
local ffi, C = lt.ffi, lt.C

local M = {}

local function last_error() return ffi.string(C.lt_last_error()) end

-- Writes text (a string) to path; opts.sync_dir also fsyncs the directory after the rename.
-- true, or nil and the message.
function M.write(path, text, opts)
  if type(path) ~= "string" or type(text) ~= "string" then
    return nil, "atomic_file.write: expected a path and a string, got " .. type(path) .. " and " .. type(text)
  end
  if C.lt_write_file_atomic(path, text, #text, opts and opts.sync_dir and 1 or 0) ~= 0 then return nil, last_error() end
  return true
end

local Append = {}
Append.__index = Append

-- Appends the strings (or numbers) given; true, or nil and the message.
function Append:write(...)
  if self.file == nil then return nil, "cannot write " .. self.path .. ": the file is closed" end
  for i = 1, select("#", ...) do
    local s = tostring((select(i, ...)))
    if C.lt_append_file_write(self.file, s, #s) ~= 0 then return nil, last_error() end
  end
  return true
end

-- Each write is a write(2) of its own: nothing waits in a buffer.
function Append:flush() return true end

function Append:close()
  local f = self.file
  if f == nil then return true end
  self.file = nil
  ffi.gc(f, nil)
  if C.lt_append_file_close(f) ~= 0 then return nil, last_error() end
  return true
end

-- Opens path for appending (opts.truncate: starting empty); the file object, or nil and the message.
function M.append(path, opts)
  if type(path) ~= "string" then return nil, "atomic_file.append: expected a path, got " .. type(path) end
  local out = ffi.new("lt_append_file*[1]")
  if C.lt_append_file_open(out, path, opts and opts.truncate and 1 or 0) ~= 0 then return nil, last_error() end
  return setmetatable({path = path, file = ffi.gc(out[0], C.lt_append_file_close)}, Append)
end

return M
