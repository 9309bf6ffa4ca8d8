#!/usr/bin/env bash
# bench/alltoall.sh — all_to_all bus bandwidth, lutra.dist (bench/alltoall.lua) next to a
# plain C MPI_Alltoallv loop (bench/alltoall_mpi.c as liballtoall_peer.so), run in the same
# processes with their timed blocks alternating, under mpirun.
#   bench/alltoall.sh [BUILD_DIR (default build)]   env NP (ranks, default 2), REPS (default 15)
# One table: size, ours GB/s, MPI GB/s, ratio; then the median ratio. The load average is
# printed first: on a shared machine the figures move with it.
set -u
BUILD=${1:-build}
NP=${NP:-2}
REPS=${REPS:-15}
LUTRA=$BUILD/lutra
PEER=$BUILD/bench/liballtoall_peer.so
for f in "$LUTRA" "$PEER"; do
  if [ ! -e "$f" ]; then
    echo "alltoall.sh: $f is missing (cmake --build $BUILD; the peer needs MPI found by CMake)" >&2
    exit 2
  fi
done
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
echo "$(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
exec mpirun --oversubscribe --bind-to none -np "$NP" -x OMP_NUM_THREADS=1 -x LUTRA_QUIET=1 \
  "$LUTRA" "$(dirname "$0")/alltoall.lua" --reps "$REPS" --peer "$PEER"
