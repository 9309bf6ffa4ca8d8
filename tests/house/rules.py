#!/usr/bin/env python3
"""tests/house/rules.py — the rules of the house (docs/ARCHITECTURE.md), checked: ctest's house.rules.

  python3 tests/house/rules.py            # from the repository root: every rule over the tree; exit 1 on a breach
  python3 tests/house/rules.py --self-check  # plants one breach of each rule in a scratch tree and expects each caught

1. Floors: a C or CUDA file includes only headers of its own floor or of a floor below it
   (FLOORS), named by floor ("core/internal.h"), or lutra.h.
2. One dispatch seam: `#if LUTRA_HAVE_CUDA` stands only in the files of CUDA_SEAM.
3. One Lua layout: no lua/lutra/X.lua beside a package folder lua/lutra/X/.
4. The tensor type owns its fields: outside the lua/lutra/tensor/ package and ffi.lua, no Lua module touches
   lt_tensor's raw fields; it goes through lutra/tensor/fields.lua.
5. No source file past MAX_LINES lines.
6. No require circle among the Lua modules: house.lua_require_graph, where a require inside a function
   and a pcall(require, ...) count (one inside a string does not).
7. The C core never reads lt_tensor's lua_slot (the Lua binding's registry index): it stands only in
   host/include/lutra.h among the C files.
8. Nothing that came with a model, checkpoint, run directory or data set is executed: Lua code is
   compiled (loadstring, load, loadfile, dofile; luaL_load*, luaL_do*, lua_load) only in CODE_LOADERS,
   each of which runs what the user typed or named as code.
9. The Lua library writes files through lutra.atomic_file (a temporary renamed over the path, links never
   followed), never io.open(path, "w"/"a"), except the launcher's own signal files (RAW_WRITERS).
"""
import os, re, shutil, sys, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import house  # noqa: E402

# floor -> the floors its files may include (its own first)
FLOORS = {
    "host/core": {"core"},
    "kernels": {"kernels", "core"},
    "host/ops": {"ops", "kernels", "core"},
    "host/io": {"io", "core"},
    "host/tok": {"tok", "core"},
    "host/dist": {"dist", "kernels", "core"},
    "host/app": None,  # the executable sits on top: anything
}
CUDA_SEAM = {"host/core/device.c", "host/ops/backend.c", "host/core/runtime.c"}
MAX_LINES = 800
# The only places that compile Lua code, and whose code each runs.
CODE_LOADERS = {
    "host/app/main.c": "the script named on the command line, -e, LUA_INIT",
    "lua/lutra/repl.lua": "what the user types at the prompt",
    "lua/lutra/config.lua": "--config=FILE.lua, the user's own settings code",
    "host/app/custom_op_cpu.c": "the bytecode (mode \"b\" only) of a function the script passed to lt.kernel, "
                                "compiled by the main state, loaded into the worker states that run it on threads",
}
# Files that write with io.open, and why that is safe: each writes a signal file in a directory the
# launcher made for this job, never a user's data.
RAW_WRITERS = {
    "lua/lutra/dist/console.lua": "the console's host and tty markers in the launch directory",
    "lua/lutra/train/fault.lua": "fault-injection markers in LUTRA_LAUNCH_DIR (tests)",
    "lua/lutra/repl.lua": "the launcher's hold file (LUTRA_HOLD_FILE)",
    "lua/lutra/atomic_file.lua": "the writer itself",
}
RAW_WRITE = re.compile(r"""io\.open\s*\([^)]*,\s*["'][wa]""")
LUA_LOADER = re.compile(r"(?<![\w.:])(loadstring|loadfile|dofile|load)\s*\(")
C_LOADER = re.compile(r"\b(luaL_load\w*|luaL_do\w*|lua_load)\s*\(")


def floor_of(path):
    for floor in sorted(FLOORS, key=len, reverse=True):
        if path.startswith(floor + "/"):
            return floor
    return None


def check_floors(paths):
    breaches = []
    for p in paths:
        floor = floor_of(p)
        if floor is None or FLOORS[floor] is None or not p.endswith((".c", ".h", ".cu", ".cuh")):
            continue
        for n, line in enumerate(house.lines(p), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m or m.group(1) == "lutra.h":
                continue
            target = m.group(1).split("/")[0] if "/" in m.group(1) else None
            if target not in FLOORS[floor]:
                breaches.append(f"{p}:{n}: includes \"{m.group(1)}\": {floor} may include only "
                                + ", ".join(f'"{f}/..."' for f in sorted(FLOORS[floor])) + " and \"lutra.h\"")
    return breaches


def check_cuda_seam(paths):
    return [f"{p}: {n} #if on LUTRA_HAVE_CUDA outside the dispatch seam ({', '.join(sorted(CUDA_SEAM))})"
            for p in paths if p not in CUDA_SEAM and (n := house.cuda_if_sites(p))]


def check_lua_layout(paths):
    dirs = {os.path.dirname(p) for p in paths if p.startswith("lua/")}
    return [f"{p}: a module beside its package folder {p[:-4]}/ (move it to {p[:-4]}/init.lua)"
            for p in paths if p.startswith("lua/") and p.endswith(".lua") and p[:-4] in dirs]


def check_raw_fields(paths):
    breaches = []
    for p in paths:
        if not p.startswith("lua/") or not p.endswith(".lua") or p.endswith(house.TENSOR_TYPE):
            continue
        if n := house.raw_field_sites(p):
            breaches.append(f"{p}: touches lt_tensor's raw fields {n} times: use lutra/tensor/fields.lua")
    return breaches


def check_sizes(paths):
    return [f"{p}: {n} lines (at most {MAX_LINES}): split it by responsibility"
            for p in paths if (n := len(house.lines(p))) > MAX_LINES]


def check_require_circles(paths):
    graph = house.lua_require_graph(paths)
    where = {house.lua_module(p): p for p in paths if p.startswith("lua/") and p.endswith(".lua")}
    breaches = []
    for circle in house.sccs(graph):
        inside = set(circle)
        edges = ", ".join(f"{a} -> {b}" for a in circle for b in sorted(graph[a] & inside))
        breaches.append(f"{where[circle[0]]}: a require circle of {len(circle)} modules ({edges}): move the shared "
                        "piece down into its own module, or pass the higher module's function in at setup")
    return breaches


def check_lua_slot(paths):
    return [f"{p}:{n}: reads lt_tensor's lua_slot, which belongs to the Lua binding (only lutra.h declares it)"
            for p in paths if p.endswith((".c", ".h", ".cu", ".cuh")) and p != "host/include/lutra.h"
            and not p.startswith("tests/")
            for n, line in enumerate(house.lines(p), 1) if "lua_slot" in line]


def check_code_loaders(paths):
    breaches = []
    for p in paths:
        if p in CODE_LOADERS or not p.startswith(("lua/lutra/", "host/")):
            continue
        if p.endswith(".lua"):
            code_of, pattern = (lambda line: line.split("--")[0]), LUA_LOADER
        elif p.endswith((".c", ".h", ".cu")):
            code_of, pattern = (lambda line: "" if line.lstrip().startswith(("*", "/*", "//")) else line), C_LOADER
        else:
            continue
        for n, line in enumerate(house.lines(p), 1):
            m = pattern.search(code_of(line))
            if m:
                breaches.append(f"{p}:{n}: compiles Lua code ({m.group(1)}); only {', '.join(sorted(CODE_LOADERS))} "
                                "may, and only what the user gave as code: data from a file is parsed, never run")
    return breaches


def check_raw_writes(paths):
    return [f"{p}:{n}: writes a file with io.open; write through lutra.atomic_file (a crash or a planted link "
            "never leaves a half-written or redirected file)"
            for p in paths if p.startswith("lua/lutra/") and p.endswith(".lua") and p not in RAW_WRITERS
            for n, line in enumerate(house.lines(p), 1) if RAW_WRITE.search(line.split("--")[0])]


def run(paths):
    return (check_floors(paths) + check_cuda_seam(paths) + check_lua_layout(paths)
            + check_raw_fields(paths) + check_sizes(paths) + check_require_circles(paths)
            + check_lua_slot(paths) + check_code_loaders(paths) + check_raw_writes(paths))


def self_check():
    """Each rule must fire on a planted breach, and only that rule."""
    plants = {
        "floors": ("host/core/bad.c", '#include "ops/layer_norm.h"\n'),
        "seam": ("host/ops/bad.c", "#ifdef LUTRA_HAVE_CUDA\n#endif\n"),
        "layout": ("lua/lutra/nn.lua", "return {}\n"),
        "raw": ("lua/lutra/bad.lua", "local n = t.shape_[0]\n"),
        "size": ("host/io/big.c", "int x;\n" * (MAX_LINES + 1)),
        # the way back is a require inside a function: it counts
        "circle": ("lua/lutra/circle_a.lua", 'local b = require "lutra.circle_b"\n',
                   "lua/lutra/circle_b.lua", 'return {a = function() return require("lutra.circle_a") end}\n'),
        "circle_pcall": ("lua/lutra/circle_c.lua", 'local d = require "lutra.circle_d"\n',
                         "lua/lutra/circle_d.lua", 'local ok, c = pcall(require, "lutra.circle_c")\n'),
        "lua_slot": ("host/core/bad.c", "int slot(const lt_tensor *t) { return t->lua_slot; }\n"),
        "loader_lua": ("lua/lutra/manifest_reader.lua", "local m = loadstring(text)()\n"),
        "loader_lua_load": ("lua/lutra/bad.lua", "local f = load(text, '=manifest')\n"),
        "raw_write": ("lua/lutra/sft/saver.lua", 'local f = io.open(dir .. "/chat_template.jinja", "wb")\n'),
        "loader_c": ("host/io/bad.c", "int f(lua_State *L) { return luaL_loadbuffer(L, b, n, \"x\"); }\n"),
    }
    failures = []
    cwd = os.getcwd()
    for rule, (path, text, *more) in plants.items():
        scratch = tempfile.mkdtemp()
        try:
            os.chdir(scratch)
            os.makedirs("lua/lutra/nn", exist_ok=True)
            open("lua/lutra/nn/init.lua", "w").write("return {}\n")
            paths = ["lua/lutra/nn/init.lua"]
            for p, t in [(path, text)] + list(zip(more[::2], more[1::2])):
                os.makedirs(os.path.dirname(p), exist_ok=True)
                open(p, "w").write(t)
                paths.append(p)
            found = run(paths)
            if len(found) != 1 or not found[0].startswith(path):
                failures.append(f"{rule}: planted {path}, the rules said {found}")
        finally:
            os.chdir(cwd)
            shutil.rmtree(scratch)
    return failures


def main():
    if sys.argv[1:] == ["--self-check"]:
        failures = self_check()
        print("\n".join(failures) if failures else "rules.py: every planted breach was caught")
        return 1 if failures else 0
    breaches = run(house.files(house.ROOTS))
    for b in breaches:
        print(b)
    print(f"rules.py: {len(breaches)} breaches of the house rules (docs/ARCHITECTURE.md)")
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
