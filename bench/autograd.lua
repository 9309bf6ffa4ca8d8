-- bench/autograd.lua — what recording for autograd costs, next to PyTorch eager.
--   lutra bench/autograd.lua [--peer PATH/torch_overhead.py] [--calls N] [--reps N]
-- Prints the cost of a tiny add (4 elements) from Lua, plain and with one operand that
-- requires grad (the node is recorded), then the same two figures from PyTorch
-- (../shared/peers/torch_overhead.py run with /usr/bin/python3, 1 thread), and the
-- ratio of the autograd figures (issue 3's goal: <= 0.5). Then a backward over a chain
-- of tiny ops, per op.
local lt = require "lutra"
local ffi = require "ffi"

local peer = "../shared/peers/torch_overhead.py"
local calls, reps = 1000000, 5
for i = 1, #arg do
  if arg[i] == "--peer" then peer = arg[i + 1] end
  if arg[i] == "--calls" then calls = tonumber(arg[i + 1]) end
  if arg[i] == "--reps" then reps = tonumber(arg[i + 1]) end
end

local util = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/util.lua")
local now, median = util.now, util.median

lt.set_num_threads(1) -- as the peer
local a, b = lt.ones(4), lt.ones(4)
local ag = lt.ones(4, {requires_grad = true})

-- Microseconds per `c = x + y`, median over reps runs of `calls` calls, plain and with grad
-- interleaved so that both see the same machine noise. Two loops written out, as the peer's
-- two lambdas: each gets its own compiled trace.
local plain, grad = {}, {}
local function run_plain()
  local t0 = now()
  local c
  for _ = 1, calls do c = a + b end
  return (now() - t0) / calls * 1e6
end
local function run_grad()
  local t0 = now()
  local c
  for _ = 1, calls do c = ag + b end
  return (now() - t0) / calls * 1e6
end
run_plain()
run_grad()
for r = 1, reps do
  plain[r] = run_plain()
  grad[r] = run_grad()
end
local ours_plain, ours_grad = median(plain), median(grad)
print(string.format("tiny add from Lua: lutra %.3f us plain, %.3f us recording for autograd", ours_plain, ours_grad))

local t_plain, t_grad, why = util.torch_add_overhead(peer)
if t_plain then
  print(string.format("PyTorch eager:     %.3f us plain, %.3f us with autograd", t_plain, t_grad))
  print(string.format("ratio (lutra / PyTorch): plain %.2f, autograd %.2f (goal <= 0.5)", ours_plain / t_plain,
    ours_grad / t_grad))
else
  print("(" .. why .. ")")
end

-- Backward over a chain of 1000 tiny ops, per op (recording excluded).
do
  local samples = {}
  for r = 1, reps do
    local x = lt.ones(4, {requires_grad = true})
    local y = x
    for _ = 1, 1000 do y = y * 1.001 + b end
    local loss = y:sum()
    local t0 = now()
    loss:backward()
    samples[r] = (now() - t0) / 2000 * 1e6
  end
  print(string.format("backward through tiny ops: %.3f us per op", median(samples)))
end
