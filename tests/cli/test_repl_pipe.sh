#!/usr/bin/env bash
# test_repl_pipe.sh — the REPL fed through a pipe (no readline): expression printing,
# several values, tables one level deep, tostring of tensors/objects, multi-line chunks,
# errors that do not end the session, the completion function, a broken `require "lutra"`,
# lutra.debug() (locals/upvalues read and assigned, EOF continues) and --repl-on-error.
# usage: test_repl_pipe.sh LUTRA LIBLUTRA
LUTRA=$(realpath "${1:?usage: test_repl_pipe.sh path/to/lutra path/to/liblutra.so}")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"
# repl INPUT: runs the REPL on INPUT; stdout in $out, stderr in $err, status in $st
repl() {
  printf '%s\n' "$1" | "$LUTRA" "${@:2}" >"$T/out" 2>"$T/err"
  st=$?
  out=$(cat "$T/out")
  err=$(grep -v '^lutra: require "lutra" failed' "$T/err")
}

# ---- printing ------------------------------------------------------------------------------
repl '1 + 41'
expect_eq "expression" "$out" "42"
expect_eq "exit status at EOF" "$st" "0"
repl '1, nil, "a", false'
expect_eq "several values, tab separated" "$out" "$(printf '1\tnil\ta\tfalse')"
repl '"just a string"'
expect_eq "string printed raw" "$out" "just a string"
repl '{1, 2, "s", x = 3, ["a b"] = true, t = {1}, e = {}}'
expect_eq "table one level deep" "$out" '{1, 2, "s", ["a b"] = true, e = {}, t = {...}, x = 3}'
repl 'x = 5
x
=x * 2
do return 7, 8 end
for i = 1, 3 do io.write(i) end print()'
expect_eq "statements, =expr, return in a block" "$out" "5
10
7	8
123"
repl 'setmetatable({}, {__tostring = function() return "OBJ<1>" end})
ffi = require "ffi"
ffi.cdef "typedef struct { double v[2]; } zz_vec;"
_ = ffi.metatype("zz_vec", {__tostring = function(s) return "tensor([" .. s.v[0] .. ", " .. s.v[1] .. "])" end})
zv = ffi.new("zz_vec", {{1, 2}})
zv
{zv}'
expect_eq "objects and cdata print via tostring" "$out" "OBJ<1>
tensor([1, 2])
{tensor([1, 2])}"
repl 'print(type(lutra))'
if [ "$out" = "table" ]; then
  ok
  repl 'lutra.zeros and lutra.zeros(2)
print(lutra.zeros and tostring(lutra.zeros(2)))'
  if [ -n "$out" ] && [ "$(printf '%s\n' "$out" | sed -n 1p)" != "nil" ]; then
    n=$(printf '%s\n' "$out" | wc -l)
    half=$((n / 2))
    expect_eq "a tensor prints as its tostring" "$(printf '%s\n' "$out" | head -n "$half")" "$(printf '%s\n' "$out" | tail -n "$half")"
    repl '{w = lutra.zeros(2, 3), n = 1}'
    expect_eq "a tensor inside a table prints its shape and dtype" "$out" "{n = 1, w = <tensor [2, 3] f32>}"
  fi
else
  expect_grep "lutra global is nil only when require fails" "$(cat "$T/err")" 'require "lutra" failed'
fi

# ---- multi-line chunks ------------------------------------------------------------------------
repl 'function sq(n)
  local r = n * n
  return r
end
sq(9)
t = {
  10,
  20,
}
#t
s = [[a
b]]
s
sq(
3
)'
expect_eq "multi-line function, table, long string, call" "$out" "81
2
a
b
9"

# ---- errors do not end the session -----------------------------------------------------------------
repl 'error("boom")
local function h() error("deep") end h()
1 +* 2
nil + 1
"still here"'
expect_eq "session continues after errors" "$out" "still here"
expect_grep "error message with position" "$err" '^stdin:1: boom$'
expect_grep "error in a function: traceback" "$err" "stdin:1: in function 'h'"
expect_grep "syntax error reported" "$err" "^stdin:1: unexpected symbol near '\*'|^stdin:1: unexpected symbol"
expect_grep "runtime error reported" "$err" "attempt to perform arithmetic on a nil value"
repl 'error({code = 1})'
expect_grep "non-string error object printed" "$err" '\{code = 1\}'

# ---- a broken `require "lutra"` still opens the REPL ------------------------------------------------
LUA_INIT='package.preload.lutra = function() error("simulated breakage") end' repl 'type(lutra)
2 * 21'
expect_eq "REPL works when require lutra fails" "$out" "nil
42"
expect_grep "the require error is shown" "$(cat "$T/err")" 'require "lutra" failed.*simulated breakage'

# ---- completion (the Lua side of TAB) -----------------------------------------------------------------
comp=$("$LUTRA" -e '
local repl = require "lutra.repl"
local function show(line, env) print(line .. " -> " .. table.concat(repl.complete(line, env), " ")) end
show("string.fo")
show("x = math.fl")
show("print(os.ti")
show("whi")
zzobj = {alpha = 1, alps = 2, beta = 3, sub = {deep = 1}}
show("zzobj.al")
show("zzobj.sub.d")
show("zzobj:b")
show("(\"s\"):up")
show("nothere.x")
show("3.1")
local ffi = require "ffi"
ffi.cdef "typedef struct { int x; } zz_t;"
local methods = {zzmethod = function() end, zzmore = function() end, other = 1}
ffi.metatype("zz_t", {__index = methods})
zt = ffi.new("zz_t")
package.loaded.lutra = {_methods = methods}
show("zt:zzm")
show("zt.o")
show("lo", setmetatable({localvar = 1}, {__index = _G}))')
expect_eq "complete() candidates" "$comp" 'string.fo -> string.format
x = math.fl -> math.floor
print(os.ti -> os.time
whi -> while
zzobj.al -> zzobj.alpha zzobj.alps
zzobj.sub.d -> zzobj.sub.deep
zzobj:b -> 
("s"):up -> 
nothere.x -> 
3.1 -> 
zt:zzm -> zt:zzmethod zt:zzmore
zt.o -> zt.other
lo -> load loadfile loadstring local localvar'
comp=$("$LUTRA" -e 'local r = require "lutra.repl" print(table.concat(r.complete("s:up", {s = "x"}), " "))')
expect_eq "string methods after ':'" "$comp" "s:upper"

# ---- lutra.debug(): read and assign locals and upvalues; EOF continues ---------------------------------
cat >"$T/dbg.lua" <<'EOF'
local repl = require "lutra.repl"
local counter = 10
local function step(a)
  local b = a * 2
  local msg = "hi"
  do
    local b = b + 1 -- shadows: the debugger sees the innermost b
    repl.debug()
    print("inner b=" .. b)
  end
  print("after: a=" .. a .. " b=" .. b .. " msg=" .. msg .. " counter=" .. counter .. " g=" .. tostring(zz_global))
  return b
end
print("returned " .. step(3))
EOF
repl 'a
b
msg
counter
b = 100
a = a + 1
msg = msg .. "!"
counter = 11
zz_global = "set"
.locals
.up
.down
b' "$T/dbg.lua"
expect_eq "debug(): values printed, assignments seen by the script" "$out" "3
7
hi
10
100
inner b=100
after: a=4 b=6 msg=hi! counter=11 g=set
returned 6"
expect_grep "debug(): header names the frame" "$err" "dbg.lua:8: in function 'step'"
expect_grep "debug(): header lists locals" "$err" 'locals: a, b, msg, b'
expect_grep "debug(): .locals shows values" "$err" 'local a = 4'
expect_grep "debug(): .up goes to the caller" "$err" 'dbg.lua:14: in main chunk'
expect_eq "debug(): exit status" "$st" "0"
cat >"$T/loop.lua" <<'EOF'
local sum = 0
for i = 1, 200 do
  sum = sum + i
  if i == 150 then require("lutra.repl").debug() end
end
print("sum " .. sum)
EOF
repl 'i
sum
sum = 0' "$T/loop.lua"
expect_eq "debug() inside a (compiled) loop" "$out" "150
11325
sum 8775"

# ---- --repl-on-error: the REPL opens at the frame that raised, then exit 1 ------------------------------
cat >"$T/fail.lua" <<'EOF'
local function check(n)
  local limit = 5
  if n > limit then error("too big: " .. n) end
end
local function run(count)
  local total = count * 2
  check(total)
end
run(4)
EOF
repl 'n
limit
.up
total
count' --repl-on-error "$T/fail.lua"
expect_eq "--repl-on-error: locals of the failing frame, then its caller's" "$out" "8
5
8
4"
expect_eq "--repl-on-error: exit status" "$st" "1"
expect_grep "--repl-on-error: message first" "$(head -1 "$T/err")" "^$T/fail.lua:3: too big: 8$"
expect_grep "--repl-on-error: traceback printed" "$err" 'stack traceback:'
expect_eq "--repl-on-error: message printed once" "$(grep -c 'too big' "$T/err")" "1"
expect_grep "--repl-on-error: opens in check" "$err" "fail.lua:3: in function 'check'"
repl '' "$T/fail.lua"
expect_eq "without the flag: no REPL, exit 1" "$st:$(grep -c 'locals:' "$T/err")" "1:0"
cat >"$T/rt.lua" <<'EOF'
local function f(t)
  local k = "missing"
  return t[k].field
end
f({})
EOF
repl 'k
t' --repl-on-error "$T/rt.lua"
expect_eq "--repl-on-error on a runtime error" "$out:$st" "missing
{}:1"

if "$LUTRA" -e 'require "lutra"' 2>/dev/null; then
  cat >"$T/libfail.lua" <<'EOF'
local lt = require "lutra"
local function build(n)
  local x = lt.zeros(n)
  local y = x:view(n + 1)
  return y
end
build(2)
EOF
  repl 'n
tostring(x.shape[1])
.down' --repl-on-error "$T/libfail.lua"
  expect_eq "--repl-on-error: a library error opens at the user's frame" "$out:$st" "2
2:1"
  expect_grep "--repl-on-error: user's frame named" "$err" "Stopped at .*libfail.lua:4: in function 'build'"
  expect_grep "--repl-on-error: .down reaches the library" "$err" "^/.*/lutra/([a-z_]+/)*[a-z_]+\.lua:[0-9]+: in function"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
