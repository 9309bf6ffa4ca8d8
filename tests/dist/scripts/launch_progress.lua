-- The trainer's progress bar on a rank of `lutra launch`: three updates and the end, then whether
-- it wrote in place ("in place true/false"). mpirun gives the rank a pty either way; the launcher's
-- own stdout decides (LUTRA_TTY).
local P = require "lutra.train.progress"
local device = require "lutra.dist.device"
local bar = P.new {total = 3}
if device.world_rank() == 0 then
  for step = 1, 3 do bar:update {step = step, loss = 1 / step} end
  bar:finish()
end
print(string.format("rank %d in place %s", device.world_rank(), tostring(bar.tty)))
