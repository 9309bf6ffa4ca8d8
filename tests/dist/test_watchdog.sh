#!/bin/bash
# No silent hangs: the watchdog ends a job where one rank skips a collective, debug mode
# names a mismatched call on every rank, and LUTRA_HOLD_FILE holds the watchdog.
# Usage (from the repo root): bash tests/dist/test_watchdog.sh LUTRA MPIRUN
set -u
LUTRA=${1:?usage: test_watchdog.sh LUTRA MPIRUN}
MPIRUN=${2:?usage: test_watchdog.sh LUTRA MPIRUN}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $1"; echo "--- output:"; cat "$dir/out"; echo "---"; }
expect() { # expect NAME FRAGMENT: the output contains FRAGMENT
  if grep -qF -- "$2" "$dir/out"; then ok; else bad "$1: output lacks '$2'"; fi
}
run() { # run NP SCRIPT [mpirun options...]
  local np=$1 script=$2
  shift 2
  local t0=$SECONDS
  timeout 60 "$MPIRUN" --oversubscribe --bind-to none -np "$np" -x OMP_NUM_THREADS=1 -x LUTRA_QUIET=1 "$@" \
    "$LUTRA" "$script" >"$dir/out" 2>&1
  status=$?
  elapsed=$((SECONDS - t0))
}

# 1. rank 1 skips an all_reduce: the job ends within ~30 s, non-zero, naming the pending op
run 2 tests/dist/scripts/skip_collective.lua -x LUTRA_COMM_TIMEOUT=3
if [ "$status" -ne 0 ] && [ "$status" -ne 124 ]; then ok; else bad "skipped collective: exit status $status"; fi
if [ "$elapsed" -le 30 ]; then ok; else bad "skipped collective: took ${elapsed} s"; fi
expect "skipped collective" "lutra watchdog: rank 0: all_reduce on group world (seq 2, f32, [1024]) has not completed after"
expect "skipped collective" "lutra watchdog: rank 1: recv on group world (seq 2, f32, [8]) has not completed after"
expect "flight recorder" "seq 1 all_reduce on group world (f32, [4]) done"
if grep -qF "unreachable" "$dir/out"; then bad "skipped collective: a rank went on"; else ok; fi
echo "skipped collective: status $status after ${elapsed} s"
grep "lutra watchdog" "$dir/out" | head -8

# 2. debug mode: all_reduce on rank 0, broadcast on rank 1 -> the same error on both ranks
run 2 tests/dist/scripts/debug_mismatch.lua -x LUTRA_COMM_DEBUG=1 -x LUTRA_COMM_TIMEOUT=20
if [ "$status" -ne 0 ] && [ "$status" -ne 124 ]; then ok; else bad "debug mismatch: exit status $status"; fi
expect "debug mismatch" "comm: collective mismatch on group world at seq 2: rank 0 all_reduce f32 [16] at tests/dist/scripts/debug_mismatch.lua:8, rank 1 broadcast f32 [4] root 0 at tests/dist/scripts/debug_mismatch.lua:10"
n=$(grep -c "collective mismatch" "$dir/out")
if [ "$n" -ge 2 ]; then ok; else bad "debug mismatch: reported by $n ranks, expected 2"; fi
grep -m1 "collective mismatch" "$dir/out"

# 3. a hold on rank 0 longer than the timeout: rank 1 waits on, the job completes
run 2 tests/dist/scripts/hold.lua -x LUTRA_COMM_TIMEOUT=2 -x LUTRA_HOLD_FILE="$dir/hold" -x HOLD_SECONDS=5
if [ "$status" -eq 0 ]; then ok; else bad "hold: exit status $status"; fi
expect "hold" "lutra watchdog: rank 1: held: all_reduce on group world (seq 2) waits while $dir/hold exists"
expect "hold" "rank 1: all_reduce done after the hold"
if [ ! -e "$dir/hold" ]; then ok; else bad "hold: the hold file was not removed"; fi
grep -m1 "held:" "$dir/out"

# 4. a rank that fails with an error ends the job long before the watchdog's timeout
run 2 tests/dist/scripts/rank_error.lua -x LUTRA_COMM_TIMEOUT=100
if [ "$status" -ne 0 ] && [ "$status" -ne 124 ]; then ok; else bad "rank error: exit status $status"; fi
if [ "$elapsed" -le 20 ]; then ok; else bad "rank error: took ${elapsed} s (waited for the watchdog?)"; fi
expect "rank error" "rank 1 fails on purpose"
echo "rank error: status $status after ${elapsed} s"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
