#!/usr/bin/env python3
"""tests/house/figures.py — how walkable the source tree is, in numbers (issue 12's figures).

Run from the repository root: python3 tests/house/figures.py. It prints files and lines per folder, the
largest files and functions, include circles between C modules (foo.c + foo.h count as one module),
require circles between Lua modules, the #if sites on LUTRA_HAVE_CUDA, raw lt_tensor field sites in Lua
outside the tensor type, and where the pieces of one op are found by name.
"""
import collections, os, re, subprocess, sys

ROOTS = ["host", "kernels", "lua"]
SRC = (".c", ".h", ".cu", ".cuh", ".lua")


def files():
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"] + ROOTS,
                         capture_output=True, text=True, check=True).stdout.split()
    return sorted(f for f in out if f.endswith(SRC) and os.path.exists(f))


def lines(path):
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read().split("\n")


def c_functions(path, text):
    """Top-level brace blocks that follow a line ending in ')' or '{' at depth 0: function bodies."""
    found, depth, start, name = [], 0, None, None
    for i, line in enumerate(text):
        code = re.sub(r'"(\\.|[^"\\])*"|//.*|/\*.*?\*/', "", line)
        if depth == 0 and "{" in code and re.match(r"^[A-Za-z_].*\(", line) and not re.match(
                r"^(typedef|struct|enum|union|static const|const)\b.*=", line):
            m = re.search(r"([A-Za-z_]\w*)\s*\(", line)
            start, name = i, m.group(1) if m else "?"
        depth += code.count("{") - code.count("}")
        if depth == 0 and start is not None:
            found.append((i - start + 1, f"{path}:{start + 1} {name}"))
            start = None
    return found


def lua_functions(path, text):
    """Functions that begin at column 0 ('function', 'local function') or are indented once and end at the
    same indentation with 'end': long named closures count too."""
    found = []
    for i, line in enumerate(text):
        m = re.match(r"^(\s*)(local\s+)?function\s+([\w.:]+)", line)
        if not m:
            continue
        indent = m.group(1)
        if re.search(r"\bend[\s),]*$", line.split("--", 1)[0]):
            continue  # a one-line function
        for j in range(i + 1, len(text)):
            if re.match("^" + indent + r"end\b", text[j]):
                found.append((j - i + 1, f"{path}:{i + 1} {m.group(3)}"))
                break
    return found


def module_of(path):
    base = re.sub(r"\.(c|h|cu|cuh)$", "", path)
    return base


def include_graph(paths):
    by_name = collections.defaultdict(list)
    for p in paths:
        if p.endswith((".c", ".h", ".cu", ".cuh")):
            by_name[os.path.basename(p)].append(p)
    graph = collections.defaultdict(set)
    for p in paths:
        if not p.endswith((".c", ".h", ".cu", ".cuh")):
            continue
        for line in lines(p):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m:
                continue
            target = os.path.normpath(os.path.join(os.path.dirname(p), m.group(1)))
            if not os.path.exists(target):
                cands = by_name.get(os.path.basename(m.group(1)), [])
                if not cands:
                    continue
                target = cands[0]
            a, b = module_of(p), module_of(target)
            if a != b:
                graph[a].add(b)
    return graph


def lua_require_graph(paths):
    graph = collections.defaultdict(set)
    for p in paths:
        if not p.endswith(".lua") or not p.startswith("lua/"):
            continue
        mod = p[4:-4].replace("/", ".")
        mod = re.sub(r"\.init$", "", mod)
        for line in lines(p):
            for m in re.finditer(r"""require\s*\(?\s*["']([\w.]+)["']""", line):
                if m.group(1) != mod:
                    graph[mod].add(m.group(1))
        graph.setdefault(mod, set())
    return graph


def sccs(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def call_graph(paths):
    """Module A -> B when A calls a function that B defines (not static): the circles that includes of one
    shared internal header hide."""
    defined, bodies = {}, {}
    for p in paths:
        if not p.endswith((".c", ".cu")):
            continue
        text = lines(p)
        bodies[module_of(p)] = "\n".join(text)
        for _, where in c_functions(p, text):
            line = text[int(where.split(":")[1].split()[0]) - 1]
            if not re.match(r"^(static|__global__|template)", line):
                defined.setdefault(where.split()[-1], module_of(p))
    graph = collections.defaultdict(set)
    names = re.compile(r"\b(" + "|".join(map(re.escape, sorted(defined, key=len, reverse=True))) + r")\s*\(")
    for mod, body in bodies.items():
        for m in names.finditer(body):
            target = defined[m.group(1)]
            if target != mod:
                graph[mod].add(target)
    return graph


RAW = re.compile(r"\.(storage|shape_|stride_|dtype_|device_|refcount|ag_|view_|slot_|tag)\b")


def main():
    paths = files()
    print("== files and lines per folder")
    per = collections.OrderedDict()
    for p in paths:
        d = os.path.dirname(p)
        n, l = per.get(d, (0, 0))
        per[d] = (n + 1, l + len(lines(p)))
    for d, (n, l) in sorted(per.items()):
        print(f"  {d:<28} {n:4d} files {l:7d} lines")
    print(f"  {'total':<28} {len(paths):4d} files {sum(l for _, l in per.values()):7d} lines")

    print("== largest files")
    sizes = sorted(((len(lines(p)), p) for p in paths), reverse=True)
    for n, p in sizes[:8]:
        print(f"  {n:5d} {p}")

    print("== longest functions")
    funcs = []
    for p in paths:
        text = lines(p)
        funcs += lua_functions(p, text) if p.endswith(".lua") else c_functions(p, text)
    funcs.sort(reverse=True)
    for n, where in funcs[:10]:
        print(f"  {n:5d} {where}")
    print(f"  functions over 60 lines: {sum(1 for n, _ in funcs if n > 60)}")

    print("== include circles (C modules)")
    circles = sccs(include_graph(paths))
    for comp in circles:
        print("  " + " <-> ".join(comp))
    print(f"  {len(circles)} circles")

    print("== call circles (C modules that call each other, through any header)")
    circles = sccs(call_graph(paths))
    for comp in circles:
        print(f"  {len(comp)} modules: " + " ".join(comp[:12]) + (" ..." if len(comp) > 12 else ""))
    print(f"  {len(circles)} circles, {sum(len(c) for c in circles)} modules in them")

    print("== require circles (Lua modules, requires inside functions count)")
    circles = sccs(lua_require_graph(paths))
    for comp in circles:
        print(f"  {len(comp)} modules: " + " ".join(comp[:12]) + (" ..." if len(comp) > 12 else ""))
    print(f"  {len(circles)} circles, {sum(len(c) for c in circles)} modules in them")

    print("== #if sites on LUTRA_HAVE_CUDA")
    sites = collections.Counter()
    for p in paths:
        for line in lines(p):
            if re.match(r"\s*#\s*(if|ifdef|ifndef|elif)\b.*LUTRA_HAVE_CUDA", line):
                sites[p] += 1
    print(f"  {sum(sites.values())} sites in {len(sites)} files: " + " ".join(sorted(sites)))

    print("== raw lt_tensor fields read or written in Lua outside the tensor type")
    raw = collections.Counter()
    for p in paths:
        if p.endswith(".lua") and not p.endswith(("lutra/tensor.lua", "lutra/ffi.lua")):
            for line in lines(p):
                code = line.split("--", 1)[0]
                raw[p] += len(RAW.findall(code))
    raw = {p: n for p, n in raw.items() if n}
    print(f"  {sum(raw.values())} sites in {len(raw)} modules")

    print("== the pieces of one op, by name")
    for op, pattern in (("layer_norm", r"layer_?norm"), ("attention", r"attention")):
        named = [p for p in paths if re.search(op, os.path.basename(p))]
        holding = [p for p in paths if re.search(pattern, "\n".join(lines(p)), re.I)]
        print(f"  {op}: find -name '*{op}*' gives {len(named)} files; {len(holding)} files mention it")


if __name__ == "__main__":
    main()
