-- The model zoo against PyTorch: small gpt2 and llama models, our initial weights and
-- a batch exported to a temp directory, tests/py/ref_gpt.py rebuilds each model in
-- plain torch ops and computes logits, loss and every parameter's gradient, which
-- must match ours: in f64 to ~1e-10 and in f32 to ~1e-4 (relative to the largest
-- value of each tensor). Skipped, saying so, where /usr/bin/python3 has no torch.
local lt = require "lutra"
local models = require "lutra.models"
local T = require "lutra.testing"
local ffi = require "ffi"
local equal = T.assert_equal

local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/lua/[^/]*$")) or "."
local script = root .. "/tests/py/ref_gpt.py"


local function write_raw(f, t)
  local c = t:contiguous()
  f:write(ffi.string(c:data_ptr(), c:numel() * c:element_size()))
end

-- A tensor of `shape` and dtype read from the string s at byte offset off.
local function read_raw(s, off, shape, dt)
  local t = lt.empty(shape, dt)
  local n = t:numel() * t:element_size()
  assert(#s >= off + n, "short file")
  ffi.copy(t:data_ptr(), s:sub(off + 1, off + n), n)
  return t, off + n
end

local function slurp(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- The largest |a - b| and that relative to the largest |b|.
local function errors_of(a, b)
  local abs = (a:to("f64") - b:to("f64")):abs():max():item()
  local scale = b:to("f64"):abs():max():item()
  return abs, abs / math.max(scale, 1e-30)
end

local CFG_KEYS = {"arch", "n_layer", "n_head", "n_kv_head", "d_model", "vocab_size", "bias", "norm_eps", "rope_theta",
                  "pos", "norm", "mlp", "tie_embeddings"}

local function make_case(dir, name, cfg, dt)
  lt.manual_seed(1234)
  cfg.dtype = dt
  local model = models.build(cfg)
  local c = model.cfg
  local B, Tn = 2, 16
  local idx = lt.randint(c.vocab_size, {B, Tn})
  local targets = lt.randint(c.vocab_size, {B, Tn})
  targets[{0, 3}] = -100 -- ignored positions
  targets[{1, {10, 13}}] = -100
  local path = dir .. "/" .. name
  os.execute("mkdir -p '" .. path .. "'")
  local f = assert(io.open(path .. "/manifest.txt", "w"))
  for _, k in ipairs(CFG_KEYS) do f:write("config ", k, " ", tostring(c[k]), "\n") end
  f:write("dtype ", dt, "\n", string.format("batch %d %d\n", B, Tn))
  local names, params = {}, {}
  for pname, p in model:named_parameters() do
    names[#names + 1], params[#params + 1] = pname, p
    f:write("param ", pname, " ", table.concat(p.shape, " "), "\n")
  end
  f:close()
  f = assert(io.open(path .. "/params.bin", "wb"))
  for _, p in ipairs(params) do write_raw(f, p) end
  f:close()
  for file, t in pairs {["idx.bin"] = idx, ["targets.bin"] = targets} do
    f = assert(io.open(path .. "/" .. file, "wb"))
    write_raw(f, t)
    f:close()
  end
  local logits, loss = model(idx, targets)
  loss:backward()
  return {name = name, path = path, model = model, names = names, params = params, logits = logits, loss = loss,
          dtype = dt}
end

-- Compares one case with torch's files; returns the worst gradient errors.
local function compare(case, tol)
  local ref_loss = tonumber(slurp(case.path .. "/loss.txt"))
  local loss = case.loss:item()
  local loss_rel = math.abs(loss - ref_loss) / math.abs(ref_loss)
  assert(loss_rel <= tol, string.format("%s: loss %.17g, torch %.17g (rel %.3g)", case.name, loss, ref_loss, loss_rel))
  local ref_logits = read_raw(slurp(case.path .. "/logits.bin"), 0, case.logits.shape, case.dtype)
  local la, lr = errors_of(case.logits, ref_logits)
  assert(lr <= tol, string.format("%s: logits differ by %.3g (rel %.3g)", case.name, la, lr))
  local s, off = slurp(case.path .. "/grads.bin"), 0
  local worst_abs, worst_rel, worst_name = 0, 0, nil
  for i, p in ipairs(case.params) do
    local ref
    ref, off = read_raw(s, off, p.shape, case.dtype)
    assert(p.grad ~= nil, case.name .. ": no gradient for " .. case.names[i])
    equal(p.grad.shape, p.shape, case.names[i])
    local a, r = errors_of(p.grad, ref)
    assert(ref:abs():max():item() > 0, case.name .. ": torch's gradient of " .. case.names[i] .. " is zero")
    if r > tol then
      error(string.format("%s: gradient of %s differs from torch's by %.3g (rel %.3g > %g)", case.name,
        case.names[i], a, r, tol))
    end
    worst_abs = math.max(worst_abs, a)
    if r > worst_rel then worst_rel, worst_name = r, case.names[i] end
  end
  assert(off == #s, case.name .. ": grads.bin has more data than the parameters")
  print(string.format("  %-13s loss %.10f (torch %.10f)  %d grads: max abs err %.3g, max rel err %.3g (%s)",
    case.name, loss, ref_loss, #case.params, worst_abs, worst_rel, worst_name))
end

local SMALL = {
  gpt2 = {arch = "gpt2", n_layer = 2, n_head = 4, d_model = 32, vocab_size = 64, block_size = 16},
  llama = {arch = "llama", n_layer = 2, n_head = 4, n_kv_head = 2, d_model = 32, vocab_size = 64, block_size = 16},
  -- variants: MQA with learned positions and untied gpt2; llama with biases and LayerNorm
  gpt2_mqa = {arch = "gpt2", n_layer = 1, n_head = 4, n_kv_head = 1, d_model = 32, vocab_size = 64, block_size = 16,
              tie_embeddings = false, bias = false},
  llama_mix = {arch = "llama", n_layer = 1, n_head = 2, d_model = 32, vocab_size = 64, block_size = 16, bias = true,
               norm = "layernorm", rope_theta = 500, ffn_hidden = 40},
}

test("gpt2 and llama: loss, logits and every parameter gradient match PyTorch (f64 and f32)", function()
  local PYTHON = T.need_python("torch")
  local dir = io.popen("mktemp -d"):read("*l")
  local cases = {}
  for _, dt in ipairs {"f64", "f32"} do
    for _, name in ipairs {"gpt2", "llama", "gpt2_mqa", "llama_mix"} do
      local cfg = {}
      for k, v in pairs(SMALL[name]) do cfg[k] = v end
      cases[#cases + 1] = make_case(dir, name .. "_" .. dt, cfg, dt)
    end
  end
  local f = assert(io.open(dir .. "/cases.txt", "w"))
  for _, c in ipairs(cases) do f:write(c.name, "\n") end
  f:close()
  local p = io.popen("OMP_NUM_THREADS=1 " .. PYTHON .. " '" .. script .. "' '" .. dir .. "' 2>&1")
  local out = p:read("*a")
  p:close()
  local ok, err = pcall(function()
    for _, c in ipairs(cases) do
      local fh = io.open(c.path .. "/loss.txt")
      if not fh then error("ref_gpt.py did not write " .. c.name .. "'s results:\n" .. out) end
      fh:close()
    end
    print("test_models_torch: PyTorch reference (ref_gpt.py):")
    for _, c in ipairs(cases) do compare(c, c.dtype == "f64" and 1e-9 or 2e-4) end
  end)
  os.execute("rm -rf '" .. dir .. "'")
  if not ok then error(err, 0) end
end)
