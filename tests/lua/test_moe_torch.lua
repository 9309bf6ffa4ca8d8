-- nn.MoE against PyTorch: tests/py/ref_moe.py runs Hugging Face Mixtral's sparse MoE block
-- (written out with its formulas: softmax, topk, renormalisation, a one-hot expert mask and a
-- loop over the experts with index_add_), Mixtral's load-balancing loss and ST-MoE's z-loss, in
-- f64, with a GELU expert, a shared expert, Switch's capacity (a cumsum over the slots) and
-- norm_topk_prob off (Qwen-MoE). The same weights in nn.MoE must give the same output, losses
-- and gradients of sum(y * gout) + aux_loss_coef * balance + z_loss_coef * z (f64: the sums run
-- in another order, so 1e-12 relative, never a tolerance for this CPU). Skipped without python3
-- and torch (a failure where LUTRA_REQUIRE_TORCH=1).
local lt = require "lutra"
local T = require "lutra.testing"

local here = debug.getinfo(1, "S").source:match("^@(.*)[/\\][^/\\]+$") or "tests/lua"
local SCRIPT = here .. "/../py/ref_moe.py"

local function reference() return T.torch_reference(SCRIPT) end

local function parse(path)
  local cases, case = {}, nil
  for line in io.lines(path) do
    local tag, rest = line:match("^(%S+)%s*(.*)$")
    if tag == "case" then
      local w = {}
      for v in rest:gmatch("%S+") do w[#w + 1] = v end
      case = {name = w[1], E = tonumber(w[2]), k = tonumber(w[3]), norm = w[4] == "1", act = w[5],
              n_shared = tonumber(w[6]), capacity = tonumber(w[7]), aux = tonumber(w[8]), z = tonumber(w[9]), t = {}}
      cases[#cases + 1] = case
    elseif tag == "tensor" then
      local w = {}
      for v in rest:gmatch("%S+") do w[#w + 1] = v end
      local nd = tonumber(w[3])
      local shape, vals = {}, {}
      for d = 1, nd do shape[d] = tonumber(w[3 + d]) end
      for i = 4 + nd, #w do vals[#vals + 1] = tonumber(w[i]) end
      case.t[w[1]] = nd == 0 and vals[1] or lt.tensor(vals, {dtype = "f64"}):reshape(shape)
    end
  end
  return cases
end

-- max |a - b| / max |b|
local function rel(a, b)
  local m = b:abs():max():item()
  return (a - b):abs():max():item() / (m > 0 and m or 1)
end

local cases
local function all_cases()
  cases = cases or parse(reference())
  return cases
end

-- one test per case; the reference runs once
for _, name in ipairs {"mixtral", "qwen_norm_off", "top1_gelu", "shared", "capacity", "capacity_gelu_shared",
                       "all_experts"} do
  test("MoE matches Mixtral's sparse MoE block in PyTorch: " .. name, function()
    local c
    for _, cc in ipairs(all_cases()) do
      if cc.name == name then c = cc end
    end
    assert(c, "no case " .. name .. " from ref_moe.py")
    local t = c.t
    local N, C = t.x:size(0), t.x:size(1)
    local H = t.w_up:size(1)
    local moe = lt.nn.MoE{d_model = C, d_ff = H, n_experts = c.E, top_k = c.k, norm_topk_prob = c.norm,
                          activation = c.act, n_shared_experts = c.n_shared, aux_loss_coef = c.aux, z_loss_coef = c.z,
                          capacity_factor = c.capacity > 0 and c.capacity or nil, dtype = "f64"}
    local params = {router = moe.router.weight, w_gate = moe.w_gate, w_up = moe.w_up, w_down = moe.w_down}
    if c.n_shared > 0 then
      local sh = moe.shared
      params.shared_gate, params.shared_up, params.shared_proj = sh.gate and sh.gate.weight, sh.up and sh.up.weight
        or sh.fc.weight, sh.proj.weight
    end
    lt.no_grad(function()
      for k, p in pairs(params) do p:copy_(t[k]) end
    end)
    local x = t.x:clone()
    x.requires_grad = true
    local y = moe(x)
    if c.capacity > 0 then T.assert_equal(moe.dropped > 0, true, "the capacity drops slots in this case") end
    assert(rel(y:detach(), t.y) < 1e-12, name .. ": output differs from torch by " .. rel(y:detach(), t.y))
    T.assert_close(moe.balance_loss:item(), t.balance, {rtol = 1e-12, atol = 0})
    T.assert_close(moe.z_loss:item(), t.z, {rtol = 1e-12, atol = 0})
    ;((y * t.gout):sum() + moe.aux_loss):backward()
    assert(rel(x.grad, t.d_x) < 1e-12, name .. ": d x differs from torch by " .. rel(x.grad, t.d_x))
    for k, p in pairs(params) do
      local r = rel(p.grad, t["d_" .. k])
      assert(r < 1e-12, string.format("%s: d %s differs from torch by %.3g", name, k, r))
    end
  end)
end
