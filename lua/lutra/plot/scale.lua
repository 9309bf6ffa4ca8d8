-- lutra.plot.scale — what the terminal and the file plots share: TensorBoard's smoothing, axis
-- ranges with round tick values (linear or log10), the labels of those ticks, the palette.
--
--   scale.smooth({5, 4, 3}, 0.9)            -- debiased exponential moving average
--   local ax = scale.axis(0.12, 4.8, {ticks = 5, log = false})
--   ax.lo, ax.hi, ax.ticks                   -- 0, 5, {0, 1, 2, 3, 4, 5}: the range covers the data
--   ax:frac(2.5)                             -- 0.5: where a value sits, 0 at lo and 1 at hi
local M = {}

local log10, floor, ceil, abs = math.log10, math.floor, math.ceil, math.abs

-- TensorBoard's scalar smoothing: an exponential moving average, debiased so that the first
-- points are not pulled toward 0; a non-finite value is passed through and leaves the average alone.
function M.smooth(ys, weight)
  if not weight or weight <= 0 then return ys end
  local out, last, n = {}, 0, 0
  for i, y in ipairs(ys) do
    if y ~= y or abs(y) == math.huge then
      out[i] = y
    else
      n = n + 1
      last = last * weight + (1 - weight) * y
      out[i] = last / (1 - weight ^ n)
    end
  end
  return out
end

-- 1, 2 or 5 times a power of ten: the round step nearest raw (on a log scale, as d3's ticks).
local function nice_step(raw)
  local p = 10 ^ floor(log10(raw))
  local e = raw / p
  if e >= math.sqrt(50) then return 10 * p elseif e >= math.sqrt(10) then return 5 * p
  elseif e >= math.sqrt(2) then return 2 * p end
  return p
end

local Axis = {}
Axis.__index = Axis

-- Where v sits on the axis: 0 at lo, 1 at hi.
function Axis:frac(v)
  if self.log then return (log10(v) - log10(self.lo)) / (log10(self.hi) - log10(self.lo)) end
  return (v - self.lo) / (self.hi - self.lo)
end

local function linear(lo, hi, n)
  if hi - lo < 1e-12 * math.max(abs(lo), abs(hi), 1e-300) then -- one value: a range around it
    local d = lo == 0 and 1 or abs(lo) * 0.1
    lo, hi = lo - d, hi + d
  end
  local step = nice_step((hi - lo) / math.max(n - 1, 1))
  local a, b = floor(lo / step + 1e-9), ceil(hi / step - 1e-9)
  local ticks = {}
  for k = a, b do ticks[#ticks + 1] = k * step end
  return {lo = a * step, hi = b * step, ticks = ticks, step = step}
end

-- Log axis: bounds and ticks on the 1-2-5 values of each decade, or on whole decades (every
-- k-th) when those would be too many.
local function logarithmic(lo, hi, n)
  if hi / lo < 1 + 1e-9 then lo, hi = lo / 2, hi * 2 end
  local d0, d1 = floor(log10(lo)), ceil(log10(hi))
  for _, mantissas in ipairs({{1, 2, 5}, {1}}) do
    local vals = {}
    for d = d0, d1 do
      for _, m in ipairs(mantissas) do vals[#vals + 1] = m * 10 ^ d end
    end
    local a, b = 1, #vals
    while a < #vals and vals[a + 1] <= lo * (1 + 1e-9) do a = a + 1 end
    while b > 1 and vals[b - 1] >= hi * (1 - 1e-9) do b = b - 1 end
    if b - a + 1 <= n or #mantissas == 1 then
      local every = math.max(1, ceil((b - a) / (n - 1)))
      local ticks, i = {}, a
      repeat -- (every > 1 only for decades: vals[i] is 10^(d0 + i - 1), also past the table)
        ticks[#ticks + 1] = vals[i] or 10 ^ (d0 + i - 1)
        i = i + every
      until ticks[#ticks] >= hi * (1 - 1e-9)
      return {lo = ticks[1], hi = ticks[#ticks], ticks = ticks}
    end
  end
end

-- An axis over the data range [lo, hi], with about opts.ticks round ticks; its bounds are ticks,
-- so that the first and last tick bracket the data. opts.log: log10 scale (lo must be > 0).
function M.axis(lo, hi, opts)
  local n = math.max(2, opts and opts.ticks or 5)
  local ax = (opts and opts.log) and logarithmic(lo, hi, n) or linear(lo, hi, n)
  ax.log = opts and opts.log or false
  return setmetatable(ax, Axis)
end

-- A tick's label: as many decimals as the axis step needs ("0.25", "1200"), scientific for tiny
-- or huge values, and with opts.si thousands as k/M/G ("12k", "1.5M": token counts).
function M.label(v, ax, opts)
  if v == 0 then return "0" end
  local a = abs(v)
  if opts and opts.si and a >= 1e4 then
    for _, u in ipairs({{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}}) do
      if a >= u[1] then return (string.format("%.3g", v / u[1]) .. u[2]) end
    end
  end
  if ax.log or a >= 1e6 or a < 1e-4 then return (string.format("%.3g", v):gsub("e%+?(%-?)0*(%d)", "e%1%2")) end
  local decimals = -floor(log10(ax.step) + 1e-9)
  if decimals < 1 then decimals = 0 end -- (not math.max: -0 would print as "-0")
  return string.format("%." .. decimals .. "f", v)
end

-- One colour per series (matplotlib's tab10), as 0..1 RGB and as the nearest xterm-256 colour.
M.palette = {
  {rgb = {0x1f, 0x77, 0xb4}, ansi = 32}, {rgb = {0xff, 0x7f, 0x0e}, ansi = 208},
  {rgb = {0x2c, 0xa0, 0x2c}, ansi = 34}, {rgb = {0xd6, 0x27, 0x28}, ansi = 160},
  {rgb = {0x94, 0x67, 0xbd}, ansi = 97}, {rgb = {0x8c, 0x56, 0x4b}, ansi = 94},
  {rgb = {0xe3, 0x77, 0xc2}, ansi = 170}, {rgb = {0x7f, 0x7f, 0x7f}, ansi = 244},
  {rgb = {0xbc, 0xbd, 0x22}, ansi = 142}, {rgb = {0x17, 0xbe, 0xcf}, ansi = 38},
}
function M.colour(i) return M.palette[(i - 1) % #M.palette + 1] end

-- The x and y ranges of every point of every series: xlo, xhi, ylo, yhi (nil when no point).
function M.extent(series)
  local xlo, xhi, ylo, yhi
  for _, s in ipairs(series) do
    for i = 1, #s.x do
      local x, y = s.x[i], s.y[i]
      xlo, xhi = math.min(xlo or x, x), math.max(xhi or x, x)
      ylo, yhi = math.min(ylo or y, y), math.max(yhi or y, y)
    end
  end
  return xlo, xhi, ylo, yhi
end

return M
