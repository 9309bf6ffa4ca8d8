#!/usr/bin/env bash
# test_repl_help.sh — help(x) in the REPL fed through a pipe: the top-level REPL and the post-mortem one
# (--repl-on-error) print the sources' doc comments (lutra.doc, the text docs/api.md has); and
# tests/house/api_doc.lua --check refuses a docs/api.md that is not what it would write.
# usage: test_repl_help.sh LUTRA LIBLUTRA
LUTRA=$(realpath "${1:?usage: test_repl_help.sh path/to/lutra path/to/liblutra.so}")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"
repl() {
  printf '%s\n' "$1" | "$LUTRA" "${@:2}" >"$T/out" 2>"$T/err"
  st=$?
  out=$(cat "$T/out")
  err=$(cat "$T/err")
}

repl 'help(lutra.nn.Linear)'
expect_contains "help(nn.Linear): the module head" "$out" "nn.Linear(in_features, out_features, {bias = true, dtype =, device =}):"
expect_contains "help(nn.Linear): where" "$out" "(lutra.nn.linear, lutra/nn/linear.lua)"
repl 't = lutra.zeros(2, 2)
help(t.matmul)'
expect_contains "help(t.matmul): the definition line" "$out" "function M.matmul(a, b, out)  (lutra/ops/matmul.lua:"
expect_contains "help(t.matmul): the comment above it" "$out" "a (..., M, K) @ b (..., K, N) -> (..., M, N), batch dims broadcast."
repl 'help("cross_entropy")'
expect_contains "help(\"cross_entropy\"): the usage line" "$out" "F.cross_entropy(logits, targets, opts)   -> loss, losses, lse"
repl 'help(lutra.train)'
expect_contains "help(lutra.train)" "$out" "lutra.train — the training loop."
repl 'help(12345)'
expect_contains "help of something undocumented" "$out" "help: no documentation for 12345"
expect_eq "exit status" "$st" "0"

# the post-mortem REPL has help() too
cat >"$T/fail.lua" <<'EOF'
local lt = require "lutra"
error("stop here")
EOF
repl 'help("rope")' --repl-on-error "$T/fail.lua"
expect_contains "post-mortem help(\"rope\")" "$out" "F.rope(x, positions, rope, out)"
expect_eq "post-mortem exit status" "$st" "1"

# a reference that differs from the sources' doc comments fails the check, naming the file and the fix
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cp "$ROOT/docs/api.md" "$T/api.md"
(cd "$ROOT" && "$LUTRA" tests/house/api_doc.lua --check "$T/api.md" >"$T/out" 2>"$T/err")
expect_eq "api_doc --check: a current reference passes" "$?" "0"
printf 'a line the sources do not have\n' >>"$T/api.md"
(cd "$ROOT" && "$LUTRA" tests/house/api_doc.lua --check "$T/api.md" >"$T/out" 2>"$T/err")
expect_eq "api_doc --check: a stale reference fails" "$?" "1"
expect_contains "api_doc --check: the message" "$(cat "$T/err")" "api.md is not current with the sources' doc comments: run \`build/lutra tests/house/api_doc.lua --write"
(cd "$ROOT" && "$LUTRA" tests/house/api_doc.lua --write "$T/again.md" >"$T/out" 2>"$T/err")
expect_eq "api_doc --write writes what --check expects" "$(cmp "$T/again.md" "$ROOT/docs/api.md" && echo same)" "same"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
