-- lutra.train.resume — the trainer's checkpoints: save, find the latest, restore.
--
-- Checkpoints are lutra.ckpt's: a directory of lz4 shards, one file per rank, a manifest of
-- every tensor's global shape and pieces; atomic, optionally asynchronous, resharded on load.
-- The parameters go under their global names, the optimizer's tensors as
-- optim.<name>.<field> (lutra.ckpt.train_state); the rest (RNG, loader positions, optimizer
-- numbers, the loss scale) is each rank's extra state. Every rank of a layout takes part in
-- a save. Resume restores weights, optimizer state, step (the schedule is a function of it),
-- the RNG and both loaders' positions: a resumed run continues bitwise like a straight one.
-- A checkpoint is checked against the run before any of it is loaded (lutra.ckpt.train_state
-- .check: every parameter with its shape and dtype, no tensor the model lacks, the optimizer's
-- state; lutra.ckpt.checks: the step against the directory name, the extra state's fields),
-- and its values must be finite. With resume=auto one that fails is skipped like a damaged
-- one, saying why, and the next older one is tried.
--
--   local dir = resume.save(trainer)                -- RUN/ckpt/step_%06d
--   local path, why = resume.resume(trainer, resume_opt) -- finds and restores: the path, or nil and why
--   local path, why = resume.find(resume_opt, root) -- "auto", "fresh", a path, or nil
--   resume.restore(trainer, path)
local create = require "lutra.create"
local sharded = require "lutra.ckpt"
local checks = require "lutra.ckpt.checks"
local train_state = require "lutra.ckpt.train_state"

local M = {}

-- This rank's parameters as {name =, tensor =} (shards carry their lutra.dist.spec).
local function named_params(run)
  local out = {}
  for name, p in (run.par and run.par.model or run.model):named_parameters() do
    out[#out + 1] = {name = name, tensor = p}
  end
  return out
end

local function layout_of(run)
  local m = run.mesh
  if not m then return {dp = 1, tp = 1, pp = 1, zero = 0, world = 1} end
  return {dp = m.dp_size, tp = m.tp_size, pp = m.pp_size, zero = m.zero, world = m.size, cp = m.cp_size}
end

-- Saves the trainer's state at its step under ckpt_root; returns the checkpoint's directory.
function M.save(run)
  local dir = string.format("%s/step_%06d", run.ckpt_root, run.step)
  local tensors, optim_numbers = train_state.collect(named_params(run), run.opt)
  local extra = {optim = optim_numbers, rng = create.get_rng_state(), loader = run.data:state(),
                 val_loader = run.val and run.val:state() or nil, tokens = run.tokens, best_val = run.best_val,
                 precision = run.prec:state(), -- precision: fp16's loss scale, else nil
                 run_id = run.run_id} -- rank 0's: the run (lutra.train.runs) a resume continues
  sharded.save(dir, {step = run.step, layout = layout_of(run), config = run.cfg_plain, tensors = tensors,
                     extra = extra, files = run.ckpt_files, kind = "train"},
    {world = run.mesh and run.mesh.world or nil, async = run.get "ckpt_async", keep = run.get "ckpt_keep"})
  return dir
end

-- The checkpoint to resume from: `resume` is "auto" (the newest readable one under ckpt_root, a
-- damaged one skipped and said so), "fresh" or nil/"" (none), or a path. A job restarted by
-- `lutra launch --max-restarts` (LUTRA_RESUME=auto) resumes from the latest. "auto" with nothing
-- under ckpt_root returns nil and why; with checkpoints there but none usable it is an error
-- listing each: starting over would overwrite and prune them, so that takes --resume=fresh.
-- accept(dir) -> ok, why (optional): what "auto" also asks of a readable one (resume.resume:
-- that it restores into the run).
function M.find(resume, ckpt_root, accept)
  if (resume == nil or resume == "") and os.getenv("LUTRA_RESUME") == "auto" then resume = "auto" end
  if not resume or resume == "" or resume == "fresh" then return nil end
  if resume ~= "auto" then return resume end
  if not ckpt_root then return nil, "no run_dir to look for checkpoints in" end
  local dir, skipped = sharded.latest(ckpt_root, {accept = accept})
  if dir then return dir end
  if #skipped == 0 then return nil, "no checkpoint under " .. ckpt_root end
  local lines, rejected = {}, false
  for i, s in ipairs(skipped) do
    lines[i] = "  " .. s.dir .. ": " .. s.why
    rejected = rejected or s.rejected
  end
  error(string.format("resume=auto: %d checkpoint%s under %s, none %s:\n%s\nrepair or move %s, "
    .. "resume from one with --resume=PATH, or start over with --resume=fresh (its saves overwrite and prune "
    .. "step dirs of the same names)", #skipped, #skipped == 1 and "" or "s", ckpt_root,
    rejected and "that this run can resume from" or "readable", table.concat(lines, "\n"),
    #skipped == 1 and "it" or "them"), 0)
end

-- Loads the checkpoint at path into the trainer (resharded to the current layout), after
-- checking it against the run; an error names the file and the tensor or field.
function M.restore(run, path)
  local r = sharded.load(path)
  local m = r.manifest
  checks.step_name(r.dir, m)
  -- the rank-local state: this rank's own under the same layout, else rank 0's (the loader
  -- position counts global batches, the same in every layout)
  local saved, now = m.layout or {}, layout_of(run)
  local same = saved.dp == now.dp and saved.tp == now.tp and saved.pp == now.pp and saved.zero == now.zero
    and m.world == now.world and (saved.cp or 1) == (now.cp or 1) -- (cp: 1 in checkpoints from before it)
  local rank = same and (run.mesh and run.mesh.rank or 0) or 0
  local x = r:extra(rank)
  checks.train_extra(x, m.step, r.dir .. "/" .. m.extra[rank + 1])
  -- parameters and optimizer state, resharded to this rank's pieces of the current layout
  local all_names = {}
  for name in run.model:named_parameters() do all_names[#all_names + 1] = name end
  train_state.restore(r, named_params(run), run.opt, {all_names = all_names})
  create.set_rng_state(x.rng)
  run.data:set_state(x.loader)
  if run.val and x.val_loader then run.val:set_state(x.val_loader) end
  run.step, run.tokens, run.best_val = m.step, x.tokens or 0, x.best_val
  run.resumed_run_id = x.run_id
  run.prec:set_state(x.precision)
end

-- Under a layout, whether every rank restored (a rank's failure is every rank's).
local function agreed(run, ok, why)
  local world = run.mesh and run.mesh.world
  if not world then return ok, why end
  local flag = create.tensor({ok and 0 or 1 + run.mesh.rank}, {dtype = "i32"})
  world:all_reduce(flag, "max")
  local who = flag:item()
  if ok and who ~= 0 then return false, string.format("rank %d could not restore it", who - 1) end
  return ok, why
end

-- Finds the checkpoint of `resume` (M.find) and restores it into run: with "auto", one that
-- fails to restore is skipped (said on stderr) and the next older one tried. Returns the path
-- restored, or nil and why none was.
function M.resume(run, resume)
  local function accept(dir)
    local ok, err = pcall(M.restore, run, dir)
    return agreed(run, ok, not ok and tostring(err):gsub("^[^:]*:%d+: ", "") or nil)
  end
  local auto = resume == "auto" or ((resume == nil or resume == "") and os.getenv("LUTRA_RESUME") == "auto")
  local path, why = M.find(resume, run.ckpt_root, auto and accept or nil)
  if path and not auto then M.restore(run, path) end
  return path, why
end

return M
