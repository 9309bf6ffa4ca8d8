#!/usr/bin/env bash
# test_cuda_emu.sh — the CUDA kernels' logic on the CPU: tests/c/cuda_emu/run.sh builds the
# kernels (kernels/*.cu but the cuBLASLt, NCCL and mma.sync ones) as C++ against its CUDA
# emulator, with the host dispatch code, links them over liblutra, and runs every suite on tiny
# shapes (--quick), each op on the emulated device against the same op on the CPU. Fails on a
# mismatch, a refused call on one side only, a bad launch, a deadlock at a barrier or shuffle,
# or a hang (timeout). About 30 s on 2 cores, most of it compiling (-O0).
# usage: test_cuda_emu.sh LUTRA LIBLUTRA
LIB=$(realpath "${2:?usage: test_cuda_emu.sh path/to/lutra path/to/liblutra.so}")
here=$(cd "$(dirname "$0")" && pwd)
for tool in cc c++ perl; do
  command -v $tool >/dev/null || { echo "test_cuda_emu: $tool not found" >&2; exit 1; }
done
EMU_OPT=-O0 EMU_SMS=1 EMU_TIMEOUT=60 bash "$here/../c/cuda_emu/run.sh" --quick "$(dirname "$LIB")" all
rc=$?
[ $rc -eq 124 ] && echo "test_cuda_emu: timed out (a kernel hangs?)" >&2
exit $rc
