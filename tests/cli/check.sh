# Sourced by the command-line tests: pass/fail counters and the checks they share. A test
# ends with: echo "$pass passed, $fail failed"; [ "$fail" = 0 ]
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() {
  fail=$((fail + 1))
  echo "FAIL: $*"
}
expect_eq() { if [ "$2" = "$3" ]; then ok; else bad "$1: got [$2] want [$3]"; fi; }
expect_grep() { if printf '%s\n' "$2" | grep -qE -- "$3"; then ok; else bad "$1: [$2] does not match /$3/"; fi; }
expect_contains() { if printf '%s\n' "$2" | grep -qF -- "$3"; then ok; else bad "$1: [$2] does not contain [$3]"; fi; }
# expect_num NAME VALUE OP BOUND: a number compared with a bound (OP: < <= > >=); an empty or
# non-numeric VALUE (nan, inf, nothing printed) fails.
expect_num() {
  if [[ $2 =~ ^-?[0-9]+(\.[0-9]+)?$ ]] && awk -v v="$2" -v b="$4" "BEGIN { exit !(v $3 b) }"; then ok
  else bad "$1: [$2] is not $3 $4"; fi
}
