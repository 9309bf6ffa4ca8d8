#!/bin/sh
# run.sh — kernels/reduce.cu and kernels/softmax.cu under the CUDA emulator (emu.h), against
# the CPU ops of a CPU-only build. Slow (an OS thread per CUDA thread): minutes, not a ctest.
#   tests/c/cuda_emu/run.sh BUILD_DIR [all|reduce|softmax] [shape index]
# BUILD_DIR: a -DLUTRA_CUDA=OFF build (its liblutra.so gives the CPU ops). EMU_SMS=N sizes the
# emulated device (default 1: the split paths run on small inputs).
set -e
[ -n "$1" ] || { echo "usage: $0 BUILD_DIR [all|reduce|softmax] [shape index]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
build=$(cd "$1" && pwd)
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$here/emu.h" "$here/emu.cpp" "$work/"
sed 's|#include <cuda_runtime.h>|#include "emu.h"|' "$root/kernels/common.cuh" >"$work/common.cuh"
for k in reduce softmax; do # kernel<<<grid, block, smem, stream>>>(args) -> emu_launch(...)
  perl -pe 's/(\w+(?:<[^<>;]*>)?)<<<(.*?)>>>\((.*?)\);/emu_launch(EMU_CFG($2), [&]{ $1($3); });/g' \
    "$root/kernels/$k.cu" >"$work/$k.cu"
done
inc="-I$work -I$root/host -I$root/host/include"
rename="-DLUTRA_HAVE_CUDA=1 -Dlt_cuda_device_count=emu_device_count -Dlt_reduce_name=emu_lt_reduce_name"
for f in reduce var argmax argmin softmax log_softmax softmax_backward log_softmax_backward; do
  rename="$rename -Dlt_$f=emu_lt_$f"
done
cd "$work"
for f in ops_reduce ops_argmax ops_softmax; do
  cc -O1 -g -std=gnu11 -fopenmp -mavx2 -mfma -mf16c $inc $rename -c "$root/host/$f.c" -o $f.o
done
for f in reduce.cu softmax.cu emu.cpp; do c++ -O1 -g -std=c++17 -DLUTRA_HAVE_CUDA=1 -w $inc -x c++ -c $f -o $f.o; done
cc -O1 -g -std=gnu11 -I"$root/host/include" -c "$here/reduce_softmax.c" -o driver.o
c++ -o emu_test driver.o ops_*.o reduce.cu.o softmax.cu.o emu.cpp.o -L"$build" -llutra -Wl,-rpath,"$build" -pthread \
  -fopenmp -lm
timeout 3000 ./emu_test "$@"
