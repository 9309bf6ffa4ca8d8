-- lutra.plot — loss curves of one or more runs, in the terminal (braille) or as a PNG/SVG file.
--
--   lutra plot RUN_DIR... [--metric loss,val_loss] [--out curves.png|curves.svg] [--smooth 0.9]
--              [--log] [--width W --height H] [--x step|tokens] [--title TEXT] [--color auto|always|never]
--   lt.plot("runs/gpt")                                  -- the terminal plot, printed
--   lt.plot({"runs/a", "runs/b"}, {out = "ab.svg", smooth = 0.6})
--   lt.plot(result.losses) / lt.plot({base = records_a, lora = records_b}, {metric = "loss"})
--
-- A path is a metrics .jsonl file, a directory holding metrics.jsonl, or a run directory: its
-- `latest` link, else the newest of runs/* (lutra.train's layout). Each (run, metric) is a
-- series; val_loss records (only some steps) make their own. --smooth is TensorBoard's debiased
-- moving average; --log a log10 y axis; width and height are characters of canvas in the terminal,
-- pixels in a file. Colour when stdout is a terminal (and NO_COLOR is unset).
local scale = require "lutra.plot.scale"
local errors = require "lutra.errors"
local files = require "lutra.ckpt.files"
local metrics = require "lutra.train.metrics"
local run_dirs = require "lutra.train.runs"

local M = {}

local raise = errors.raise

local USAGE = "usage: lutra plot RUN_DIR|METRICS.jsonl... [--metric loss,val_loss] [--out FILE.png|FILE.svg]\n"
  .. "         [--smooth 0..1] [--log] [--width W] [--height H] [--x step|tokens] [--title TEXT]\n"
  .. "         [--color auto|always|never]\n"
  .. "  width and height: characters of canvas in the terminal (default: the terminal's width, 20 rows),\n"
  .. "  pixels in a file (900 x 540)\n"

-- ---- inputs ----------------------------------------------------------------------------

-- The metrics file a path names: itself, the newest run's (lutra.train.runs: DIR/latest, else the
-- last of DIR/runs/*), or DIR/metrics.jsonl.
function M.resolve(path)
  if not files.is_dir(path) then
    if files.exists(path) then return path end
    raise("plot: " .. path .. ": no such file or directory")
  end
  local dir = path:gsub("/+$", "")
  local newest = run_dirs.latest(dir) -- (the newest run before metrics of an older layout)
  for _, at in ipairs({newest or false, dir}) do
    if at and files.exists(at .. "/metrics.jsonl") then return at .. "/metrics.jsonl" end
  end
  raise("plot: " .. path .. " has no metrics.jsonl (nor latest/metrics.jsonl, nor runs/*/metrics.jsonl)")
end

-- Names for paths: the fewest trailing components that tell them apart ("a", "b"; "x/latest").
local function short_names(paths)
  local parts = {}
  for i, p in ipairs(paths) do
    local comps = {}
    for c in p:gsub("/metrics%.jsonl$", ""):gmatch("[^/]+") do comps[#comps + 1] = c end
    parts[i] = comps
  end
  for k = 1, 64 do
    local names, seen, unique = {}, {}, true
    for i, comps in ipairs(parts) do
      names[i] = table.concat(comps, "/", math.max(1, #comps - k + 1))
      if names[i] == "" then names[i] = paths[i] end
      unique = unique and not seen[names[i]]
      seen[names[i]] = true
    end
    if unique or k == 64 then return names end
  end
end

-- The runs a source names: a list of {name =, records =}.
--   "path" | {"path", ...} | {record, ...} | {loss, ...} | {name = {record, ...}, ...}
function M.runs(src)
  if type(src) == "string" then src = {src} end
  if type(src) ~= "table" then raise("plot: expected a path, a list of paths or a table of records, got " .. type(src)) end
  if type(src[1]) == "table" then return {{name = "run", records = src}} end
  if type(src[1]) == "number" then -- a list of losses (the trainer's result.losses): one a step
    local records = {}
    for i, v in ipairs(src) do records[i] = {step = i, loss = v} end
    return {{name = "run", records = records}}
  end
  local runs = {}
  if type(src[1]) == "string" then
    local names = short_names(src)
    for i, p in ipairs(src) do
      local file = M.resolve(p)
      local records = metrics.read(file)
      local any = false
      for _, r in ipairs(records) do any = any or next(r) ~= nil end
      if not any then raise("plot: " .. file .. " holds no metrics records (JSON objects, one a line)") end
      runs[i] = {name = names[i], records = records, path = file}
    end
  else
    for name, records in pairs(src) do
      if type(records) ~= "table" then raise("plot: run '" .. tostring(name) .. "': expected a table of records") end
      runs[#runs + 1] = {name = tostring(name), records = records}
    end
    table.sort(runs, function(a, b) return a.name < b.name end)
  end
  if #runs == 0 then raise("plot: nothing to plot (no path and no records)") end
  return runs
end

local function finite(v) return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge end

-- One run's metric as sorted points: the last record of each x wins (a resumed run writes some
-- steps again). With x = "tokens", a record without tokens (val_loss) takes those of its step's
-- training record.
local function points(records, metric, xname, log)
  local tokens_at = {}
  if xname == "tokens" then
    for _, r in ipairs(records) do
      if r.step and finite(r.tokens) then tokens_at[r.step] = r.tokens end
    end
  end
  local by_x, dropped = {}, 0
  for _, r in ipairs(records) do
    local x = r[xname]
    if x == nil and xname == "tokens" and r.step then x = tokens_at[r.step] end
    local y = r[metric]
    if finite(x) and finite(y) then
      if log and y <= 0 then dropped = dropped + 1 else by_x[x] = y end
    end
  end
  local xs = {}
  for x in pairs(by_x) do xs[#xs + 1] = x end
  table.sort(xs)
  local ys = {}
  for i, x in ipairs(xs) do ys[i] = by_x[x] end
  return xs, ys, dropped
end

local function numeric_keys(runs)
  local seen, keys = {}, {}
  for _, run in ipairs(runs) do
    for _, r in ipairs(run.records) do
      for k, v in pairs(r) do
        if type(v) == "number" and not seen[k] and k ~= "step" then seen[k] = true; keys[#keys + 1] = k end
      end
    end
  end
  table.sort(keys)
  return table.concat(keys, ", ")
end

-- Every (run, metric) with points, as {label =, x =, y =, raw =}; notes (said on stderr) for
-- what was left out.
function M.series(runs, o)
  local out, notes = {}, {}
  for _, run in ipairs(runs) do
    for _, metric in ipairs(o.metrics) do
      local xs, ys, dropped = points(run.records, metric, o.x, o.log)
      local label = #runs == 1 and metric or run.name .. " " .. metric
      if dropped > 0 then notes[#notes + 1] = string.format("%s: %d values <= 0 left out of the log scale", label, dropped) end
      if #xs > 0 then
        out[#out + 1] = {label = label, metric = metric, x = xs, raw = ys, y = scale.smooth(ys, o.smooth),
                         sparse = metric:match("^val") ~= nil}
      elseif not o.quiet[metric] then
        local present = false
        for _, r in ipairs(run.records) do present = present or finite(r[metric]) end
        notes[#notes + 1] = string.format("%s has no %s%s: skipped", run.name, metric,
          present and " with a " .. o.x .. " value" or "")
      end
    end
  end
  if #out == 0 then
    raise("plot: no run has " .. table.concat(o.metrics, " or ") .. " with a " .. o.x .. " value"
      .. " (the metrics there: " .. numeric_keys(runs) .. ")")
  end
  return out, notes
end

-- ---- options -----------------------------------------------------------------------------

local DEFAULT_METRICS = {"loss", "val_loss"}

-- opts (the REPL's table or the command's options) checked and completed.
function M.options(opts)
  opts = opts or {}
  local o = {out = opts.out, log = opts.log and true or false, x = opts.x or "step", title = opts.title,
             smooth = tonumber(opts.smooth or 0), quiet = {}}
  local m = opts.metric or opts.metrics
  if m == nil then
    o.metrics, o.quiet.val_loss = DEFAULT_METRICS, true -- (a run without evaluation: no note)
  elseif type(m) == "string" then
    o.metrics = {}
    for name in m:gmatch("[^,%s]+") do o.metrics[#o.metrics + 1] = name end
  else
    o.metrics = m
  end
  if #o.metrics == 0 then raise("plot: --metric names no metric") end
  if o.smooth == nil or o.smooth < 0 or o.smooth >= 1 then
    raise("plot: --smooth must be a number in [0, 1), got " .. tostring(opts.smooth))
  end
  if o.x ~= "step" and o.x ~= "tokens" then raise("plot: --x must be step or tokens, got '" .. tostring(o.x) .. "'") end
  if o.out then
    o.format = tostring(o.out):lower():match("%.(%a+)$")
    if o.format ~= "png" and o.format ~= "svg" then
      raise("plot: --out " .. tostring(o.out) .. ": the file must end in .png or .svg")
    end
  end
  for _, k in ipairs({"width", "height"}) do
    local v = opts[k]
    if v ~= nil then
      v = tonumber(v)
      local lo, hi = o.out and 100 or 4, o.out and 10000 or 1000 -- (pixels in a file, characters in the terminal)
      if not v or v ~= math.floor(v) or v < lo or v > hi then
        raise(string.format("plot: --%s must be a whole number in [%d, %d], got %s", k, lo, hi, tostring(opts[k])))
      end
      o[k] = v
    end
  end
  local c = opts.color
  if c ~= nil and c ~= true and c ~= false and c ~= "auto" and c ~= "always" and c ~= "never" then
    raise("plot: --color must be auto, always or never, got '" .. tostring(c) .. "'")
  end
  o.color = c == true or c == "always"
  if c == nil or c == "auto" then o.color = M.stdout_is_terminal() and not os.getenv("NO_COLOR") end
  return o
end

function M.stdout_is_terminal()
  local ffi = require "ffi"
  pcall(ffi.cdef, "int isatty(int fd);")
  return ffi.C.isatty(1) == 1
end

-- "loss, val_loss by step (log y, smoothed 0.9)": the metrics drawn, the x axis, the options.
local function title_of(o, series)
  local names, seen = {}, {}
  for _, s in ipairs(series) do
    if not seen[s.metric] then names[#names + 1], seen[s.metric] = s.metric, true end
  end
  local extra = {}
  if o.log then extra[#extra + 1] = "log y" end
  if o.smooth > 0 then extra[#extra + 1] = "smoothed " .. o.smooth end
  return o.title or (table.concat(names, ", ") .. " by " .. o.x
    .. (#extra > 0 and " (" .. table.concat(extra, ", ") .. ")" or ""))
end

-- The terminal text of the plot (what lt.plot and `lutra plot` print).
function M.text(src, opts)
  local o = M.options(opts)
  local series, notes = M.series(M.runs(src), o)
  local cols = tonumber(os.getenv("COLUMNS") or "") or 80
  return require("lutra.plot.terminal").render(series, {width = o.width or math.max(20, math.min(200, cols - 12)),
    height = o.height or 20, log = o.log, color = o.color, title = title_of(o, series), si_x = o.x == "tokens"}), notes
end

local function say_notes(notes)
  for _, n in ipairs(notes) do io.stderr:write("plot: ", n, "\n") end
end

-- lt.plot(src, opts): prints the terminal plot, or with opts.out writes the file (and returns its path).
function M.plot(src, opts)
  local o = M.options(opts)
  if o.out then
    local series, notes = M.series(M.runs(src), o)
    say_notes(notes)
    require("lutra.plot.cairo").write(o.out, series, {format = o.format, width = o.width or 900,
      height = o.height or 540, log = o.log, title = title_of(o, series), xlabel = o.x, si_x = o.x == "tokens"})
    return o.out
  end
  local text, notes = M.text(src, opts)
  say_notes(notes)
  io.stdout:write(text)
  io.stdout:flush()
end

-- ---- the command ---------------------------------------------------------------------------

local VALUED = {metric = true, metrics = true, out = true, smooth = true, width = true, height = true, x = true,
                title = true, color = true}
local FLAGS = {log = true, help = true}

local function parse(words)
  local paths, o = {}, {}
  local i = 1
  while i <= #words do
    local w = words[i]
    local name, value = w:match("^%-%-([%w_%-]+)=(.*)$")
    name = name or w:match("^%-%-([%w_%-]+)$")
    if name then
      if FLAGS[name] then
        if value ~= nil then return nil, "--" .. name .. " takes no value" end
        o[name] = true
      elseif VALUED[name] then
        if value == nil then
          i = i + 1
          value = words[i]
          if value == nil then return nil, "--" .. name .. " needs a value" end
        end
        o[name] = value
      else
        return nil, "unknown option " .. w
      end
    else
      paths[#paths + 1] = w
    end
    i = i + 1
  end
  return paths, o
end

-- A checked error (raised as "plot: ...") is said as its message alone; anything else is a bug
-- and keeps its traceback (lutra.commands prints it).
local function checked(err)
  local msg = type(err) == "string" and err:gsub("^[^\n]-%.lua:%d+: ", "", 1)
  if msg and msg:match("^plot: ") then return {checked = msg:sub(7)} end
  return debug.traceback(tostring(err), 2)
end

local function failed(err, status)
  if type(err) ~= "table" then error(err, 0) end
  io.stderr:write("lutra plot: ", err.checked, "\n", status == 2 and USAGE or "")
  return status
end

-- `lutra plot ...`: 0 done, 2 a usage error (options, no path), 1 a failure (a path, a metric, cairo).
function M.main(words)
  local paths, o = parse(words)
  if paths == nil or o.help or #paths == 0 then
    if paths == nil then io.stderr:write("lutra plot: ", o, "\n") end
    local to = (paths ~= nil and o.help) and io.stdout or io.stderr
    to:write(USAGE)
    return (paths ~= nil and o.help) and 0 or 2
  end
  local ok, err = xpcall(M.options, checked, o)
  if not ok then return failed(err, 2) end
  local ok2, out = xpcall(M.plot, checked, paths, o)
  if not ok2 then return failed(out, 1) end
  if out then io.stdout:write("wrote ", out, "\n") end
  return 0
end

return M
