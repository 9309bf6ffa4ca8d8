#!/usr/bin/env bash
# bench/allreduce.sh — all_reduce bus bandwidth, lutra.dist (bench/allreduce.lua) next to a
# plain C MPI_Allreduce loop (bench/allreduce_mpi.c), same sizes, ranks and timing.
#   bench/allreduce.sh [BUILD_DIR (default build)] [ROUNDS (default 3)]   env NP (default 2), REPS (7)
# The two programs run alternately ROUNDS times each; for each size the table keeps each
# one's best round (a shared machine's load comes and goes), and prints the ratio ours/MPI
# and its median over the sizes.
set -u
BUILD=${1:-build}
ROUNDS=${2:-3}
NP=${NP:-2}
REPS=${REPS:-7}
LUTRA=$BUILD/lutra
PEER=$BUILD/bench/allreduce_mpi
for f in "$LUTRA" "$PEER"; do
  if [ ! -x "$f" ]; then
    echo "allreduce.sh: $f is missing (cmake --build $BUILD; the peer needs MPI found by CMake)" >&2
    exit 2
  fi
done
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
MPIRUN=(mpirun --oversubscribe --bind-to none -np "$NP" -x OMP_NUM_THREADS=1 -x LUTRA_QUIET=1)
here=$(dirname "$0")
for r in $(seq "$ROUNDS"); do
  "${MPIRUN[@]}" "$LUTRA" "$here/allreduce.lua" --raw --reps "$REPS" >"$T/ours.$r" || exit 1
  "${MPIRUN[@]}" "$PEER" "$REPS" >"$T/mpi.$r" || exit 1
done
echo "all_reduce, f32 sum in place, $NP ranks, $(nproc) cores: bus bandwidth GB/s (median of $REPS blocks, best of $ROUNDS rounds)"
awk -v rounds="$ROUNDS" '
  FNR == 1 { who = FILENAME ~ /ours/ ? "ours" : "mpi" }
  NF == 3 {
    if (!($1 in seen)) { seen[$1] = 1; sizes[++n] = $1 }
    if ($3 > best[who, $1]) best[who, $1] = $3
  }
  function human(b) { return b >= 1048576 ? sprintf("%d MiB", b / 1048576) : sprintf("%d KiB", b / 1024) }
  END {
    printf "%10s %10s %10s %7s\n", "size", "ours", "MPI", "ratio"
    for (i = 1; i <= n; i++) {
      s = sizes[i]; o = best["ours", s]; m = best["mpi", s]
      ratio[i] = m > 0 ? o / m : 0
      printf "%10s %10.3f %10.3f %7.2f\n", human(s), o, m, ratio[i]
    }
    # median of the ratios (insertion sort: a handful of sizes)
    for (i = 2; i <= n; i++) { v = ratio[i]; j = i - 1; while (j > 0 && ratio[j] > v) { ratio[j + 1] = ratio[j]; j-- } ratio[j + 1] = v }
    med = n % 2 ? ratio[(n + 1) / 2] : (ratio[n / 2] + ratio[n / 2 + 1]) / 2
    printf "median ratio ours/MPI: %.2f\n", med
  }' "$T"/ours.* "$T"/mpi.*
