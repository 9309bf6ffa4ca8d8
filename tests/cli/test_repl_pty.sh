#!/usr/bin/env bash
# test_repl_pty.sh — the interactive REPL through a pseudo-terminal (readline): prompts,
# expression printing, a multi-line function then a call, errors, tab completion (globals,
# fields, tensor-like methods, lutra.ze when the library loads), the history file, Ctrl-C,
# lutra.debug() (read, assign, Ctrl-D continues) and --repl-on-error at the failing frame.
# usage: test_repl_pty.sh LUTRA LIBLUTRA
LUTRA=$(realpath "${1:?usage: test_repl_pty.sh path/to/lutra path/to/liblutra.so}")
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cat >"$T/dbg.lua" <<'EOF'
local repl = require "lutra.repl"
local scale = 3
local function work(n)
  local acc = n * 10
  repl.debug()
  return acc * scale
end
print("result=" .. work(4))
EOF
cat >"$T/fail.lua" <<'EOF'
local function divide(num, den)
  local q = num / den
  if den == 0 then error("division by zero: " .. num) end
  return q
end
local function run() return (divide(42, 0)) end
run()
EOF
exec /usr/bin/python3 - "$LUTRA" "$T" "$HERE" <<'PYEOF'
import os, sys, time
lutra, tmp, here = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, here)
from pty_drive import Session, check, check_completion, check_reply, scenario, summary

hist = os.path.join(tmp, "history")
env = {"LUTRA_HISTORY": hist, "HOME": tmp}
P = r"(?m)^> $"      # the main prompt at the start of a line, nothing typed yet
D = r"(?m)^debug> $"


def basics():
    s = Session([lutra], env=env)
    try:
        s.expect(r"Ctrl-D exits")
        s.expect(P)
        check_reply(s, "expression printed", "1 + 41", r"^42\s*$", P)
        check_reply(s, "several values, tabs", "1, nil, 'two'", r"^1\tnil\ttwo\s*$", P)
        check_reply(s, "table printed", "{1, 2, k = 'v'}", r'^\{1, 2, k = "v"\}\s*$', P)
        s.line("function triple(x)")
        check("continuation prompt", s.expect(r"(?m)^>> $") is not None)
        s.line("  return x * 3")
        s.expect(r"(?m)^>> $")
        s.line("end")
        s.expect(P)
        check_reply(s, "multi-line function then call", "triple(14)", r"^42\s*$", P)
        check_reply(s, "error printed", "error('boom')", r"stdin:1: boom", P)
        check_reply(s, "session continues after an error", "triple(2)", r"^6\s*$", P)
        # Ctrl-C drops the line being typed
        s.send("this is not lua")
        time.sleep(0.2)
        s.interrupt()
        s.expect(r"\^C")
        s.expect(P)
        check_reply(s, "Ctrl-C clears the line", "'after ctrl-c'", r"^after ctrl-c\s*$", P)
        # Ctrl-C interrupts running code (interpreted: hooks do not fire in compiled traces)
        s.line("jit.off() while true do end")
        time.sleep(0.4)
        s.interrupt()
        check("Ctrl-C interrupts a loop", s.expect(r"interrupted!") is not None)
        s.expect(P)
        check_reply(s, "REPL alive after the interrupt", "'alive'", r"^alive\s*$", P)
        s.eof()
        check("Ctrl-D exits 0", s.wait() == 0)
    finally:
        s.close()


def completion():
    s = Session([lutra], env=env)
    try:
        s.expect(P)
        s.send("string.fo\t")
        check("TAB completes string.fo", s.expect(r"string\.format") is not None)
        check_reply(s, "completed call runs", "('%d', 7)", r"^7\s*$", P)
        s.line("zzobj = {zebra = 1, zeta = 2, other = 3}")
        s.expect(P)
        s.send("zzobj.zeb\t")
        s.expect(r"zzobj\.zebra")
        check_reply(s, "TAB completes a table field", "", r"^1\s*$", P)
        check_completion(s, "TAB TAB lists the candidates", "zzobj.ze\t\t", r"zzobj\.zebra\s+zzobj\.zeta", P)
        # methods of a cdata with a metatype, through the library's method table (lutra._methods)
        s.line("ffi = require 'ffi'; ffi.cdef 'typedef struct { int x; } zz_t;'")
        s.expect(P)
        s.line("M = {zzmethod = function(self) return 'm' .. self.x end}; _ = ffi.metatype('zz_t', {__index = M})")
        s.expect(P)
        s.line("real = package.loaded.lutra; package.loaded.lutra = {_methods = M}; zt = ffi.new('zz_t', 5)")
        s.expect(P)
        s.send("zt:zzme\t")
        s.expect(r"zt:zzmethod")
        check_reply(s, "TAB completes a tensor-like method", "()", r"^m5\s*$", P)
        s.line("package.loaded.lutra = real")
        s.expect(P)
        s.line("type(lutra) == 'table' and lutra.zeros ~= nil")
        has_zeros = s.expect(r"^(true|false)\s*$").group(1) == "true"
        s.expect(P)
        if has_zeros:  # the real library: lutra.zeros, then methods and properties of a tensor
            # the first TAB inserts the common prefix, the third lists
            check_completion(s, "TAB completes lutra.ze", "lutra.ze\t\t\t", r"lutra\.zeros", P)
            s.line("zt2 = lutra.zeros(2, 3)")
            s.expect(P)
            check_completion(s, "TAB completes a tensor method", "zt2:resha\t", r"zt2:reshape", P)
            s.send("zt2.sha\t")
            s.expect(r"zt2\.shape")
            check_reply(s, "TAB completes a tensor property", "", r"^\{2, 3\}\s*$", P)
        s.eof()
        check("exit after completion session", s.wait() == 0)
    finally:
        s.close()


def history():
    text = open(hist).read() if os.path.exists(hist) else ""
    check("history file written", "1 + 41" in text and "triple(14)" in text, repr(text[:300]))
    check("multi-line chunk kept as one entry", "function triple(x)" in text, repr(text[:300]))
    s = Session([lutra], env=env)
    try:
        s.expect(P)
        s.send("\x10")  # Ctrl-P: previous history entry
        time.sleep(0.2)
        s.send("\n")
        # the last entry of the previous session was "type(lutra) == ..." or "package.loaded.lutra = real"
        s.expect(P)
        # the prompt is awaited before Ctrl-D: typed before readline holds the terminal, the cooked tty eats it
        check_reply(s, "history recalled without error", "'hist ok'", r"^hist ok\s*$", P)
        s.eof()
        s.wait()
    finally:
        s.close()
    text = open(hist).read()
    check("later sessions append", "'hist ok'" in text)


def debug_repl():
    s = Session([lutra, os.path.join(tmp, "dbg.lua")], env=env)
    try:
        check("debug(): header", s.expect(r"dbg\.lua:5: in function 'work'") is not None)
        s.expect(D)
        check_reply(s, "debug(): reads a local", "acc", r"^40\s*$", D)
        check_reply(s, "debug(): reads an upvalue", "scale", r"^3\s*$", D)
        s.line("acc = acc + 2")
        s.expect(D)
        check_reply(s, "debug(): assignment visible", "acc", r"^42\s*$", D)
        check_completion(s, "debug(): TAB completes locals", "ac\t", r"acc", D)
        s.eof()
        check("debug(): Ctrl-D continues, the script sees the new value", s.expect(r"result=126") is not None)
        check("debug(): script exits 0", s.wait() == 0)
    finally:
        s.close()


def debug_stdout_redirected():
    # `lutra script.lua | tee log`: the REPL must still talk to the terminal (on stderr)
    log = os.path.join(tmp, "log")
    s = Session(["/bin/sh", "-c", '"$0" "$1" | cat > "$2"', lutra, os.path.join(tmp, "dbg.lua"), log], env=env)
    try:
        s.expect(D)
        check_reply(s, "stdout redirected: value shown on the terminal", "acc + 1", r"^41\s*$", D)
        s.eof()
        check("stdout redirected: exit 0", s.wait() == 0)
        check("stdout redirected: the script's output went to the pipe", open(log).read() == "result=120\n",
              repr(open(log).read()))
    finally:
        s.close()


def post_mortem():
    s = Session([lutra, "--repl-on-error", os.path.join(tmp, "fail.lua")], env=env)
    try:
        check("--repl-on-error: message", s.expect(r"fail\.lua:3: division by zero: 42") is not None)
        check("--repl-on-error: traceback", s.expect(r"stack traceback:") is not None)
        check("--repl-on-error: at the failing frame", s.expect(r"fail\.lua:3: in function 'divide'") is not None)
        s.expect(D)
        check_reply(s, "--repl-on-error: locals readable", "num, den, q", r"^42\t0\tinf\s*$", D)
        check_reply(s, "--repl-on-error: .bt", ".bt", r"->.*fail\.lua:3: in function 'divide'", D)
        s.eof()
        check("--repl-on-error: exit status 1 after the REPL", s.wait() == 1)
    finally:
        s.close()


for name, fn in [("basics", basics), ("completion", completion), ("history", history),
                 ("debug", debug_repl), ("debug-redirected", debug_stdout_redirected),
                 ("post-mortem", post_mortem)]:
    scenario(name, fn)
sys.exit(summary())
PYEOF
