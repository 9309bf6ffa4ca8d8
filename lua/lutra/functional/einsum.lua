-- lutra.functional.einsum — Einstein summation over tensors, as torch.einsum.
--
--   F.einsum("bhtd,bhsd->bhts", q, k) -> y   (the tensors may also come as one list)
--
-- Each operand's subscript names its dims by letters (a-z, A-Z; spaces ignored); a letter in two
-- operands pairs those dims, and a letter left out of the output ("->...") is summed over. Without
-- "->" the output is, as torch's, the letters that appear once, in alphabetical order (capitals
-- first), after the "..." dims. "..." stands for the dims a subscript does not name; they broadcast
-- across operands (aligned from the right) and are kept in front, or where the output puts "...",
-- or summed when an explicit output leaves it out. A letter repeated in one operand takes the
-- diagonal ("ii->i", "ii" the trace). A size of 1 broadcasts against the letter's size elsewhere;
-- other mismatches are errors that name the letter.
--
-- The plan is torch's: per operand, diagonals (index_select over the flattened dims), then sums of
-- the letters no other operand and no output has; then the operands contract left to right, each
-- pair as one batched matmul of permuted and reshaped operands ((batch, kept by a, contracted) @
-- (batch, contracted, kept by b)); the result is permuted to the output's order. Every step is a
-- differentiable op with a path on either device, so gradients and CUDA come with it. Operands have
-- one dtype and device (no promotion).
local errors = require "lutra.errors"
local U = require "lutra.functional.util"
local ops = require "lutra.ops"
local create = require "lutra.create"
local index_select = require("lutra.functional.index_select").index_select

local M = {}

local raise = errors.raise
local is_tensor = ops.is_tensor
local ELL = "..." -- an ellipsis in a parsed subscript; its dims become the labels "...1", "...2", ...

local function show(label)
  if label:sub(1, 3) == ELL then return "'...' (its dim " .. label:sub(4) .. ")" end
  return "'" .. label .. "'"
end

-- a subscript's labels (ELL for "..."), and whether it has "..."
local function parse_term(term, eq)
  local labels, i, ell = {}, 1, false
  while i <= #term do
    local c = term:sub(i, i)
    if c == "." then
      if term:sub(i, i + 2) ~= ELL then raise("einsum: a '.' outside '...' in \"" .. eq .. "\"") end
      if ell then raise("einsum: '...' twice in the subscript '" .. term .. "'") end
      ell, i = true, i + 3
      labels[#labels + 1] = ELL
    elseif c:match("^%a$") then
      labels[#labels + 1], i = c, i + 1
    else
      raise(string.format("einsum: '%s' in \"%s\" is not a letter (subscripts are letters a-z, A-Z and '...')", c, eq))
    end
  end
  return labels, ell
end

-- the labels of each operand (ellipses expanded) and of the output
local function parse(eq, xs)
  eq = eq:gsub("%s", "")
  local lhs, rhs = eq:match("^(.-)%->(.*)$")
  if lhs == nil then lhs = eq end
  local terms = {}
  for term in (lhs .. ","):gmatch("([^,]*),") do terms[#terms + 1] = term end
  if #terms ~= #xs then
    raise(string.format("einsum: \"%s\" has %d operand subscripts, %d tensors were given", eq, #terms, #xs))
  end
  local inputs, ell_dims, E = {}, {}, 0
  for k, term in ipairs(terms) do
    local labels, ell = parse_term(term, eq)
    local named, nd = #labels - (ell and 1 or 0), xs[k].ndim
    if (ell and nd < named) or (not ell and nd ~= named) then
      raise(string.format("einsum: operand %d has %d dims, its subscript '%s' names %d", k, nd, term, named))
    end
    inputs[k], ell_dims[k] = labels, ell and nd - named or 0
    E = math.max(E, ell_dims[k])
  end
  local function expand(labels, e) -- ELL -> the last e of "...1" .. "...E"
    local out = {}
    for _, l in ipairs(labels) do
      if l == ELL then
        for j = E - e + 1, E do out[#out + 1] = ELL .. j end
      else
        out[#out + 1] = l
      end
    end
    return out
  end
  local count = {}
  for k = 1, #inputs do
    inputs[k] = expand(inputs[k], ell_dims[k])
    for _, l in ipairs(inputs[k]) do count[l] = (count[l] or 0) + 1 end
  end
  local output = {}
  if rhs == nil then -- implicit: the ellipsis dims, then the letters seen once, sorted
    local once = {}
    for l, c in pairs(count) do
      if c == 1 and l:sub(1, 3) ~= ELL then once[#once + 1] = l end
    end
    table.sort(once)
    output = expand({ELL}, E)
    for _, l in ipairs(once) do output[#output + 1] = l end
  else
    local labels = parse_term(rhs, eq)
    local seen = {}
    for _, l in ipairs(labels) do
      if l ~= ELL then
        if count[l] == nil then raise(string.format("einsum: the output's '%s' is in no operand of \"%s\"", l, eq)) end
        if seen[l] then raise(string.format("einsum: '%s' twice in the output of \"%s\"", l, eq)) end
        seen[l] = true
      end
    end
    output = expand(labels, E)
  end
  return inputs, output
end

local function position(list, v)
  for i = 1, #list do if list[i] == v then return i end end
  return nil
end

-- x with each label repeated in its subscript reduced to the diagonal; labels as they are left
local function diagonals(x, labels, k)
  while true do
    local rep
    for i = 1, #labels do
      if position(labels, labels[i]) ~= i then rep = labels[i] break end
    end
    if rep == nil then return x, labels end
    local others, other_labels, at, sizes = {}, {}, {}, {}
    for i = 1, #labels do
      if labels[i] == rep then
        at[#at + 1] = i - 1
      else
        others[#others + 1], other_labels[#other_labels + 1] = i - 1, labels[i]
        sizes[#sizes + 1] = x:size(i - 1)
      end
    end
    local n = x:size(at[1])
    for _, d in ipairs(at) do
      if x:size(d) ~= n then
        raise(string.format("einsum: %s repeats in operand %d with sizes %d and %d", show(rep), k, n, x:size(d)))
      end
    end
    local perm, flat, step = {}, 1, 0
    for _, d in ipairs(others) do perm[#perm + 1] = d end
    for _, d in ipairs(at) do
      perm[#perm + 1] = d
      step, flat = step + flat, flat * n -- step = 1 + n + ... + n^(m-1): from [i, ..., i] to [i+1, ..., i+1]
    end
    sizes[#sizes + 1] = flat
    x = x:permute(perm):reshape(sizes)
    local at_diagonal = create.arange(0, math.max(flat, 1), step, {dtype = "i64", device = x.device}):narrow(0, 0, n)
    x = index_select(x, -1, at_diagonal)
    other_labels[#other_labels + 1] = rep
    labels = other_labels
  end
end

-- x summed over the dims of the labels `drop` says to drop
local function sum_out(x, labels, drop)
  local dims, kept = {}, {}
  for i, l in ipairs(labels) do
    if drop(l) then dims[#dims + 1] = i - 1 else kept[#kept + 1] = l end
  end
  if #dims == 0 then return x, labels end
  return x:sum(dims), kept
end

local function product(sizes, labels)
  local p = 1
  for _, l in ipairs(labels) do p = p * sizes[l] end
  return p
end

-- a (labels la) and b (lb) contracted over their common labels outside `keep`
local function contract(a, la, b, lb, keep, size)
  local batch, contracted, a_only, b_only = {}, {}, {}, {}
  for _, l in ipairs(la) do
    if position(lb, l) then
      if keep[l] then batch[#batch + 1] = l else contracted[#contracted + 1] = l end
    else
      a_only[#a_only + 1] = l
    end
  end
  for _, l in ipairs(lb) do
    if not position(la, l) then b_only[#b_only + 1] = l end
  end
  local function arrange(x, labels, first, second, third) -- permuted to first ++ second ++ third, 3-d
    local perm = {}
    for _, group in ipairs {first, second, third} do
      for _, l in ipairs(group) do perm[#perm + 1] = position(labels, l) - 1 end
    end
    if #perm > 0 then x = x:permute(perm) end
    return x:reshape(product(size, first), product(size, second), product(size, third))
  end
  local y = ops.matmul(arrange(a, la, batch, a_only, contracted), arrange(b, lb, batch, contracted, b_only))
  local labels, sizes = {}, {}
  for _, group in ipairs {batch, a_only, b_only} do
    for _, l in ipairs(group) do
      labels[#labels + 1], sizes[#sizes + 1] = l, size[l]
    end
  end
  return y:reshape(sizes), labels
end

function M.einsum(eq, ...)
  if type(eq) ~= "string" then raise("einsum: the equation must be a string, got " .. type(eq)) end
  local xs = {...}
  if #xs == 1 and type(xs[1]) == "table" and not is_tensor(xs[1]) then xs = {unpack(xs[1])} end -- not the caller's
  if #xs == 0 then raise("einsum: no operands given") end
  for k, x in ipairs(xs) do
    U.need("einsum", "operand " .. k, x)
    if x.dtype ~= xs[1].dtype or x.device ~= xs[1].device then
      raise(string.format("einsum: operand %d is %s on %s, operand 1 is %s on %s (no promotion)", k, x.dtype, x.device,
        xs[1].dtype, xs[1].device))
    end
  end
  local inputs, output = parse(eq, xs)
  -- diagonals first, then every label's size (1 broadcasts)
  local size, seen_in = {}, {}
  for k = 1, #xs do
    xs[k], inputs[k] = diagonals(xs[k], inputs[k], k)
    for i, l in ipairs(inputs[k]) do
      local s = xs[k]:size(i - 1)
      if size[l] == nil or size[l] == 1 then
        size[l], seen_in[l] = s, k
      elseif s ~= 1 and s ~= size[l] then
        raise(string.format("einsum: %s has size %d in operand %d and %d in operand %d", show(l), size[l], seen_in[l],
          s, k))
      end
    end
  end
  local in_output, uses = {}, {}
  for _, l in ipairs(output) do in_output[l] = true end
  for k = 1, #xs do
    for _, l in ipairs(inputs[k]) do uses[l] = (uses[l] or 0) + 1 end
  end
  -- sizes of 1 expanded to the letter's size; letters no one else needs summed
  for k = 1, #xs do
    local x, labels, full, grow = xs[k], inputs[k], {}, false
    for i, l in ipairs(labels) do
      full[i] = size[l]
      if x:size(i - 1) ~= size[l] then grow = true end
    end
    if grow then x = x:expand(full) end
    xs[k], inputs[k] = sum_out(x, labels, function(l) return uses[l] == 1 and not in_output[l] end)
  end
  local y, labels = xs[1], inputs[1]
  for k = 2, #xs do
    local keep = {}
    for l in pairs(in_output) do keep[l] = true end
    for j = k + 1, #xs do
      for _, l in ipairs(inputs[j]) do keep[l] = true end
    end
    y, labels = sum_out(y, labels, function(l) return not keep[l] and not position(inputs[k], l) end)
    y, labels = contract(y, labels, xs[k], inputs[k], keep, size)
  end
  if #output == 0 then return y:reshape({}) end
  local perm = {}
  for i, l in ipairs(output) do perm[i] = position(labels, l) - 1 end
  return y:permute(perm) -- a view even where the order is already the output's, as torch's
end

return M
