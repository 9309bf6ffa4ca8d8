-- lutra.train.metrics — metrics as JSON lines: one object per record, appended to
-- RUN_DIR/metrics.jsonl and flushed, so that a crash loses nothing and `tail -f` works.
--
--   local metrics = require "lutra.train.metrics"
--   local log = metrics.open("runs/x/metrics.jsonl")       -- appends (a resumed run continues it)
--   log:write{step = 10, loss = 3.2, lr = 1e-3}             -- {"loss":3.2,"lr":0.001,"step":10}
--   log:close()
--   metrics.read("runs/x/metrics.jsonl")                    -- the records, as tables
--   metrics.trim("runs/x/metrics.jsonl", function(r) return r.step <= 20 end)
local atomic_file = require "lutra.atomic_file"
local json = require "lutra.json"
local invalid_utf8_at = json.invalid_utf8_at

local M = {}

-- A record never stops a run: a string that is not valid UTF-8 (a parameter name, a path) is
-- written with U+FFFD in place of each byte that does not begin a valid sequence, so that the
-- file stays valid JSON.
local function valid_utf8(s)
  local at = invalid_utf8_at(s)
  while at do
    s = s:sub(1, at - 1) .. "\239\191\189" .. s:sub(at + 1)
    at = invalid_utf8_at(s)
  end
  return s
end

local function encode_string(s)
  return '"' .. valid_utf8(s):gsub('[%c"\\]', function(c)
    local map = {['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t"}
    return map[c] or string.format("\\u%04x", c:byte())
  end) .. '"'
end

local function encode_number(v)
  if v ~= v or v == math.huge or v == -math.huge then return "null" end -- JSON has no NaN/Inf
  if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return string.format("%d", v) end
  return string.format("%.17g", v)
end

-- A flat or nested table of numbers, strings, booleans as JSON (keys sorted).
function M.encode(v)
  local t = type(v)
  if t == "number" then return encode_number(v) end
  if t == "string" then return encode_string(v) end
  if t == "boolean" then return tostring(v) end
  if t == "nil" then return "null" end
  if t == "table" then
    if #v > 0 then
      local parts = {}
      for i = 1, #v do parts[i] = M.encode(v[i]) end
      return "[" .. table.concat(parts, ",") .. "]"
    end
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = tostring(k) end
    table.sort(keys)
    local parts = {}
    for _, k in ipairs(keys) do parts[#parts + 1] = encode_string(k) .. ":" .. M.encode(v[k]) end
    return "{" .. table.concat(parts, ",") .. "}"
  end
  return encode_string(tostring(v))
end

local Log = {}
Log.__index = Log

-- mode "a" appends (a resumed run), "w" starts the file empty. Opened through
-- lutra.atomic_file: a symbolic link planted at path is replaced by a fresh file, never
-- written through.
function M.open(path, mode)
  local f, err = atomic_file.append(path, {truncate = mode == "w"})
  if not f then error("metrics: " .. tostring(err), 0) end
  return setmetatable({path = path, file = f}, Log)
end

-- One record, one write(2): a crash loses no record that was written.
function Log:write(record)
  local ok, err = self.file:write(M.encode(record) .. "\n")
  if not ok then error("metrics: " .. tostring(err), 0) end
end

function Log:close()
  if self.file then self.file:close() end
  self.file = nil
end

-- A line of a metrics file as a table (numbers, strings, booleans, lists; null is left out), or
-- an empty table when the line is not a JSON object (a line that is not a record is no record).
function M.decode_line(line)
  local v = json.try_decode(line)
  if type(v) ~= "table" or json.is_array(v) then return {} end
  for k, x in pairs(v) do
    if x == json.null then v[k] = nil end
  end
  return v
end

-- Drops the records (lines with a step) that keep(record) refuses, rewriting the file whole (a
-- temporary renamed over it): a run resumed from an earlier step than its last record continues
-- the file as a run that never stopped would have written it. Other lines are left as they are
-- (not ours to judge). true, or nil and the message.
function M.trim(path, keep)
  local f = io.open(path, "rb")
  if not f then return true end
  local kept, dropped = {}, 0
  for line in f:lines() do
    local r = M.decode_line(line)
    if type(r.step) ~= "number" or keep(r) then kept[#kept + 1] = line .. "\n" else dropped = dropped + 1 end
  end
  f:close()
  if dropped == 0 then return true end
  return atomic_file.write(path, table.concat(kept))
end

-- Every record of a metrics file.
function M.read(path)
  local f = io.open(path, "r")
  if not f then return {} end
  local out = {}
  for line in f:lines() do
    if line:match("%S") then out[#out + 1] = M.decode_line(line) end
  end
  f:close()
  return out
end

return M
