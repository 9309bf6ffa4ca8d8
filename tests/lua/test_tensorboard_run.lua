-- A real run's TensorBoard files, read back by TensorBoard's own readers (tests/lua/tb_reader.lua):
-- recipes/pretrain.lua (a mixture of experts in fp16, so that the records carry loss_scale and the
-- loss_fn's extras lm_loss and aux_loss) with evaluation, samples and histograms, then resumed from
-- an earlier checkpoint of the same run.
-- Every scalar of metrics.jsonl is in the events at the same steps, with its value as f32; the
-- config and the samples are text; the weights' and gradients' histograms are there on request.
local ffi = require "ffi"
local json = require "lutra.json"
local metrics = require "lutra.train.metrics"
local runs = require "lutra.train.runs"
local T = require "lutra.testing"
local equal = T.assert_equal
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/"
local files = dofile(here .. "file_helpers.lua")
local tb_read = dofile(here .. "tb_reader.lua").read
local root = here .. "../../"

local dir = files.temp_dir()
local lutra = (os.getenv("LUTRA_BUILD_DIR") or root .. "build") .. "/lutra"

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function pretrain(run_dir, steps, more)
  local cmd = string.format("cd %s && %s recipes/pretrain.lua --model.arch=moe --model.n_experts=4 --model.n_layer=1 "
    .. "--model.d_model=32 --model.n_head=2 --model.block_size=16 --batch=4 --precision=fp16 --steps=%d --warmup=1 "
    .. "--eval_every=3 --eval_iters=2 --sample_every=3 --sample_tokens=8 --histogram_every=3 --ckpt_every=3 "
    .. "--run_dir=%s --data_dir=%s %s >%s/out.txt 2>&1", sh_quote(root), sh_quote(lutra), steps, sh_quote(run_dir),
    sh_quote(dir .. "/data"), more or "", sh_quote(dir))
  local ok = os.execute(cmd)
  if not (ok == true or ok == 0) then error("pretrain failed:\n" .. files.read(dir .. "/out.txt")) end
end

local function f32(x) return tonumber(ffi.new("float", x)) end

-- Each scalar tag of the events: {step = value}.
local function by_step(got)
  local out = {}
  for tag, events in pairs(got.scalars) do
    out[tag] = {}
    for _, e in ipairs(events) do out[tag][e[1]] = e[2] end
  end
  return out
end

local SCALARS = {"loss", "val_loss", "lr", "grad_norm", "loss_scale", "tokens_per_s", "mfu", "peak_mem_mb", "step_ms",
                 "lm_loss", "aux_loss"}

test("a run's events: every scalar of its metrics, the config, samples and histograms", function()
  local run_dir = dir .. "/run"
  pretrain(run_dir, 6)
  -- the same run again from its save at step 3: its events file starts with a session START at step
  -- 4, after which TensorBoard's readers drop the first file's steps 4 to 6
  pretrain(run_dir, 6, "--resume=" .. sh_quote(run_dir .. "/ckpt/step_000003"))
  local ids = runs.list(run_dir)
  equal(#ids, 1)
  local run_path = run_dir .. "/runs/" .. ids[1]
  local got = tb_read(run_path)
  equal(#got.files, 2) -- one events file a start
  for name, rec in pairs(got.records) do
    assert((rec.error == nil or rec.error == json.null) and rec.count == rec.framed and rec.count > 10, name .. ": " .. tostring(rec.error))
    equal(rec.file_version, "brain.Event:2")
  end
  local events = by_step(got)
  for _, tag in ipairs(SCALARS) do assert(events[tag], "no scalar " .. tag .. " in the events") end
  -- every number of every record (the resumed run's replace the first's after step 3: metrics.jsonl
  -- was trimmed at the resume, the events by the session START)
  local n = 0
  for _, r in ipairs(metrics.read(run_path .. "/metrics.jsonl")) do
    for k, v in pairs(r) do
      if k ~= "step" and type(v) == "number" then
        equal(events[k][r.step], f32(v), k .. " at step " .. r.step)
        n = n + 1
      end
    end
  end
  assert(n > 60, "compared " .. n .. " values")
  local steps = {}
  for s in pairs(events.loss) do steps[#steps + 1] = s end
  table.sort(steps)
  equal(steps, {1, 2, 3, 4, 5, 6})
  equal(got.app_steps.loss, {1, 2, 3, 4, 5, 6}) -- what the app shows: each step once, after the restart
  local val_steps = {}
  for s in pairs(events.val_loss) do val_steps[#val_steps + 1] = s end
  table.sort(val_steps)
  equal(val_steps, {0, 3, 6})
  assert(events.loss_scale[1] > 1, "fp16's loss scale")
  -- text: the config as a table, the samples in a code fence
  local config = got.texts.config[1]
  equal(config.plugin, "text")
  assert(config.text[1]:find("| model.arch | \"moe\" |", 1, true), config.text[1])
  assert(config.text[1]:find("| precision | \"fp16\" |", 1, true), config.text[1])
  local sample_steps = {}
  for _, e in ipairs(got.texts.samples) do
    sample_steps[#sample_steps + 1] = e.step
    assert(e.text[1]:match("^```+\n"), e.text[1])
  end
  equal(sample_steps, {3, 3, 6}) -- at step 3 by both starts (before the START's step), at 6 by the second
  -- histograms every 3 steps: each parameter's weights and gradients
  local hist_tags = 0
  for tag, hs in pairs(got.histograms) do
    hist_tags = hist_tags + 1
    assert(tag:match("^weights/") or tag:match("^grads/"), tag)
    local hsteps = {}
    for _, h in ipairs(hs) do
      hsteps[#hsteps + 1] = h.step
      assert(h.num > 0 and h.min <= h.max, tag)
    end
    equal(hsteps, {3, 6}, tag) -- step 3's by the first start, step 6's by the second
  end
  assert(got.histograms["weights/wte.weight"] and got.histograms["grads/wte.weight"], "wte's histograms")
  assert(hist_tags >= 10, hist_tags .. " histogram tags")
  -- what the TensorBoard app lists: scalars, text and histograms plugins
  for _, plugin in ipairs {"scalars", "text", "histograms"} do assert(got.plugins[plugin], "plugin " .. plugin) end
end)

test("log_tensorboard = false: no events file", function()
  local run_dir = dir .. "/quiet"
  pretrain(run_dir, 2, "--log_tensorboard=false --histogram_every=0 --sample_every=0")
  local p = io.popen("ls " .. sh_quote(run_dir .. "/latest"))
  local names = p:read("*a")
  p:close()
  assert(names:find("metrics.jsonl", 1, true) and not names:find("tfevents", 1, true), names)
end)
