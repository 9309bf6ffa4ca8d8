-- Shared by the multi-rank layout tests (dofile'd; not a test file itself).
local lt = require "lutra"
local spec = require "lutra.dist.spec"

local M = {}

-- The full value of every parameter of a reference model, gathered from a parallel
-- layout's pieces: each rank adds the boxes it owns into zeros, a world all-reduce sums
-- them. In f64 (exact for f32 values). par: the trainer's result.parallel; names: the
-- reference's parameter names in order; ref_params: name -> the reference's tensor.
function M.gather(par, names, ref_params, world)
  local mesh = par.mesh
  local all_dp = par.zero ~= nil and mesh.zero == 3 -- dp ranks hold different shards (of trainable params)
  local mine = {}
  for name, p in par.model:named_parameters() do mine[name] = p end
  local out = {}
  for _, name in ipairs(names) do
    local full = lt.zeros(ref_params[name].shape, {dtype = "f64"})
    local p = mine[name]
    local sharded = all_dp and p ~= nil and p.requires_grad
    if p ~= nil and spec.owned(p) and (sharded or mesh.dp_rank == 0) and p:numel() > 0 then
      for _, box in ipairs(spec.boxes(p)) do
        local dst, src = full, p
        for d = 0, p.ndim - 1 do
          dst = dst:narrow(d, box.offset[d + 1], box.shape[d + 1])
          src = src:narrow(d, box.local_offset[d + 1], box.shape[d + 1])
        end
        lt.no_grad(function() dst:copy_(src:double()) end)
      end
    end
    world:all_reduce(full, "sum")
    out[name] = full
  end
  return out
end

return M
