-- lutra.selftest — `lutra selftest`: every op that has a CUDA path, run on the GPU and on
-- the CPU over random shapes (odd sizes included) and compared element by element.
--
--   lutra selftest            compare cuda:0 with the CPU; exit 77 (skipped) where there is
--                             no GPU to test: no device, no driver, or a build without CUDA.
--                             A driver that is there but fails (too old, cannot initialise)
--                             or a C library that does not load is a failure (exit 1), and
--                             so is "no GPU" where LUTRA_REQUIRE_GPU=1 (set it on GPU machines)
--   lutra selftest -v         print every case, not one row per op and dtype
--   lutra selftest --device=cpu   run the harness with the CPU on both sides (checks the
--                             checker where there is no GPU; every error must be 0)
--   lutra selftest --only=attention,sort   only these case modules ("core": the copy, fill,
--                             convert and add cases), e.g. under compute-sanitizer
--
-- After the core cases below (copy, fill, convert, add), each case module
-- lua/lutra/selftest/<op>.lua (CASE_MODULES: matmul and the fused linear layer, streams,
-- elementwise, reductions, layer_norm, rms_norm (each with its residual-fused form),
-- cross_entropy, embedding, gather (with the scatter and index ops), rope, random numbers,
-- attention, optimizers, whole training steps of gpt2 and llama, and shape_ops: einsum, split, clamp,
-- repeat_interleave, bincount and histc, made of other ops) adds its own, through the `st` table of case_api().
--
-- The GPU kernels are designed to be bit-identical with the CPU (fill writes the host's
-- bits, conversions round as host/core/internal.h does, adds round the f32 sum), so the
-- expected error is 0. matmul (cuBLASLt)
-- sums in its own order and is checked against the CPU within a tolerance per dtype
-- (selftest/matmul.lua).
--
-- The GPU count is read through the FFI before anything else, so that the skip path
-- needs nothing but the C API (not the Lua tensor library).
local ffi = require "ffi"

local M = {}

local PROBE = {
  lt_cuda_device_count = "int lt_cuda_device_count(void);",
  lt_cuda_status = "const char *lt_cuda_status(void);",
  lt_cuda_availability = "int lt_cuda_availability(void);",
}
-- lt_cuda_availability()'s values for "no GPU here" (host/include/lutra.h); anything else
-- without a device is LT_CUDA_BROKEN
local CUDA_NOT_BUILT, CUDA_NO_DEVICE = 1, 2

-- The C API: ffi.C inside the lutra executable, else liblutra ($LUTRA_LIB or "lutra").
local function probe_api()
  for name, decl in pairs(PROBE) do
    if not pcall(function() return ffi.C[name] end) then pcall(ffi.cdef, decl) end
  end
  if pcall(function() return ffi.C.lt_cuda_device_count end) then return ffi.C end
  local ok, lib = pcall(ffi.load, os.getenv("LUTRA_LIB") or "lutra")
  if ok then return lib end
  return nil, tostring(lib)
end

-- ---- inputs ----------------------------------------------------------------------------

local DTYPES = {"f32", "f64", "bf16", "f16", "i32", "i64", "u8", "bool"}
local ADD_DTYPES = {"f32", "f64", "bf16", "f16", "i32", "i64"}
local FLOAT = {f32 = true, f64 = true, bf16 = true, f16 = true}

-- Floats that stress conversions: ties, subnormals, overflow, infinities, NaN.
local SPECIAL = {0, -0.0, 1, -1.5, 2.5, 65504, 65520, 1e-8, 6e-8, 3e-5, 1.00390625, 1.005859375, 3.4e38, -1e30,
                 1e-40, 0.1, 1 / 0, -1 / 0, 0 / 0}

-- xorshift: inputs independent of lutra's own generator
local rng_state = 88172645463325252ULL
local function uniform()
  local x = rng_state
  x = bit.bxor(x, bit.lshift(x, 13))
  x = bit.bxor(x, bit.rshift(x, 7))
  x = bit.bxor(x, bit.lshift(x, 17))
  rng_state = x
  return tonumber(bit.rshift(x, 11)) / 9007199254740992
end

-- n values fit for src (and, when converting, for dst: float -> int stays in range,
-- since C leaves out-of-range conversions undefined).
local function values(n, src, dst)
  local buf = ffi.new("double[?]", math.max(n, 1))
  local to_int = dst and not FLOAT[dst]
  for i = 0, n - 1 do
    local v
    if src == "bool" or dst == "bool" and not FLOAT[src] then
      v = uniform() < 0.5 and 0 or 1
    elseif src == "u8" or dst == "u8" then
      v = math.floor(uniform() * 256)
    elseif not FLOAT[src] then
      v = math.floor(uniform() * 2000001) - 1000000
    elseif not to_int and i < #SPECIAL then
      v = SPECIAL[i + 1]
    else
      v = (uniform() * 2 - 1) * (to_int and 1000 or 100)
    end
    buf[i] = v
  end
  return buf
end

local function shape_str(shape)
  local parts = {}
  for i, d in ipairs(shape) do parts[i] = tostring(d) end
  return "[" .. table.concat(parts, ",") .. "]"
end

local function numel(shape)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  return n
end

-- Sizes from the brief (1, 7, 1023, 65537: tails, odd blocks, more than one grid) and a
-- few random multi-dim shapes.
local function test_shapes()
  local shapes = {{1}, {7}, {1023}, {65537}, {3, 5, 7}}
  for _ = 1, 3 do
    local nd, shape = 2 + math.floor(uniform() * 2), {}
    for d = 1, nd do shape[d] = 1 + math.floor(uniform() * (d == nd and 300 or 40)) end
    shapes[#shapes + 1] = shape
  end
  return shapes
end

-- ---- comparison --------------------------------------------------------------------------

-- max abs and max rel error of got against want (CPU tensors of the same shape); NaN
-- matches NaN, inf matches the same inf.
local function compare(C, got, want, n)
  local g, w = ffi.new("double[?]", math.max(n, 1)), ffi.new("double[?]", math.max(n, 1))
  assert(C.lt_copy_to_buffer(got, g, C.LT_F64, n) == 0, ffi.string(C.lt_last_error()))
  assert(C.lt_copy_to_buffer(want, w, C.LT_F64, n) == 0, ffi.string(C.lt_last_error()))
  local max_abs, max_rel = 0, 0
  for i = 0, n - 1 do
    local a, b = g[i], w[i]
    if not (a == b or (a ~= a and b ~= b)) then
      local abs = math.abs(a - b)
      if abs ~= abs then abs = math.huge end -- NaN vs number, inf vs -inf
      local rel = abs == math.huge and math.huge or abs / math.max(math.abs(b), 1e-300)
      if abs > max_abs then max_abs = abs end
      if rel > max_rel then max_rel = rel end
    end
  end
  return max_abs, max_rel
end

-- ---- the cases ----------------------------------------------------------------------------

-- ---- the case modules: lua/lutra/selftest/<area>.lua ----------------------------------------

-- Each module returns function(st); they run in this order after the core cases above.
local CASE_MODULES = {"matmul", "streams", "elementwise", "reduce", "layer_norm", "rms_norm", "cross_entropy",
                      "embedding", "gather", "rope", "random", "attention", "optim", "train", "sort", "shape_ops"}

-- What a case module gets (documented for their authors in the module list above):
-- st.lt, st.C, st.device, st.uniform(), st.randint(lo, hi), st.rand(shape, dtype, lo, hi),
-- st.ints(shape, dtype, f), st.empty(shape, dtype, dev), st.to_device(t), st.noncontig(t),
-- st.ok(rc), st.check(op, dtype, got, want, tol), st.guarded(op, shape, dtype, f),
-- st.same_error(op, shape, dtype, call_cpu, call_dev), st.report(...), st.shapes().
local function case_api(lt, C, device, report)
  local st = {lt = lt, C = C, device = device, uniform = uniform, report = report, shapes = test_shapes}
  local function err() return ffi.string(C.lt_last_error()) end
  -- raises the C error of a failed call (rc ~= 0) at the caller's line
  function st.ok(rc) if rc ~= 0 then error(err(), 2) end end
  -- an integer in [lo, hi)
  function st.randint(lo, hi) return lo + math.floor(uniform() * (hi - lo)) end
  function st.empty(shape, dtype, dev) return lt.empty(shape, {dtype = dtype, device = dev or "cpu"}) end
  -- a CPU integer tensor of `dtype` with values f(i), i = 0 .. numel - 1
  function st.ints(shape, dtype, f)
    local n = numel(shape)
    local buf = ffi.new("double[?]", math.max(n, 1))
    for i = 0, n - 1 do buf[i] = f(i) end
    local t = st.empty(shape, dtype)
    st.ok(C.lt_copy_from_buffer(t, buf, C.LT_F64, n))
    return t
  end
  -- runs f(), reporting an error it raises as a failed row instead of ending the self-test
  function st.guarded(op, shape, dtype, f)
    local fine, msg = pcall(f)
    if not fine then
      print(string.format("  %s %s: %s", op, dtype, tostring(msg)))
      report(op, shape, dtype, math.huge, math.huge, false)
    end
  end
  -- both sides fail with the same message (devices aside)
  function st.same_error(op, shape, dtype, call_cpu, call_dev)
    local rc1 = call_cpu()
    local m1 = rc1 ~= 0 and err() or "(no error)"
    local rc2 = call_dev()
    local m2 = rc2 ~= 0 and err() or "(no error)"
    local fine = rc1 ~= 0 and m1 == m2
    if not fine then print(string.format("  %s: cpu says '%s', %s says '%s'", op, m1, device, m2)) end
    report(op, shape, dtype, fine and 0 or math.huge, 0, fine)
  end
  function st.rand(shape, dtype, lo, hi)
    lo, hi = lo or -1, hi or 1
    local n = numel(shape)
    local buf = ffi.new("double[?]", math.max(n, 1))
    for i = 0, n - 1 do buf[i] = lo + (hi - lo) * uniform() end
    local t = lt.empty(shape, {dtype = dtype or "f32"})
    assert(C.lt_copy_from_buffer(t, buf, C.LT_F64, n) == 0, ffi.string(C.lt_last_error()))
    return t
  end
  function st.to_device(t) return device == "cpu" and t:clone() or t:to(device) end
  -- every other element of a tensor twice as wide in its last dim: strided, same values
  function st.noncontig(t)
    local shape = {}
    for i, d in ipairs(t.shape) do shape[i] = d end
    if #shape == 0 then return t:clone() end
    shape[#shape] = shape[#shape] * 2
    local big = lt.empty(shape, {dtype = t.dtype, device = t.device})
    local v = big:slice(#shape - 1, 0, nil, 2)
    v:copy_(t)
    return v
  end
  -- got (any device) against want (a CPU tensor of the same shape): NaN matches NaN and an
  -- infinity the same infinity; passes when max abs err <= tol * max(1, max |want|)
  function st.check(op, dtype, got, want, tol)
    local n = numel(want.shape)
    local g, w = ffi.new("double[?]", math.max(n, 1)), ffi.new("double[?]", math.max(n, 1))
    local gc = got:cpu():contiguous()
    assert(numel(gc.shape) == n, op .. ": got " .. shape_str(gc.shape) .. ", want " .. shape_str(want.shape))
    assert(C.lt_copy_to_buffer(gc, g, C.LT_F64, n) == 0, ffi.string(C.lt_last_error()))
    assert(C.lt_copy_to_buffer(want:contiguous(), w, C.LT_F64, n) == 0, ffi.string(C.lt_last_error()))
    local max_abs, max_rel, scale = 0, 0, 1
    for i = 0, n - 1 do
      local a, b = g[i], w[i]
      if b == b and math.abs(b) ~= math.huge then scale = math.max(scale, math.abs(b)) end
      if not (a == b or (a ~= a and b ~= b)) then
        local abs = math.abs(a - b)
        if abs ~= abs then abs = math.huge end
        max_abs = math.max(max_abs, abs)
        max_rel = math.max(max_rel, abs == math.huge and math.huge or abs / math.max(math.abs(b), 1e-300))
      end
    end
    local ok = max_abs == 0 or (tol or 0) > 0 and max_abs <= tol * scale
    report(op, want.shape, dtype, max_abs, max_rel, ok)
    return ok
  end
  return st
end

local function run_case_modules(lt, C, device, report, only)
  local st = case_api(lt, C, device, report)
  for _, name in ipairs(CASE_MODULES) do
    local modname = "lutra.selftest." .. name
    local found = false
    for _, searcher in ipairs(package.loaders) do
      if type(searcher(modname)) == "function" then
        found = true
        break
      end
    end
    if found and (only == nil or only[name]) then require(modname)(st) end
  end
end

-- Runs every case (or those of the modules in `only`, "core" naming the copy, fill, convert
-- and add cases below); report(op, shape, dtype, max_abs, max_rel, ok) gets each result.
local function run_cases(lt, C, device, report, only)
  -- a CPU tensor of dtype holding buf, made through the Lua library
  local function host(shape, dtype, buf)
    local t = lt.empty(shape, {dtype = dtype})
    if buf then assert(C.lt_copy_from_buffer(t, buf, C.LT_F64, numel(shape)) == 0, ffi.string(C.lt_last_error())) end
    return t
  end
  local function fill(t, v)
    assert(C.lt_fill(t, v) == 0, ffi.string(C.lt_last_error()))
  end
  local function exact(op, shape, dtype, got, want)
    local abs, rel = compare(C, got, want, numel(shape))
    report(op, shape, dtype, abs, rel, abs == 0)
  end

  for _, shape in ipairs(only and not only.core and {} or test_shapes()) do
    local n = numel(shape)
    for _, dt in ipairs(DTYPES) do
      -- copy: host -> device -> host
      local h = host(shape, dt, values(n, dt))
      local d = device == "cpu" and h:clone() or h:to(device) -- to() returns h itself on the cpu
      exact("copy h2d+d2h", shape, dt, d:cpu(), h)
      -- fill: the device fill against the CPU fill
      local v = dt == "bool" and 1 or dt == "u8" and 200 or FLOAT[dt] and -1 / 3 or -5
      fill(d, v)
      fill(h, v)
      exact("fill", shape, dt, d:cpu(), h)
      -- convert: every other dtype into dt, on the device
      for _, src in ipairs(DTYPES) do
        if src ~= dt then
          local hs = host(shape, src, values(n, src, dt))
          exact("convert", shape, src .. "->" .. dt, hs:to(device):to(dt):cpu(), hs:to(dt))
        end
      end
    end
    for _, dt in ipairs(ADD_DTYPES) do
      local a, b = host(shape, dt, values(n, dt)), host(shape, dt, values(n, dt))
      local abs, rel = compare(C, (a:to(device) + b:to(device)):cpu(), a + b, n)
      local ok = abs == 0 -- both sides round the same f32 sum
      report("add", shape, dt, abs, rel, ok)
    end
  end
  run_case_modules(lt, C, device, report, only)
end

-- ---- output ---------------------------------------------------------------------------------

local function fmt_err(x)
  if x == 0 then return "0" end
  return string.format("%.3g", x)
end

-- One row per (op, dtype): the largest errors over all shapes, and the shape they came from;
-- ops in the order they first ran, each op's dtypes together.
local function print_table(rows)
  local op_order = {}
  for _, r in ipairs(rows) do op_order[r.op] = op_order[r.op] or r.order end
  table.sort(rows, function(a, b)
    if a.op ~= b.op then return op_order[a.op] < op_order[b.op] end
    return a.order < b.order
  end)
  local line = "%-22s %-12s %-7s %-16s %-11s %-11s %s"
  local head = string.format(line, "op", "dtype", "cases", "worst shape", "max abs err", "max rel err", "result")
  print(head)
  print(string.rep("-", #head))
  for _, r in ipairs(rows) do
    local worst = (r.abs > 0 or r.rel > 0) and r.shape or "-"
    print(string.format(line, r.op, r.dtype, tostring(r.cases), worst, fmt_err(r.abs), fmt_err(r.rel),
                        r.ok and "pass" or "FAIL"))
  end
end

-- Where there is no CUDA device: nil, the exit status and its message when the run ends
-- here (77 skipped, 1 failed), or nil when only the harness runs (--device=cpu).
local function without_gpu(C, device)
  if device == "cpu" then return nil end
  local why = ffi.string(C.lt_cuda_status())
  local state = C.lt_cuda_availability()
  if state ~= CUDA_NOT_BUILT and state ~= CUDA_NO_DEVICE then
    return 1, "selftest: FAILED: the CUDA driver does not work: " .. why
  end
  local require_gpu = os.getenv("LUTRA_REQUIRE_GPU")
  if require_gpu and require_gpu ~= "" and require_gpu ~= "0" then
    return 1, "selftest: FAILED: no GPU to test (" .. why .. ") and LUTRA_REQUIRE_GPU=" .. require_gpu
  end
  return 77, "selftest: skipped: no GPU to test (" .. why .. ")"
end

-- The command line after `selftest`: verbose, device; or nil and the exit status (help, an
-- unknown argument).
local function parse_args(args)
  local verbose, device, only = false, nil, nil
  for _, a in ipairs(args) do
    if a == "-v" or a == "--verbose" then
      verbose = true
    elseif a:match("^%-%-device=") then
      device = a:match("^%-%-device=(.*)$")
    elseif a:match("^%-%-only=") then
      only = {}
      for name in a:match("^%-%-only=(.*)$"):gmatch("[^,]+") do
        local known = name == "core"
        for _, m in ipairs(CASE_MODULES) do known = known or m == name end
        if not known then
          io.stderr:write("lutra selftest: --only: no case module '", name, "' (core, ",
                          table.concat(CASE_MODULES, ", "), ")\n")
          return nil, 1
        end
        only[name] = true
      end
    elseif a == "-h" or a == "--help" then
      print("usage: lutra selftest [-v] [--device=cuda|cuda:K|cpu] [--only=core,matmul,...]")
      return nil, 0
    else
      io.stderr:write("lutra selftest: unknown argument '", a, "'\n")
      return nil, 1
    end
  end
  return verbose, device, only
end

-- report(op, shape, dtype, abs, rel, ok) for every case: counts it, prints it (verbose, or a
-- failure) and folds it into its (op, dtype) row; summary() gives rows, failures, cases.
local function reporter(verbose)
  local rows, by_key, failures, cases = {}, {}, 0, 0
  local function report(op, shape, dtype, abs, rel, ok)
    cases = cases + 1
    if not ok then failures = failures + 1 end
    local s = shape_str(shape)
    if verbose or not ok then
      print(string.format("  %-22s %-16s %-12s abs %-9s rel %-9s %s", op, s, dtype, fmt_err(abs), fmt_err(rel),
                          ok and "pass" or "FAIL"))
    end
    local key = op .. " " .. dtype
    local r = by_key[key]
    if not r then
      r = {op = op, dtype = dtype, shape = s, cases = 0, abs = 0, rel = 0, ok = true, order = #rows}
      by_key[key] = r
      rows[#rows + 1] = r
    end
    r.cases = r.cases + 1
    if abs > r.abs or rel > r.rel then r.shape = s end
    r.abs, r.rel, r.ok = math.max(r.abs, abs), math.max(r.rel, rel), r.ok and ok
  end
  return report, function() return rows, failures, cases end
end

-- args: the command line after `selftest` (a list of strings). Returns the exit status:
-- 0 all passed, 1 a failure, 77 skipped (no GPU: see the top of this file).
function M.main(args)
  local verbose, device, only = parse_args(args or {})
  if verbose == nil then return device end

  local C, err = probe_api()
  if not C then
    print("selftest: FAILED: the C library did not load: " .. err)
    return 1
  end
  local count = C.lt_cuda_device_count()
  if count == 0 then
    local status, msg = without_gpu(C, device)
    if status then
      print(msg)
      return status
    end
  end
  device = device or "cuda"

  local lt = require "lutra"
  C = require("lutra.ffi").C
  print(string.format("selftest: %s against cpu; %s", device,
                      count > 0 and ffi.string(C.lt_cuda_status()) or "no CUDA device, harness check only"))

  local report, summary = reporter(verbose)
  local ok, msg = xpcall(run_cases, debug.traceback, lt, C, device, report, only)
  local rows, failures, cases = summary()
  print_table(rows)
  if not ok then
    print("selftest: FAILED with an error: " .. tostring(msg))
    return 1
  end
  if failures > 0 then
    print(string.format("selftest: FAILED: %d of %d cases", failures, cases))
    return 1
  end
  print(string.format("selftest: passed: %d cases", cases))
  return 0
end

return M
