-- lutra — tensors for LuaJIT over the lutra C core.
--
--   local lt = require "lutra"
--   local x = lt.randn(4, 8)                 -- f32 on the CPU
--   local w = lt.tensor({{1, 2}, {3, 4}}, {dtype = "f64"})
--   local y = (x:matmul(lt.ones(8, 2)) + 1):relu()
--   print(y[{{0, 2}, -1}])                   -- 0-based; {a, b} is the range [a, b)
--
-- Module contents:
--   creation   tensor, empty, zeros, ones, full, *_like, arange, linspace,
--              rand, randn, randint, cat, stack
--   random     manual_seed, get_rng_state, set_rng_state (and t:uniform_, t:normal_, ...)
--   ops        every tensor method as a function too (lt.exp(x), lt.matmul(a, b), lt.where(c, a, b))
--   nn         lt.F: fused kernels (layer_norm, rms_norm, cross_entropy, embedding, rope,
--              scaled_dot_product_attention, adamw_step) and their backwards
--   autograd   t.requires_grad, t.grad, t.grad_fn, t:backward(), no_grad, enable_grad,
--              zero_grad, checkpoint, detect_anomaly, lt.autograd.backward/grad (see lutra/autograd/init.lua)
--   memory     tidy, keep, memory_stats, reset_peak_memory_stats, empty_cache, collectgarbage
--   runtime    version, build_info, get_num_threads, set_num_threads, now, cuda.*, profile (lutra/profile/)
--   custom ops custom_op, kernel (bodies in Lua for the CPU, CUDA C via NVRTC), gradcheck
--   training   data, tokenizer, nn, models, optim, train, generate, config, dist, ckpt, hf,
--              and on first use lora, dpo, tensorboard, sft.{data, modeldir, eval, templates}
--   types      is_tensor, Tensor (the methods table), dtype names as lt.float32 = "f32", ...
-- See lutra/tensor/ for the tensor type, lutra/index.lua for indexing.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local dtype = require "lutra.dtype"
local memory = require "lutra.memory"
local tensor = require "lutra.tensor"
local create = require "lutra.create"
local ops = require "lutra.ops"
local F = require "lutra.functional"
local autograd = require "lutra.autograd"
local ffi, C = lt.ffi, lt.C

local M = {}

-- every method as a module function: lt.exp(x) == x:exp(). Called as a method, the
-- first argument is a tensor by construction; as a function it is checked here.
-- (The method is looked up per call: lutra.profile swaps wrappers into tensor.methods.)
local methods = tensor.methods
for name in pairs(methods) do
  M[name] = function(t, ...)
    if not ops.is_tensor(t) then errors.raise(name .. ": expected a tensor, got " .. type(t)) end
    return methods[name](t, ...)
  end
end
M.matmul = ops.matmul -- checks both operands itself
-- random fills as methods: t:uniform_(lo, hi), t:normal_(mean, std), t:random_(lo, hi), t:bernoulli_(p)
for _, name in ipairs {"uniform_", "normal_", "random_", "bernoulli_"} do tensor.methods[name] = create[name] end
-- indexing ops as methods and functions, as torch's: x:gather(dim, index), lutra.one_hot(index, C)
for _, name in ipairs {"gather", "scatter", "scatter_add", "scatter_reduce", "index_select", "index_add", "index_copy",
                       "masked_fill"} do
  tensor.methods[name], M[name] = F[name], F[name]
end
M.one_hot = F.one_hot
for name, fn in pairs(create) do
  if name ~= "options" and name ~= "fill_" then M[name] = fn end
end
M.where, M.gemm, M.is_tensor = ops.where, ops.gemm, ops.is_tensor
M.F = F
for _, name in ipairs {"topk", "sort", "argsort", "cumsum", "cumprod", "tril", "triu", "logsumexp", "isnan", "isinf", "isfinite", "nan_to_num"} do tensor.methods[name], M[name] = F[name], F[name] end -- F's ops along a dim, as methods
for _, name in ipairs {"split", "chunk", "unbind", "clamp", "clamp_", "clamp_min", "clamp_min_", "clamp_max",
                       "clamp_max_", "clip", "clip_", "repeat_interleave", "bincount", "histc"} do
  tensor.methods[name], M[name] = F[name], F[name] -- F's shape ops and clamp (tensor bounds too), as methods
end
M.einsum = F.einsum

-- ---- autograd -------------------------------------------------------------------------------
M.autograd = autograd
M.no_grad, M.enable_grad, M.set_grad_enabled, M.is_grad_enabled = autograd.no_grad, autograd.enable_grad,
  autograd.set_grad_enabled, autograd.is_grad_enabled
M.zero_grad, M.checkpoint = autograd.zero_grad, autograd.checkpoint
M.detect_anomaly, M.is_anomaly_enabled = autograd.detect_anomaly, autograd.is_anomaly_enabled
M.Tensor, M.tensor_properties = tensor.methods, tensor.properties

-- ---- memory ---------------------------------------------------------------------------------
M.tidy, M.keep = memory.tidy, memory.keep
M.memory_stats, M.reset_peak_memory_stats, M.empty_cache = memory.memory_stats, memory.reset_peak_memory_stats,
  memory.empty_cache
M.collectgarbage = memory.collect -- a full GC, then resets the pressure counters

-- ---- dtypes and devices ---------------------------------------------------------------------
for alias, name in pairs {float32 = "f32", float = "f32", float64 = "f64", double = "f64", bfloat16 = "bf16",
                          float16 = "f16", half = "f16", int32 = "i32", int64 = "i64", long = "i64",
                          uint8 = "u8", bool = "bool", f32 = "f32", f64 = "f64", bf16 = "bf16", f16 = "f16",
                          i32 = "i32", i64 = "i64", u8 = "u8", int = "i32"} do
  M[alias] = name -- lt.float is the dtype, as torch.float (x:float() stays the conversion)
end
M.dtypes = {"f32", "f64", "bf16", "f16", "i32", "i64", "u8", "bool"}

-- ---- runtime ------------------------------------------------------------------------------------
M.version = ffi.string(C.lt_version())
-- The C core's build as text: version, compiler, BLAS library and its threads, CUDA.
M.build_info = function() return ffi.string(C.lt_build_info()) end
-- The number of CPU threads the C core's ops use.
M.get_num_threads = function() return C.lt_get_num_threads() end
-- Sets the number of CPU threads the C core's ops use (as --threads=N).
M.set_num_threads = function(n)
  if C.lt_set_num_threads(n) ~= 0 then errors.fail() end
end
M.C, M.ffi = C, ffi -- the raw API, for code that needs it

-- Opens the REPL in the caller's frame (a tail call, so that the caller's frame is
-- the one the debugger sees); Ctrl-D continues. In a job of many ranks, lutra.debug{rank = r}
-- (every rank calls it) opens it on rank r while the others wait, watchdog off.
function M.debug(opts) return require("lutra.repl").debug(opts) end

-- Issue 3's modules; each loads without requiring "lutra" itself.
M.data = require "lutra.data"
M.tokenizer = require "lutra.tokenizer"
M.nn = require "lutra.nn"
M.parameter = M.nn.parameter -- lt.parameter(t): t marked as a parameter (lutra/nn/parameter.lua)
M.models = require "lutra.models"
M.optim = require "lutra.optim"
M.train = require "lutra.train" -- callable: lt.train{model =, data =, config =}
M.generate = require "lutra.generate" -- callable: lt.generate(model, ids, opts); lt.generate.text(model, tok, prompt, opts)
M.config = require "lutra.config" -- callable: lt.config{...}; also lt.config.optional/number/one_of
M.json = require "lutra.json"
M.hf = require "lutra.hf" -- lt.hf.load_pretrained(dir), lt.hf.save_pretrained(dir, model, tok)
M.safetensors = require "lutra.ckpt.safetensors"
M.ckpt = require "lutra.ckpt" -- sharded checkpoints: lt.ckpt.save/load/latest, lt.ckpt.inspect(dir)
M.autocast = require("lutra.autocast").run -- lt.autocast("bf16", fn, ...)
M.dist = require "lutra.dist" -- lt.dist.init{dp =, tp =, pp =, zero =} -> mesh; groups and collectives

M.cuda = require "lutra.cuda" -- devices, memory stats, events, pinned memory, async copies
M.custom_op = require("lutra.custom_op").custom_op -- lt.custom_op{name =, forward =, backward =}
M.kernel = require("lutra.custom_op").kernel -- lt.kernel{name =, args =, cpu =, cuda =}: fused bodies
M.gradcheck = require "lutra.gradcheck" -- lt.gradcheck(fn, inputs, opts): autograd against finite differences
M.profile = require "lutra.profile" -- lt.profile(fn, opts) -> prof: prof:table(), prof:export_chrome_trace(path)
M.now = require("lutra.train.interrupt").now -- wall-clock seconds (monotonic), for timing a loop

-- Loaded on first use (fine-tuning): lt.lora (adapters), lt.dpo (preference tuning), and
-- lt.sft.data, lt.sft.modeldir, lt.sft.eval, lt.sft.templates (chats, model directories);
-- lt.tensorboard (event files: scalars, text, histograms).
local LAZY = {lora = "lutra.lora", dpo = "lutra.dpo", tensorboard = "lutra.tensorboard"}

-- Loss curves: lt.plot(run_dir | path | {paths} | records | losses | {name = records}, opts) prints the
-- terminal plot; opts.out = "x.png" | "x.svg" writes a file instead. opts: metric ("loss,val_loss"),
-- smooth (0..1, TensorBoard's), log, x ("step" | "tokens"), width, height, title, color (lutra.plot).
function M.plot(src, opts) return require("lutra.plot").plot(src, opts) end
local SFT = {data = true, modeldir = true, eval = true, templates = true}
M.sft = setmetatable({}, {__index = function(t, k)
  if not SFT[k] then return nil end
  local mod = require("lutra.sft." .. k)
  rawset(t, k, mod)
  return mod
end})
setmetatable(M, {__index = function(t, k)
  local name = LAZY[k]
  if not name then return nil end
  local mod = require(name)
  rawset(t, k, mod)
  return mod
end})

-- Said once per process: a CUDA build on a machine where CUDA cannot be used.
if ffi.string(C.lt_build_info()):find("cuda: built", 1, true) and C.lt_cuda_device_count() == 0
    and not os.getenv("LUTRA_QUIET") then
  io.stderr:write("lutra: no usable CUDA device (" .. ffi.string(C.lt_cuda_status()) .. "); using the CPU\n")
end

return M
