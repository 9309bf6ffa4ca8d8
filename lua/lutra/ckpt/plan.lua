-- lutra.ckpt.plan — which boxes of which tensors a checkpoint holds, and which rank writes each.
--
--   local plan = require "lutra.ckpt.plan"
--   local mine = plan.local_plan(state.tensors)           -- this rank's boxes
--   local tensors, boxes = plan.assign({mine, theirs...})  -- the manifest's tensors, each box's owner
--
-- Each local tensor contributes the boxes lutra.dist.spec gives it (dup copies skipped). A box
-- held by several ranks (a dp-replicated parameter) is written once, by one of them (chosen
-- by a hash of the name and box, which spreads the bytes over the ranks). Every rank learns
-- every rank's boxes (an all_gather of the serialised plans: plan_text, gather_texts) so that
-- all agree on the owners and on the errors (a tensor whose pieces do not tile its global
-- shape fails on every rank).
local errors = require "lutra.errors"
local ops = require "lutra.ops"
local json = require "lutra.json"
local spec = require "lutra.dist.spec"
local ckpt_files = require "lutra.ckpt.files"

local M = {}
local raise, is_tensor = errors.raise, ops.is_tensor

-- This rank's boxes: {name, dtype, global, offset, shape, local_offset, tensor} per box it holds.
local function local_plan(tensors)
  if type(tensors) ~= "table" then raise("ckpt.save: state.tensors must be a list of {name =, tensor =}") end
  local plan, seen = {}, {}
  for i, e in ipairs(tensors) do
    if type(e) ~= "table" or type(e.name) ~= "string" or e.name == "" or not is_tensor(e.tensor) then
      raise(string.format("ckpt.save: state.tensors[%d] must be {name = <string>, tensor = <tensor>}", i))
    end
    if seen[e.name] then raise("ckpt.save: the tensor name '" .. e.name .. "' is given twice") end
    seen[e.name] = true
    local t = e.tensor
    if spec.owned(t) then
      for _, b in ipairs(spec.boxes(t)) do
        plan[#plan + 1] = {name = e.name, dtype = t.dtype, global = spec.global_shape(t), offset = b.offset,
                           shape = b.shape, local_offset = b.local_offset, tensor = t}
      end
    end
  end
  return plan
end

local function plan_text(plan)
  local out = {}
  for i, p in ipairs(plan) do
    out[i] = {name = p.name, dtype = p.dtype, global = json.array(p.global), offset = json.array(p.offset),
              shape = json.array(p.shape)}
  end
  return json.encode(json.array(out))
end

-- Every rank's plan text.
local function gather_texts(group, text)
  if not group then return {text} end
  return group:all_gather_text(text)
end

local function box_key(p) return p.name .. "|" .. table.concat(p.offset, ",") .. "|" .. table.concat(p.shape, ",") end

local function string_hash(s)
  local h = 5381
  for i = 1, #s do h = (h * 33 + s:byte(i)) % 4294967296 end
  return h
end

-- From every rank's plan: the manifest's tensors and, for each rank, the plan entries it writes.
local function assign(plans)
  local tensors, by_name, boxes = {}, {}, {}
  for r, plan in ipairs(plans) do
    for _, p in ipairs(plan) do
      local t = by_name[p.name]
      if not t then
        t = {name = p.name, dtype = p.dtype, shape = p.global, pieces = {}}
        by_name[p.name] = t
        tensors[#tensors + 1] = t
      elseif t.dtype ~= p.dtype or table.concat(t.shape, ",") ~= table.concat(p.global, ",") then
        raise(string.format("ckpt.save: tensor '%s' is %s {%s} on one rank and %s {%s} on rank %d", p.name, t.dtype,
          table.concat(t.shape, ", "), p.dtype, table.concat(p.global, ", "), r - 1))
      end
      local key = box_key(p)
      local b = boxes[key]
      if not b then
        b = {tensor = t, offset = p.offset, shape = p.shape, holders = {}}
        boxes[key] = b
        t.pieces[#t.pieces + 1] = b
      end
      b.holders[#b.holders + 1] = r - 1
    end
  end
  -- owners, and a check that the pieces tile each tensor (no overlap, nothing missing)
  for _, t in ipairs(tensors) do
    local total = 0
    for i, b in ipairs(t.pieces) do
      b.owner = b.holders[string_hash(box_key {name = t.name, offset = b.offset, shape = b.shape}) % #b.holders + 1]
      total = total + ckpt_files.numel(b.shape)
      for k = 1, i - 1 do
        local o = ckpt_files.intersect(b.offset, b.shape, t.pieces[k].offset, t.pieces[k].shape)
        if o then
          raise(string.format("ckpt.save: tensor '%s': the pieces at {%s} and {%s} overlap", t.name,
            table.concat(b.offset, ", "), table.concat(t.pieces[k].offset, ", ")))
        end
      end
    end
    if total ~= ckpt_files.numel(t.shape) then
      raise(string.format("ckpt.save: tensor '%s' {%s}: the ranks' pieces cover %d of its %d elements", t.name,
        table.concat(t.shape, ", "), total, ckpt_files.numel(t.shape)))
    end
  end
  return tensors, boxes
end

M.local_plan, M.plan_text, M.gather_texts, M.box_key, M.assign = local_plan, plan_text, gather_texts, box_key, assign

return M
