-- lutra.plot: TensorBoard's smoothing against hand-computed values, axes whose ticks bracket the
-- data, the braille canvas (its lines, tick labels, legend, a decreasing curve drawn decreasing,
-- log scale straightening an exponential, smoothing calming a noisy curve), the paths a run is
-- found by (a file, DIR/metrics.jsonl, latest, the newest of runs/*), resumed runs, --x tokens,
-- lt.plot's record tables, and the errors. (The files and the command: tests/cli/test_plot.sh.)
local T = require "lutra.testing"
local plot = require "lutra.plot"
local scale = require "lutra.plot.scale"
local terminal = require "lutra.plot.terminal"
local equal, fails = T.assert_equal, T.assert_error
local files = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "file_helpers.lua")

local function close(a, b, tol) return math.abs(a - b) <= (tol or 1e-12) * math.max(1, math.abs(b)) end

-- a run's records: loss = f(step) for steps 1..n, val_loss = g(step) every 10 steps
local function records(n, f, g)
  local out = {}
  for s = 1, n do
    out[#out + 1] = {step = s, loss = f(s), tokens = s * 512, lr = 1e-3}
    if g and s % 10 == 0 then out[#out + 1] = {step = s, val_loss = g(s)} end
  end
  return out
end

local function jsonl(recs)
  local lines = {}
  for i, r in ipairs(recs) do lines[i] = require("lutra.train.metrics").encode(r) end
  return table.concat(lines, "\n") .. "\n"
end

local function decay(s) return 5 * math.exp(-s / 20) end

-- Canvas rows of a rendered plot (after the title line): the text right of the axis.
local function canvas_rows(text, height)
  local lines = {}
  for l in text:gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  local rows = {}
  for r = 1, height do rows[r] = lines[1 + r] end
  return lines, rows
end

-- Per braille column (cell), the topmost row with a dot in it: {col = row}.
local function top_rows(rows)
  local tops = {}
  for r, line in ipairs(rows) do
    local body = line:match("[┤│](.*)$") or ""
    local col = 0
    for ch in body:gmatch("[%z\1-\127\194-\244][\128-\191]*") do
      if ch:byte() == 0xE2 and ch:byte(2) >= 0xA0 and ch:byte(2) <= 0xA3 and tops[col] == nil then tops[col] = r end
      col = col + 1
    end
  end
  return tops
end

local function first_last(tops)
  local lo, hi
  for col in pairs(tops) do lo, hi = math.min(lo or col, col), math.max(hi or col, col) end
  return lo, hi
end

test("smoothing is TensorBoard's debiased moving average", function()
  -- weight 0.5 over {4, 2, 2}: the average 2, 2, 2 over 1 - 0.5^n: 4, 8/3, 16/7
  local s = scale.smooth({4, 2, 2}, 0.5)
  assert(close(s[1], 4) and close(s[2], 8 / 3) and close(s[3], 16 / 7), T.show(s))
  equal(scale.smooth({1, 2}, 0), {1, 2})
  local n = scale.smooth({1, 0 / 0, 3}, 0.5) -- NaN passes through, the average skips it
  assert(n[2] ~= n[2] and close(n[3], (0.25 + 1.5) / 0.75), T.show(n))
end)

test("axis ticks are round and bracket the data, linear and log", function()
  for _, case in ipairs({{0.12, 4.8}, {-3.3, 7.1}, {1000, 1001}, {2.5, 2.5}, {0, 1e7}}) do
    local ax = scale.axis(case[1], case[2], {ticks = 5})
    assert(ax.lo <= case[1] and ax.hi >= case[2] and ax.lo < ax.hi, T.show({case, ax.lo, ax.hi}))
    assert(#ax.ticks >= 2 and #ax.ticks <= 11, T.show(ax.ticks))
    equal(ax.ticks[1], ax.lo)
    assert(close(ax.ticks[#ax.ticks], ax.hi, 1e-9))
  end
  local lg = scale.axis(0.0337, 4.95, {ticks = 5, log = true})
  equal({lg.lo, lg.hi}, {0.01, 10})
  assert(close(lg:frac(0.1), 1 / 3, 1e-9) and close(lg:frac(1), 2 / 3, 1e-9))
  local near = scale.axis(1.7, 4.95, {ticks = 5, log = true}) -- under a decade: 1-2-5 ticks
  equal(near.ticks, {1, 2, 5})
  equal(scale.label(2500000, scale.axis(0, 3e6, {ticks = 5}), {si = true}), "2.5M")
  equal(scale.label(0.06, scale.axis(0, 0.1, {ticks = 5})), "0.06")
  equal(scale.label(1200, scale.axis(0, 2000, {ticks = 5})), "1200")
end)

test("terminal: lines, braille, y ticks around the data, a decreasing curve, legend", function()
  local s = {label = "a loss", x = {}, y = {}}
  for i = 1, 100 do s.x[i], s.y[i] = i, decay(i) end
  local t = {label = "b loss", x = {1, 100}, y = {3, 2.5}}
  local text = terminal.render({s, t}, {width = 50, height = 12, title = "loss by step"})
  local lines, rows = canvas_rows(text, 12)
  equal(#lines, 1 + 12 + 2 + 2) -- title, canvas, axis, x values, legend
  equal(lines[1], "loss by step")
  assert(text:find("\226[\160-\163]"), "no braille character")
  assert(not text:find("\27"), "colour codes in plain text")
  -- y tick labels: the top one >= the data's max, the bottom one <= its min
  local labels = {}
  for _, l in ipairs(rows) do
    local v = l:match("^%s*(%-?[%d.e%-]+) ┤")
    if v then labels[#labels + 1] = tonumber(v) end
  end
  assert(#labels >= 2, text)
  assert(labels[1] >= decay(1) and labels[#labels] <= decay(100), T.show(labels))
  assert(rows[1]:find("┤") and rows[12]:find("┤"), "the axis' ends carry ticks")
  -- the curve starts high and ends low: its first column's top dot is rows above its last
  local tops = top_rows(rows)
  local a, b = first_last(tops)
  assert(b - a >= 45, "the curve spans the width: " .. a .. ".." .. b)
  assert(tops[a] <= 4 and tops[b] == 12, "first column's row " .. tops[a] .. ", last " .. tops[b])
  -- the second series is drawn with its own sign (plain text) and named in the legend
  assert(lines[16]:find("⣿ a loss", 1, true) and lines[17]:find("+ b loss", 1, true), text)
  assert(table.concat(rows, "\n"):find("+", 1, true), "no '+' of the second series")
  -- x axis: ticks under the canvas, their values below from 0 to 100
  assert(lines[14]:find("└┬", 1, true), lines[14])
  assert(lines[15]:match("^%s*0 ") and lines[15]:match("100$"), lines[15])
  local colored = terminal.render({s, t}, {width = 50, height = 12, color = true})
  assert(colored:find("\27[38;5;32m", 1, true) and colored:find("\27[38;5;208m", 1, true), "no series colours")
end)

test("log scale draws an exponential decay as a straight line", function()
  local s = {label = "loss", x = {}, y = {}}
  for i = 0, 100 do s.x[i + 1], s.y[i + 1] = i, 10 ^ (1 - i / 50) end -- 10 .. 0.1
  local function bend(log)
    local _, rows = canvas_rows(terminal.render({s}, {width = 41, height = 16, log = log}), 16)
    local tops = top_rows(rows)
    local a, b = first_last(tops)
    local mid = tops[math.floor((a + b) / 2)]
    return mid - (tops[a] + tops[b]) / 2 -- 0 for a straight line; linear y: far below the chord
  end
  local lin, lg = bend(false), bend(true)
  assert(math.abs(lg) <= 1, "log: the middle is " .. lg .. " rows off the chord")
  assert(lin >= 4, "linear: the middle is only " .. lin .. " rows below the chord")
  local text = terminal.render({s}, {width = 41, height = 16, log = true})
  assert(text:find("\n%s*10 ┤") and text:find("\n%s*0%.1 ┤"), text) -- decades as ticks
end)

test("smoothing calms a noisy curve and keeps its start", function()
  local recs = {}
  for i = 1, 200 do recs[i] = {step = i, loss = 3 + (i % 2 == 0 and 1 or -1)} end
  local o = plot.options({smooth = 0.9, color = false})
  local ser = plot.series({{name = "r", records = recs}}, o)
  equal(ser[1].y[1], 2) -- debiased: the first point is the first value
  assert(math.abs(ser[1].y[200] - 3) < 0.2, ser[1].y[200])
  local function dots(smooth)
    local text = plot.text(recs, {smooth = smooth, width = 40, height = 10, color = false})
    local n = 0
    for c in text:gmatch("\226([\160-\163].)") do
      local bits = (c:byte(1) - 160) * 64 + c:byte(2) - 128
      while bits > 0 do n, bits = n + bits % 2, math.floor(bits / 2) end
    end
    return n
  end
  local raw, smooth = dots(0), dots(0.9)
  assert(smooth * 2 < raw, "dots: raw " .. raw .. ", smoothed " .. smooth)
end)

test("runs are found by file, directory, latest link, and newest of runs/", function()
  local dir = files.temp_dir()
  os.execute("mkdir -p '" .. dir .. "/r/runs/20261204-163005' '" .. dir .. "/r/runs/20261204-163005-2' '"
    .. dir .. "/r/runs/20261203-235959' '" .. dir .. "/plain' '" .. dir .. "/empty'")
  files.write(dir .. "/plain/metrics.jsonl", jsonl(records(5, decay)))
  for _, id in ipairs({"20261204-163005", "20261204-163005-2", "20261203-235959"}) do
    files.write(dir .. "/r/runs/" .. id .. "/metrics.jsonl", jsonl({{step = 1, loss = 1}}))
  end
  equal(plot.resolve(dir .. "/plain"), dir .. "/plain/metrics.jsonl")
  equal(plot.resolve(dir .. "/plain/metrics.jsonl"), dir .. "/plain/metrics.jsonl")
  equal(plot.resolve(dir .. "/r"), dir .. "/r/runs/20261204-163005-2/metrics.jsonl") -- the newest id
  equal(plot.resolve(dir .. "/r/runs/20261204-163005-2"), dir .. "/r/runs/20261204-163005-2/metrics.jsonl")
  os.execute("ln -s runs/20261204-163005 '" .. dir .. "/r/latest'")
  equal(plot.resolve(dir .. "/r/"), dir .. "/r/latest/metrics.jsonl")
  fails("has no metrics.jsonl", plot.resolve, dir .. "/empty")
  fails(dir .. "/nope: no such file or directory", plot.resolve, dir .. "/nope")
  -- legend names: the fewest trailing components that tell the runs apart
  local runs = plot.runs({dir .. "/plain", dir .. "/r"})
  equal({runs[1].name, runs[2].name}, {"plain", "r"})
  files.write(dir .. "/junk.txt", "not json\n")
  fails("holds no metrics records", plot.runs, dir .. "/junk.txt")
  os.execute("rm -rf '" .. dir .. "'")
end)

test("series: resumed steps, val_loss as its own sparse series, tokens on x, notes", function()
  local recs = records(30, decay, function(s) return decay(s) + 1 end)
  recs[#recs + 1] = {step = 20, loss = 99, tokens = 20 * 512} -- a resumed run writes step 20 again
  local ser = plot.series({{name = "r", records = recs}}, plot.options({color = false}))
  equal(#ser, 2)
  equal({ser[1].label, ser[2].label}, {"loss", "val_loss"})
  equal(#ser[1].x, 30)
  equal(ser[1].y[20], 99) -- the last record of a step wins
  equal(ser[2].x, {10, 20, 30})
  assert(ser[2].sparse and not ser[1].sparse)
  local tok = plot.series({{name = "r", records = recs}}, plot.options({x = "tokens", metric = "val_loss"}))
  equal(tok[1].x, {10 * 512, 20 * 512, 30 * 512}) -- val records take their step's tokens
  local two = {{name = "a", records = recs}, {name = "b", records = records(5, decay)}}
  local s2, notes = plot.series(two, plot.options({metric = "loss,val_loss"}))
  equal(#s2, 3)
  equal(s2[3].label, "b loss")
  equal(notes, {"b has no val_loss: skipped"})
  local _, quiet = plot.series(two, plot.options({})) -- the default val_loss: no note
  equal(quiet, {})
  fails("no run has grad_norm with a step value (the metrics there: loss, lr, tokens, val_loss)",
    plot.series, two, plot.options({metric = "grad_norm"}))
  local _, lognotes = plot.series({{name = "z", records = {{step = 1, loss = 0}, {step = 2, loss = 1}}}},
    plot.options({log = true}))
  equal(lognotes, {"loss: 1 values <= 0 left out of the log scale"})
end)

test("lt.plot takes records and named record tables; writes a file with out", function()
  local lt = require "lutra"
  assert(type(lt.plot) == "function")
  local text = plot.text(records(50, decay), {width = 30, height = 8, color = false})
  assert(text:find("loss", 1, true) and not text:find("run loss", 1, true), text) -- one run: no run name
  equal(text:match("^[^\n]*"), "loss by step") -- the title names what is drawn (no val_loss here)
  local named = plot.text({base = records(50, decay), lora = records(50, function(s) return decay(s) / 2 end)},
    {width = 30, height = 8, color = false})
  assert(named:find("⣿ base loss", 1, true) and named:find("+ lora loss", 1, true), named)
  local losses = {}
  for i = 1, 40 do losses[i] = decay(i) end
  local small = {width = 30, height = 8, color = false}
  equal(plot.text(losses, small), plot.text(records(40, decay), small)) -- a list of losses: one a step
  local dir = files.temp_dir()
  local ok, err = pcall(lt.plot, records(50, decay), {out = dir .. "/c.svg"})
  if not ok and tostring(err):find("could not be loaded", 1, true) then
    os.execute("rm -rf '" .. dir .. "'")
    skip("cairo: " .. tostring(err))
  end
  assert(ok, err)
  local svg = files.read(dir .. "/c.svg")
  assert(svg:find("<svg", 1, true) and svg:find("<desc>loss</desc>", 1, true), svg:sub(1, 300))
  os.execute("rm -rf '" .. dir .. "'")
end)

test("bad options are errors naming the option", function()
  fails("--out curves.jpg: the file must end in .png or .svg", plot.options, {out = "curves.jpg"})
  fails("--smooth must be a number in [0, 1), got 1", plot.options, {smooth = 1})
  fails("--smooth must be a number in [0, 1), got x", plot.options, {smooth = "x"})
  fails("--x must be step or tokens, got 'time'", plot.options, {x = "time"})
  fails("--width must be a whole number in [4, 1000], got 2", plot.options, {width = 2})
  fails("--color must be auto, always or never", plot.options, {color = "sometimes"})
  fails("expected a path, a list of paths or a table of records, got number", plot.runs, 3)
end)

test("without libcairo a file is a clear error naming it", function()
  local ffi = require "ffi"
  local load, saved = ffi.load, package.loaded["lutra.plot.cairo"]
  package.loaded["lutra.plot.cairo"] = nil
  ffi.load = function(name) error("cannot open shared object " .. name, 0) end -- (as dlopen says it)
  local ok, err = pcall(function()
    return require("lutra.plot.cairo").write("curves.png", {}, {format = "png", width = 100, height = 100})
  end)
  ffi.load, package.loaded["lutra.plot.cairo"] = load, saved
  assert(not ok and tostring(err):find("plot: cannot write curves.png: the cairo library (libcairo.so.2) could not be "
    .. "loaded (cannot open shared object libcairo.so.2); install libcairo2", 1, true), tostring(err))
end)
