#!/usr/bin/env bash
# test_thread_env.sh — the lutra executable starts with a short OpenMP spin (GOMP_SPINCOUNT)
# and single-threaded OpenBLAS unless the user set them (host/app/thread_env.c re-executes
# itself once with them); arguments, stdin and the exit status survive the re-exec; BLAS
# stays on one thread after set_num_threads, and matmul still uses the OpenMP threads.
# usage: test_thread_env.sh LUTRA LIBLUTRA
LUTRA=$(realpath "${1:?usage: test_thread_env.sh path/to/lutra path/to/liblutra.so}")
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"

show='print(os.getenv("GOMP_SPINCOUNT"), os.getenv("OMP_WAIT_POLICY"), os.getenv("OPENBLAS_NUM_THREADS"))'
expect_eq "defaults" "$(env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY -u OPENBLAS_NUM_THREADS "$LUTRA" -e "$show")" \
  "$(printf '2000\tnil\t1')"
expect_eq "the user's spin count wins" "$(GOMP_SPINCOUNT=7 "$LUTRA" -e "$show")" "$(printf '7\tnil\t1')"
expect_eq "the user's wait policy wins" \
  "$(env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=active OPENBLAS_NUM_THREADS=3 "$LUTRA" -e "$show")" \
  "$(printf 'nil\tactive\t3')"
# arguments (with spaces), stdin and the exit status go through the re-exec
script=$(mktemp --suffix=.lua)
trap 'rm -f "$script"' EXIT
echo 'print(arg[1], arg[2], io.read("*l")) os.exit(5)' >"$script"
out=$(printf 'from stdin\n' | env -u GOMP_SPINCOUNT "$LUTRA" "$script" "a b" c 2>&1)
st=$?
expect_eq "args and stdin" "$out" "$(printf 'a b\tc\tfrom stdin')"
expect_eq "exit status" "$st" "5"
# after set_num_threads(2) OpenMP has 2 threads and OpenBLAS keeps 1
out=$("$LUTRA" -e '
local lt = require "lutra"
local ffi = require "ffi"
ffi.cdef "int openblas_get_num_threads(void);"
lt.set_num_threads(2)
local a = lt.randn(300, 300)
lt.matmul(a, a)
print(lt.get_num_threads(), ffi.C.openblas_get_num_threads())')
expect_eq "threads" "$out" "$(printf '2\t1')"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
