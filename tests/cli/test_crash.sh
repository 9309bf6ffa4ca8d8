#!/usr/bin/env bash
# A fatal signal in a script (here a store through a bad FFI pointer) prints a C backtrace
# on stderr and still ends the process with that signal (exit 139 = 128 + SIGSEGV);
# LUTRA_NO_CRASH_HANDLER=1 leaves the signal alone. Under AddressSanitizer (CI's
# sanitizer pass) ASan reports the fault itself and the handler is not installed: there the
# test exits 77, ctest's skip.
# usage: test_crash.sh LUTRA LIBLUTRA
LUTRA=${1:?usage: test_crash.sh path/to/lutra path/to/liblutra.so}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fails=$((fails + 1)); fi; }
crash='local ffi = require "ffi"; ffi.cast("int *", 8)[0] = 1'

"$LUTRA" -e "$crash" >"$T/out" 2>"$T/err"
rc=$?
if grep -q AddressSanitizer "$T/err"; then
  echo "skipped: built with AddressSanitizer, which reports the fault itself"
  exit 77
fi
check "exit status is the signal's (139)" '[ "$rc" -eq 139 ]'
check "names the signal" 'grep -q "fatal signal SIGSEGV" "$T/err"'
check "prints a backtrace through main" 'grep -q "lutra(main+" "$T/err"'

LUTRA_NO_CRASH_HANDLER=1 "$LUTRA" -e "$crash" >"$T/out" 2>"$T/err"
rc=$?
check "LUTRA_NO_CRASH_HANDLER=1: still 139" '[ "$rc" -eq 139 ]'
check "LUTRA_NO_CRASH_HANDLER=1: no report" '! grep -q "fatal signal" "$T/err"'

# a script that does not crash is untouched
"$LUTRA" -e 'print("fine")' >"$T/out" 2>"$T/err"
check "a normal script exits 0" '[ $? -eq 0 ] && grep -q fine "$T/out"'
echo "$((6 - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
