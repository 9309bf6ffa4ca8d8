-- bench/matmul.lua — lt.matmul n^3 f32 alone in its process: the lutra side of
-- bench/matmul_procs.sh (whose peer is bench/sgemm_direct.c, OpenBLAS with its defaults).
--   lutra bench/matmul.lua [n] [reps]
-- Prints: gflops=<median over reps> threads=<lutra's>.
local lt = require "lutra"
local util = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/util.lua")
local n, reps = tonumber(arg[1]) or 1024, tonumber(arg[2]) or 15
local a, b, c = lt.randn(n, n), lt.randn(n, n), lt.empty(n, n)
lt.matmul(a, b, c)
local t = {}
for r = 1, reps do
  local t0 = util.now()
  lt.matmul(a, b, c)
  t[r] = util.now() - t0
end
print(string.format("gflops=%.1f threads=%d", 2 * n * n * n / util.median(t) / 1e9, lt.get_num_threads()))
