-- lutra.profile.report — what a stopped profile shows (methods of a lutra.profile Profile):
--
--   prof:key_averages()      -> rows {name, cat, calls, total_ms, self_ms, avg_ms, cuda_ms, bytes, flops,
--                               gflops (per second: of cuda_ms when the op ran on CUDA, else of total_ms)}
--   prof:table{sort_by = "self_ms", top = 20}  -> the rows as text, torch.profiler's table
--       (sort_by: self_ms, total_ms, avg_ms, cuda_ms, calls, bytes, flops)
--   prof:export_chrome_trace(path)   -> Chrome trace event JSON: "X" events (ts, dur in
--       microseconds since the epoch), pid = rank, tid = thread (1 main, 2 the ckpt writer,
--       100 + d the CUDA device d's compute stream, from CUDA events), args {shapes, dtype, device,
--       bytes, flops}; metadata "process_name" = "rank N" and "thread_name". Under lutra.dist with
--       more than one rank it is collective: every rank hands its events to rank 0
--       (all_gather_text), which writes the one file, a track per rank. Returns path (rank 0) or nil.
local json = require "lutra.json"
local dtype = require "lutra.dtype"
local atomic_file = require "lutra.atomic_file"

local M = {methods = {}}
local P = M.methods

local SORT_KEYS = {self_ms = true, total_ms = true, avg_ms = true, cuda_ms = true, calls = true, bytes = true,
                   flops = true}

function P:key_averages()
  local rows, by = {}, {}
  for _, ev in ipairs(self.events) do
    local key = ev.cat .. "\0" .. ev.name
    local r = by[key]
    if not r then
      r = {name = ev.name, cat = ev.cat, calls = 0, total_ms = 0, self_ms = 0, cuda_ms = 0, bytes = 0, flops = 0}
      by[key] = r
      rows[#rows + 1] = r
    end
    r.calls = r.calls + 1
    r.total_ms = r.total_ms + ev.dur / 1e3
    r.self_ms = r.self_ms + ev.self / 1e3
    r.cuda_ms = r.cuda_ms + (ev.cuda_dur or 0) / 1e3
    r.bytes = r.bytes + ev.bytes
    r.flops = r.flops + (ev.flops or 0)
  end
  for _, r in ipairs(rows) do
    r.avg_ms = r.total_ms / r.calls
    local ms = r.cuda_ms > 0 and r.cuda_ms or r.total_ms
    r.gflops = r.flops > 0 and ms > 0 and r.flops / (ms * 1e6) or nil
  end
  return rows
end

local function human_bytes(b)
  if b <= 0 then return "-" end
  local units, i = {"B", "KB", "MB", "GB", "TB"}, 1
  while b >= 1024 and i < #units do
    b, i = b / 1024, i + 1
  end
  return string.format(i == 1 and "%.0f %s" or "%.1f %s", b, units[i])
end

-- The rows as a table: the top `top` by sort_by (descending), then the totals.
function P:table(opts)
  opts = opts or {}
  local sort_by, top = opts.sort_by or "self_ms", opts.top or 20
  if not SORT_KEYS[sort_by] then
    error("profile: table: sort_by must be one of self_ms, total_ms, avg_ms, cuda_ms, calls, bytes, flops; got "
      .. tostring(sort_by), 2)
  end
  local rows = self:key_averages()
  table.sort(rows, function(a, b)
    if a[sort_by] ~= b[sort_by] then return a[sort_by] > b[sort_by] end
    return a.name < b.name
  end)
  local self_total, cuda_total = 0, 0
  for _, r in ipairs(rows) do
    self_total, cuda_total = self_total + r.self_ms, cuda_total + r.cuda_ms
  end
  local cuda = cuda_total > 0
  local head = string.format("%-34s %7s %10s %10s %9s %7s %10s %9s", "Name", "Calls", "Total ms", "Self ms", "Avg ms",
    "Self %", "Bytes", "GFLOP/s")
  if cuda then head = head .. string.format(" %10s", "CUDA ms") end
  local rule = string.rep("-", #head)
  local lines = {rule, head, rule}
  for i = 1, math.min(top, #rows) do
    local r = rows[i]
    local name = r.name
    if #name > 34 then name = name:sub(1, 31) .. "..." end
    local line = string.format("%-34s %7d %10.3f %10.3f %9.3f %6.1f%% %10s %9s", name, r.calls, r.total_ms, r.self_ms,
      r.avg_ms, 100 * r.self_ms / math.max(self_total, 1e-12), human_bytes(r.bytes),
      r.gflops and string.format("%.1f", r.gflops) or "-")
    if cuda then line = line .. string.format(" %10.3f", r.cuda_ms) end
    lines[#lines + 1] = line
  end
  lines[#lines + 1] = rule
  local wall = ((self.t1 or self.t0) - self.t0) / 1e3
  lines[#lines + 1] = string.format("Self time total: %.3f ms over %d events (%d names); profiled wall time %.3f ms%s",
    self_total, #self.events, #rows, wall, cuda and string.format("; CUDA total %.3f ms", cuda_total) or "")
  return table.concat(lines, "\n")
end

-- ---- the Chrome trace ---------------------------------------------------------------------------

local THREADS = {main = 1, ["ckpt writer"] = 2}
local CUDA_TID = 100

local function num(x) return string.format("%.3f", x) end

local function args_of(ev)
  local a = {bytes = ev.bytes}
  if #ev.shapes > 0 then a.shapes = table.concat(ev.shapes, ", ") end
  if ev.n_in then a.inputs = ev.n_in end
  if ev.dtype then a.dtype = dtype.name(ev.dtype) end
  if ev.dev then a.device = dtype.device_name(ev.dev) end
  if ev.flops then a.flops = ev.flops end
  if ev.cuda_dur then a.cuda_us = tonumber(num(ev.cuda_dur)) end
  if ev.args then
    for k, v in pairs(ev.args) do
      if type(v) == "string" or type(v) == "number" or type(v) == "boolean" then a[k] = v end
    end
  end
  return json.encode(a)
end

-- This rank's events as JSON texts (one per event, metadata first).
function P:trace_events()
  local pid, out, threads = self.rank, {}, {}
  local function meta(name, tid, value)
    out[#out + 1] = string.format('{"name":%s,"ph":"M","pid":%d,"tid":%d,"args":{"name":%s}}', json.encode(name), pid,
      tid, json.encode(value))
  end
  meta("process_name", 0, "rank " .. pid)
  out[#out + 1] = string.format('{"name":"process_sort_index","ph":"M","pid":%d,"tid":0,"args":{"sort_index":%d}}',
    pid, pid)
  local events = {}
  for i, ev in ipairs(self.events) do events[i] = ev end
  table.sort(events, function(a, b)
    if a.ts ~= b.ts then return a.ts < b.ts end
    return a.depth < b.depth
  end)
  for _, ev in ipairs(events) do
    local tname = ev.thread or "main"
    local tid = THREADS[tname] or 1
    threads[tid] = tname
    local args = args_of(ev)
    out[#out + 1] = string.format('{"name":%s,"cat":%s,"ph":"X","ts":%s,"dur":%s,"pid":%d,"tid":%d,"args":%s}',
      json.encode(ev.name), json.encode(ev.cat), num(ev.ts), num(ev.dur), pid, tid, args)
    if ev.cuda_ts and ev.cuda_dur then
      tid = CUDA_TID + ev.dev
      threads[tid] = dtype.device_name(ev.dev) .. " compute stream"
      out[#out + 1] = string.format('{"name":%s,"cat":"cuda","ph":"X","ts":%s,"dur":%s,"pid":%d,"tid":%d,"args":%s}',
        json.encode(ev.name), num(ev.cuda_ts), num(ev.cuda_dur), pid, tid, args)
    end
  end
  threads[1] = "main"
  for tid, name in pairs(threads) do meta("thread_name", tid, name) end
  return out
end

local function write_file(path, text)
  local ok, err = atomic_file.write(path, text)
  if not ok then error("profile: export_chrome_trace: " .. tostring(err), 0) end
end

-- The world group when this process is one of several ranks, else nil.
local function world_of()
  local comm = package.loaded["lutra.dist.comm"]
  if comm and comm.initialized() and comm.size() > 1 then return comm.init() end
  return nil
end

function P:export_chrome_trace(path)
  if type(path) ~= "string" or path == "" then error("profile: export_chrome_trace: path must be a file name", 2) end
  local mine = table.concat(self:trace_events(), ",\n")
  local world, parts = world_of(), {mine}
  if world then
    parts = world:all_gather_text(mine)
    if world.rank ~= 0 then return nil end
  end
  local body = {}
  for _, p in ipairs(parts) do
    if #p > 0 then body[#body + 1] = p end
  end
  write_file(path, '{"traceEvents":[\n' .. table.concat(body, ",\n") .. '\n],"displayTimeUnit":"ms",'
    .. '"otherData":{"producer":"lutra.profile","clock":"microseconds since the epoch"}}\n')
  return path
end

return M
