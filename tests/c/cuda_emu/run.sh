#!/usr/bin/env bash
# run.sh — the CUDA kernels (kernels/*.cu) under the CUDA emulator (emu.h), against the CPU ops.
#   tests/c/cuda_emu/run.sh [--quick] LIBDIR [SUITE ...]
# LIBDIR holds a built liblutra.so (CPU-only or not). The emulated program links it, and its own
# copies of the host files that dispatch to CUDA (host/core/memory.c, tensor.c, copy.c and host/ops/*.c,
# compiled with LUTRA_HAVE_CUDA) and of the kernels (compiled as C++ with emu.h) take precedence
# over the library's (ELF interposition), so one process has the CPU ops (device -1) and the
# emulated CUDA ops (device 0, host memory): each suite runs the same lt_* call on both and
# compares. --quick: the tiny shapes only (the ctest, tests/cli/test_cuda_emu.sh).
# SUITE: all (default) or any of the names emu_main.c lists. EMU_SMS=N sizes the emulated
# device (default 1: grid-stride and split paths run on small inputs); EMU_REVERSE=1 runs the
# threads of a block in reverse order between barriers (emu.cpp), EMU_REVERSE=both runs the
# suites in both orders (a missing barrier shows in one or the other). EMU_WORK=DIR keeps the
# objects there between runs (rebuilt when a source is newer). EMU_TIMEOUT (default 3000 s).
# EMU_OPT (default -O1; the ctest uses -O0, faster to compile).
set -e
quick=0
[ "$1" = "--quick" ] && quick=1 && shift
[ -n "$1" ] || { echo "usage: $0 [--quick] LIBDIR [SUITE ...]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
lib=$(cd "$1" && pwd)
shift
if [ -n "$EMU_WORK" ]; then
  mkdir -p "$EMU_WORK" && work=$(cd "$EMU_WORK" && pwd)
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
cd "$work"
mkdir -p src/kernels src/core src/ops cub/device
# the kernels, rewritten for the emulator by emu_rewrite.pl (launches, shared memory, vector
# accesses, mma.sync) into src/, so that a kernel edited meanwhile is re-copied; and emu_probe.cu,
# the errors suite's kernels that break the rules on purpose and its mma check
kernels="elementwise unary binary copy layer_norm cross_entropy embedding rope random adamw lion multi_tensor adafactor lamb gather
  attention_forward attention_backward attention_backward_mma reduce softmax sort cumsum tril"
hostfiles="core/memory core/tensor core/copy ops/elementwise ops/unary ops/binary ops/layer_norm ops/rms_norm
  ops/cross_entropy ops/embedding ops/rope ops/random ops/adamw ops/lion ops/multi_tensor ops/adafactor ops/lamb ops/attention
  ops/attention_cuda ops/reduce ops/argmax ops/softmax ops/backend core/device ops/gather ops/index_select ops/sort ops/topk
  ops/cumsum ops/tril"
for h in emu.h emu_cub.h; do cp "$here/$h" src/$h.new; done
perl "$here/emu_rewrite.pl" <"$root/kernels/common.cuh" | sed 's|#include <cuda_runtime.h>|#include "emu.h"|' \
  >src/kernels/common.cuh.new
grep -q "lt_dev_vec { EMU_VEC_CHECKS" src/kernels/common.cuh.new || { echo "run.sh: lt_dev_vec not found in kernels/common.cuh" >&2; exit 1; }
for h in cuda_bf16.h cuda_fp16.h; do echo '#include "emu.h"' >"src/$h.new"; done
for h in device_radix_sort device_run_length_encode device_scan; do echo '#include "emu_cub.h"' >"cub/device/$h.cuh"; done
for k in $(for k in $kernels; do echo $k.cu; done) $(cd "$root/kernels" && ls *.cuh | grep -vx common.cuh); do
  perl "$here/emu_rewrite.pl" <"$root/kernels/$k" >"src/kernels/$k.new" || exit 1
done
for h in "$root"/kernels/*.h; do cp "$h" "src/kernels/$(basename "$h").new"; done
perl "$here/emu_rewrite.pl" <"$here/emu_probe.cu" >src/emu_probe.cu.new || exit 1
for f in src/*.new src/kernels/*.new; do # replace only what changed, so that make-like checks below skip the rest
  cmp -s "$f" "${f%.new}" 2>/dev/null && rm "$f" || mv "$f" "${f%.new}"
done
for f in $hostfiles; do cmp -s "$root/host/$f.c" "src/$f.c" 2>/dev/null || cp "$root/host/$f.c" "src/$f.c"; done

opt=${EMU_OPT:--O1}
inc="-Isrc -I. -I$root/host -I$root/host/include"
obj() { echo "${1//\//_}"; } # core/memory -> core_memory
newer() { # newer OBJ SRC...: true when OBJ is missing or older than a source or a header
  [ -f "$1" ] || return 0
  local o=$1 s
  shift
  for s in "$@" src/*.h src/kernels/*.cuh src/kernels/*.h "$root"/host/*/*.h; do [ "$s" -nt "$o" ] && return 0; done
  return 1
}
objs=""
: >cmds
for f in $hostfiles; do
  o=$(obj $f).o
  objs="$objs $o"
  newer $o src/$f.c &&
    echo "cc $opt -std=gnu11 -fopenmp -mavx2 -mfma -mf16c -DLUTRA_HAVE_CUDA=1 -w $inc -c src/$f.c -o $o" >>cmds
done
for f in $kernels emu_probe emu cuda_device backend_cuda; do
  s=src/kernels/$f.cu o=$opt
  [ $f = emu_probe ] && s=src/$f.cu
  [ $f = cuda_device ] && s=$root/host/core/$f.cu # the core's device table (no kernels: not rewritten)
  [ $f = backend_cuda ] && s=$root/host/ops/$f.cu # the ops' CUDA table (no kernels either)
  [ $f = emu ] && s=$here/emu.cpp o=-O2 # the emulator's runtime (the mma arithmetic): quick to build, hot
  objs="$objs $f.cu.o"
  newer $f.cu.o $s "$here/emu.cpp" && echo "c++ $o -std=c++17 -DLUTRA_HAVE_CUDA=1 -w $inc -x c++ -c $s -o $f.cu.o" >>cmds
done
# two compiles at a time (CI and this machine have 2 cores)
[ -s cmds ] && { xargs -P 2 -I{} sh -c '{} || exit 255' <cmds || { echo "run.sh: a compile failed" >&2; exit 1; }; }
drivers="emu_main emu_check emu_elementwise emu_nn emu_optim emu_attention emu_errors reduce_softmax emu_gather emu_sort"
for d in $drivers; do
  objs="$objs $d.o"
  if newer $d.o "$here/$d.c" "$here/emu_check.h"; then
    cc -O1 -g -std=gnu11 -w -I"$here" -I"$root/host/include" -I"$root/host" -c "$here/$d.c" -o $d.o
  fi
done
c++ -o emu_test $objs -L"$lib" -llutra -Wl,-rpath,"$lib" -lopenblas -pthread -fopenmp -lm
[ $# -gt 0 ] || set -- all
run() { EMU_QUICK=$quick EMU_REVERSE=$1 timeout "${EMU_TIMEOUT:-3000}" ./emu_test "${@:2}"; }
if [ "$EMU_REVERSE" = both ]; then
  run 0 "$@" && echo "run.sh: again, the threads of each block in reverse order" && run 1 "$@"
else
  run "${EMU_REVERSE:-0}" "$@"
fi
