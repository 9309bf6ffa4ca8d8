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
--
-- create_graph (gradients of gradients): the formulas run with grad mode on, each node's
-- saved aliases connected to the records of the tensors they stand for (the alias takes that
-- record while the formula runs), so the gradients are recorded results that a later backward
-- differentiates. An op declares a formula made of recorded ops for this (lutra/autograd/op.lua:
-- twice_differentiable, double_backward); one that does not runs its plain formula, and its
-- gradients carry a node that raises, naming the op, if a gradient ever reaches it. Nothing is
-- freed or summed in place in this mode (the new graph may hold any tensor the formulas made),
-- and the graph is retained unless retain_graph = false.
local lt = require "lutra.ffi"
local S = require "lutra.autograd.state"
local memory = require "lutra.memory"
local errors = require "lutra.errors"
local ops = require "lutra.ops"
local shape = require "lutra.shape"
local fields = require "lutra.tensor.fields"
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

-- The node a not twice-differentiable op's gradients carry under create_graph: raises its
-- message if backward reaches it.
local unsupported_cls = {name = "DoubleBackwardUnsupported", saves = {}, versions = {}, sources = {},
  backward = function(n) raise(n.message) end}
unsupported_cls.double_backward = unsupported_cls.backward

local same_shape = fields.same_shape
M.same_shape = same_shape

-- Checks a node's saved tensors before its backward uses them.
local function check_saved(node)
  local cls = node.cls
  local saves, vers = cls.saves, cls.versions
  for i = 1, #saves do
    local t = node[saves[i]]
    if t ~= nil then
      if fields.is_freed(t) then
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
      if fields.view_kind(t) == fields.SAVED_ALIAS then t:free() end -- an alias autograd made (S.alias)
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
      local ok, r = errors.pcall(fn, g)
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

-- ---- one backward pass ------------------------------------------------------------------------
-- A pass: deps (record -> edges into it not yet processed), grads (record -> its summed
-- gradient so far), uses (gradient -> how many holders still need it), owned (gradients
-- autograd made, which it may free or sum into), escaped (gradients someone else keeps),
-- captured (for grad(): record -> gradient), ready (a stack of records whose gradients
-- are complete).

-- Counts the edges into every record reachable from the roots (not past the records where the
-- pass stops).
local function count_edges(pass, roots)
  local deps, stack, seen, stop = pass.deps, {}, {}, pass.stop
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
    if not rec.leaf and not (stop and stop[rec]) then
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
end

-- One holder of gradient t is done with it.
local function drop(pass, t)
  local uses = pass.uses
  local n = uses[t] - 1
  uses[t] = n
  if n == 0 and pass.owned[t] and not pass.escaped[t] then t:free() end
end

-- Exclusively ours: can be summed into in place.
local function exclusive(pass, t)
  return pass.owned[t] and pass.uses[t] == 1 and not pass.escaped[t] and not fields.is_freed(t)
    and fields.storage_refs(t) == 1 and C.lt_is_contiguous(t) ~= 0
end

-- Adds gradient g (from the node named `from`) to rec's.
local function put(pass, rec, g, from)
  local grads, uses, owned = pass.grads, pass.uses, pass.owned
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
  if pass.create then -- recorded, out of place: cur may be saved by the new graph
    grads[rec] = ops.add(cur, g)
    uses[grads[rec]] = 1
    return
  end
  if exclusive(pass, cur) then
    ops.add(cur, g, cur)
  else
    local sum = ops.add(cur, g)
    owned[sum] = true
    grads[rec] = sum
    uses[sum] = 1
    drop(pass, cur)
  end
  if uses[g] == nil and owned[g] and not pass.escaped[g] then g:free() end
end

local function push_ready(pass, rec)
  local n = pass.nready + 1
  pass.nready = n
  pass.ready[n] = rec
end

-- The roots' gradients put in place, and the roots nothing else depends on made ready.
local function seed(pass, roots, root_grads, given_owned)
  for i = 1, #roots do
    local g = root_grads[i]
    if given_owned and given_owned[g] and not pass.create then pass.owned[g] = true end
    put(pass, roots[i], g, "the root")
  end
  local queued = {}
  for i = 1, #roots do
    local r = roots[i]
    if pass.deps[r] == nil and not queued[r] then
      queued[r] = true
      push_ready(pass, r)
    end
  end
end

-- A leaf's gradient: captured (grad()), or accumulated into its .grad.
local function accumulate_leaf(pass, rec, g)
  local owned, uses, escaped = pass.owned, pass.uses, pass.escaped
  if pass.capture then
    if pass.capture[rec] then pass.captured[rec] = g; escaped[g] = true end
    return
  end
  local cur = rec.grad
  if pass.create then -- recorded: a copy of g first (g may be another tensor's too), then sums
    rec.grad = cur == nil and g:clone() or ops.add(cur, g)
    memory.keep(rec.grad)
    return
  end
  if cur == nil then
    if owned[g] and uses[g] == 1 and not escaped[g] and fields.storage_refs(g) == 1 and C.lt_is_contiguous(g) ~= 0 then
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

local function process_leaf(pass, rec, g)
  if g == nil then return end
  if rec.hooks then g = call_hooks(rec, g, pass.escaped) end
  accumulate_leaf(pass, rec, g)
  local post = rec.post_accumulate
  if post and not pass.capture then
    for i = 1, #post do
      if post[i] then post[i](rec.grad) end
    end
  end
end

-- Before a node's backward: hooks, retain_grad, capture of its gradient.
local function observe(pass, rec, g)
  local escaped = pass.escaped
  if rec.hooks then g = call_hooks(rec, g, escaped) end
  if rec.retains then
    rec.grad = g
    escaped[g] = true
    memory.keep(g)
  end
  if rec.cls.keeps_grad then escaped[g] = true end
  if pass.capture and pass.capture[rec] then
    pass.captured[rec] = g
    escaped[g] = true
  end
  return g
end

-- Runs the node's backward formula, noting the tensors it made: those it returns become the
-- pass's (owned), the others are freed at once.
local function run_formula(pass, rec, g)
  check_saved(rec)
  local made = {}
  local owner = memory.set_owner(made)
  local g1, g2, g3 = rec.cls.backward(rec, g)
  memory.set_owner(owner)
  local owned = pass.owned
  if type(g1) == "table" and g1 ~= DELIVERED then -- a list, one entry per edge
    for _, t in pairs(g1) do
      if is_tensor(t) and made[t] then made[t] = nil; owned[t] = true end
    end
  else
    if g1 ~= nil and g1 ~= DELIVERED and made[g1] then made[g1] = nil; owned[g1] = true end
    if g2 ~= nil and g2 ~= DELIVERED and made[g2] then made[g2] = nil; owned[g2] = true end
    if g3 ~= nil and g3 ~= DELIVERED and made[g3] then made[g3] = nil; owned[g3] = true end
  end
  for t in pairs(made) do -- the formula's temporaries
    if not fields.is_freed(t) then t:free() end
  end
  local anomaly = S.anomaly -- lutra.detect_anomaly: the first gradient holding a nan or inf
  if anomaly ~= nil then anomaly.backward(rec, g1, g2, g3, DELIVERED) end
  return g1, g2, g3
end

-- ---- create_graph -------------------------------------------------------------------------

-- The node's saved aliases made records again (those of the tensors they stand for: an alias
-- with no "src_" field holds the node's own result) while its formula runs; listed in
-- pass.connected until disconnect.
local function connect(pass, node)
  local cls = node.cls
  local saves, sources, list = cls.saves, cls.sources, pass.connected
  for i = 1, #saves do
    local t = node[saves[i]]
    if t ~= nil and fields.view_kind(t) == fields.SAVED_ALIAS then
      S.set_record(t, node[sources[i]] or node)
      fields.set_autograd_state(t, fields.RECORDED)
      list[#list + 1] = t
    end
  end
end

local function disconnect(pass)
  local list = pass.connected
  for i = #list, 1, -1 do
    local t = list[i]
    list[i] = nil
    if not fields.is_freed(t) then
      S.set_record(t, nil)
      fields.set_autograd_state(t, fields.UNTRACKED)
    end
  end
end

-- What a backward that is not made of recorded ops returned, each tensor replaced by a view of
-- it that carries a node raising, naming the op, if a gradient of the gradient reaches it.
local function unsupported(cls, g1, g2, g3)
  local hint = cls.no_double and ("; " .. cls.no_double) or ""
  local what = cls.op and (cls.op .. " (" .. cls.name .. ")") or cls.name
  local message = what .. ": double backward is not supported (its backward is a fused kernel, not recorded ops)"
    .. hint
  local function mark(t) -- a node each: the gradients have different shapes
    if not is_tensor(t) then return t end
    return S.attach(S.share(t), {cls = unsupported_cls, message = message})
  end
  if type(g1) == "table" and g1 ~= DELIVERED then
    local list = {}
    for k, t in pairs(g1) do list[k] = mark(t) end
    return list
  end
  return mark(g1), mark(g2), mark(g3)
end

-- The node's gradients, recorded (create_graph): its double_backward with the saved tensors
-- connected, or its plain backward with grad mode off and the result marked unsupported.
local function run_formula_graph(pass, rec, g)
  check_saved(rec)
  local cls = rec.cls
  local fn, g1, g2, g3 = cls.double_backward, nil, nil, nil
  if fn then
    connect(pass, rec)
    g1, g2, g3 = fn(rec, g)
    disconnect(pass)
  else
    S.enabled = false
    g1, g2, g3 = cls.backward(rec, g)
    S.enabled = true
    g1, g2, g3 = unsupported(cls, g1, g2, g3)
  end
  local anomaly = S.anomaly
  if anomaly ~= nil then anomaly.backward(rec, g1, g2, g3, DELIVERED) end
  return g1, g2, g3
end

-- Hands the formula's gradients on along the node's edges; edges whose gradients are now
-- complete become ready.
local function pass_on(pass, rec, g1, g2, g3)
  local deps, name = pass.deps, rec.cls.name
  local list = type(g1) == "table" and g1 ~= DELIVERED and g1 or nil
  local i, e = 1, rec[1]
  while e ~= nil do
    if e then
      local gi
      if list then gi = list[i] elseif i == 1 then gi = g1 elseif i == 2 then gi = g2 else gi = g3 end
      if gi ~= nil and gi ~= DELIVERED then put(pass, e, gi, name) end
      local n = deps[e] - 1
      deps[e] = n
      if n == 0 then push_ready(pass, e) end
    end
    i = i + 1
    e = rec[i]
  end
end

local function process_node(pass, rec, g)
  if pass.stop and pass.stop[rec] then -- the pass ends here: the gradient is captured, not passed on
    if g ~= nil then observe(pass, rec, g) end
    return
  end
  if rec.freed then raise(M.FREED) end
  local g1, g2, g3
  if g ~= nil or rec.cls.always then
    if g ~= nil then g = observe(pass, rec, g) end
    if pass.create then
      g1, g2, g3 = run_formula_graph(pass, rec, g)
    else
      g1, g2, g3 = run_formula(pass, rec, g)
    end
  end
  if not pass.retain then release(rec) end
  pass_on(pass, rec, g1, g2, g3)
end

local function process(pass, rec)
  local g = pass.grads[rec]
  pass.grads[rec] = nil
  if rec.leaf then
    process_leaf(pass, rec, g)
  else
    process_node(pass, rec, g)
  end
  if g ~= nil and pass.uses[g] ~= nil then drop(pass, g) end
end

local function drain(pass)
  local ready = pass.ready
  while pass.nready > 0 do
    local rec = ready[pass.nready]
    ready[pass.nready] = nil
    pass.nready = pass.nready - 1
    process(pass, rec)
  end
end

-- Runs the pass with grad mode off (on for create_graph) and the retain_graph setting visible
-- to the formulas; on an error, the gradients the pass owns are freed.
local function run_guarded(pass)
  local enabled, retaining = S.enabled, S.retain_graph
  local owner = memory.set_owner(nil)
  S.enabled = pass.create
  -- formulas may reuse saved buffers unless set (under create_graph the new graph may hold them)
  S.retain_graph = (pass.retain or pass.create) and true or false
  local ok, err = errors.pcall(drain, pass)
  S.enabled, S.retain_graph = enabled, retaining
  memory.set_owner(owner)
  if pass.create then disconnect(pass) end
  if not ok then
    for _, g in pairs(pass.grads) do
      if pass.owned[g] and not pass.escaped[g] and not fields.is_freed(g) then g:free() end
    end
    error(err, 0)
  end
end

-- One backward pass. opts: retain_graph, capture (records -> true: their gradients are
-- returned, and leaves' .grad are left alone), owned (the root gradients autograd made),
-- create_graph (record the formulas; retain_graph then defaults to true), stop_at_capture (the
-- captured records' own backward does not run: the pass ends at them).
function M.run(roots, root_grads, opts)
  opts = opts or {}
  local create = opts.create_graph and true or false
  local retain = opts.retain_graph
  if create and retain == nil then retain = true end
  local pass = {deps = {}, grads = {}, uses = {}, owned = {}, escaped = {}, ready = {}, nready = 0,
                retain = retain, capture = opts.capture, captured = opts.capture and {} or nil, create = create,
                connected = create and {} or nil, stop = opts.stop_at_capture and opts.capture or nil}
  count_edges(pass, roots)
  seed(pass, roots, root_grads, opts.owned)
  run_guarded(pass)
  return pass.captured
end

return M
