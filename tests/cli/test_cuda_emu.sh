#!/usr/bin/env bash
# test_cuda_emu.sh — the CUDA kernels' logic on the CPU: tests/c/cuda_emu/run.sh builds the
# kernels (kernels/*.cu but the cuBLASLt and NCCL ones; mma.sync is emulated) as C++ against its
# CUDA emulator, with the host dispatch code, links them over liblutra, and runs every suite on
# tiny shapes (--quick; the attention suite's bf16/f16 cases with D 64 and 128 take the
# tensor-core kernels, and it prints how many did), each op on the emulated device against the
# same op on the CPU, twice: the threads of each block in order, then in reverse. Fails on a
# mismatch, a refused call on one side only, a bad launch (dynamic shared memory over 48 KB
# without the opt-in included), a misaligned vector access, a deadlock at a barrier, shuffle or
# mma, or a hang (timeout). About 21 s of CPU time, most of it compiling (-O0); a pass runs in 1 s.
# usage: test_cuda_emu.sh LUTRA LIBLUTRA
LIB=$(realpath "${2:?usage: test_cuda_emu.sh path/to/lutra path/to/liblutra.so}")
here=$(cd "$(dirname "$0")" && pwd)
for tool in cc c++ perl; do
  command -v $tool >/dev/null || { echo "test_cuda_emu: $tool not found" >&2; exit 1; }
done
EMU_OPT=-O0 EMU_SMS=1 EMU_TIMEOUT=60 EMU_REVERSE=both bash "$here/../c/cuda_emu/run.sh" --quick "$(dirname "$LIB")" all
rc=$?
[ $rc -eq 124 ] && echo "test_cuda_emu: timed out (a kernel hangs?)" >&2
exit $rc
