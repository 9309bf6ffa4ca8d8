-- lutra.ckpt.checks — what a checkpoint must be beyond the structure host/io/ckpt_manifest.c
-- checks (plain file names, no NUL, pieces inside their tensors), before any of it is used.
-- lutra.ckpt.reader runs them on load and verify (so `lutra ckpt ls --verify` and resume's
-- fallback see them); lutra.train.resume runs the trainer's against the run it restores into.
--
--   checks.paths(dir, m)             every file the manifest names (files, extra, copied) lies in
--                                    dir once symlinks are resolved: a link out is refused
--   checks.step_name(dir, m)         a trainer's directory named step_NNNNNN holds step NNNNNN
--   checks.train_tensors(dir, m)     a trainer checkpoint's tensors (manifest kind "train"):
--                                    floating point; each optim.<param>.<field> has its
--                                    parameter's shape
--   checks.train_extra(x, step, where)  a rank's extra state as the trainer writes it: rng
--                                    {seed, offset} integers, loader and val_loader tables
--                                    (step an integer), optim {kind, steps <= step, numbers},
--                                    tokens >= 0, best_val a number, run_id a safe name, precision {mode,
--                                    loss_scale > 0, ...}; a loader that drew fewer batches
--                                    than the step count, or an optimizer with more steps,
--                                    says the step was edited. Other fields are the caller's.
-- Each raises a message naming the file and the tensor or field.
local errors = require "lutra.errors"
local ckpt_files = require "lutra.ckpt.files"

local M = {}
local raise = errors.raise

local FLOAT = {f32 = true, f64 = true, bf16 = true, f16 = true}
local TWO53 = 2 ^ 53

function M.paths(dir, m)
  local root = ckpt_files.resolved(dir)
  if not root then return end
  local inside = root == "/" and "/" or root .. "/"
  for _, key in ipairs {"files", "extra", "copied"} do
    for _, name in ipairs(m[key] or {}) do
      local p = ckpt_files.resolved(dir .. "/" .. name)
      if p and p:sub(1, #inside) ~= inside then
        raise(string.format("ckpt: %s/%s (in manifest.json's %s) leads to %s, outside the checkpoint directory: "
          .. "refused", dir, name, key, p))
      end
    end
  end
end

function M.step_name(dir, m)
  local base = ckpt_files.basename(dir) or ""
  local n = base:match("^step_(%d+)$")
  if n and tonumber(n) ~= m.step then
    raise(string.format("ckpt: %s/manifest.json: step is %s but the directory is %s", dir, tostring(m.step), base))
  end
end

local function shape_str(s) return "{" .. table.concat(s, ", ") .. "}" end

function M.train_tensors(dir, m)
  local src = dir .. "/manifest.json"
  local by_name = {}
  for _, t in ipairs(m.tensors) do by_name[t.name] = t end
  for _, t in ipairs(m.tensors) do
    if not FLOAT[t.dtype] then
      raise(string.format("ckpt: %s: tensor '%s' is %s: a trainer checkpoint holds floating-point parameters and "
        .. "optimizer state only (f32, f64, bf16, f16)", src, t.name, t.dtype))
    end
    local key = t.name:match("^optim%.(.+)%.[^.]+$")
    if key then
      local p = by_name[key]
      if not p then
        raise(string.format("ckpt: %s: optimizer state '%s' is for '%s', which the checkpoint does not hold", src,
          t.name, key))
      end
      if shape_str(p.shape) ~= shape_str(t.shape) then
        raise(string.format("ckpt: %s: optimizer state '%s' is %s, its parameter '%s' %s", src, t.name,
          shape_str(t.shape), key, shape_str(p.shape)))
      end
    end
  end
end

-- ---- the trainer's extra state ----------------------------------------------------------------

local function show(v)
  if v == nil then return "nothing (the field is missing)" end
  if type(v) == "string" then return string.format("string %q", #v > 40 and v:sub(1, 40) .. "..." or v) end
  if type(v) == "table" then return "a table" end
  return type(v) .. " " .. tostring(v)
end

local function is_int(v) return type(v) == "number" and v >= 0 and v <= TWO53 and v == math.floor(v) end
local function is_num(v) return type(v) == "number" and v == v and v > -math.huge and v < math.huge end

-- A checker of one table: field(path, value, ok, want) raises naming where and the field.
local function checker(where)
  return function(path, value, ok, want)
    if not ok then raise(string.format("%s: %s must be %s, got %s", where, path, want, show(value))) end
  end
end

local function check_loader(field, name, v)
  field(name, v, type(v) == "table", "a table")
  field(name .. ".step", v.step, v.step == nil or is_int(v.step), "an integer >= 0")
  field(name .. ".seed", v.seed, v.seed == nil or is_int(v.seed), "an integer >= 0")
end

local function check_optim(field, o, step)
  field("optim", o, type(o) == "table", "a table")
  field("optim.kind", o.kind, type(o.kind) == "string", "a string")
  field("optim.steps", o.steps, is_int(o.steps) and o.steps <= step,
    string.format("an integer from 0 to the checkpoint's step (%s)", tostring(step)))
  field("optim.numbers", o.numbers, o.numbers == nil or type(o.numbers) == "table", "a table")
  for key, fields in pairs(o.numbers or {}) do
    local at = "optim.numbers[" .. string.format("%q", tostring(key)) .. "]"
    field(at, fields, type(fields) == "table", "a table")
    for f, v in pairs(fields) do field(at .. "." .. tostring(f), v, is_num(v), "a finite number") end
    if fields.step ~= nil then
      field(at .. ".step", fields.step, is_int(fields.step) and fields.step <= step,
        string.format("an integer from 0 to the checkpoint's step (%s)", tostring(step)))
    end
  end
end

-- A run id (lutra.train.runs) names a directory under run_dir/runs: letters, digits, "-", "_",
-- ".", not starting with ".", at most 64 characters; one read from a file is checked so.
function M.valid_run_id(id)
  return type(id) == "string" and #id > 0 and #id <= 64 and id:match("^[%w_%-][%w_%.%-]*$") ~= nil
end

function M.train_extra(x, step, where)
  local field = checker(where)
  field("the extra state", x, type(x) == "table", "a JSON object")
  local rng = x.rng
  field("rng", rng, type(rng) == "table", "a table {seed, offset}")
  field("rng.seed", rng.seed, is_int(rng.seed), "an integer >= 0")
  field("rng.offset", rng.offset, is_int(rng.offset), "an integer >= 0")
  check_loader(field, "loader", x.loader)
  if x.val_loader ~= nil then check_loader(field, "val_loader", x.val_loader) end
  if x.optim ~= nil then check_optim(field, x.optim, step) end
  field("tokens", x.tokens, x.tokens == nil or (is_num(x.tokens) and x.tokens >= 0), "a number >= 0")
  field("best_val", x.best_val, x.best_val == nil or type(x.best_val) == "number", "a number")
  field("run_id", x.run_id, x.run_id == nil or M.valid_run_id(x.run_id),
    "a run id (letters, digits, '-', '_', '.', not starting with '.', at most 64 characters)")
  local p = x.precision
  if p ~= nil then
    field("precision", p, type(p) == "table", "a table")
    field("precision.mode", p.mode, type(p.mode) == "string", "a string")
    field("precision.loss_scale", p.loss_scale, is_num(p.loss_scale) and p.loss_scale > 0, "a finite number > 0")
    field("precision.good_steps", p.good_steps, p.good_steps == nil or is_int(p.good_steps), "an integer >= 0")
    field("precision.skipped", p.skipped, p.skipped == nil or is_int(p.skipped), "an integer >= 0")
  end
  -- every step draws at least one batch: a loader behind the step count means the step is wrong
  if x.loader.step ~= nil and x.loader.step < step then
    raise(string.format("%s: loader.step is %d but the checkpoint's step is %s: every step draws at least one batch "
      .. "(was the step edited?)", where, x.loader.step, tostring(step)))
  end
end

return M
