-- lutra.functional.repeat_interleave — each slice repeated in place, as torch's repeat_interleave.
--
--   F.repeat_interleave(x, repeats, dim, output_size) -> y
--       repeats: a number (every slice that many times), or per slice an i32/i64 tensor (1-d with
--       one count per slice of dim, or one count for all) or a list of counts; counts are >= 0.
--       dim nil: x is flattened first (as torch). output_size, when given, must be the total.
--   F.repeat_interleave(counts) -> indices   the one-argument form: 0, 1, 2, ... each repeated
--       counts[i] times (i64), as torch.repeat_interleave(repeats)
--
-- y is x:index_select(dim, index) for the repeated index (made on x's device), so it runs where
-- index_select does and its gradient is index_select's: the copies' gradients summed in order. A
-- tensor of counts is read to the host (a wait on a GPU), as torch's unless output_size is given.
local errors = require "lutra.errors"
local U = require "lutra.functional.util"
local ops = require "lutra.ops"
local create = require "lutra.create"
local index_select = require("lutra.functional.index_select").index_select

local M = {}

local raise, int_arg = errors.raise, errors.int_arg
local need, is_tensor = U.need, ops.is_tensor

-- the counts as a Lua list (n of them: one given count stands for all)
local function counts_of(repeats, n)
  local list
  if is_tensor(repeats) then
    if repeats.dtype ~= "i64" and repeats.dtype ~= "i32" then
      raise("repeat_interleave: repeats must be an i32 or i64 tensor, got " .. repeats.dtype)
    end
    if repeats.ndim > 1 then raise("repeat_interleave: repeats must be 0-d or 1-d, got " .. repeats.ndim .. " dims") end
    list = repeats.ndim == 0 and {repeats:item()} or repeats:tolist()
  elseif type(repeats) == "table" then
    list = repeats
  else
    raise("repeat_interleave: repeats must be a number, a tensor or a list of counts, got " .. type(repeats))
  end
  for i = 1, #list do
    local c = list[i]
    if type(c) ~= "number" or c ~= math.floor(c) or c < 0 then
      raise(string.format("repeat_interleave: repeats[%d] is %s, expected a non-negative integer", i - 1, tostring(c)))
    end
  end
  if #list == 1 and n ~= 1 then
    local all = {}
    for i = 1, n do all[i] = list[1] end
    return all
  end
  if #list ~= n then raise(string.format("repeat_interleave: %d repeats for %d slices along dim", #list, n)) end
  return list
end

-- i64 indices 0 .. #counts-1, each repeated counts[i] times, on `device`
local function repeated_index(counts, device)
  local idx = {}
  for i = 1, #counts do
    for _ = 1, counts[i] do idx[#idx + 1] = i - 1 end
  end
  if #idx == 0 then return create.zeros({0}, {dtype = "i64", device = device}) end
  return create.tensor(idx, {dtype = "i64"}):to(device)
end

function M.repeat_interleave(x, repeats, dim, output_size)
  need("repeat_interleave", "x", x)
  if repeats == nil then -- the one-argument form: x holds the counts
    return repeated_index(counts_of(x, x.ndim == 0 and 1 or x:size(0)), x.device)
  end
  int_arg("repeat_interleave", dim, "dim", true)
  int_arg("repeat_interleave", output_size, "output_size", true)
  if dim == nil then
    x, dim = x:reshape(-1), 0
  elseif x.ndim == 0 or dim < -x.ndim or dim >= x.ndim then
    raise(string.format("repeat_interleave: dim %d out of range for a %d-d tensor", dim, x.ndim))
  end
  local n = x:size(dim)
  local index
  if type(repeats) == "number" then
    int_arg("repeat_interleave", repeats, "repeats")
    if repeats < 0 then raise("repeat_interleave: repeats must be non-negative, got " .. repeats) end
    index = create.arange(n, {dtype = "i64", device = x.device}):unsqueeze(1):expand(n, repeats):reshape(-1)
  else
    index = repeated_index(counts_of(repeats, n), x.device)
  end
  if output_size ~= nil and output_size ~= index:numel() then
    raise(string.format("repeat_interleave: output_size is %d, the repeats make %d", output_size, index:numel()))
  end
  return index_select(x, dim, index)
end

return M
