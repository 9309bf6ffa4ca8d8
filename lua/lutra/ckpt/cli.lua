-- lutra.ckpt.cli — looking inside checkpoints, from the shell or the REPL.
--
--   lutra ckpt ls DIR [--verify]             -- DIR: a run's checkpoint dir (step_* inside) or one checkpoint
--   lutra ckpt inspect DIR [--tensors] [--json]
--
--   ckpt.ls(dir, {verify = true})   -> {{name, step, latest, layout, world, tensors, raw, disk, ratio, valid, why}, ...}
--   ckpt.inspect(dir, {tensors = true}) -> {dir, step, layout, world, config, files = {{name, bytes, pieces}},
--                                          raw, disk, ratio, tensors = {{name, dtype, shape, pieces, raw,
--                                          compressed, min, max, mean, std}}}
-- ls checks each checkpoint (manifest, files, footers, and what lutra.ckpt.reader's verify
-- checks without a model: paths, step, dtypes, the trainer's extra state) and, with --verify,
-- decodes every frame; an invalid one is also named on stderr, with why, and the exit status
-- is 1. inspect --tensors decodes each tensor for its statistics (in f64).
local reader = require "lutra.ckpt.reader"
local ckpt_files = require "lutra.ckpt.files"
require "lutra.tensor" -- the tensor metatype (methods, properties) for what this module makes
local json = require "lutra.json"

local M = {}

local function human(n)
  if not n then return "-" end
  local units = {"B", "KB", "MB", "GB", "TB"}
  local i = 1
  while n >= 1024 and i < #units do
    n, i = n / 1024, i + 1
  end
  return i == 1 and string.format("%d B", n) or string.format("%.1f %s", n, units[i])
end

local function layout_str(l)
  if type(l) ~= "table" then return "-" end
  local parts = {}
  for _, k in ipairs {"dp", "tp", "pp", "zero"} do
    if l[k] ~= nil then parts[#parts + 1] = k .. "=" .. tostring(l[k]) end
  end
  return #parts > 0 and table.concat(parts, " ") or "single"
end

local function disk_bytes(dir, m)
  local total = ckpt_files.file_size(dir .. "/manifest.json") or 0
  for _, list in ipairs {m.files or {}, m.extra or {}, m.copied or {}} do
    for _, name in ipairs(list) do total = total + (ckpt_files.file_size(dir .. "/" .. name) or 0) end
  end
  return total
end

local function shard_bytes(dir, m)
  local total = 0
  for _, name in ipairs(m.files or {}) do total = total + (ckpt_files.file_size(dir .. "/" .. name) or 0) end
  return total
end

local function row(dir, name, opts, latest_name)
  local r = {name = name, latest = name == latest_name}
  local ok, rd = pcall(reader.load, dir)
  if ok then
    local m = rd.manifest
    r.step, r.layout, r.world, r.tensors, r.raw = m.step, m.layout, m.world, #m.tensors, m.bytes
    r.disk = disk_bytes(dir, m)
    local shards = shard_bytes(dir, m)
    r.ratio = shards > 0 and m.bytes / shards or nil
    r.valid, r.why = rd:verify(opts.verify == true)
  else
    r.valid, r.why = false, tostring(rd):gsub("^[^:]*:%d+: ", "")
  end
  return r
end

-- One row per checkpoint under dir (or for dir itself when it is a checkpoint), newest first.
function M.ls(dir, opts)
  opts = opts or {}
  dir = dir:gsub("/+$", "")
  if ckpt_files.exists(dir .. "/manifest.json") then return {row(dir, ckpt_files.basename(dir), opts)} end
  local latest_name = (ckpt_files.read(dir .. "/latest") or ""):match("^%s*(.-)%s*$")
  local rows = {}
  for _, s in ipairs(ckpt_files.steps(dir)) do rows[#rows + 1] = row(dir .. "/" .. s.name, s.name, opts, latest_name) end
  return rows
end

local function stats(t)
  local x = t:to("f64")
  if x:numel() == 0 then return {} end
  local s = {min = x:min():item(), max = x:max():item(), mean = x:mean():item()}
  s.std = x:numel() > 1 and x:std():item() or 0
  return s
end

function M.inspect(dir, opts)
  opts = opts or {}
  dir = dir:gsub("/+$", "")
  local rd = reader.load(dir)
  local m = rd.manifest
  local out = {dir = dir, step = m.step, layout = m.layout, world = m.world, config = m.config, raw = m.bytes,
               disk = disk_bytes(dir, m), saved_at = m.saved_at, files = {}, copied = m.copied}
  local comp_of = {} -- file k -> piece index -> compressed bytes
  for k, name in ipairs(m.files) do
    local idx = rd:file_index(k - 1)
    comp_of[k - 1] = idx.pieces
    out.files[k] = {name = name, bytes = idx.size, pieces = idx.n}
  end
  local shards = shard_bytes(dir, m)
  out.ratio = shards > 0 and m.bytes / shards or nil
  out.valid, out.why = rd:verify(opts.verify == true)
  if opts.tensors then
    out.tensors = {}
    for i, t in ipairs(m.tensors) do
      local raw, comp = 0, 0
      for _, p in ipairs(t.pieces) do
        raw = raw + p.bytes
        comp = comp + tonumber(comp_of[p.file][p.index].csize)
      end
      local e = {name = t.name, dtype = t.dtype, shape = t.shape, pieces = #t.pieces, raw = raw, compressed = comp}
      if opts.stats ~= false then
        local ok, s = pcall(function() return stats(rd:tensor(t.name)) end)
        if ok then
          for k, v in pairs(s) do e[k] = v end
        else
          e.error = tostring(s):gsub("^[^:]*:%d+: ", "")
          out.valid, out.why = false, out.why or e.error
        end
      end
      out.tensors[i] = e
    end
  end
  return out
end

-- ---- the command ---------------------------------------------------------------------------

local USAGE = [[
usage: lutra ckpt ls DIR [--verify]
       lutra ckpt inspect DIR [--tensors] [--verify] [--json]
  DIR is a checkpoint directory (it holds manifest.json) or a run's checkpoint directory
  (step_* checkpoints and the `latest` pointer inside).
]]

local function print_ls(rows)
  print(string.format("%-14s %8s %-22s %5s %7s %10s %10s %6s  %s", "checkpoint", "step", "layout", "world", "tensors",
    "raw", "on disk", "ratio", "status"))
  for _, r in ipairs(rows) do
    print(string.format("%-14s %8s %-22s %5s %7s %10s %10s %6s  %s%s", r.name, tostring(r.step or "-"),
      layout_str(r.layout), tostring(r.world or "-"), tostring(r.tensors or "-"), human(r.raw), human(r.disk),
      r.ratio and string.format("%.2fx", r.ratio) or "-", r.valid and "valid" or ("INVALID: " .. tostring(r.why)),
      r.latest and "  <- latest" or ""))
  end
end

local function fmt_num(v) return v and string.format("%.5g", v) or "-" end

local function print_inspect(info)
  print(string.format("checkpoint %s: step %s, layout %s, world %s, saved %s", info.dir, tostring(info.step),
    layout_str(info.layout), tostring(info.world), tostring(info.saved_at or "?")))
  print(string.format("raw %s, on disk %s, lz4 ratio %s, %s", human(info.raw), human(info.disk),
    info.ratio and string.format("%.2fx", info.ratio) or "-", info.valid and "valid" or ("INVALID: " .. tostring(info.why))))
  for _, f in ipairs(info.files) do print(string.format("  %-22s %10s  %d pieces", f.name, human(f.bytes), f.pieces)) end
  if info.copied and #info.copied > 0 then print("  files: " .. table.concat(info.copied, ", ")) end
  if info.tensors then
    print(string.format("%-40s %-5s %-16s %6s %10s %10s %11s %11s %11s %11s", "tensor", "dtype", "shape", "pieces", "raw",
      "lz4", "min", "max", "mean", "std"))
    for _, t in ipairs(info.tensors) do
      print(string.format("%-40s %-5s %-16s %6d %10s %10s %11s %11s %11s %11s%s", t.name, t.dtype,
        "{" .. table.concat(t.shape, ",") .. "}", t.pieces, human(t.raw), human(t.compressed), fmt_num(t.min),
        fmt_num(t.max), fmt_num(t.mean), fmt_num(t.std), t.error and ("  ERROR: " .. t.error) or ""))
    end
  end
end

function M.main(words)
  local cmd, dir = words[1], words[2]
  local flags = {}
  for i = 3, #words do flags[words[i]] = true end
  if cmd == nil or cmd == "-h" or cmd == "--help" then
    io.write(USAGE)
    return cmd and 0 or 2
  end
  if not dir or (cmd ~= "ls" and cmd ~= "inspect") then
    io.stderr:write(USAGE)
    return 2
  end
  for f in pairs(flags) do
    if not ({["--verify"] = true, ["--tensors"] = true, ["--json"] = true})[f] then
      io.stderr:write("lutra ckpt: unknown option ", f, "\n", USAGE)
      return 2
    end
  end
  if not ckpt_files.is_dir(dir) then
    io.stderr:write("lutra ckpt: ", dir, " is not a directory\n")
    return 1
  end
  if cmd == "ls" then
    local rows = M.ls(dir, {verify = flags["--verify"]})
    if flags["--json"] then print(json.encode(rows)) else print_ls(rows) end
    if #rows == 0 then
      io.stderr:write("lutra ckpt: no checkpoints in ", dir, "\n")
      return 1
    end
    local status = 0
    for _, r in ipairs(rows) do
      if not r.valid then
        io.stderr:write("lutra ckpt ls: ", r.name, ": INVALID: ", tostring(r.why), "\n")
        status = 1
      end
    end
    return status
  end
  local ok, info = pcall(M.inspect, dir, {tensors = flags["--tensors"], verify = flags["--verify"]})
  if not ok then
    io.stderr:write("lutra ckpt inspect: ", (tostring(info):gsub("^[^:]*:%d+: ", "")), "\n")
    return 1
  end
  if flags["--json"] then print(json.encode(info)) else print_inspect(info) end
  return info.valid and 0 or 1
end

return M
