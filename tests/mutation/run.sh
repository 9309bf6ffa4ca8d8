#!/usr/bin/env bash
# tests/mutation/run.sh — do the dist tests catch plausible bugs? Copies the tree (tracked and
# untracked files, not ignored ones), builds the copy once (CPU only), runs the dist suite on
# it unchanged (it must pass), then applies each mutation below alone, runs the suite again
# (it must fail) and restores the file. Prints a table: mutation, caught or not, the tests
# that failed. Exits 1 when a mutation was missed or the unchanged suite failed.
#
#   bash tests/mutation/run.sh              # every mutation (~5 min each on 2 cores)
#   bash tests/mutation/run.sh ddp_sum      # only those named
#   LUTRA_MUTATION_DIR=/tmp/m ...           # where the copy goes (kept; default: a temp dir, removed)
#   LUTRA_MUTATION_TESTS=regex              # a subset of the dist tests (ctest -R)
#   LUTRA_MUTATION_REV=HEAD                 # copy a commit rather than the working tree
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here=$root/tests/mutation

# name | file | the exact text (once in the file) | its replacement | what the bug is
mutations=(
  "ddp_sum|lua/lutra/dist/ddp.lua|\"all_reduce\", b.flat, \"avg\")|\"all_reduce\", b.flat, \"sum\")|data parallel sums the gradients instead of averaging them"
  "tp_allreduce_dropped|lua/lutra/dist/tp_ops.lua|declare("TPCopyToBackward", function(n, g) return all_reduced(g, n.group) end)|declare("TPCopyToBackward", function(n, g) return g end)|tensor parallel: the all-reduce of the input gradient of a column-parallel layer is dropped"
  "pp_microbatch_skipped|lua/lutra/dist/pp_exec.lua|local scaled = loss * scale|local scaled = loss * (a.micro == 1 and 0 or scale)|pipeline: the first micro-batch's gradient is skipped"
  "zero2_shard_offset|lua/lutra/dist/zero.lua|flat.move(inp, r * S + e.off,|flat.move(inp, ((r + (self.stage == 2 and 1 or 0)) % n) * S + e.off,|ZeRO-2: each rank's gradient rows go into the next rank's reduce-scatter chunk"
  "loader_resume_off_by_one|lua/lutra/data.lua|  self.step = step\n  return self|  self.step = step + 1\n  return self|the loader resumes one batch later than it was saved"
  "ckpt_other_rank_file|lua/lutra/ckpt/reader.lua|local name = self.manifest.files[k + 1]|local name = self.manifest.files[(k + 1) % #self.manifest.files + 1]|a checkpoint shard is read from the next rank's file"
  "clip_norm_replicas|lua/lutra/dist/parallelize.lua|if not self.zero then total_sq = total_sq / mesh.dp_size end|total_sq = total_sq|the global gradient norm counts every data-parallel replica"
)

wanted=("$@")
selected() {
  [ ${#wanted[@]} -eq 0 ] && return 0
  local w
  for w in "${wanted[@]}"; do [ "$w" = "$1" ] && return 0; done
  return 1
}

work=${LUTRA_MUTATION_DIR:-}
if [ -z "$work" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
tree=$work/tree
rm -rf "$tree"
mkdir -p "$tree"
if [ -n "${LUTRA_MUTATION_REV:-}" ]; then
  git -C "$root" archive "$LUTRA_MUTATION_REV" | tar -C "$tree" -xf -
else
  (cd "$root" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -C "$tree" -xf -
fi
# the copy's tests find ../shared as the original does
[ -e "$root/../shared" ] && [ ! -e "$work/shared" ] && ln -s "$(cd "$root/../shared" && pwd)" "$work/shared"

echo "mutation: building the copy in $tree/build (CPU only)"
if ! bash "$tree/.ci/build" "$tree/build" -DLUTRA_CUDA=OFF >"$work/build.log" 2>&1; then
  tail -20 "$work/build.log"
  echo "mutation: the copy does not build" >&2
  exit 1
fi

if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_btl_vader_single_copy_mechanism=none
jobs=${LUTRA_JOBS:-$(nproc)}

# Runs the dist suite; prints the names of the tests that failed (none: it passed).
run_suite() {
  local log=$1
  local filter=()
  [ -n "${LUTRA_MUTATION_TESTS:-}" ] && filter=(-R "$LUTRA_MUTATION_TESTS")
  (cd "$tree/build" && ctest -L dist "${filter[@]}" -j "$jobs" --timeout 900 >"$log" 2>&1)
  sed -n '/The following tests FAILED/,$p' "$log" | sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\) .*/\1/p'
}

echo "mutation: the unchanged suite"
base_failed=$(run_suite "$work/base.log")
ran=$(grep -c "Test *#" "$work/base.log")
if [ -n "$base_failed" ] || [ "$ran" -eq 0 ]; then
  echo "mutation: the unchanged dist suite fails ($ran tests ran): $base_failed" >&2
  tail -30 "$work/base.log"
  exit 1
fi
echo "mutation: the unchanged suite passes ($ran tests)"

rows=()
missed=0
for m in "${mutations[@]}"; do
  IFS='|' read -r name file old new what <<<"$m"
  selected "$name" || continue
  cp "$tree/$file" "$work/original"
  if ! python3 "$here/apply.py" "$tree/$file" "$old" "$new"; then
    rows+=("$(printf '%-26s %-8s %s' "$name" "ERROR" "the text to mutate is not (once) in $file: update run.sh")")
    missed=$((missed + 1))
    continue
  fi
  start=$SECONDS
  failed=$(run_suite "$work/$name.log")
  cp "$work/original" "$tree/$file"
  secs=$((SECONDS - start))
  if [ -n "$failed" ]; then
    rows+=("$(printf '%-26s %-8s %4ds  %s' "$name" "caught" "$secs" "$(echo $failed | tr ' ' ',')")")
  else
    rows+=("$(printf '%-26s %-8s %4ds  %s' "$name" "MISSED" "$secs" "every dist test passed")")
    missed=$((missed + 1))
  fi
  echo "${rows[-1]}   ($what)"
done

echo
printf '%-26s %-8s %5s  %s\n' mutation result time "dist tests that failed"
for r in "${rows[@]}"; do echo "$r"; done
total=${#rows[@]}
echo "$((total - missed)) passed, $missed failed"
[ "$missed" -eq 0 ]
