-- lutra.lora.linear — LoRALinear, the layer lora.apply (lutra.lora.apply) puts in place of an
-- nn.Linear: it holds the base layer's own weight and bias tensors (frozen; state_dict names
-- unchanged) and two bias-free Linears, lora_A (r, in) drawn kaiming-uniform(a = sqrt(5)) as
-- PEFT does, and lora_B (out, r) zeros, so that the wrapped model starts equal to the base.
-- forward(x) = base(x) + s * B(A(dropout(x))), s = alpha / r, or alpha / sqrt(r) with rsLoRA.
-- Row blocks (set_blocks) give independent adapters on parts of a fused layer. Also here:
-- is_lora(m) (this class or a subclass: lutra.lora.tp's parallel layers) and layers(model).
local Module = require "lutra.nn.module"
local Linear = require "lutra.nn.linear"
local Dropout = require "lutra.nn.dropout"
local create = require "lutra.create"
local F = require "lutra.functional"
local ops = require "lutra.ops"
local errors = require "lutra.errors"
local grad = require "lutra.nn.grad"

local raise = errors.raise
local release = grad.release

local M = {}

local LoRALinear = Module:extend("LoRALinear")
M.LoRALinear = LoRALinear

-- LoRALinear(base, {r =, alpha =, dropout =, rslora =}): base is an nn.Linear (its weight and
-- bias tensors are taken over, frozen).
function LoRALinear:init(base, opts)
  local w = base.weight
  self.in_features, self.out_features = w:size(1), w:size(0)
  self.r, self.alpha, self.rslora = opts.r, opts.alpha, opts.rslora
  self.scaling = opts.rslora and opts.alpha / math.sqrt(opts.r) or opts.alpha / opts.r
  self.dropout_p = opts.dropout
  rawset(self, "merged", false)
  rawset(self, "disabled", false)
  self:param("weight", w)
  grad.set_requires_grad(w, false) -- (after: registering a parameter turns requires_grad on)
  if base.bias ~= nil then
    self:param("bias", base.bias)
    grad.set_requires_grad(base.bias, false)
  end
  local fo = {bias = false, dtype = w.dtype, device = w.device}
  self.lora_A = Linear(self.in_features, self.r, fo)
  self.lora_B = Linear(self.r, self.out_features, fo)
  -- kaiming_uniform_(a = sqrt(5)) on (r, in): bound = sqrt(6 / ((1 + 5) fan_in)) = 1 / sqrt(in)
  local bound = 1 / math.sqrt(self.in_features)
  grad.no_grad(function()
    create.uniform_(self.lora_A.weight, -bound, bound)
    create.fill_(self.lora_B.weight, 0)
  end)
  if opts.dropout > 0 then self.lora_dropout = Dropout(opts.dropout) end
end

-- x (..., in) -> (..., out)
function LoRALinear:forward(x)
  local y = F.linear(x, self.weight, self.bias)
  if self.merged or self.disabled then return y end
  local xin = self.lora_dropout and self.lora_dropout(x) or x
  local h = self.lora_A(xin) -- (..., r)
  release(xin, x)
  return self:add_update(y, h, self.lora_B.weight)
end

-- y + s * h B^T, h (..., r) the adapter's A x; with row blocks B is masked (its entries
-- outside the blocks stay zero, their gradient masked too). Frees h and y. The tensor-
-- parallel layers (lora_tp.lua) pass their own B (a shard, or B through a tp collective).
function LoRALinear:add_update(y, h, b)
  local mask = rawget(self, "_mask")
  local bm = mask and b * mask or b
  local ds = F.linear(h, bm) -- (..., out)
  if mask then release(bm) end
  release(h)
  if self.scaling ~= 1 then
    local d = ds
    ds = d * self.scaling
    release(d)
  end
  local out = y + ds
  release(ds)
  release(y)
  return out
end

-- The update s * B A (out, in), in the weight's dtype, without autograd.
function LoRALinear:delta()
  return grad.no_grad(function()
    local b = self.lora_B.weight
    if rawget(self, "_mask") then b = b * self._mask end
    return ops.matmul(b, self.lora_A.weight) * self.scaling
  end)
end

-- Independent adapters on row blocks of this layer, as PEFT has on separate q_proj, k_proj,
-- v_proj where lutra fuses them: blocks = {{first row, rows}, ...}, each of rank r. lora_A
-- becomes (k r, in) (block i's A is rows [i r, (i + 1) r)), lora_B (out, k r) whose entries
-- outside (block i's rows) x (block i's columns) are held at zero by a fixed mask. Rows
-- in no block get no update. New A, B: kaiming-uniform and zeros, as apply's.
function LoRALinear:set_blocks(blocks)
  local r, k = self.r, #blocks
  local w = self.weight
  local fo = {bias = false, dtype = w.dtype, device = w.device}
  self.lora_A = Linear(self.in_features, k * r, fo)
  self.lora_B = Linear(k * r, self.out_features, fo)
  local mask = create.zeros(self.out_features, k * r, {dtype = w.dtype, device = w.device})
  local bound = 1 / math.sqrt(self.in_features)
  grad.no_grad(function()
    create.uniform_(self.lora_A.weight, -bound, bound)
    create.fill_(self.lora_B.weight, 0)
    for i, b in ipairs(blocks) do
      if b[1] < 0 or b[2] < 1 or b[1] + b[2] > self.out_features then
        raise(string.format("LoRALinear:set_blocks: block %d rows [%d, %d) outside [0, %d)", i, b[1], b[1] + b[2],
          self.out_features))
      end
      mask:narrow(0, b[1], b[2]):narrow(1, (i - 1) * r, r):fill_(1)
    end
  end)
  rawset(self, "_mask", mask)
  rawset(self, "blocks", blocks)
  return self
end

-- Trainable adapter entries of this layer: r (in + out), or with blocks, r (in + rows) each.
function LoRALinear:adapter_size()
  local blocks = rawget(self, "blocks")
  if not blocks then return self.r * (self.in_features + self.out_features) end
  local n = 0
  for _, b in ipairs(blocks) do n = n + self.r * (self.in_features + b[2]) end
  return n
end

function LoRALinear:extra_repr()
  return string.format("%d, %d, r=%d, alpha=%g, scaling=%g%s%s", self.in_features, self.out_features, self.r,
    self.alpha, self.scaling, self.dropout_p > 0 and string.format(", dropout=%g", self.dropout_p) or "",
    self.merged and ", merged" or "")
end

-- LoRALinear or a subclass (lutra.lora.tp's tensor-parallel layers)
local function is_lora(m)
  local cls = type(m) == "table" and getmetatable(m) or nil
  while cls ~= nil do
    if cls == LoRALinear then return true end
    cls = rawget(cls, "super")
  end
  return false
end
M.is_lora = is_lora

-- The wrapped layers: list of {name, module}.
function M.layers(model)
  local out = {}
  for name, m in model:named_modules() do
    if is_lora(m) then out[#out + 1] = {name, m} end
  end
  return out
end

return M
