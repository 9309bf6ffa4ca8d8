#!/usr/bin/env bash
# test_profile_launch.sh — `lutra launch -n 2 recipes/pretrain.lua --parallel.dp=2 --profile=2-4`: the
# job prints the profiler's top table, and the run's trace.json holds 3 profiled steps of both
# ranks in the Chrome trace-event format that Perfetto loads. The schema is checked by python3's
# json: a traceEvents list; every event a known phase; complete events ("X") with a name, a
# category, ts and dur in microseconds (dur >= 0), an integer pid (the rank) and tid; a
# process_name metadata event per rank and a thread_name for every track used; each rank's ProfilerStep#2..4
# ranges, its ops and its gradient all-reduces inside them; the ranks' steps overlap on one clock.
# usage (from the repo root): bash tests/dist/test_profile_launch.sh LUTRA MPIRUN
LUTRA=$(realpath "${1:?usage: test_profile_launch.sh LUTRA MPIRUN}")
MPIRUN=${2:?usage: test_profile_launch.sh LUTRA MPIRUN}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 LUTRA_QUIET=1
unset LUTRA_DEVICE
command -v python3 >/dev/null || { echo "no python3 to check the trace's schema"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$LUTRA" -e "require('lutra.testing').word_corpus('$T/c.txt', {'the', 'quick', 'brown', 'fox', 'jumps', 'over',
  'a', 'lazy', 'dog'}, 4000, 7)" || exit 1
timeout 300 "$LUTRA" launch --mpirun "$MPIRUN" -n 2 recipes/pretrain.lua --parallel.dp=2 --data="$T/c.txt" \
  --model.n_layer=1 --model.n_head=2 --model.d_model=32 --model.block_size=16 --batch=4 --steps=5 --warmup=1 \
  --eval_every=0 --run_dir="$T/run" --profile=2-4 --threads=1 >"$T/out" 2>"$T/err"
st=$?
if [ $st -ne 0 ]; then
  echo "FAIL: the job exited $st"; cat "$T/out" "$T/err"; exit 1
fi
fail=0
grep -qE '^Name +Calls +Total ms +Self ms' "$T/out" || { echo "FAIL: no top table in the output"; fail=1; }
grep -qE '^linear ' "$T/out" || { echo "FAIL: the top table has no linear row"; fail=1; }
python3 - "$T/run/latest/trace.json" <<'EOF' || fail=1
import json, sys
doc = json.load(open(sys.argv[1]))
errors = []
def check(ok, what):
    if not ok:
        errors.append(what)
events = doc.get("traceEvents")
check(isinstance(events, list) and events, "traceEvents is a non-empty list")
phases = {"X", "M", "i", "I", "B", "E", "C"}
procs, steps, ops, reduces = {}, {}, {}, {}
threads = {(e.get("pid"), e.get("tid")) for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
for e in events:
    ph = e.get("ph")
    check(ph in phases, "phase %r of %s" % (ph, e))
    check(isinstance(e.get("pid"), int) and isinstance(e.get("tid"), (int, str)), "pid and tid of %s" % e)
    if ph == "M":
        if e["name"] == "process_name":
            procs[e["pid"]] = e["args"]["name"]
    elif ph == "X":
        check(isinstance(e.get("name"), str) and e["name"], "name of %s" % e)
        check(isinstance(e.get("cat"), str), "cat of %s" % e)
        check(isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0,
              "ts and dur of %s" % e)
        check((e["pid"], e["tid"]) in threads, "the thread of %s is named (thread_name)" % e)
        if e["name"].startswith("ProfilerStep#"):
            steps.setdefault(e["pid"], {})[e["name"]] = (e["ts"], e["ts"] + e["dur"])
        elif e.get("cat") == "comm" and "all_reduce" in e["name"]:
            reduces.setdefault(e["pid"], []).append(e["ts"])
        elif e.get("cat") == "op":
            ops.setdefault(e["pid"], []).append(e["ts"])
check(procs == {0: "rank 0", 1: "rank 1"}, "process names: %s" % procs)
for r in (0, 1):
    s = steps.get(r, {})
    check(sorted(s) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"], "rank %d's steps: %s" % (r, sorted(s)))
    inside = lambda ts: any(a <= ts <= b for a, b in s.values())
    check(len(ops.get(r, [])) > 50 and all(inside(t) for t in ops[r]), "rank %d's ops inside its steps" % r)
    check(len(reduces.get(r, [])) >= 3 and all(inside(t) for t in reduces[r]), "rank %d's all-reduces" % r)
for name in ("ProfilerStep#2", "ProfilerStep#4"):
    if name in steps.get(0, {}) and name in steps.get(1, {}):
        (a0, b0), (a1, b1) = steps[0][name], steps[1][name]
        check(a0 < b1 and a1 < b0, "%s overlaps across the ranks (one clock)" % name)
for e in errors[:10]:
    print("FAIL: trace.json:", e)
print("trace.json: %d events, ranks %s, %d ops, %d all-reduces" % (len(events), sorted(procs),
      sum(len(v) for v in ops.values()), sum(len(v) for v in reduces.values())))
sys.exit(1 if errors else 0)
EOF
if [ $fail -ne 0 ]; then echo "--- stdout:"; cat "$T/out"; echo "--- stderr:"; cat "$T/err"; exit 1; fi
echo "ok: the top table and a Perfetto-loadable trace of 3 steps of both ranks"
