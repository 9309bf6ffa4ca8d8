-- lutra.plot.terminal — curves drawn with Unicode braille: each character cell holds 2x4 dots,
-- so a W x H canvas has 2W x 4H points. Colour (xterm-256, one per series) when asked; without
-- it the first series keeps the braille dots and the others mark their cells with an ASCII
-- sign each (+ x o ...), named in the legend.
--
--   local text = require("lutra.plot.terminal").render(series, {width = 70, height = 20})
--   -- series: {{label = "a loss", x = {...}, y = {...}}, ...}; opts: log, color, title, si_x
--
-- The text is: the title, `height` rows of canvas with the y ticks at the left, the x axis,
-- its tick values, then one legend line per series.
local scale = require "lutra.plot.scale"

local M = {}

local floor = math.floor
local BRAILLE_BASE = 0x2800
-- bit of the dot at (column 0..1, row 0..3) of a cell (Unicode's braille numbering)
local DOT = {[0] = {[0] = 0x01, 0x02, 0x04, 0x40}, {[0] = 0x08, 0x10, 0x20, 0x80}}
local MARKS = {"+", "x", "o", "*", "#", "@", "%", "&", "="}

local function utf8_char(cp) -- (braille is U+2800..U+28FF: three bytes)
  return string.char(0xE0 + floor(cp / 4096), 0x80 + floor(cp / 64) % 64, 0x80 + cp % 64)
end

-- The symbol a series is drawn with in plain text.
local function mark(i) return i == 1 and utf8_char(BRAILLE_BASE + 0xFF) or MARKS[(i - 2) % #MARKS + 1] end

-- Cells: bits[row][col] (the union of every series' dots), owner[row][col] (the last series there).
local function new_canvas(w, h)
  local c = {w = w, h = h, bits = {}, owner = {}}
  for r = 0, h - 1 do
    c.bits[r], c.owner[r] = {}, {}
  end
  return c
end

local function set_dot(c, px, py, id)
  if px < 0 or py < 0 or px >= 2 * c.w or py >= 4 * c.h then return end
  local col, row = floor(px / 2), floor(py / 4)
  c.bits[row][col] = bit.bor(c.bits[row][col] or 0, DOT[px % 2][py % 4])
  c.owner[row][col] = id
end

-- Every dot on the segment (x0, y0)-(x1, y1) (Bresenham).
local function line(c, x0, y0, x1, y1, id)
  local dx, dy = math.abs(x1 - x0), -math.abs(y1 - y0)
  local sx, sy = x0 < x1 and 1 or -1, y0 < y1 and 1 or -1
  local err = dx + dy
  while true do
    set_dot(c, x0, y0, id)
    if x0 == x1 and y0 == y1 then return end
    local e2 = 2 * err
    if e2 >= dy then err, x0 = err + dy, x0 + sx end
    if e2 <= dx then err, y0 = err + dx, y0 + sy end
  end
end

local function colour_on(i) return string.format("\27[38;5;%dm", scale.colour(i).ansi) end
local RESET = "\27[0m"

-- One canvas row as text: braille cells, or in plain text the ASCII sign of a cell's owner.
local function row_text(c, r, color)
  local parts, current = {}, nil
  for col = 0, c.w - 1 do
    local bits, id = c.bits[r][col], c.owner[r][col]
    local ch = " "
    if bits then ch = (color or id == 1) and utf8_char(BRAILLE_BASE + bits) or mark(id) end
    if color and bits and id ~= current then
      parts[#parts + 1] = colour_on(id)
      current = id
    elseif color and not bits and current then
      parts[#parts + 1] = RESET
      current = nil
    end
    parts[#parts + 1] = ch
  end
  if current then parts[#parts + 1] = RESET end
  return table.concat(parts)
end

local function pad_left(s, n) return string.rep(" ", n - #s) .. s end

function M.render(series, opts)
  local w, h = opts.width or 70, opts.height or 20
  local xlo, xhi, ylo, yhi = scale.extent(series)
  local xa = scale.axis(xlo, xhi, {ticks = math.max(2, floor(w / 12))})
  local ya = scale.axis(ylo, yhi, {ticks = math.max(3, floor(h / 3)), log = opts.log})
  local pw, ph = 2 * w, 4 * h

  local c = new_canvas(w, h)
  local function px(x) return floor(xa:frac(x) * (pw - 1) + 0.5) end
  local function py(y) return floor((1 - ya:frac(y)) * (ph - 1) + 0.5) end
  for id, s in ipairs(series) do
    local x0, y0 = px(s.x[1]), py(s.y[1])
    set_dot(c, x0, y0, id)
    for i = 2, #s.x do
      local x1, y1 = px(s.x[i]), py(s.y[i])
      line(c, x0, y0, x1, y1, id)
      x0, y0 = x1, y1
    end
  end

  -- y ticks: each on the row its value falls in (the first of two that share a row)
  local ylabels, lw = {}, 0
  for _, v in ipairs(ya.ticks) do
    local r = floor(py(v) / 4)
    if not ylabels[r] then
      ylabels[r] = scale.label(v, ya)
      lw = math.max(lw, #ylabels[r])
    end
  end

  local out = {opts.title or ""}
  for r = 0, h - 1 do
    out[#out + 1] = pad_left(ylabels[r] or "", lw) .. ((ylabels[r] and " ┤" or " │") .. row_text(c, r, opts.color)):gsub("%s+$", "")
  end

  -- x axis: a ┬ at each tick's column, its value centred below (skipped where it would touch
  -- the one before)
  local axis, labels, free = {}, {}, 0
  for col = 0, w - 1 do axis[col] = "─" end
  for _, v in ipairs(xa.ticks) do
    local col = floor(px(v) / 2)
    axis[col] = "┬"
    local text = scale.label(v, xa, {si = opts.si_x})
    local at = math.max(0, col - floor(#text / 2))
    if at >= free then
      labels[#labels + 1] = string.rep(" ", at - free) .. text
      free = at + #text + 1
      labels[#labels + 1] = " "
    end
  end
  out[#out + 1] = string.rep(" ", lw) .. " └" .. table.concat(axis, "", 0, w - 1)
  out[#out + 1] = string.rep(" ", lw + 2) .. table.concat(labels):gsub("%s+$", "")

  for id, s in ipairs(series) do
    local sign = mark(id)
    if opts.color then sign = colour_on(id) .. utf8_char(BRAILLE_BASE + 0xFF) .. RESET end
    out[#out + 1] = string.rep(" ", lw + 2) .. sign .. " " .. s.label
  end
  return table.concat(out, "\n") .. "\n"
end

return M
