-- lutra.optim.schedule — learning-rate schedules as pure functions of the step.
--
--   local S = lutra.optim.schedule
--   local sched = S.cosine{lr = 1e-3, min_lr = 1e-4, warmup = 100, total = 2000}
--   sched(0) --> 1e-5 ... sched(99) --> 1e-3, then cosine down to min_lr at step `total`
--
-- `step` is the 0-based index of the optimizer step about to run (the number of steps
-- done so far), so a resumed run that knows its step gets exactly the same lr. Every
-- schedule is a callable table that keeps its settings (kind, lr, min_lr, warmup, total,
-- ...) for printing and checkpoints.
--
-- Warmup (every kind): for step < warmup, lr * (step + 1) / warmup (linear, reaching lr at
-- step warmup - 1). After it, with r = (step - warmup) / (total - warmup) clamped to [0, 1]:
--   cosine    min_lr + 0.5 * (1 + cos(pi * r)) * (lr - min_lr)
--   linear    min_lr + (1 - r) * (lr - min_lr)
--   constant  lr
--   wsd       warmup-stable-decay: lr until the last decay_frac * total steps, which decay
--             to min_lr ("linear" by default, or "cosine" or "sqrt": 1 - sqrt(r))
-- The warmup and cosine expressions are those of ../shared/peers/torch_charlm.py's lr_at,
-- operation for operation, so that the lrs are the same doubles.
local errors = require "lutra.errors"

local M = {}

local raise = errors.raise
local cos, sqrt, pi, floor = math.cos, math.sqrt, math.pi, math.floor

local function number_field(kind, opts, key, default, min)
  local v = opts[key]
  if v == nil then v = default end
  if type(v) ~= "number" or v ~= v then
    raise(string.format("schedule.%s: %s must be a number, got %s", kind, key, tostring(v)))
  end
  if min and v < min then raise(string.format("schedule.%s: %s must be >= %g, got %g", kind, key, min, v)) end
  return v
end

local function integer_field(kind, opts, key, default, min)
  local v = number_field(kind, opts, key, default, min)
  if v ~= floor(v) then raise(string.format("schedule.%s: %s must be an integer, got %g", kind, key, v)) end
  return v
end

local function check_step(kind, step)
  if type(step) ~= "number" or step ~= floor(step) or step < 0 then
    raise(string.format("schedule.%s: step must be an integer >= 0, got %s", kind, tostring(step)))
  end
end

local Schedule = {}
Schedule.__index = Schedule
Schedule.__call = function(self, step) return self.at(step) end
Schedule.__tostring = function(self)
  local parts = {}
  for _, k in ipairs {"lr", "min_lr", "warmup", "total", "decay_frac", "decay"} do
    if self[k] ~= nil then parts[#parts + 1] = k .. "=" .. tostring(self[k]) end
  end
  return "schedule." .. self.kind .. "{" .. table.concat(parts, ", ") .. "}"
end

-- Common settings; `after(step, s)` gives the lr once warmup is over.
local function make(kind, opts, needs_total, after, extra_keys)
  if type(opts) ~= "table" then raise("schedule." .. kind .. ": expected a table of settings, got " .. type(opts)) end
  local known = {lr = true, warmup = true}
  if needs_total then known.min_lr, known.total = true, true end
  for _, k in ipairs(extra_keys or {}) do known[k] = true end
  for k in pairs(opts) do
    if not known[k] then
      local names = {}
      for n in pairs(known) do names[#names + 1] = n end
      table.sort(names)
      raise(string.format("schedule.%s: unknown setting '%s' (%s)", kind, tostring(k), table.concat(names, ", ")))
    end
  end
  local s = setmetatable({kind = kind}, Schedule)
  s.lr = number_field(kind, opts, "lr", nil, 0)
  s.warmup = integer_field(kind, opts, "warmup", 0, 0)
  if needs_total then
    s.min_lr = number_field(kind, opts, "min_lr", 0, 0)
    s.total = integer_field(kind, opts, "total", nil, 1)
    if s.total <= s.warmup then
      raise(string.format("schedule.%s: total (%d) must be greater than warmup (%d)", kind, s.total, s.warmup))
    end
  end
  local lr, warmup = s.lr, s.warmup
  s.at = function(step)
    check_step(kind, step)
    if step < warmup then return lr * (step + 1) / warmup end
    return after(step, s)
  end
  return s
end

-- Fraction of the post-warmup span done, clamped to [0, 1].
local function progress(step, from, to)
  local r = (step - from) / (to - from)
  if r > 1 then return 1 end
  return r
end

function M.cosine(opts)
  return make("cosine", opts, true, function(step, s)
    local r = progress(step, s.warmup, s.total)
    return s.min_lr + 0.5 * (1 + cos(pi * r)) * (s.lr - s.min_lr)
  end)
end

-- S.linear{lr =, min_lr =, warmup =, total =}: warmup, then straight down to min_lr at total.
function M.linear(opts)
  return make("linear", opts, true, function(step, s)
    local r = progress(step, s.warmup, s.total)
    return s.min_lr + (1 - r) * (s.lr - s.min_lr)
  end)
end

-- S.constant{lr =, warmup =}: warmup, then lr.
function M.constant(opts)
  return make("constant", opts, false, function(_, s) return s.lr end)
end

local DECAY_SHAPES = {
  linear = function(r) return 1 - r end,
  cosine = function(r) return 0.5 * (1 + cos(pi * r)) end,
  sqrt = function(r) return 1 - sqrt(r) end,
}

-- Warmup, then lr held until the decay starts at total - decay_steps, decay_steps =
-- floor(decay_frac * total + 0.5) (at least 1), then the decay to min_lr at `total`.
function M.wsd(opts)
  if type(opts) ~= "table" then raise("schedule.wsd: expected a table of settings, got " .. type(opts)) end
  local frac = number_field("wsd", opts, "decay_frac", 0.1, 0)
  if frac > 1 then raise(string.format("schedule.wsd: decay_frac must be in [0, 1], got %g", frac)) end
  local shape_name = opts.decay or "linear"
  local shape = DECAY_SHAPES[shape_name]
  if not shape then
    raise("schedule.wsd: decay must be \"linear\", \"cosine\" or \"sqrt\", got " .. tostring(shape_name))
  end
  local s = make("wsd", opts, true, function(step, s)
    if step < s.decay_start then return s.lr end
    local r = progress(step, s.decay_start, s.total)
    return s.min_lr + shape(r) * (s.lr - s.min_lr)
  end, {"decay_frac", "decay"})
  s.decay_frac, s.decay = frac, shape_name
  s.decay_steps = math.max(1, floor(frac * s.total + 0.5))
  s.decay_start = s.total - s.decay_steps
  if s.decay_start < s.warmup then
    raise(string.format("schedule.wsd: the decay (%d steps) starts before warmup (%d steps) ends", s.decay_steps,
      s.warmup))
  end
  return s
end

-- A schedule from a config table: {kind = "cosine" | "linear" | "constant" | "wsd", ...}.
function M.make(opts)
  if type(opts) ~= "table" then raise("schedule.make: expected a table with a kind, got " .. type(opts)) end
  local kind = opts.kind or "cosine"
  local fn = kind ~= "make" and kind ~= "is_schedule" and M[kind]
  if not fn then raise("schedule.make: unknown kind " .. tostring(kind) .. " (cosine, linear, constant, wsd)") end
  local rest = {}
  for k, v in pairs(opts) do
    if k ~= "kind" then rest[k] = v end
  end
  return fn(rest)
end

-- Whether x is a schedule made here.
function M.is_schedule(x) return getmetatable(x) == Schedule end

return M
