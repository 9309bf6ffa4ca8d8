-- Prints this rank's place in the world as the launcher gave it, and the args it got;
-- with `fail=R` as its first argument, rank R exits with status 7 (the job must end with it).
local device = require "lutra.dist.device"
local rank, size = device.world_rank(), device.world_size()
print(string.format("hello rank %d of %d local %s threads %s args %s", rank, size, tostring(device.local_rank()),
  tostring(os.getenv("OMP_NUM_THREADS")), table.concat(arg, ",")))
local fail = (arg[1] or ""):match("^fail=(%d+)$")
if fail and tonumber(fail) == rank then
  os.exit(7)
end
