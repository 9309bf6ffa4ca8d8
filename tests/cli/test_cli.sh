#!/usr/bin/env bash
# test_cli.sh — the lutra command line: the `arg` table (compared with plain luajit), -e, -l,
# -i, -, --version, --help, exit statuses, os.exit, error messages (FILE:LINE + traceback),
# package.path order, and `lutra selftest` without its module.
# usage: test_cli.sh LUTRA LIBLUTRA
LUTRA=$(realpath "${1:?usage: test_cli.sh path/to/lutra path/to/liblutra.so}")
SRC=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d)
VERSION_LUA='local ffi = require "ffi" ffi.cdef "const char *lt_version(void);" io.write(ffi.string(ffi.C.lt_version()))'
trap 'rm -rf "$T"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"
expect_no_grep() { if printf '%s\n' "$2" | grep -qE -- "$3"; then bad "$1: [$2] matches /$3/"; else ok; fi; }

# ---- arg table and varargs, as luajit builds them --------------------------------------
cat >"$T/args.lua" <<'EOF'
local lo, hi = 0, 0
while arg[lo - 1] ~= nil do lo = lo - 1 end
while arg[hi + 1] ~= nil do hi = hi + 1 end
for i = lo, hi do io.write(i, "=", i == lo and "INTERP" or arg[i], "\n") end
io.write("n=", select("#", ...), " ", table.concat({...}, ","), "\n")
EOF
command -v luajit >/dev/null || bad "luajit not in PATH: the arg table is compared with it"
for opts in "" "-e x=1" "-e x=1 -e y=2 --"; do
  # shellcheck disable=SC2086
  got=$("$LUTRA" $opts "$T/args.lua" a "b c" "" -x 2>&1)
  # shellcheck disable=SC2086
  want=$(luajit $opts "$T/args.lua" a "b c" "" -x 2>&1)
  expect_eq "arg table (options: '$opts')" "$got" "$want"
done
cat >"$T/arg0.lua" <<'EOF'
print(arg[0], arg[-1], arg[1], arg[2], #arg)
EOF
expect_eq "arg[0] script, arg[-1] interpreter" "$("$LUTRA" "$T/arg0.lua" p q)" "$T/arg0.lua	$LUTRA	p	q	2"

# ---- -e, -l, -, -i -----------------------------------------------------------------------
expect_eq "-e runs" "$("$LUTRA" -e 'print(6 * 7)')" "42"
expect_eq "-e repeatable, in order" "$("$LUTRA" -e 'x = 20' -e 'x = x + 1' -e'print(x * 2)')" "42"
echo 'print(y)' >"$T/printy.lua"
expect_eq "-e runs before the script" "$("$LUTRA" -e 'y = 5' "$T/printy.lua")" "5"
"$LUTRA" -e 'error("from e")' >"$T/out" 2>&1
st=$?
expect_eq "-e error exit status" "$st" "1"
expect_grep "-e error message" "$(cat "$T/out")" '^\(command line\):1: from e'
mkdir -p "$T/mods"
echo 'print("mod loaded"); return {}' >"$T/mods/zzmod.lua"
expect_eq "-l requires" "$(LUA_PATH="$T/mods/?.lua;;" "$LUTRA" -l zzmod -e 'print(package.loaded.zzmod ~= nil)')" "mod loaded
true"
expect_eq "- runs stdin" "$(echo 'print(arg[0], ...)' | "$LUTRA" - u v)" "-	u	v"
echo 'zz = 41' >"$T/setz.lua"
expect_eq "-i runs the script then the REPL" "$(printf 'zz + 1\n' | "$LUTRA" -i "$T/setz.lua" 2>/dev/null)" "42"
echo 'zz = 41; error("script fails")' >"$T/ifail.lua"
out=$(printf 'zz + 1\n' | "$LUTRA" -i "$T/ifail.lua" 2>/dev/null)
expect_eq "-i opens the REPL after a failed script, exit status 1" "$out:$?" "42:1"
expect_eq "-j and -O options" "$("$LUTRA" -joff -O3 -e 'print((jit.status()))')" "false"

# ---- versions and help ---------------------------------------------------------------------
v=$("$LUTRA" --version)
expect_grep "--version" "$v" '^lutra [0-9]+\.[0-9]+\.[0-9]+ \(LuaJIT 2\.[0-9]'
expect_eq "-v same as --version" "$("$LUTRA" -v)" "$v"
expect_grep "--version has liblutra's version" "$v" "lutra $("$LUTRA" -e "$VERSION_LUA") "
h=$("$LUTRA" --help)
st=$?
expect_eq "--help exit status" "$st" "0"
expect_grep "--help usage" "$h" '^usage: lutra'
expect_grep "--help lists doctor" "$h" 'doctor'
expect_grep "--help lists --repl-on-error" "$h" '--repl-on-error'
"$LUTRA" --bogus >"$T/out" 2>&1
expect_eq "unknown option exit status" "$?" "1"
expect_grep "unknown option prints usage" "$(cat "$T/out")" '^usage: lutra'
expect_grep "unknown option named" "$(cat "$T/out")" "^lutra: unknown option '--bogus'"
expect_no_grep "unknown option: no traceback" "$(cat "$T/out")" 'stack traceback'

# ---- exit statuses and error messages --------------------------------------------------------
echo 'print("fine")' >"$T/ok.lua"
"$LUTRA" "$T/ok.lua" >/dev/null
expect_eq "clean script exits 0" "$?" "0"
printf 'os.exit(3)\n' >"$T/exit3.lua"
"$LUTRA" "$T/exit3.lua"
expect_eq "os.exit(3)" "$?" "3"
"$LUTRA" -e 'os.exit(true)'
expect_eq "os.exit(true)" "$?" "0"
"$LUTRA" -e 'os.exit(false)'
expect_eq "os.exit(false)" "$?" "1"
"$LUTRA" -e 'io.write("buffered"); os.exit(0)' >"$T/out"
expect_eq "os.exit flushes stdout" "$(cat "$T/out")" "buffered"
cat >"$T/err.lua" <<'EOF'
local function inner(x)
  return x + nil
end
local function outer() return (inner(1)) end
print("before")
outer()
print("never")
EOF
"$LUTRA" "$T/err.lua" >"$T/out" 2>"$T/errout"
st=$?
expect_eq "uncaught error exits 1" "$st" "1"
expect_eq "stdout before the error" "$(cat "$T/out")" "before"
expect_grep "error message starts with FILE:LINE" "$(head -1 "$T/errout")" "^$T/err.lua:2: attempt to perform arithmetic"
expect_grep "traceback follows" "$(cat "$T/errout")" '^stack traceback:'
expect_grep "traceback names the function" "$(cat "$T/errout")" "err.lua:2: in function 'inner'"
expect_grep "traceback reaches the main chunk" "$(cat "$T/errout")" "err.lua:6: in main chunk"
printf 'local t = setmetatable({}, {__tostring = function() return "custom error object" end})\nerror(t)\n' >"$T/errobj.lua"
"$LUTRA" "$T/errobj.lua" 2>"$T/errout"
expect_eq "error object exit status" "$?" "1"
expect_grep "error object uses __tostring" "$(head -1 "$T/errout")" '^custom error object$'
printf 'x = = 1\n' >"$T/syntax.lua"
"$LUTRA" "$T/syntax.lua" 2>"$T/errout"
expect_eq "syntax error exit status" "$?" "1"
expect_grep "syntax error names FILE:LINE" "$(head -1 "$T/errout")" "^$T/syntax.lua:1: unexpected symbol"
"$LUTRA" "$T/missing.lua" 2>"$T/errout"
expect_eq "missing script exit status" "$?" "1"
expect_grep "missing script message" "$(cat "$T/errout")" 'cannot open .*missing.lua'
"$LUTRA" lanch x 2>"$T/errout"
expect_eq "mistyped command exit status" "$?" "1"
expect_grep "mistyped command: one line naming the commands" "$(cat "$T/errout")" '^lutra: cannot open lanch: .*nor is it a command: doctor, selftest, launch'
printf 'local cfg = require("lutra").config {steps = 10}\nprint(cfg.steps)\n' >"$T/cfg.lua"
"$LUTRA" "$T/cfg.lua" --stpes=3 2>"$T/errout"
expect_eq "mistyped recipe option exit status" "$?" "1"
expect_eq "mistyped recipe option: one line, no traceback" "$(cat "$T/errout")" \
  "$T/cfg.lua:1: config: unknown config key 'stpes'; did you mean 'steps'? (--stpes=3)"
printf 'error("only the message", 0)\n' >"$T/lvl0.lua"
"$LUTRA" "$T/lvl0.lua" 2>"$T/errout"
expect_grep "error level 0 message" "$(head -1 "$T/errout")" '^only the message$'

# ---- package.path ------------------------------------------------------------------------------
pp=$(LUA_PATH="/user/dir/?.lua;;" "$LUTRA" -e 'io.write(package.path)')
expect_grep "LUTRA_LUA_DIR first" "$pp" "^$SRC/lua/\?\.lua;$SRC/lua/\?/init\.lua;"
exedir=$(cd "$(dirname "$LUTRA")" && pwd -P)
expect_grep "<exe dir>/../lua fallback" "$pp" "$exedir/\.\./lua/\?\.lua"
expect_grep "<exe dir>/../share/lutra/lua fallback" "$pp" "$exedir/\.\./share/lutra/lua/\?\.lua"
expect_grep "user LUA_PATH after ours" "$pp" "share/lutra/lua/\?/init\.lua;/user/dir/\?\.lua;"
expect_eq "lutra.repl found from any directory" "$(cd / && "$LUTRA" -e 'io.write(type(require("lutra.repl").complete))')" "function"
expect_no_grep "-E ignores LUA_PATH" "$(LUA_PATH="/user/dir/?.lua;;" "$LUTRA" -E -e 'io.write(package.path)')" '/user/dir'
expect_eq "LUA_INIT runs first" "$(LUA_INIT='zz_init = 7' "$LUTRA" -e 'print(zz_init)')" "7"

# ---- selftest without its module: a broken installation fails (never a skip) -------------------
if [ ! -e "$SRC/lua/lutra/selftest.lua" ] && [ ! -e "$SRC/lua/lutra/selftest/init.lua" ]; then
  "$LUTRA" selftest >/dev/null 2>"$T/errout"
  expect_eq "selftest without module exits 1" "$?" "1"
  expect_grep "selftest says the module is missing" "$(cat "$T/errout")" 'lutra.selftest not found'
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
