-- bench/util.lua — what the benchmarks share: a monotonic clock, medians, command-line
-- options, and PyTorch's cost of a tiny op (the torch_overhead.py peer).
--   local util = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/util.lua")
local lt = require "lutra"
local M = {}

-- Seconds on the monotonic clock (lt_wall_time, CLOCK_MONOTONIC in the C core).
function M.now() return lt.C.lt_wall_time() end

-- Median of a list of numbers (sorts the list).
function M.median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) / 2] or (xs[n / 2] + xs[n / 2 + 1]) / 2
end

-- The command line (arg) read into a copy of defaults: --key=value or --key value, for keys
-- that defaults has; a value is a number where the default is one. An unknown key, a missing
-- value or a number that does not parse ends the process (status 2) with "<name>: bad option".
function M.options(defaults, name)
  local o = {}
  for k, v in pairs(defaults) do o[k] = v end
  local i = 1
  while i <= #arg do
    local opt = arg[i]
    local key, val = opt:match("^%-%-([%w_]+)=(.*)$")
    if key == nil then
      key, val = opt:match("^%-%-([%w_]+)$"), arg[i + 1]
      i = i + 1
    end
    if type(o[key]) == "number" then val = tonumber(val) end
    if key == nil or o[key] == nil or val == nil then
      io.stderr:write(name .. ": bad option " .. opt .. "\n")
      os.exit(2)
    end
    o[key] = val
    i = i + 1
  end
  return o
end

-- PyTorch eager's microseconds for a tiny add, plain and recorded for autograd, from the peer
-- script at path (run with /usr/bin/python3); nil and why where the peer is missing or failed.
function M.torch_add_overhead(path)
  local f = io.open(path, "r")
  if not f then return nil, nil, "peer script not found at " .. path .. "; pass --peer PATH" end
  f:close()
  local p = io.popen("/usr/bin/python3 " .. path .. " 2>&1")
  local out = p:read("*a")
  p:close()
  local plain, grad = tonumber(out:match("add_us=([%d%.]+)")), tonumber(out:match("add_autograd_us=([%d%.]+)"))
  if plain and grad then return plain, grad end
  return nil, nil, "PyTorch peer did not run: " .. out:gsub("\n", " "):sub(1, 160)
end

-- The GPT step's setup shared by bench/gpt_step.lua and bench/profile_overhead.lua (options a:
-- layers, heads, dim, seq, vocab, batch, threads, gpu): a GPT-2 model on cuda:0 (--gpu 1, else
-- the CPU), its parameters, AdamW (lr 3e-4, wd 0.1 on every parameter, as the torch peer) and
-- random tokens. Without a CUDA device under --gpu 1 the process ends with status 77 (skip).
function M.gpt_setup(a, name)
  local optim = require "lutra.optim"
  lt.set_num_threads(a.threads)
  lt.manual_seed(0)
  local device = a.gpu ~= 0 and "cuda:0" or "cpu"
  if a.gpu ~= 0 and not lt.cuda.is_available() then
    io.stderr:write(name, ": --gpu 1 but no CUDA device (", lt.cuda.status(), ")\n")
    os.exit(77)
  end
  local model = lt.models.build {arch = "gpt2", n_layer = a.layers, n_head = a.heads, d_model = a.dim,
                                 vocab_size = a.vocab, block_size = a.seq, dropout = 0}
  model:to(device)
  local params = model:parameters()
  local opt = optim.AdamW(params, {lr = 3e-4, weight_decay = 0.1})
  local idx = lt.randint(0, a.vocab, {a.batch, a.seq}):to(device)
  local tgt = lt.randint(0, a.vocab, {a.batch, a.seq}):to(device)
  return {model = model, params = params, opt = opt, idx = idx, tgt = tgt, device = device}
end

-- A C peer library of the benchmarks (bench/*_mpi.c built as bench/lib<name>.so): from `path`
-- (--peer), else next to the build's lutra ($LUTRA_BUILD_DIR, or the executable's directory).
-- Returns the library and its path, or nil. cdef: the peer's declarations.
function M.load_peer(name, path, cdef)
  local ffi = require "ffi"
  ffi.cdef(cdef)
  pcall(ffi.cdef, "long readlink(const char *path, char *buf, size_t size);")
  local candidates = {}
  if path then candidates[1] = path end
  local build = os.getenv("LUTRA_BUILD_DIR")
  if build then candidates[#candidates + 1] = build .. "/bench/lib" .. name .. ".so" end
  local buf = ffi.new("char[4096]")
  local len = ffi.C.readlink("/proc/self/exe", buf, 4095)
  local exe = len > 0 and ffi.string(buf, len):match("^(.*)/[^/]*$")
  if exe then candidates[#candidates + 1] = exe .. "/bench/lib" .. name .. ".so" end
  for _, p in ipairs(candidates) do
    local ok, lib = pcall(ffi.load, p)
    if ok then return lib, p end
  end
  return nil
end

-- Calls per timed block: about 32 MiB of traffic, between 2 and 2000 calls.
function M.calls_per_block(bytes) return math.max(2, math.min(2000, math.floor(32 * 2 ^ 20 / bytes))) end

return M
