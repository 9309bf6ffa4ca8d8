-- lutra.functional.split — a tensor cut into views along one dim, as torch's split, chunk and unbind.
--
--   F.split(x, size, dim)       -> {views}  pieces of `size` along dim (the last may be shorter), or
--                                           of the sizes in a list (size = {2, 3, 1}, summing to dim's)
--   F.chunk(x, chunks, dim)     -> {views}  torch's chunk: pieces of ceil(n / chunks), so there may be
--                                           fewer than `chunks` of them
--   F.unbind(x, dim)            -> {views}  every index along dim, that dim removed
--
-- dim defaults to 0 and may be negative. The results are a Lua list (local a, b = unpack(x:split(2)))
-- of views sharing x's storage (narrow, select): gradients flow back to x through each, and a write
-- into a piece writes into x. Each piece is its own view node, so the backward of n pieces writes n
-- gradients of x's size (cheap for a few pieces; for many, index x instead).
local errors = require "lutra.errors"
local U = require "lutra.functional.util"

local M = {}

local raise, int_arg = errors.raise, errors.int_arg
local need = U.need

-- dim (default 0) as a non-negative dim of x, and x's size along it
local function dim_of(name, x, dim)
  dim = int_arg(name, dim, "dim", true) or 0
  local n = x.ndim
  if n == 0 then raise(name .. ": expects a tensor with at least one dim, got a 0-d tensor") end
  if dim < -n or dim >= n then raise(string.format("%s: dim %d out of range for a %d-d tensor", name, dim, n)) end
  if dim < 0 then dim = dim + n end
  return dim, x:size(dim)
end

-- views of x along dim, of the given sizes in order (they sum to the dim's size)
local function pieces(x, dim, sizes)
  local out, start = {}, 0
  for i = 1, #sizes do
    out[i] = x:narrow(dim, start, sizes[i])
    start = start + sizes[i]
  end
  return out
end

function M.split(x, size, dim)
  need("split", "x", x)
  local d, n = dim_of("split", x, dim)
  local sizes = {}
  if type(size) == "table" then
    local total = 0
    for i = 1, #size do
      local s = size[i]
      if type(s) ~= "number" or s ~= math.floor(s) or s < 0 then
        raise(string.format("split: size %d is %s, expected a non-negative integer", i, tostring(s)))
      end
      sizes[i], total = s, total + s
    end
    if total ~= n then
      raise(string.format("split: the sizes {%s} sum to %d, expected dim %d's size %d", table.concat(size, ", "),
        total, d, n))
    end
    return pieces(x, d, sizes)
  end
  int_arg("split", size, "size (a number or a list of sizes)")
  if size < 0 then raise("split: size must be non-negative, got " .. size) end
  if size == 0 and n > 0 then
    raise(string.format("split: size can be 0 only where dim %d is empty (it has %d)", d, n))
  end
  local count = size == 0 and 1 or math.max(math.ceil(n / size), 1)
  for i = 1, count do sizes[i] = math.min(size, n - (i - 1) * size) end
  return pieces(x, d, sizes)
end

function M.chunk(x, chunks, dim)
  need("chunk", "x", x)
  int_arg("chunk", chunks, "chunks")
  if chunks < 1 then raise("chunk: chunks must be at least 1, got " .. chunks) end
  local d, n = dim_of("chunk", x, dim)
  if n == 0 then -- as torch: `chunks` empty pieces
    local sizes = {}
    for i = 1, chunks do sizes[i] = 0 end
    return pieces(x, d, sizes)
  end
  return M.split(x, math.ceil(n / chunks), d)
end

function M.unbind(x, dim)
  need("unbind", "x", x)
  local d, n = dim_of("unbind", x, dim)
  local out = {}
  for i = 1, n do out[i] = x:select(d, i - 1) end
  return out
end

return M
