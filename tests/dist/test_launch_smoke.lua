-- np: 2
-- The multi-rank harness itself: every rank sees the MPI world mpirun made.
local testing = require "lutra.testing"

test("mpirun gives each rank its place in the world", function()
  local size = tonumber(os.getenv("OMPI_COMM_WORLD_SIZE"))
  local rank = tonumber(os.getenv("OMPI_COMM_WORLD_RANK"))
  testing.assert_equal(size, 2)
  assert(rank == 0 or rank == 1, "rank " .. tostring(rank))
end)
