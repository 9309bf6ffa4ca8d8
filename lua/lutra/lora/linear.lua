-- lutra.lora.linear — LoRALinear, the layer lora.apply (lutra.lora.apply) puts in place of an
-- nn.Linear: it holds the base layer's own weight and bias tensors (frozen; state_dict names
-- unchanged) and two bias-free Linears, lora_A (r, in) drawn kaiming-uniform(a = sqrt(5)) as
-- PEFT does, and lora_B (out, r) zeros, so that the wrapped model starts equal to the base.
-- forward(x) = base(x) + s * B(A(dropout(x))), s = alpha / r, or alpha / sqrt(r) with rsLoRA.
-- Row blocks (set_blocks) give independent adapters on parts of a fused layer, each with its own
-- r and alpha (peft's rank_pattern / alpha_pattern on q_proj, k_proj, v_proj). DoRA (enable_dora,
-- Liu et al. 2024, peft's use_dora) adds a magnitude per output row. Also here: is_lora(m) (this
-- class or a subclass: lutra.lora.tp's parallel layers) and layers(model).
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
  if rawget(self, "lora_magnitude") ~= nil and not (self.merged or self.disabled) then return self:dora_forward(x) end
  local y = F.linear(x, self.weight, self.bias)
  if self.merged or self.disabled then return y end
  local xin = self.lora_dropout and self.lora_dropout(x) or x
  local h = self.lora_A(xin) -- (..., r)
  release(xin, x)
  return self:add_update(y, h, self.lora_B.weight)
end

-- s * h B^T, h (..., r) the adapter's A x; with row blocks B is masked (its entries outside
-- the blocks stay zero, their gradient masked too; the mask holds each block's scaling over
-- self.scaling). Frees h.
function LoRALinear:update(h, b)
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
  return ds
end

-- y + s * h B^T (update). Frees h and y. The tensor-parallel layers (lora_tp.lua) pass their
-- own B (a shard, or B through a tp collective).
function LoRALinear:add_update(y, h, b)
  local ds = self:update(h, b)
  local out = y + ds
  release(ds)
  release(y)
  return out
end

-- ---- DoRA ------------------------------------------------------------------------------------------
-- peft's DoRA: W' = m * (W + s B A) / ||W + s B A|| row by row (the norm of each output row,
-- taken as a constant in backward, as peft detaches it: section 4.3 of the paper), so
--   forward(x) = base(x) + (g - 1) * (xd W^T) + g * s * B A xd,   g = m / ||W + s B A||,
-- xd = dropout(x) (x without dropout, where the sum is g * (x W^T + s B A x) + bias).
-- Rows in no block of a fused layer have no DoRA: g = 1 there.

-- ||W + s B A|| per output row (out), without autograd.
function LoRALinear:weight_norm()
  return grad.no_grad(function()
    local d = self:delta()
    local w = self.weight + d
    local n = ops.norm(w, 1)
    d:free()
    w:free()
    return n
  end)
end

-- 1 on the rows with an adapter, 0 elsewhere (nil: every row has one).
local function dora_rows(self)
  local mask = rawget(self, "_mask")
  if mask == nil then return nil end
  return grad.no_grad(function()
    local rows = create.zeros(self.out_features, {dtype = self.weight.dtype, device = self.weight.device})
    for _, b in ipairs(self.blocks) do rows:narrow(0, b[1], b[2]):fill_(1) end
    return rows
  end)
end

-- Turns DoRA on: lora_magnitude (out), trainable, starts at ||W + s B A|| (peft's init: the
-- layer's output is unchanged).
function LoRALinear:enable_dora()
  local n = self:weight_norm()
  self:param("lora_magnitude", n)
  rawset(self, "_dora_rows", dora_rows(self))
  return self
end

-- g = m / ||W + s B A|| (out), through autograd in m; 1 on rows with no adapter.
function LoRALinear:dora_scale()
  local n = self:weight_norm()
  local g = self.lora_magnitude / n -- (n stays: the division's backward holds it)
  local rows = rawget(self, "_dora_rows")
  if rows then
    local off = grad.no_grad(function() return rows * -1 + 1 end)
    local gr = g * rows
    release(g)
    g = gr + off
    release(gr)
  end
  return g
end

-- forward with DoRA: (x W^T + s B A x) scaled per output feature by g = m / ||W + s B A||
-- (dora_scale), plus the bias.
function LoRALinear:dora_forward(x)
  local g = self:dora_scale()
  local xin = self.lora_dropout and self.lora_dropout(x) or x
  local yb = F.linear(xin, self.weight) -- (..., out), no bias
  local ds = self:update(self.lora_A(xin), self.lora_B.weight)
  local sum = yb + ds
  release(ds)
  local scaled = sum * g
  release(sum)
  release(g)
  local out
  if xin == x then
    release(yb)
    if self.bias == nil then return scaled end
    out = scaled + self.bias
  else
    local y = F.linear(x, self.weight, self.bias)
    local t = y - yb
    release(y)
    release(yb)
    out = t + scaled
    release(t)
    release(xin)
  end
  release(scaled)
  return out
end

-- The merged weight in place: W + s B A, row-scaled by g with DoRA. unmerge_weight undoes it.
function LoRALinear:merge_weight()
  local d = self:delta()
  if rawget(self, "lora_magnitude") ~= nil then
    local g = grad.no_grad(function() return self:dora_scale() end)
    grad.no_grad(function()
      ops.add_(self.weight, d)
      self.weight:copy_(self.weight * g:unsqueeze(1))
    end)
    rawset(self, "_merge_scale", g)
  else
    grad.no_grad(function() ops.add_(self.weight, d) end)
  end
  d:free()
end

-- Undoes merge_weight: W back from W + s B A (and DoRA's row scale).
function LoRALinear:unmerge_weight()
  local g = rawget(self, "_merge_scale")
  if g ~= nil then
    grad.no_grad(function() self.weight:copy_(self.weight / g:unsqueeze(1)) end)
    rawset(self, "_merge_scale", nil)
    g:free()
  end
  local d = self:delta()
  grad.no_grad(function() ops.sub_(self.weight, d) end)
  d:free()
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
-- v_proj where lutra fuses them: blocks = {{first row, rows, r =, alpha =}, ...} (r, alpha:
-- the layer's when absent). lora_A becomes (sum r_i, in) (block i's A: rows [c_i, c_i + r_i),
-- c_i = r_1 + ... + r_(i-1)), lora_B (out, sum r_i) whose entries outside (block i's rows) x
-- (block i's columns) are held at zero by a fixed mask; the mask holds s_i / s on block i (1
-- where every block has the layer's r and alpha). Rows in no block get no update. New A, B:
-- kaiming-uniform and zeros, as apply's. block(i) gives block i's first column, r and alpha.
function LoRALinear:set_blocks(blocks)
  local w = self.weight
  local total, cols = 0, {}
  for i, b in ipairs(blocks) do
    cols[i] = {col = total, r = b.r or self.r, alpha = b.alpha or self.alpha}
    total = total + cols[i].r
    if b[1] < 0 or b[2] < 1 or b[1] + b[2] > self.out_features then
      raise(string.format("LoRALinear:set_blocks: block %d rows [%d, %d) outside [0, %d)", i, b[1], b[1] + b[2],
        self.out_features))
    end
  end
  local fo = {bias = false, dtype = w.dtype, device = w.device}
  self.lora_A = Linear(self.in_features, total, fo)
  self.lora_B = Linear(total, self.out_features, fo)
  local mask = create.zeros(self.out_features, total, {dtype = w.dtype, device = w.device})
  local bound = 1 / math.sqrt(self.in_features)
  grad.no_grad(function()
    create.uniform_(self.lora_A.weight, -bound, bound)
    create.fill_(self.lora_B.weight, 0)
    for i, b in ipairs(blocks) do
      local c = cols[i]
      local s = self.rslora and c.alpha / math.sqrt(c.r) or c.alpha / c.r
      mask:narrow(0, b[1], b[2]):narrow(1, c.col, c.r):fill_(s / self.scaling)
    end
  end)
  rawset(self, "_mask", mask)
  rawset(self, "blocks", blocks)
  rawset(self, "_cols", cols)
  if rawget(self, "lora_magnitude") ~= nil then rawset(self, "_dora_rows", dora_rows(self)) end
  return self
end

-- Block i's first column of lora_B (row of lora_A), rank and alpha.
function LoRALinear:block(i)
  local cols = rawget(self, "_cols")
  if cols then return cols[i].col, cols[i].r, cols[i].alpha end
  return (i - 1) * self.r, self.r, self.alpha
end

-- Trainable adapter entries of this layer: r (in + out), or with blocks, r_i (in + rows) each;
-- and out more with DoRA (the magnitudes).
function LoRALinear:adapter_size()
  local blocks = rawget(self, "blocks")
  local dora = rawget(self, "lora_magnitude") ~= nil and self.out_features or 0
  if not blocks then return self.r * (self.in_features + self.out_features) + dora end
  local n = 0
  for i, b in ipairs(blocks) do
    local _, r = self:block(i)
    n = n + r * (self.in_features + b[2])
  end
  return n + dora
end

function LoRALinear:extra_repr()
  return string.format("%d, %d, r=%d, alpha=%g, scaling=%g%s%s%s", self.in_features, self.out_features, self.r,
    self.alpha, self.scaling, self.dropout_p > 0 and string.format(", dropout=%g", self.dropout_p) or "",
    rawget(self, "lora_magnitude") ~= nil and ", dora" or "", self.merged and ", merged" or "")
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
