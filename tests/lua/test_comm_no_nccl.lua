-- lutra.dist.comm in a build without NCCL (skipped as a whole in a build with it, where
-- test_comm_nccl_gpu.lua takes CUDA tensors through NCCL): CUDA tensors are a clear error.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local lf = require "lutra.ffi"

if not lf.ffi.string(lf.C.lt_build_info()):find("nccl: not built", 1, true) then skip("a build with NCCL") end

local world = comm.init()

test("CUDA tensors in a build without NCCL: a clear error", function()
  local t = lt.ones(2)
  t.device_ = 0 -- seen as a CUDA tensor by the dispatch (the check fails before any data is touched)
  local ok, err = pcall(function() world:all_reduce(t) end)
  t.device_ = -1
  assert(not ok and tostring(err):find("all_reduce: CUDA tensors need NCCL: NCCL is not available in this build", 1, true), tostring(err))
end)
