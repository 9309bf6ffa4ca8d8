-- lutra.train.fault — failures injected on purpose, to test automatic restart.
--
--   LUTRA_FAULT=step:S[@R]   rank R (every rank without @R) dies abruptly (SIGKILL) right
--                            after training step S
--   LUTRA_FAULT=lose:S[@R]   the same, and the rank is reported lost to `lutra launch`, whose
--                            restart may then come back with fewer ranks (--min-ranks)
--   LUTRA_FAULT=hang:S[@R]   rank R stops after step S without dying: the other ranks wait in
--                            their next collective until the watchdog ends the job
--   LUTRA_FAULT=nan:S[@R]    the loss of training step S on rank R (every rank without @R) is
--                            nan, once per process (a rollback replays the step clean): the
--                            trainer's nonfinite handling, lutra/train/nonfinite.lua (not under
--                            pipeline parallel, whose stages compute the loss themselves)
-- (LUTRA_FAULT=save:<point>[@R] faults live in the checkpoint writer: lutra.h, ckpt io;
-- LUTRA_FAULT=write:N, a SIGKILL at byte N of the files written, in lutra.h's files written safely.)
-- A fault fires once per job: a marker in LUTRA_LAUNCH_DIR (set by `lutra launch`) keeps the
-- restarted job from dying again at the same step.
local ffi = require "ffi"

local M = {}

pcall(ffi.cdef, [[
int getpid(void);
int kill(int pid, int sig);
int poll(void *fds, unsigned long nfds, int timeout);
]])

local function parse(spec)
  if not spec then return nil end
  local kind, step, rank = spec:match("^(%a+):(%d+)@?(%d*)$")
  if kind ~= "step" and kind ~= "lose" and kind ~= "hang" and kind ~= "nan" then return nil end
  return {kind = kind, step = tonumber(step), rank = rank ~= "" and tonumber(rank) or nil}
end

M.parse = parse

-- Called by the trainer after each step: dies here when LUTRA_FAULT says so.
function M.after_step(step, rank)
  local f = parse(os.getenv("LUTRA_FAULT"))
  if f == nil or f.kind == "nan" or f.step ~= step or (f.rank ~= nil and f.rank ~= rank) then return end
  local dir = os.getenv("LUTRA_LAUNCH_DIR")
  local marker = dir and string.format("%s/fault_%s_%d_%d", dir, f.kind, step, rank)
  if marker then
    local done = io.open(marker, "r")
    if done then
      done:close()
      return -- fired already, in an earlier attempt
    end
    local m = io.open(marker, "w")
    if m then m:close() end
    if f.kind == "lose" then
      local lost = io.open(dir .. "/lost", "w")
      if lost then
        lost:write("1\n")
        lost:close()
      end
    end
  end
  io.stderr:write(string.format("lutra: fault injected (LUTRA_FAULT=%s): rank %d %s after step %d\n",
    os.getenv("LUTRA_FAULT"), rank, f.kind == "hang" and "hangs" or "dies", step))
  io.stderr:flush()
  io.stdout:flush()
  if f.kind == "hang" then
    while true do ffi.C.poll(nil, 0, 1000) end -- until the job is torn down
  end
  ffi.C.kill(ffi.C.getpid(), 9)
end

local nan_fired = false

-- True (once per process) when LUTRA_FAULT=nan:S[@R] says the loss of `step` on `rank` is nan.
function M.nan_at(step, rank)
  if nan_fired then return false end
  local f = parse(os.getenv("LUTRA_FAULT"))
  if f == nil or f.kind ~= "nan" or f.step ~= step or (f.rank ~= nil and f.rank ~= rank) then return false end
  nan_fired = true
  return true
end

return M
