#!/usr/bin/env bash
# bench/matmul_procs.sh — lt.matmul against cblas_sgemm, each in a process of its own, alternating.
#   bench/matmul_procs.sh [-n ROUNDS] [SIZE]
# bench/ops.lua compares the two in one process (same OpenBLAS state, same buffers); here the
# peer is a plain C program with OpenBLAS's defaults (bench/sgemm_direct.c, built to a
# temporary directory with cc), lutra runs bench/matmul.lua, both at SIZE^3 f32 (default 1024)
# on OpenBLAS's default thread count for the peer and lutra's (all cores) for lutra. Prints
# every round and the medians and their ratio.
# Environment: LUTRA (default build/lutra, else the first build*/lutra found), CC (default cc).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=7
if [[ "${1:-}" == "-n" ]]; then rounds="$2"; shift 2; fi
size="${1:-1024}"
lutra="${LUTRA:-}"
if [[ -z "$lutra" ]]; then
  for c in build/lutra build*/lutra; do
    if [[ -x "$c" ]]; then lutra="$c"; break; fi
  done
fi
[[ -x "$lutra" ]] || { echo "matmul_procs: no lutra binary (set LUTRA=path)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${CC:-cc}" -O2 bench/sgemm_direct.c -o "$tmp/sgemm_direct" -lopenblas
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<<"$2"; }
ours=() direct=()
for ((r = 1; r <= rounds; r++)); do
  o=$("$lutra" bench/matmul.lua "$size") d=$("$tmp/sgemm_direct" "$size")
  echo "round $r: lutra $o | cblas_sgemm $d"
  ours+=("$(field gflops "$o")") direct+=("$(field gflops "$d")")
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
awk -v o="$(median "${ours[@]}")" -v d="$(median "${direct[@]}")" -v s="$size" 'BEGIN {
  printf "matmul %d^3 f32, separate processes: lutra %.1f GFLOP/s, cblas_sgemm %.1f GFLOP/s, ratio %.3f\n", s, o, d, o / d }'
