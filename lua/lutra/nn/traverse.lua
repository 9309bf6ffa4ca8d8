-- lutra.nn.traverse — walking a module tree: every module reachable from a root with its dotted
-- path, and the parameters or buffers found on the way. nn.Module's methods (parameters,
-- named_modules, ...) and the state dict (lutra.nn.state_dict) are built on these two.
local errors = require "lutra.errors"

local raise = errors.raise

local M = {}

-- Calls visit(module, prefix) for every module reachable from m, pre-order, each module
-- once (a module held twice is visited under its first path) unless all_paths is set.
local function walk(m, prefix, visit, seen, stack)
  if seen then
    if seen[m] then return end
    seen[m] = true
  else
    stack = stack or {}
    if stack[m] then raise("module: '" .. prefix:sub(1, -2) .. "' contains itself") end
    stack[m] = true
  end
  visit(m, prefix)
  for _, e in ipairs(m._entries) do
    if e.kind == "module" then
      local c = rawget(m, e.key)
      if c ~= nil then walk(c, prefix .. e.name .. ".", visit, seen, stack) end
    end
  end
  if stack then stack[m] = nil end
end

-- Lists of names and tensors of one kind, in traversal order: each tensor once (its
-- first name); for the state (state = true), every path of every module instead, and
-- only the persistent buffers.
local function collect(m, kind, state)
  local names, tensors, seen = {}, {}, {}
  walk(m, "", function(mod, prefix)
    for _, e in ipairs(mod._entries) do
      local t = rawget(mod, e.key)
      if e.kind == kind and t ~= nil and (seen[t] == nil or state) and (e.persistent or not state) then
        seen[t] = true
        names[#names + 1] = prefix .. e.name
        tensors[#tensors + 1] = t
      end
    end
  end, not state and {} or nil)
  return names, tensors
end

M.walk, M.collect = walk, collect

return M
