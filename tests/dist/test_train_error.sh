#!/bin/bash
# An error in the middle of a parallel step ends the job cleanly: rank 1's loss_fn raises in
# step 2 (tests/dist/scripts/train_error.lua) under dp, ZeRO 3, tp and pp; the job exits
# non-zero with the message, no rank ends on a signal (a segfault in MPI_Finalize, say), and
# the job ends by the error, not by the watchdog (whose timeout is set far away).
# Usage (from the repo root): bash tests/dist/test_train_error.sh LUTRA MPIRUN
set -u
LUTRA=${1:?usage: test_train_error.sh LUTRA MPIRUN}
MPIRUN=${2:?usage: test_train_error.sh LUTRA MPIRUN}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $1"; echo "--- output:"; cat "$dir/out"; echo "---"; }

for layout in dp zero3 tp pp; do
  timeout 300 "$MPIRUN" --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 -x LUTRA_QUIET=1 \
    -x LUTRA_COMM_TIMEOUT=600 -x LAYOUT=$layout "$LUTRA" tests/dist/scripts/train_error.lua >"$dir/out" 2>&1
  status=$?
  if [ "$status" -ne 0 ] && [ "$status" -ne 124 ]; then ok; else bad "$layout: exit status $status"; fi
  if grep -qF "rank 1's loss_fn fails in step 2 on purpose" "$dir/out"; then ok; else bad "$layout: no message"; fi
  if grep -qiE "signal|segmentation|core dumped|sigsegv" "$dir/out"; then bad "$layout: a rank ended on a signal"; else ok; fi
  if grep -qF "has not completed after" "$dir/out"; then bad "$layout: ended by the watchdog"; else ok; fi
  if grep -qF "unreachable" "$dir/out"; then bad "$layout: a rank finished"; else ok; fi
  echo "$layout: status $status"
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
