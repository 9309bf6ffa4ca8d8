-- lutra.train.progress — the trainer's console output: one line per logged step that
-- updates in place on a terminal (\r, cleared to the end of the line) and plain lines
-- when stdout is a pipe or a file.
--
--   local P = require "lutra.train.progress"
--   local bar = P.new{total = 2000, out = io.stdout}     -- tty = auto-detected
--   bar:update{step = 10, loss = 3.2, lr = 1e-3, tokens_per_s = 5e4, grad_norm = 0.8, eta = 120}
--   bar:print("step 10: val loss 3.1")                   -- a line that stays
--   bar:finish()
local ffi = require "ffi"

local M = {}

pcall(ffi.cdef, "int isatty(int fd);")
pcall(ffi.cdef, "int fileno(void *stream);")

-- True when file descriptor fd (default 1, stdout) is a terminal.
function M.isatty(fd)
  local ok, r = pcall(function() return ffi.C.isatty(fd or 1) end)
  return ok and r == 1
end

-- Whether stdout shows progress in place: LUTRA_TTY=1 or 0 when set (lutra launch sets it from
-- its own stdout); else under mpirun, whose ranks write to a pty even when the job's output
-- goes to a file, plain lines; else whether stdout is a terminal.
function M.stdout_is_terminal()
  local forced = os.getenv("LUTRA_TTY")
  if forced == "1" or forced == "0" then return forced == "1" end
  if os.getenv("OMPI_COMM_WORLD_SIZE") or os.getenv("PMI_SIZE") or os.getenv("PMIX_RANK") then return false end
  return M.isatty(1)
end

-- Seconds as 1h02m, 3m05s or 12s.
function M.duration(s)
  if s == nil or s ~= s or s == math.huge or s < 0 then return "?" end
  s = math.floor(s + 0.5)
  if s >= 3600 then return string.format("%dh%02dm", math.floor(s / 3600), math.floor(s % 3600 / 60)) end
  if s >= 60 then return string.format("%dm%02ds", math.floor(s / 60), s % 60) end
  return string.format("%ds", s)
end

-- Megabytes as 812 MB, 12.3 GB.
function M.megabytes(mb)
  if mb >= 1024 then return string.format("%.1f GB", mb / 1024) end
  return string.format("%.0f MB", mb)
end

-- 12345 -> "12.3k", 1.2e6 -> "1.20M"
function M.count(n)
  if n >= 1e6 then return string.format("%.2fM", n / 1e6) end
  if n >= 1e4 then return string.format("%.1fk", n / 1e3) end
  return string.format("%d", math.floor(n + 0.5))
end

local Progress = {}
Progress.__index = Progress

function M.new(opts)
  opts = opts or {}
  local out = opts.out or io.stdout
  local tty = opts.tty
  if tty == nil then tty = out == io.stdout and M.stdout_is_terminal() end
  return setmetatable({total = opts.total, out = out, tty = tty, open = false,
                       width = #tostring(opts.total or 0)}, Progress)
end

-- The text of a progress line from a record {step, loss, lr, tokens_per_s, grad_norm, eta, ...}.
function Progress:format(r)
  local parts = {string.format("step %" .. self.width .. "d/%d", r.step, self.total or 0),
                 string.format("loss %.4f", r.loss)}
  if r.lr then parts[#parts + 1] = string.format("lr %.2e", r.lr) end
  if r.grad_norm then parts[#parts + 1] = string.format("norm %.3f", r.grad_norm) end
  if r.tokens_per_s then parts[#parts + 1] = M.count(r.tokens_per_s) .. " tok/s" end
  if r.ms_per_step then parts[#parts + 1] = string.format("%.0f ms/step", r.ms_per_step) end
  if r.mfu then parts[#parts + 1] = string.format("MFU %.1f%%", 100 * r.mfu) end
  local per_rank = r.rank_peak_mem_mb -- many ranks: the fullest device, and which rank holds it
  if type(per_rank) == "table" and #per_rank > 1 then
    local top = 1
    for i = 2, #per_rank do
      if per_rank[i] > per_rank[top] then top = i end
    end
    parts[#parts + 1] = string.format("mem %s max (rank %d)", M.megabytes(per_rank[top]), top - 1)
  elseif r.peak_mem_mb then
    parts[#parts + 1] = string.format("mem %s", M.megabytes(r.peak_mem_mb))
  end
  if r.eta then parts[#parts + 1] = "eta " .. M.duration(r.eta) end
  return table.concat(parts, " | ")
end

function Progress:update(r)
  local line = self:format(r)
  if self.tty then
    self.out:write("\r", line, "\27[K")
    self.open = true
  else
    self.out:write(line, "\n")
  end
  self.out:flush()
end

-- A line that stays (evaluations, samples, messages), below the progress line.
function Progress:print(s)
  if self.open then
    self.out:write("\r\27[K")
    self.open = false
  end
  self.out:write(s, "\n")
  self.out:flush()
end

-- Ends the in-place line so that what follows starts on a new line.
function Progress:finish()
  if self.open then
    self.out:write("\n")
    self.open = false
    self.out:flush()
  end
end

M.Progress = Progress
return M
