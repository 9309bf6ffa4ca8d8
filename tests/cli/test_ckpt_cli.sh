#!/usr/bin/env bash
# test_ckpt_cli.sh — `lutra ckpt ls` and `lutra ckpt inspect`: a run dir with three sharded
# checkpoints (one of them corrupted afterwards), the table's columns (step, layout, tensors,
# sizes, lz4 ratio, valid / INVALID with the reason, the latest marker), --verify catching a
# flipped byte that the quick check cannot see, --json, per-tensor stats against the values
# saved, usage errors (exit 2) and failures (exit 1); the REPL functions return tables.
# usage: test_ckpt_cli.sh LUTRA LIBLUTRA
LUTRA=$(realpath "${1:?usage: test_ckpt_cli.sh path/to/lutra path/to/liblutra.so}")
cd "$(dirname "$0")/../.." || exit 2
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run="$tmp/run"

TMPD="$run" "$LUTRA" -e '
local lt = require "lutra"
local ckpt = require "lutra.ckpt"
local root = os.getenv("TMPD")
for s = 1, 3 do
  local w = lt.arange(0, 64 * 32):view(64, 32):to("f32") / 100 * s   -- min 0, max 20.47 * s
  local e = lt.ones(100, 8):to("bf16")                               -- compresses well
  ckpt.save(string.format("%s/step_%06d", root, s * 100), {step = s * 100, layout = {dp = 2, tp = 1, pp = 1, zero = 1},
    config = {lr = 1e-3}, tensors = {{name = "layer.w", tensor = w}, {name = "emb", tensor = e}}})
end' || bad "making the checkpoints"

out=$("$LUTRA" ckpt ls "$run")
expect_eq "ls exit" "$?" "0"
expect_contains "ls header" "$out" "checkpoint         step layout"
expect_contains "ls latest" "$out" "step_000300"
expect_contains "ls marks latest" "$(printf '%s\n' "$out" | grep step_000300)" "<- latest"
expect_contains "ls layout" "$out" "dp=2 tp=1 pp=1 zero=1"
expect_contains "ls valid" "$(printf '%s\n' "$out" | grep step_000100)" "valid"
expect_eq "ls rows" "$(printf '%s\n' "$out" | grep -c '^step_')" "3"
ratio=$(printf '%s\n' "$out" | grep step_000100 | grep -o '[0-9.]*x' | tr -d x)
expect_eq "ls ratio > 1 (compressible weights)" "$(awk -v r="$ratio" 'BEGIN { print (r > 1.1) ? "yes" : "no" }')" "yes"

# a flipped byte in step 200's data: the quick ls misses it, --verify finds it
f="$run/step_000200/rank_00000.lz4"
size=$(stat -c %s "$f")
# (the byte is inverted, so it surely changes; by lutra itself: under the sanitizer build's
# LD_PRELOAD a plain dd is not what the test is about)
F="$f" AT=$((size / 3)) "$LUTRA" -e '
local f = assert(io.open(os.getenv("F"), "r+b"))
local at = tonumber(os.getenv("AT"))
f:seek("set", at)
local b = f:read(1):byte()
f:seek("set", at)
f:write(string.char(255 - b))
f:close()' || bad "flipping a byte"
out=$("$LUTRA" ckpt ls "$run" --verify)
expect_eq "ls --verify exit on a corrupt checkpoint" "$?" "1"
expect_contains "ls --verify names the problem" "$(printf '%s\n' "$out" | grep step_000200)" "INVALID: ckpt: rank_00000.lz4: piece"
# a deleted shard is seen without --verify
rm "$run/step_000100/rank_00000.lz4"
out=$("$LUTRA" ckpt ls "$run")
expect_contains "ls: deleted shard" "$(printf '%s\n' "$out" | grep step_000100)" "rank_00000.lz4 is missing"

out=$("$LUTRA" ckpt inspect "$run/step_000300" --tensors)
expect_eq "inspect exit" "$?" "0"
expect_contains "inspect header" "$out" "step 300, layout dp=2 tp=1 pp=1 zero=1, world 1"
row=$(printf '%s\n' "$out" | grep '^layer.w')
expect_contains "inspect dtype/shape" "$row" "f32   {64,32}"
expect_contains "inspect min" "$row" " 0 "
expect_contains "inspect max" "$row" "61.41"
expect_contains "inspect bf16 row" "$(printf '%s\n' "$out" | grep '^emb')" "bf16  {100,8}"
out=$("$LUTRA" ckpt inspect "$run/step_000200" --tensors)
expect_eq "inspect of a corrupt checkpoint fails" "$?" "1"
expect_contains "inspect names the tensor's problem" "$out" "ERROR: ckpt.load: tensor 'layer.w'"
json=$("$LUTRA" ckpt inspect "$run/step_000300" --json)
expect_contains "inspect --json" "$json" '"step":300'

"$LUTRA" ckpt >/dev/null 2>&1
expect_eq "no words: usage, exit 2" "$?" "2"
"$LUTRA" ckpt frob "$run" >/dev/null 2>&1
expect_eq "unknown subcommand: exit 2" "$?" "2"
"$LUTRA" ckpt ls "$run" --bogus >/dev/null 2>&1
expect_eq "unknown option: exit 2" "$?" "2"
err=$("$LUTRA" ckpt ls "$tmp/nope" 2>&1)
expect_eq "missing dir: exit 1" "$?" "1"
expect_contains "missing dir message" "$err" "is not a directory"

# from the REPL: tables
out=$(TMPD="$run" "$LUTRA" -e '
local ckpt = require "lutra.ckpt"
local rows = ckpt.ls(os.getenv("TMPD"))
local info = ckpt.inspect(os.getenv("TMPD") .. "/step_000300", {tensors = true})
print(#rows, rows[1].name, rows[1].valid, info.step, info.tensors[1].name, string.format("%.3f", info.tensors[1].max), info.tensors[2].mean)')
expect_eq "REPL tables" "$out" "3	step_000300	true	300	layer.w	61.410	1"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
