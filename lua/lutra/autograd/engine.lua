-- lutra.autograd.engine — runs backward over the recorded graph.
--
-- run(roots, grads, opts): roots are records (nodes or leaf records), grads their
-- gradients. The records reachable from the roots are counted (how many edges point at
-- each), then processed in dependency order: a record runs once every gradient that
-- flows into it has been summed. Leaves accumulate into .grad; nodes call their class's
-- backward and pass the results on along their edges.
--
-- Memory: backward formulas run with grad mode off and with the memory module noting
-- every tensor they make. What a node's formula made and did not return is freed as soon
-- as it returns; a gradient is freed once every record it was handed to has used it
-- (unless it escaped: kept as a leaf's .grad, retained, or shown to a hook). Saved
-- tensors are dropped after their node ran (aliases autograd made are freed), unless
-- retain_graph.
local lt = require "lutra.ffi"
local S = require "lutra.autograd.state"
local memory = require "lutra.memory"
local errors = require "lutra.errors"
local ops = require "lutra.ops"
local shape = require "lutra.shape"
local C = lt.C

local M = {}

local raise = errors.raise
local is_tensor = ops.is_tensor
local pairs, type = pairs, type

M.FREED = "backward: trying to backward through the graph a second time (or to use saved tensors after "
  .. "they were freed): saved values are freed when backward runs; pass {retain_graph = true} to the "
  .. "first backward to keep them"

-- The value a backward may return for an edge whose gradient it delivered itself.
M.DELIVERED = setmetatable({}, {__tostring = function() return "delivered" end})
local DELIVERED = M.DELIVERED


local function same_shape(a, b)
  local n = a.ndim
  if n ~= b.ndim then return false end
  for d = 0, n - 1 do
    if a.shape_[d] ~= b.shape_[d] then return false end
  end
  return true
end
M.same_shape = same_shape

-- Checks a node's saved tensors before its backward uses them.
local function check_saved(node)
  local cls = node.cls
  local saves, vers = cls.saves, cls.versions
  for i = 1, #saves do
    local t = node[saves[i]]
    if t ~= nil then
      if t.storage == nil then
        raise(string.format("backward: a tensor saved for backward (%s of %s) was freed (by free() or lutra.tidy) "
          .. "before backward ran", saves[i], cls.name))
      end
      if S.modified(t, node[vers[i]]) then
        raise(string.format("backward: a tensor needed for backward was modified in place: %s of %s; compute "
          .. "it out of place (x = x + y rather than x:add_(y)) or clone() it before modifying", saves[i],
          cls.name))
      end
    end
  end
end
M.check_saved = check_saved

-- Drops a node's saved tensors (freeing the aliases autograd made for it).
local function release(node)
  local cls = node.cls
  local saves = cls.saves
  for i = 1, #saves do
    local f = saves[i]
    local t = node[f]
    if t ~= nil then
      node[f] = nil
      if t.view_ == 2 then t:free() end -- an alias autograd made (S.alias)
    end
  end
  if cls.release then cls.release(node) end
  if #saves > 0 or cls.release then node.freed = true end
end
M.release = release

local function call_hooks(rec, g, escaped)
  local hooks = rec.hooks
  for i = 1, #hooks do
    local fn = hooks[i]
    if fn then
      escaped[g] = true
      local owner = memory.set_owner(nil)
      local ok, r = pcall(fn, g)
      memory.set_owner(owner)
      if not ok then error(r, 0) end
      if r ~= nil then
        if not is_tensor(r) or not same_shape(r, g) then
          raise("backward: a hook returned " .. (is_tensor(r) and ("a tensor of shape " .. shape.shape_string(r))
            or type(r)) .. ", expected nil or a tensor of the gradient's shape " .. shape.shape_string(g))
        end
        g = r
        escaped[g] = true
      end
    end
  end
  return g
end

-- One backward pass. opts: retain_graph, capture (records -> true: their gradients are
-- returned, and leaves' .grad are left alone), owned (the root gradients autograd made).
function M.run(roots, root_grads, opts)
  opts = opts or {}
  local retain, capture = opts.retain_graph, opts.capture
  local deps, grads, uses, owned, escaped = {}, {}, {}, {}, {}
  local captured = capture and {} or nil

  -- count the edges into every reachable record
  local stack, seen = {}, {}
  for i = 1, #roots do
    local r = roots[i]
    if not seen[r] then
      seen[r] = true
      stack[#stack + 1] = r
    end
  end
  while #stack > 0 do
    local rec = stack[#stack]
    stack[#stack] = nil
    if not rec.leaf then
      local i, e = 1, rec[1]
      while e ~= nil do
        if e then
          deps[e] = (deps[e] or 0) + 1
          if not seen[e] then
            seen[e] = true
            stack[#stack + 1] = e
          end
        end
        i = i + 1
        e = rec[i]
      end
    end
  end

  local function drop(t) -- one holder of gradient t is done with it
    local n = uses[t] - 1
    uses[t] = n
    if n == 0 and owned[t] and not escaped[t] then t:free() end
  end

  -- exclusively ours: can be summed into in place
  local function exclusive(t)
    return owned[t] and uses[t] == 1 and not escaped[t] and t.storage ~= nil and t.storage.refcount == 1
      and C.lt_is_contiguous(t) ~= 0
  end

  local function put(rec, g, from)
    local cur = grads[rec]
    if cur == nil then
      grads[rec] = g
      uses[g] = (uses[g] or 0) + 1
      return
    end
    if not same_shape(cur, g) then
      raise(string.format("backward: internal error: %s gave a gradient of shape %s where %s was expected",
        from, shape.shape_string(g), shape.shape_string(cur)))
    end
    if exclusive(cur) then
      ops.add(cur, g, cur)
    else
      local sum = ops.add(cur, g)
      owned[sum] = true
      grads[rec] = sum
      uses[sum] = 1
      drop(cur)
    end
    if uses[g] == nil and owned[g] and not escaped[g] then g:free() end
  end

  for i = 1, #roots do
    local g = root_grads[i]
    if opts.owned and opts.owned[g] then owned[g] = true end
    put(roots[i], g, "the root")
  end

  local ready, nready = {}, 0
  for i = 1, #roots do
    local r = roots[i]
    if deps[r] == nil and not ready[r] then
      ready[r] = true
      nready = nready + 1
      ready[nready] = r
    end
  end

  local function accumulate_leaf(rec, g)
    if capture then
      if capture[rec] then captured[rec] = g; escaped[g] = true end
      return
    end
    local cur = rec.grad
    if cur == nil then
      if owned[g] and uses[g] == 1 and not escaped[g] and g.storage.refcount == 1 and C.lt_is_contiguous(g) ~= 0 then
        rec.grad = g -- steal it
      else
        rec.grad = g:contiguous()
        if rec.grad == g then rec.grad = g:clone() end
      end
      escaped[rec.grad] = true
      memory.keep(rec.grad)
    else
      ops.add(cur, g, cur)
    end
  end

  local function process(rec)
    local g = grads[rec]
    grads[rec] = nil
    if rec.leaf then
      if g ~= nil then
        if rec.hooks then g = call_hooks(rec, g, escaped) end
        accumulate_leaf(rec, g)
        local post = rec.post_accumulate
        if post and not capture then
          for i = 1, #post do
            if post[i] then post[i](rec.grad) end
          end
        end
      end
    else
      local cls = rec.cls
      if rec.freed then raise(M.FREED) end
      local g1, g2, g3
      if g ~= nil or cls.always then
        if g ~= nil and rec.hooks then g = call_hooks(rec, g, escaped) end
        if g ~= nil and rec.retains then
          rec.grad = g
          escaped[g] = true
          memory.keep(g)
        end
        if cls.keeps_grad and g ~= nil then escaped[g] = true end
        if capture and capture[rec] and g ~= nil then
          captured[rec] = g
          escaped[g] = true
        end
        check_saved(rec)
        local made = {}
        local owner = memory.set_owner(made)
        g1, g2, g3 = cls.backward(rec, g)
        memory.set_owner(owner)
        if type(g1) == "table" and g1 ~= DELIVERED then -- a list, one entry per edge
          for k, t in pairs(g1) do
            if is_tensor(t) and made[t] then made[t] = nil; owned[t] = true end
          end
        else
          if g1 ~= nil and g1 ~= DELIVERED and made[g1] then made[g1] = nil; owned[g1] = true end
          if g2 ~= nil and g2 ~= DELIVERED and made[g2] then made[g2] = nil; owned[g2] = true end
          if g3 ~= nil and g3 ~= DELIVERED and made[g3] then made[g3] = nil; owned[g3] = true end
        end
        for t in pairs(made) do -- the formula's temporaries
          if t.storage ~= nil then t:free() end
        end
      end
      if not retain then release(rec) end
      local list = type(g1) == "table" and g1 ~= DELIVERED and g1 or nil
      local i, e = 1, rec[1]
      while e ~= nil do
        if e then
          local gi
          if list then gi = list[i] elseif i == 1 then gi = g1 elseif i == 2 then gi = g2 else gi = g3 end
          if gi ~= nil and gi ~= DELIVERED then put(e, gi, cls.name) end
          local n = deps[e] - 1
          deps[e] = n
          if n == 0 then
            nready = nready + 1
            ready[nready] = e
          end
        end
        i = i + 1
        e = rec[i]
      end
    end
    if g ~= nil and uses[g] ~= nil then drop(g) end
  end

  local enabled, retaining = S.enabled, S.retain_graph
  local owner = memory.set_owner(nil)
  S.enabled = false
  S.retain_graph = retain and true or false -- formulas may reuse saved buffers unless set
  local ok, err = pcall(function()
    while nready > 0 do
      local rec = ready[nready]
      ready[nready] = nil
      nready = nready - 1
      process(rec)
    end
  end)
  S.enabled, S.retain_graph = enabled, retaining
  memory.set_owner(owner)
  if not ok then
    for _, g in pairs(grads) do
      if owned[g] and not escaped[g] and g.storage ~= nil then g:free() end
    end
    error(err, 0)
  end
  return captured
end

return M
