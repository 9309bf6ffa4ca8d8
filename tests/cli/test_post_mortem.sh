#!/usr/bin/env bash
# test_post_mortem.sh — --repl-on-error inside lutra.train, through a pseudo-terminal: an error
# raised in forward, loss_fn, the loader's next, a gradient hook, a custom backward and
# lutra.checkpoint's recomputation (tests/cli/pm_train.lua PLACE) opens the REPL at the raising
# function: its local and upvalue read, .bt names it first and reaches the recipe's main chunk,
# and the REPL's first command that raises prints its own error. `lutra -i script.lua` keeps
# the script's main-chunk locals; help() lists the REPL's commands.
# usage: test_post_mortem.sh LUTRA LIBLUTRA
LUTRA=$(realpath "${1:?usage: test_post_mortem.sh path/to/lutra path/to/liblutra.so}")
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cat >"$T/locals.lua" <<'LUA'
local lt = require "lutra"
local model = lt.nn.Linear(3, 2)
local answer = 42
do local hidden = "out of scope" end -- luacheck: ignore
LUA
cat >"$T/locals_fail.lua" <<'LUA'
local width = 5
error("script fails")
LUA
cat >"$T/plain_fail.lua" <<'LUA'
local function f(n)
  local twice = n * 2
  error("plain fails")
end
f(21)
LUA
cat >"$T/caught.lua" <<'LUA'
local lt = require "lutra"
local model = lt.nn.Linear(2, 2)
model.forward = function() error("inside forward") end
local ok, err = pcall(lt.train, {model = model, data = {next = function() return 1, 1 end}, quiet = true,
                                 config = {steps = 1, warmup = 0, eval_every = 0}})
print("caught: " .. tostring(not ok) .. " " .. tostring(err))
LUA
exec /usr/bin/python3 - "$LUTRA" "$T" "$HERE" <<'PYEOF'
import os, sys
lutra, tmp, here = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, here)
from pty_drive import Session, check, check_reply, scenario, summary

env = {"LUTRA_HISTORY": "", "HOME": tmp, "LUTRA_QUIET": "1"}
D = r"(?m)^debug> $"
P = r"(?m)^> $"
script = os.path.join(here, "pm_train.lua")
lines = {}
for i, text in enumerate(open(script).read().split("\n"), 1):
    if "fails: " in text:
        lines[text.split('error("')[1].split(" fails")[0]] = i
# place -> (the raising function as .bt names it, the message's head, its local `marker`)
PLACES = {
    "forward": (r"in function 'forward'", "forward", "in forward"),
    "loss_fn": (r"in function 'loss_fn'", "loss_fn", "in loss_fn"),
    "data": (r"in function 'next'", "data", "in data"),
    "hook": (r"in function <[^>]*pm_train\.lua:\d+>", "hook", "in hook"),
    "backward": (r"in function 'backward'", "custom backward", "in custom backward"),
    "checkpoint": (r"in function <[^>]*pm_train\.lua:\d+>", "recomputation", "in recomputation"),
}


def place_scenario(place):
    fn, head, marker = PLACES[place]
    line = lines[head]

    def run():
        s = Session([lutra, "--repl-on-error", script, place], env=env, cwd=tmp, timeout=30)
        try:
            where = r"pm_train\.lua:%d: %s" % (line, fn)
            check(place + ": message", s.expect(r"pm_train\.lua:%d: %s fails: %s 7" % (line, head, marker)) is not None)
            check(place + ": stopped at the raising frame", s.expect(r"Stopped at \S*" + where) is not None)
            s.expect(D)
            # the first command that raises prints its own error (not "error in error handling")
            check_reply(s, place + ": first error printed", "nil + 1", r"stdin:1: attempt to perform arithmetic on a nil value", D)
            check_reply(s, place + ": a local of the frame", "marker", r"^%s\s*$" % marker, D)
            check_reply(s, place + ": an upvalue of the frame", "scale", r"^7\s*$", D)
            s.line(".bt")
            m = s.expect(r"(?s)->\S*%s\n(.*?)\n\S*debug> $" % where)
            check(place + ": .bt reaches the recipe's main chunk", m is not None and "pm_train.lua:" in m.group(1)
                  and "in main chunk" in m.group(1), m.group(0) if m else "")
            check("no error in error handling", "error in error handling" not in s.text)
            s.eof()
            check(place + ": exit 1 after the REPL", s.wait() == 1)
            check(place + ": the error printed once", s.text.count("%s fails: %s 7" % (head, marker)) == 1, s.text)
        finally:
            s.close()
    return run


def interactive_locals():
    s = Session([lutra, "-i", os.path.join(tmp, "locals.lua")], env=env, cwd=tmp)
    try:
        s.expect(P)
        check_reply(s, "-i: a main-chunk local", "answer", r"^42\s*$", P)
        check_reply(s, "-i: the model local", "model.weight.shape", r"^\{2, 3\}\s*$", P)
        check_reply(s, "-i: a block's local stays out of scope", "hidden", r"^nil\s*$", P)
        check_reply(s, "-i: locals assign", "answer = answer + 1; print(answer)", r"^43\s*$", P)
        s.eof()
        check("-i: exit 0", s.wait() == 0)
    finally:
        s.close()
    s = Session([lutra, "-i", os.path.join(tmp, "locals_fail.lua")], env=env, cwd=tmp)
    try:
        s.expect(r"script fails")
        s.expect(P)
        check_reply(s, "-i after an error: the locals up to it", "width", r"^5\s*$", P)
        s.eof()
        check("-i after an error: exit 1", s.wait() == 1)
    finally:
        s.close()


def outside_trainer():
    # the host's own handler (no library pcall between): the first error typed is printed too
    s = Session([lutra, "--repl-on-error", os.path.join(tmp, "plain_fail.lua")], env=env, cwd=tmp)
    try:
        s.expect(r"Stopped at \S*plain_fail\.lua:3: in function 'f'")
        s.expect(D)
        check_reply(s, "host handler: first error printed", "error('typed')", r"stdin:1: typed", D)
        check_reply(s, "host handler: the local after it", "twice", r"^42\s*$", D)
        s.eof()
        check("host handler: exit 1", s.wait() == 1)
        check("host handler: no error in error handling", "error in error handling" not in s.text)
    finally:
        s.close()
    # an error the script's own pcall catches opens no REPL, inside lutra.train as well
    s = Session([lutra, "--repl-on-error", os.path.join(tmp, "caught.lua")], env=env, cwd=tmp)
    try:
        check("caught by the script: it goes on", s.expect(r"caught: true \S*caught\.lua:3: inside forward") is not None)
        check("caught by the script: exit 0", s.wait() == 0)
        check("caught by the script: no REPL", "post-mortem" not in s.text, s.text)
    finally:
        s.close()


def help_text():
    s = Session([lutra], env=env, cwd=tmp)
    try:
        s.expect(P)
        check_reply(s, "help() lists the REPL's commands", "help()", r"(?s)Ctrl-D.*\.bt", P)
        check_reply(s, "help(x) without a doc says so", "help(print)", r"no documentation", P)
        s.eof()
        s.wait()
    finally:
        s.close()


for place in PLACES:
    scenario("post-mortem in " + place, place_scenario(place))
scenario("outside the trainer, and caught", outside_trainer)
scenario("-i keeps the locals", interactive_locals)
scenario("help()", help_text)
sys.exit(summary())
PYEOF
