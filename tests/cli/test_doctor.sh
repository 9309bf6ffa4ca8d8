#!/usr/bin/env bash
# test_doctor.sh — `lutra doctor` reports LuaJIT (and GC64, checked against ffi.abi), BLAS,
# OpenMP threads (following OMP_NUM_THREADS), the CUDA build and devices, NCCL, MPI, and
# which device it will use; the values agree with lt_build_info() and lt_cuda_device_count().
# usage: test_doctor.sh LUTRA LIBLUTRA
LUTRA=$(realpath "${1:?usage: test_doctor.sh path/to/lutra path/to/liblutra.so}")
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"
field() { printf '%s\n' "$out" | sed -n "s/^$1: *//p"; }

out=$(OMP_NUM_THREADS=3 "$LUTRA" doctor)
st=$?
expect_eq "doctor exit status" "$st" "0"
echo "$out"
# what the C API says, read through ffi.C inside lutra
api=$(OMP_NUM_THREADS=3 "$LUTRA" -e '
local ffi = require "ffi"
ffi.cdef [[const char *lt_version(void); const char *lt_build_info(void);
int lt_cuda_device_count(void); int lt_get_num_threads(void);]]
local C = ffi.C
print("version=" .. ffi.string(C.lt_version()))
print("gc64=" .. (ffi.abi("gc64") and "on" or "off"))
print("ndev=" .. C.lt_cuda_device_count())
print("threads=" .. C.lt_get_num_threads())
io.write(ffi.string(C.lt_build_info()))')
get() { printf '%s\n' "$api" | sed -n "s/^$1[=:] *//p" | head -1; }

expect_eq "lutra version" "$(field lutra)" "$(get version)"
expect_grep "luajit version" "$(field luajit)" "^$("$LUTRA" -e 'io.write(jit.version)' | sed 's/\./\\./g') "
expect_grep "GC64 state" "$(field luajit)" "GC64 $(get gc64)"
expect_eq "blas from lt_build_info" "$(field blas)" "$(get blas)"
expect_grep "openmp threads follow OMP_NUM_THREADS" "$(field openmp)" '; 3 threads \(OMP_NUM_THREADS=3\)'
expect_eq "cuda build from lt_build_info" "$(field 'cuda build')" "$(get cuda)"
expect_grep "cuda device count" "$(field 'cuda devices')" "^$(get ndev) \("
expect_eq "nccl from lt_build_info" "$(field nccl)" "$(get nccl)"
expect_eq "mpi from lt_build_info" "$(field mpi)" "$(get mpi)"
expect_grep "lua library line" "$(field 'lua library')" '^require "lutra" (ok|FAILED: .+)$'
if [ "$(get ndev)" -gt 0 ]; then
  expect_grep "will use the GPU" "$(field 'will use')" '^cuda:0 \([0-9]+ GPUs?\)$'
else
  expect_eq "will use the CPU" "$(field 'will use')" "cpu (3 threads)"
fi
out1=$(OMP_NUM_THREADS=1 "$LUTRA" doctor)
if [ "$(get ndev)" -eq 0 ]; then
  expect_eq "thread count changes" "$(printf '%s\n' "$out1" | sed -n 's/^will use: *//p')" "cpu (1 threads)"
fi
# the doctor module works under a plain luajit too (through ffi.load)
if command -v luajit >/dev/null; then
  SRC=$(cd "$(dirname "$0")/../.." && pwd)
  lib=$(realpath "${2:?}")
  plain=$(luajit -e "package.path = '$SRC/lua/?.lua;' .. package.path
    package.preload.lutra = function() error('no') end
    local ffi = require 'ffi'
    local real_load = ffi.load
    ffi.load = function(name) return real_load(name == 'lutra' and '$lib' or name) end
    print((require('lutra.doctor').report()))")
  expect_grep "doctor under plain luajit" "$plain" '^blas: +OpenBLAS'
else
  bad "luajit not found in PATH: the doctor under plain luajit is not checked"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
