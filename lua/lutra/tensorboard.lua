-- lutra.tensorboard — TensorBoard event files: scalars, text and histograms, written by the C
-- core's writer (host/io/tfevents.c; lutra.h, "TensorBoard event files").
--
--   local tb = require "lutra.tensorboard"          -- also lt.tensorboard
--   local w = tb.open("runs/x")                      -- makes the directory; w.path is the file
--   w:scalar("loss", 2.31, 100)                      -- stored as f32, as TensorBoard keeps it
--   w:text("samples", "Once upon a time", 100)      -- the text plugin (markdown)
--   w:histogram("weights/wte", model.wte.weight, 100) -- a tensor of any dtype and device, or a
--                                                    -- table of numbers; opts {bins = 30}
--   w:histogram("h", {min =, max =, num =, sum =, sum_squares =, bucket_limit = {..}, bucket = {..}}, 1)
--   w:flush(); w:close()
--
-- Records wait in a buffer until flush() (or close(), or 1 MiB of them). Every failure raises a
-- message naming the file and the reason. An optional last argument wall_time (seconds since the
-- epoch) replaces "now" in each call.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local files = require "lutra.ckpt.files"
local ffi, C = lt.ffi, lt.C

local M = {}
local raise, fail = errors.raise, errors.fail
local Tensor = ffi.typeof("lt_tensor")
local DEFAULT_BINS = 30

local Writer = {}
Writer.__index = Writer

local function check_open(w, op)
  if w.writer == nil then raise("tensorboard." .. op .. ": the writer of " .. w.path .. " is closed") end
end

local function check_tag_step(op, tag, step)
  if type(tag) ~= "string" or tag == "" then raise("tensorboard." .. op .. ": tag must be a non-empty string, got " .. type(tag)) end
  if type(step) ~= "number" or step ~= math.floor(step) or math.abs(step) >= 2 ^ 53 then
    raise("tensorboard." .. op .. ": step must be an integer, got " .. tostring(step) .. " (" .. tag .. ")")
  end
end

local function wall(t) return t == nil and -1 or t end

-- w:scalar(tag, value, step[, wall_time]): a number, stored as f32 (as TensorBoard keeps scalars).
function Writer:scalar(tag, value, step, wall_time)
  check_open(self, "scalar")
  check_tag_step("scalar", tag, step)
  if type(value) ~= "number" then raise("tensorboard.scalar: " .. tag .. ": value must be a number, got " .. type(value)) end
  if C.lt_tb_scalar(self.writer, tag, value, step, wall(wall_time)) ~= 0 then fail() end
end

-- w:session_start(step[, wall_time]): a restart at step (a resumed run): TensorBoard's readers drop
-- what the earlier events files hold for step and later, which this run writes again.
function Writer:session_start(step, wall_time)
  check_open(self, "session_start")
  if type(step) ~= "number" or step ~= math.floor(step) then
    raise("tensorboard.session_start: step must be an integer, got " .. tostring(step))
  end
  if C.lt_tb_session_start(self.writer, step, wall(wall_time)) ~= 0 then fail() end
end

-- w:text(tag, text, step[, wall_time]): a string for the text plugin (which renders markdown).
function Writer:text(tag, text, step, wall_time)
  check_open(self, "text")
  check_tag_step("text", tag, step)
  if type(text) ~= "string" then raise("tensorboard.text: " .. tag .. ": text must be a string, got " .. type(text)) end
  if C.lt_tb_text(self.writer, tag, text, #text, step, wall(wall_time)) ~= 0 then fail() end
end

local double_array = ffi.typeof("double[?]")

local function buckets(w, tag, h, step, wall_time)
  local n = #h.bucket_limit
  if #h.bucket ~= n then
    raise(string.format("tensorboard.histogram: %s: %d bucket_limit but %d bucket", tag, n, #h.bucket))
  end
  local limit, count = double_array(math.max(n, 1)), double_array(math.max(n, 1))
  for i = 1, n do limit[i - 1], count[i - 1] = h.bucket_limit[i], h.bucket[i] end
  local s = ffi.new("lt_tb_histo")
  for _, k in ipairs {"min", "max", "num", "sum", "sum_squares"} do
    if type(h[k]) ~= "number" then raise("tensorboard.histogram: " .. tag .. ": field " .. k .. " must be a number") end
    s[k] = h[k]
  end
  s.bucket_limit, s.bucket, s.n_buckets = limit, count, n
  if C.lt_tb_histogram_buckets(w, tag, s, step, wall_time) ~= 0 then fail() end
end

-- w:histogram(tag, values, step[, opts[, wall_time]]). values: a tensor of any dtype and device
-- (copied to the host as f64), a table of numbers, or a table of buckets (bucket_limit, bucket, min,
-- max, num, sum, sum_squares; bucket i counts (bucket_limit[i-1], bucket_limit[i]]). opts.bins:
-- the number of equal-width buckets over [min, max] (30); NaN and infinities are left out.
function Writer:histogram(tag, values, step, opts, wall_time)
  check_open(self, "histogram")
  check_tag_step("histogram", tag, step)
  local bins = opts and opts.bins or DEFAULT_BINS
  if type(bins) ~= "number" or bins ~= math.floor(bins) or bins < 1 then
    raise("tensorboard.histogram: " .. tag .. ": bins must be a positive integer, got " .. tostring(bins))
  end
  if type(values) == "table" and values.bucket_limit then return buckets(self.writer, tag, values, step, wall(wall_time)) end
  if ffi.istype(Tensor, values) then
    local w = self.writer
    memory.tidy(function()
      local h = values:detach():to("cpu"):to("f64"):contiguous()
      if C.lt_tb_histogram(w, tag, ffi.cast("const double *", C.lt_data_ptr(h)), h:numel(), bins, step,
                           wall(wall_time)) ~= 0 then
        fail()
      end
    end)
    return
  end
  if type(values) ~= "table" then
    raise("tensorboard.histogram: " .. tag .. ": expected a tensor or a table of numbers, got " .. type(values))
  end
  local n = #values
  local buf = double_array(math.max(n, 1))
  for i = 1, n do
    if type(values[i]) ~= "number" then raise("tensorboard.histogram: " .. tag .. ": item " .. i .. " is not a number") end
    buf[i - 1] = values[i]
  end
  if C.lt_tb_histogram(self.writer, tag, buf, n, bins, step, wall(wall_time)) ~= 0 then fail() end
end

-- Writes the buffered records out.
function Writer:flush()
  check_open(self, "flush")
  if C.lt_tb_flush(self.writer) ~= 0 then fail() end
end

-- Flushes and closes; a second close does nothing.
function Writer:close()
  local w = self.writer
  if w == nil then return end
  self.writer = nil
  ffi.gc(w, nil)
  if C.lt_tb_close(w) ~= 0 then fail() end
end

-- Opens a new events file in dir (made with its parents when missing).
function M.open(dir)
  if type(dir) ~= "string" or dir == "" then raise("tensorboard.open: expected a directory path, got " .. type(dir)) end
  files.mkdir_p(dir)
  local out = ffi.new("lt_tb_writer*[1]")
  if C.lt_tb_open(out, dir) ~= 0 then fail() end
  local path = ffi.new("const char*[1]")
  C.lt_tb_path(out[0], path)
  return setmetatable({writer = ffi.gc(out[0], C.lt_tb_close), path = ffi.string(path[0]), dir = dir}, Writer)
end

M.Writer = Writer -- the writers' methods

return M
