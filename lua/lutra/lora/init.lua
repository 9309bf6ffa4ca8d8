-- lutra.lora — low-rank adapters (Hu et al. 2021, LoRA) on a model's Linear layers.
--
--   local lora = require "lutra.lora"
--   lora.apply(model, {targets = "all-linear", r = 8, alpha = 16, dropout = 0.05, rslora = false})
--   print(lora.summary(model))   -- "trainable params: 73,728 || all params: ... || trainable%: 3.41"
--   local opt = lt.optim.AdamW(lora.param_groups(model), {lr = 1e-3})   -- the adapters only
--   ... train ...
--   lora.save("runs/adapter", model)          -- PEFT's adapter_model.safetensors + adapter_config.json
--   lora.load("runs/adapter", model)          -- into the base model (wraps what the file covers) or a wrapped one
--   lora.merge(model) / lora.unmerge(model)   -- W += s B A, and back
--   lora.disable(model, fn, ...)              -- fn(...) with the adapters off (the base model)
--
-- apply replaces each chosen nn.Linear in its parent by a LoRALinear that holds the base
-- layer's own weight and bias tensors (frozen; state_dict names unchanged, so
-- "blocks.0.attn.qkv.weight" stays where it was) and two bias-free Linears, lora_A (r, in)
-- drawn kaiming-uniform(a = sqrt(5)) as PEFT does, and lora_B (out, r) zeros, so that the
-- wrapped model starts equal to the base. forward(x) = base(x) + s * B(A(dropout(x))), with
-- s = alpha / r, or alpha / sqrt(r) with rsLoRA (Kalajdzievski 2023). Every other parameter
-- of the model is frozen (requires_grad false): lora.trainable(model) lists the adapters
-- alone, lora.count / lora.summary count their entries (model:num_parameters{trainable =
-- true} too, but for the zeros that row-block adapters hold fixed).
--
-- targets: "all-linear" (every Linear but the output head lm_head, PEFT's rule), or a list of
-- Lua patterns matched against dotted module names ("attn%.qkv$", "mlp%.") and against the
-- Hugging Face module names of lutra.lora.peft ("q_proj", "c_attn"): PEFT's target_modules
-- work as they are. A pattern that matches no Linear is an error that lists the Linears.
-- In lutra's models q, k and v come from one fused Linear (attn.qkv). Chosen by its lutra
-- name (or all-linear), it gets one adapter pair (one A shared by q, k, v; B stacked):
-- exported to PEFT as q_proj, k_proj and v_proj with the same lora_A, exactly the same
-- update. Chosen by HF names ({"q_proj", "v_proj"}), or with split_fused = true, it gets
-- independent adapters on those row blocks (LoRALinear:set_blocks), as PEFT has them.
local Module = require "lutra.nn.module"
local Linear = require "lutra.nn.linear"
local Dropout = require "lutra.nn.dropout"
local create = require "lutra.create"
local F = require "lutra.functional"
local ops = require "lutra.ops"
local errors = require "lutra.errors"
local grad = require "lutra.nn.grad"
local O = require "lutra.nn.options"

local raise = errors.raise
local release = grad.release

local M = {}

-- ---- the wrapped layer ---------------------------------------------------------------------------

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

-- ---- options ---------------------------------------------------------------------------------------

local function check_opts(opts)
  opts = O.check("lora.apply", opts, {"targets", "r", "alpha", "dropout", "rslora", "freeze", "split_fused"})
  local o = {}
  o.r = O.positive_int("lora.apply", "r", opts.r or 8)
  o.alpha = O.positive("lora.apply", "alpha", opts.alpha or 16)
  o.dropout = O.probability("lora.apply", "dropout", opts.dropout or 0)
  if o.dropout >= 1 then raise("lora.apply: dropout must be below 1, got " .. o.dropout) end
  o.rslora = O.boolean("lora.apply", "rslora", opts.rslora, false)
  o.freeze = O.boolean("lora.apply", "freeze", opts.freeze, true)
  o.split_fused = O.boolean("lora.apply", "split_fused", opts.split_fused, false)
  local t = opts.targets or "all-linear"
  if type(t) == "string" and t ~= "all-linear" then t = {t} end
  if t ~= "all-linear" then
    if type(t) ~= "table" or #t == 0 then
      raise("lora.apply: targets must be \"all-linear\" or a list of Lua patterns on module names, got " .. type(t))
    end
    for _, p in ipairs(t) do
      if type(p) ~= "string" then raise("lora.apply: each target must be a Lua pattern (string), got " .. type(p)) end
      local ok, err = pcall(string.find, "", p)
      if not ok then raise("lora.apply: bad target pattern '" .. p .. "': " .. tostring(err)) end
    end
  end
  o.targets = t
  return o
end

-- The Linear modules of model as a list of {name =, module =, parent =, key =}, in traversal order.
local function linears(model)
  local found = {}
  Module._walk(model, "", function(mod, prefix)
    for _, e in ipairs(mod._entries) do
      local c = rawget(mod, e.key)
      if e.kind == "module" and c ~= nil and (getmetatable(c) == Linear or is_lora(c)) then
        found[#found + 1] = {name = prefix .. e.name, module = c, parent = mod, key = e.key}
      end
    end
  end, {})
  return found
end

local function selected(name, targets)
  if targets == "all-linear" then return not name:find("^lm_head$") and not name:find("%.lm_head$") end
  for _, p in ipairs(targets) do
    if name:find(p) then return true end
  end
  return false
end

-- ---- the public functions ---------------------------------------------------------------------------

-- Wraps the chosen Linears of model (in place) and freezes everything else. Returns model and
-- the list of wrapped module names.
function M.apply(model, opts)
  if not Module.is_module(model) then raise("lora.apply: expected a module, got " .. type(model)) end
  local o = check_opts(opts)
  local peft = require "lutra.lora.peft"
  local all = linears(model)
  local chosen, hits = {}, {}
  -- a Linear is chosen by its lutra name, or by its Hugging Face module names (PEFT's
  -- target_modules: "q_proj", "c_attn"); a fused layer of which only some parts are named
  -- (or every part with split_fused) gets independent adapters on those row blocks
  local function choose(l)
    if selected(l.name, o.targets) then
      if o.targets ~= "all-linear" then
        for _, p in ipairs(o.targets) do
          if l.name:find(p) then hits[p] = true end
        end
      end
      local hs = o.split_fused and peft.hf_names(model, l.name) or {}
      if #hs > 1 then return true, hs end
      return true, nil
    end
    if o.targets == "all-linear" then return false end
    local hs, parts = peft.hf_names(model, l.name), {}
    for _, h in ipairs(hs) do
      for _, p in ipairs(o.targets) do
        if h[1]:find(p) then
          hits[p] = true
          parts[#parts + 1] = h
          break
        end
      end
    end
    if #parts == 0 then return false end
    if #hs == 1 then return true, nil end
    return true, parts
  end
  for _, l in ipairs(all) do
    local sel, parts = choose(l)
    if sel and is_lora(l.module) then raise("lora.apply: '" .. l.name .. "' already has an adapter") end
    if sel then
      l.parts = parts
      chosen[#chosen + 1] = l
    end
  end
  if o.targets ~= "all-linear" then
    for _, p in ipairs(o.targets) do
      if not hits[p] then
        local names = {}
        for _, l in ipairs(all) do names[#names + 1] = l.name end
        raise(string.format("lora.apply: target '%s' matches no Linear module (they are: %s)", p,
          table.concat(names, ", ")))
      end
    end
  end
  if #chosen == 0 then raise("lora.apply: no Linear module to wrap") end
  if o.freeze then model:freeze() end
  local names = {}
  for _, l in ipairs(chosen) do
    local wrapped = LoRALinear(l.module, o)
    if l.parts then
      local blocks = {}
      for i, h in ipairs(l.parts) do blocks[i] = {h[2], h[3]} end
      wrapped:set_blocks(blocks)
    end
    if type(l.key) == "string" then
      l.parent[l.key] = wrapped -- same entry, same declaration order
    else
      rawset(l.parent, l.key, wrapped) -- a ModuleList slot
    end
    names[#names + 1] = l.name
  end
  local cfg = {r = o.r, alpha = o.alpha, dropout = o.dropout, rslora = o.rslora, targets = o.targets, modules = names}
  rawset(model, "_lora", cfg)
  return model, names
end

-- The wrapped layers: list of {name, module}.
function M.layers(model)
  local out = {}
  for name, m in model:named_modules() do
    if is_lora(m) then out[#out + 1] = {name, m} end
  end
  return out
end

local function need_layers(model, who)
  if not Module.is_module(model) then raise(who .. ": expected a module, got " .. type(model)) end
  local ls = M.layers(model)
  if #ls == 0 then raise(who .. ": the model has no LoRA layers (lora.apply first)") end
  return ls
end

-- The parameters that require grad, as a list of {name, tensor} (for optim: see param_groups).
function M.trainable(model)
  local out = {}
  for name, p in model:named_parameters() do
    if p.requires_grad then out[#out + 1] = {name, p} end
  end
  return out
end

-- Optimizer groups over the trainable parameters alone: optim.AdamW(lora.param_groups(model), opts).
-- (optim.AdamW(model) would list the frozen parameters too: they have no gradient, so they are
-- skipped and get no state, but lora.param_groups keeps the optimizer's view to the adapters.)
function M.param_groups(model, opts)
  local tr = M.trainable(model)
  if #tr == 0 then raise("lora.param_groups: the model has no trainable parameters") end
  opts = opts or {}
  return require("lutra.optim").param_groups(tr, {weight_decay = opts.weight_decay, no_decay = opts.no_decay})
end

-- Counts: trainable (entries of tensors that require grad, less the masked zeros of block
-- adapters), total (each tensor once), and the analytic count: the sum over wrapped layers of
-- r * (in + out), or r * (in + rows) per block.
function M.count(model)
  local trainable, total, analytic = 0, 0, 0
  for _, p in ipairs(model:parameters()) do
    total = total + p:numel()
    if p.requires_grad then trainable = trainable + p:numel() end
  end
  for _, l in ipairs(M.layers(model)) do
    local m = l[2]
    analytic = analytic + m:adapter_size()
    local mask = rawget(m, "_mask")
    if mask and m.lora_B.weight.requires_grad then -- B's entries held at zero do not train
      trainable = trainable - (mask:numel() - grad.no_grad(function() return mask:sum():item() end))
    end
  end
  return trainable, total, analytic
end

local function commas(n)
  local s = string.format("%d", n)
  local out = s:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (out:gsub("^,", ""))
end

-- PEFT's print_trainable_parameters line.
function M.summary(model)
  local trainable, total = M.count(model)
  return string.format("trainable params: %s || all params: %s || trainable%%: %.4f", commas(trainable),
    commas(total), 100 * trainable / total)
end

-- W += s B A in every wrapped layer (forward then skips the adapter path). Returns model.
function M.merge(model)
  for _, l in ipairs(need_layers(model, "lora.merge")) do
    local m = l[2]
    if not m.merged then
      local d = m:delta()
      grad.no_grad(function() ops.add_(m.weight, d) end)
      d:free()
      rawset(m, "merged", true)
    end
  end
  return model
end

-- W -= s B A: back to the base weight (within rounding) and the adapter path on.
function M.unmerge(model)
  for _, l in ipairs(need_layers(model, "lora.unmerge")) do
    local m = l[2]
    if m.merged then
      local d = m:delta()
      grad.no_grad(function() ops.sub_(m.weight, d) end)
      d:free()
      rawset(m, "merged", false)
    end
  end
  return model
end

-- fn(...) with every adapter off: the base model's outputs (a merged model is refused: its
-- weights hold the adapters). Returns fn's results; the adapters are back on after, errors too.
function M.disable(model, fn, ...)
  local ls = need_layers(model, "lora.disable")
  if type(fn) ~= "function" then raise("lora.disable: expected a function to run, got " .. type(fn)) end
  local before = {}
  for i, l in ipairs(ls) do
    if l[2].merged then raise("lora.disable: '" .. l[1] .. "' is merged (lora.unmerge first)") end
    before[i] = l[2].disabled
    rawset(l[2], "disabled", true)
  end
  local res = {pcall(fn, ...)}
  for i, l in ipairs(ls) do rawset(l[2], "disabled", before[i]) end
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

-- Replaces every LoRALinear by a plain Linear holding the merged weight (trainable again:
-- the model is an ordinary model after). Returns model.
function M.merge_and_unload(model)
  M.merge(model)
  for _, m in ipairs(model:modules()) do
    for _, e in ipairs(m._entries) do
      local c = rawget(m, e.key)
      if e.kind == "module" and is_lora(c) then
        local lin
        if c.unloaded then
          lin = c:unloaded() -- a tensor-parallel layer (lutra.lora.tp): the plain parallel layer
        else
          lin = Linear(c.in_features, c.out_features, {bias = c.bias ~= nil, dtype = c.weight.dtype,
                                                       device = c.weight.device})
          lin.weight = c.weight
          if c.bias ~= nil then lin.bias = c.bias end
        end
        if type(e.key) == "string" then m[e.key] = lin else rawset(m, e.key, lin) end
      end
    end
  end
  rawset(model, "_lora", nil)
  return model
end

-- The module that holds the layer named `name` (its parent), e.g. the attention of "blocks.0.attn.qkv".
function M.owner_attention(model, name)
  local parent = name:match("^(.*)%.[^.]+$")
  for n, m in model:named_modules() do
    if n == parent then return m end
  end
  raise("lora: no module holds '" .. name .. "'")
end

-- Adapters on disk (PEFT's layout): lutra/lora/peft.lua.
-- A tensor-parallel model (lutra.lora.tp) saves its gathered adapters (a collective over its
-- tp group) and loads into its pieces.
local function tensor_parallel(model)
  if not Module.is_module(model) then return false end
  for _, l in ipairs(M.layers(model)) do
    if rawget(l[2], "group") ~= nil then return true, l[1] end
  end
  return false
end
function M.save(dir, model, opts)
  if tensor_parallel(model) then return require("lutra.lora.tp").save(dir, model, opts) end
  return require("lutra.lora.peft").save(dir, model, opts)
end
function M.load(dir, model, opts)
  if tensor_parallel(model) then return require("lutra.lora.tp").load(dir, model, opts) end
  return require("lutra.lora.peft").load(dir, model, opts)
end

return M
