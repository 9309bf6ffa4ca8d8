#!/bin/bash
# A ring of async p2p rounds in debug mode where rank 1 skips a round: the watchdog ends the
# job on both ranks, naming the pending p2p, its seq and the rank it waits on (see
# tests/dist/scripts/ring_skip.lua; the working ring is tests/dist/test_ring.lua).
# Usage (from the repo root): bash tests/dist/test_ring_watchdog.sh LUTRA MPIRUN
set -u
LUTRA=${1:?usage: test_ring_watchdog.sh LUTRA MPIRUN}
MPIRUN=${2:?usage: test_ring_watchdog.sh LUTRA MPIRUN}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $1"; echo "--- output:"; cat "$dir/out"; echo "---"; }
expect() { # expect NAME FRAGMENT: the output contains FRAGMENT
  if grep -qF -- "$2" "$dir/out"; then ok; else bad "$1: output lacks '$2'"; fi
}

t0=$SECONDS
timeout 60 "$MPIRUN" --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 -x LUTRA_QUIET=1 \
  -x LUTRA_COMM_DEBUG=1 -x LUTRA_COMM_TIMEOUT=3 "$LUTRA" tests/dist/scripts/ring_skip.lua >"$dir/out" 2>&1
status=$?
elapsed=$((SECONDS - t0))
if [ "$status" -ne 0 ] && [ "$status" -ne 124 ]; then ok; else bad "ring skip: exit status $status"; fi
if [ "$elapsed" -le 30 ]; then ok; else bad "ring skip: took ${elapsed} s"; fi
# rounds 1 and 2 are seqs 1-4 (p2p, all_reduce); round 3's p2p (rank 0) and round 4's (rank 1) are seq 5
expect "ring skip" "lutra watchdog: rank 0: p2p on group world (seq 5, f32, [16]) has not completed after"
expect "ring skip" "lutra watchdog: rank 0: the pending p2p is with rank 1 of group world"
expect "ring skip" "lutra watchdog: rank 1: p2p on group world (seq 5, f32, [16]) has not completed after"
expect "ring skip" "lutra watchdog: rank 1: the pending p2p is with rank 0 of group world"
expect "flight recorder" "seq 4 all_reduce on group world (f32, [1]) done"
if grep -qF "collective mismatch" "$dir/out"; then bad "ring skip: the fingerprint checker objected to the ring"; else ok; fi
if grep -qF "unreachable" "$dir/out"; then bad "ring skip: a rank finished the ring"; else ok; fi
echo "ring skip: status $status after ${elapsed} s"
grep "lutra watchdog" "$dir/out" | grep -v "   seq" | head -4

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
