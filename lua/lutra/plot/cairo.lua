-- lutra.plot.cairo — the plot as a PNG or SVG file, drawn by cairo (libcairo.so.2, through the FFI):
-- title, grid, axes with tick values, the curves (a smoothed series over its raw values, faint;
-- sparse ones such as val_loss with a dot at each measured value), the x axis' name and a legend below.
--
--   require("lutra.plot.cairo").write("curves.png", series, {format = "png", width = 900, height = 540,
--     log = false, title = "loss by step", xlabel = "step"})
--
-- The bytes come back through cairo's stream callbacks and are written by lutra.atomic_file.
local ffi = require "ffi"
local scale = require "lutra.plot.scale"
local atomic_file = require "lutra.atomic_file"
local raise = require("lutra.errors").raise

local M = {}

local CDEF = [[
typedef struct _cairo cairo_t;
typedef struct _cairo_surface cairo_surface_t;
typedef int cairo_status_t;
typedef cairo_status_t (*cairo_write_func_t)(void *closure, const unsigned char *data, unsigned int length);
typedef struct { double x_bearing, y_bearing, width, height, x_advance, y_advance; } cairo_text_extents_t;
cairo_surface_t *cairo_image_surface_create(int format, int width, int height);
cairo_surface_t *cairo_svg_surface_create_for_stream(cairo_write_func_t write_func, void *closure, double width, double height);
cairo_status_t cairo_surface_write_to_png_stream(cairo_surface_t *surface, cairo_write_func_t write_func, void *closure);
cairo_status_t cairo_surface_status(cairo_surface_t *surface);
void cairo_surface_finish(cairo_surface_t *surface);
void cairo_surface_destroy(cairo_surface_t *surface);
cairo_t *cairo_create(cairo_surface_t *target);
void cairo_destroy(cairo_t *cr);
cairo_status_t cairo_status(cairo_t *cr);
const char *cairo_status_to_string(cairo_status_t status);
void cairo_set_source_rgba(cairo_t *cr, double red, double green, double blue, double alpha);
void cairo_set_line_width(cairo_t *cr, double width);
void cairo_set_line_join(cairo_t *cr, int line_join);
void cairo_move_to(cairo_t *cr, double x, double y);
void cairo_line_to(cairo_t *cr, double x, double y);
void cairo_rectangle(cairo_t *cr, double x, double y, double width, double height);
void cairo_arc(cairo_t *cr, double xc, double yc, double radius, double angle1, double angle2);
void cairo_stroke(cairo_t *cr);
void cairo_fill(cairo_t *cr);
void cairo_paint(cairo_t *cr);
void cairo_clip(cairo_t *cr);
void cairo_save(cairo_t *cr);
void cairo_restore(cairo_t *cr);
void cairo_select_font_face(cairo_t *cr, const char *family, int slant, int weight);
void cairo_set_font_size(cairo_t *cr, double size);
void cairo_text_extents(cairo_t *cr, const char *utf8, cairo_text_extents_t *extents);
void cairo_show_text(cairo_t *cr, const char *utf8);
]]
local FORMAT_ARGB32, LINE_JOIN_ROUND, WEIGHT_NORMAL, WEIGHT_BOLD = 0, 1, 0, 1

local lib, load_error
-- The library, or a clear error naming what could not be loaded and for which file.
local function cairo(path)
  if lib then return lib end
  if not load_error then
    pcall(ffi.cdef, CDEF)
    local ok, l = pcall(ffi.load, "cairo")
    if not ok then ok, l = pcall(ffi.load, "libcairo.so.2") end
    if ok then lib = l else load_error = tostring(l) end
  end
  if load_error then
    raise("plot: cannot write " .. path .. ": the cairo library (libcairo.so.2) could not be loaded ("
      .. load_error .. "); install libcairo2, or plot in the terminal (no --out)")
  end
  return lib
end

local function rgb(i)
  local c = scale.colour(i).rgb
  return c[1] / 255, c[2] / 255, c[3] / 255
end

local function text_width(C, cr, s)
  local e = ffi.new("cairo_text_extents_t")
  C.cairo_text_extents(cr, s, e)
  return e.x_advance
end

-- The legend's entries laid out in rows under the plot: {x, row} per series, and the row count.
local function legend_layout(C, cr, series, width)
  local at, x, row = {}, 0, 0
  for i, s in ipairs(series) do
    local w = 26 + text_width(C, cr, s.label) + 18
    if x > 0 and x + w > width then x, row = 0, row + 1 end
    at[i] = {x = x, row = row}
    x = x + w
  end
  return at, row + 1
end

local function draw(C, cr, series, o)
  local W, H = o.width, o.height
  local xlo, xhi, ylo, yhi = scale.extent(series)
  local font = "sans-serif"
  C.cairo_set_source_rgba(cr, 1, 1, 1, 1)
  C.cairo_paint(cr)
  C.cairo_select_font_face(cr, font, 0, WEIGHT_NORMAL)
  C.cairo_set_font_size(cr, 12)

  -- the frame: the plot area is what the title, tick values, x axis' name and legend leave
  local ya = scale.axis(ylo, yhi, {ticks = math.max(2, math.floor(H / 90)), log = o.log})
  local ylabels, lw = {}, 0
  for i, v in ipairs(ya.ticks) do
    ylabels[i] = scale.label(v, ya)
    lw = math.max(lw, text_width(C, cr, ylabels[i]))
  end
  local left, right, top = math.floor(lw) + 14, W - 24, 40
  local legend, legend_rows = legend_layout(C, cr, series, right - left)
  local bottom = H - (44 + 20 * legend_rows)
  local xa = scale.axis(xlo, xhi, {ticks = math.max(2, math.floor((right - left) / 110))})
  local function px(x) return left + xa:frac(x) * (right - left) end
  local function py(y) return bottom - ya:frac(y) * (bottom - top) end

  -- grid (on a log axis also the 2..9 of each decade, lighter), then the axes
  C.cairo_set_line_width(cr, 1)
  if o.log then
    C.cairo_set_source_rgba(cr, 0.95, 0.95, 0.95, 1)
    for d = math.floor(math.log10(ya.lo)), math.ceil(math.log10(ya.hi)) do
      for m = 2, 9 do
        local v = m * 10 ^ d
        if v > ya.lo and v < ya.hi then
          C.cairo_move_to(cr, left, math.floor(py(v)) + 0.5)
          C.cairo_line_to(cr, right, math.floor(py(v)) + 0.5)
        end
      end
    end
    C.cairo_stroke(cr)
  end
  C.cairo_set_source_rgba(cr, 0.88, 0.88, 0.88, 1)
  for _, v in ipairs(ya.ticks) do
    C.cairo_move_to(cr, left, math.floor(py(v)) + 0.5)
    C.cairo_line_to(cr, right, math.floor(py(v)) + 0.5)
  end
  for _, v in ipairs(xa.ticks) do
    C.cairo_move_to(cr, math.floor(px(v)) + 0.5, top)
    C.cairo_line_to(cr, math.floor(px(v)) + 0.5, bottom)
  end
  C.cairo_stroke(cr)
  C.cairo_set_source_rgba(cr, 0, 0, 0, 1)
  C.cairo_move_to(cr, left + 0.5, top)
  C.cairo_line_to(cr, left + 0.5, bottom + 0.5)
  C.cairo_line_to(cr, right, bottom + 0.5)
  C.cairo_stroke(cr)

  -- tick values: y right-aligned at the left, x centred below
  for i, v in ipairs(ya.ticks) do
    C.cairo_move_to(cr, left - 6 - text_width(C, cr, ylabels[i]), py(v) + 4)
    C.cairo_show_text(cr, ylabels[i])
  end
  for _, v in ipairs(xa.ticks) do
    local s = scale.label(v, xa, {si = o.si_x})
    C.cairo_move_to(cr, px(v) - text_width(C, cr, s) / 2, bottom + 17)
    C.cairo_show_text(cr, s)
  end
  C.cairo_move_to(cr, (left + right) / 2 - text_width(C, cr, o.xlabel) / 2, bottom + 34)
  C.cairo_show_text(cr, o.xlabel)

  -- the curves, clipped to the plot area
  C.cairo_save(cr)
  C.cairo_rectangle(cr, left, top, right - left, bottom - top)
  C.cairo_clip(cr)
  C.cairo_set_line_join(cr, LINE_JOIN_ROUND)
  for i, s in ipairs(series) do
    local r, g, b = rgb(i)
    local layers = s.raw ~= s.y and {{s.raw, 0.25, 1}, {s.y, 1, 2}} or {{s.y, 1, 2}}
    for _, layer in ipairs(layers) do
      local ys = layer[1]
      C.cairo_set_source_rgba(cr, r, g, b, layer[2])
      C.cairo_set_line_width(cr, layer[3])
      C.cairo_move_to(cr, px(s.x[1]), py(ys[1]))
      for k = 2, #s.x do C.cairo_line_to(cr, px(s.x[k]), py(ys[k])) end
      C.cairo_stroke(cr)
    end
    if s.sparse and #s.x <= 200 then
      for k = 1, #s.x do
        C.cairo_arc(cr, px(s.x[k]), py(s.raw[k]), 3, 0, 2 * math.pi) -- (the values measured)
        C.cairo_fill(cr)
      end
    end
  end
  C.cairo_restore(cr)

  -- legend: a swatch and the series' name, in rows under the x axis' name
  for i, s in ipairs(series) do
    local x, y = left + legend[i].x, bottom + 56 + 20 * legend[i].row
    local r, g, b = rgb(i)
    C.cairo_set_source_rgba(cr, r, g, b, 1)
    C.cairo_set_line_width(cr, 3)
    C.cairo_move_to(cr, x, y - 4)
    C.cairo_line_to(cr, x + 20, y - 4)
    C.cairo_stroke(cr)
    C.cairo_set_source_rgba(cr, 0, 0, 0, 1)
    C.cairo_move_to(cr, x + 26, y)
    C.cairo_show_text(cr, s.label)
  end

  C.cairo_select_font_face(cr, font, 0, WEIGHT_BOLD)
  C.cairo_set_font_size(cr, 15)
  C.cairo_move_to(cr, W / 2 - text_width(C, cr, o.title) / 2, 26)
  C.cairo_show_text(cr, o.title)
end

local function xml_escape(s)
  return (s:gsub("[<>&\"]", {["<"] = "&lt;", [">"] = "&gt;", ["&"] = "&amp;", ['"'] = "&quot;"}))
end

-- Writes the plot of series to path; o: format ("png" | "svg"), width, height (pixels), log,
-- title, xlabel, si_x.
function M.write(path, series, o)
  local C = cairo(path)
  local chunks = {}
  local sink = ffi.cast("cairo_write_func_t", function(_, data, n)
    chunks[#chunks + 1] = ffi.string(data, n)
    return 0
  end)
  local surface = o.format == "svg" and C.cairo_svg_surface_create_for_stream(sink, nil, o.width, o.height)
    or C.cairo_image_surface_create(FORMAT_ARGB32, o.width, o.height)
  local cr = C.cairo_create(surface)
  local ok, err = pcall(draw, C, cr, series, o)
  local status = C.cairo_status(cr)
  C.cairo_destroy(cr)
  if ok and status == 0 and o.format == "png" then status = C.cairo_surface_write_to_png_stream(surface, sink, nil) end
  C.cairo_surface_finish(surface) -- (an SVG is written out here)
  if status == 0 then status = C.cairo_surface_status(surface) end
  C.cairo_surface_destroy(surface)
  sink:free()
  if not ok then error(err, 0) end
  if status ~= 0 then raise("plot: cannot draw " .. path .. ": cairo: " .. ffi.string(C.cairo_status_to_string(status))) end

  local bytes = table.concat(chunks)
  if o.format == "svg" then
    -- cairo draws text as glyph outlines: the title and legend also as text, for search and screen readers
    local names = {}
    for i, s in ipairs(series) do names[i] = s.label end
    bytes = bytes:gsub("(<svg[^>]*>)", "%1\n<title>" .. xml_escape(o.title):gsub("%%", "%%%%") .. "</title>\n<desc>"
      .. xml_escape(table.concat(names, "; ")):gsub("%%", "%%%%") .. "</desc>", 1)
  end
  local wrote, werr = atomic_file.write(path, bytes)
  if not wrote then raise("plot: " .. tostring(werr)) end
end

return M
