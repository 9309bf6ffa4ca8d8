"""tests/house/house.py — reading the source tree as a house: its files, functions, includes, calls and
requires, for figures.py (numbers) and rules.py (the checks ctest runs). Paths are relative to the
repository root, which is the working directory."""
import collections, os, re, subprocess, sys

ROOTS = ["host", "kernels", "lua"]
SRC = (".c", ".h", ".cu", ".cuh", ".lua")


def files(roots=None):
    """The source files under roots that git tracks or would track (every file when this is no checkout)."""
    roots = roots or ROOTS
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"] + roots,
                             capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = [os.path.join(d, f) for r in roots for d, _, fs in os.walk(r) for f in fs]
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
            # as the compiler looks: beside the file, then the include roots host/ and the repository's
            candidates = [os.path.normpath(os.path.join(os.path.dirname(p), m.group(1))),
                          os.path.join("host", m.group(1)), m.group(1)]
            target = next((c for c in candidates if os.path.exists(c)), None)
            if target is None:
                cands = by_name.get(os.path.basename(m.group(1)), [])
                if not cands:
                    continue
                target = cands[0]
            a, b = module_of(p), module_of(target)
            if a != b:
                graph[a].add(b)
    return graph


def lua_module(path):
    """The module name require gives a file under lua/: lua/lutra/nn/init.lua is lutra.nn."""
    return re.sub(r"\.init$", "", path[4:-4].replace("/", "."))


def lua_require_graph(paths):
    graph = collections.defaultdict(set)
    for p in paths:
        if not p.endswith(".lua") or not p.startswith("lua/"):
            continue
        mod = lua_module(p)
        for line in lines(p):
            code = line.split("--", 1)[0]
            # require "x", require("x") and pcall(require, "x")
            for m in re.finditer(r"""require\s*(?:\(|,)?\s*["']([\w.]+)["']""", code):
                if code[:m.start()].count('"') % 2 == 0 and m.group(1) != mod:  # not inside a string
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


def tensor_type_modules():
    """The tensor type, whose fields are its own: every module of the lutra/tensor/ package (found beside this
    file, so that the checks see the same package from any working directory) and lutra/ffi.lua, which
    declares the struct. Path suffixes, for str.endswith."""
    package = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lua", "lutra", "tensor")
    found = {"lutra/tensor/init.lua", "lutra/tensor/fields.lua"}
    for d, _, fs in os.walk(package):
        found.update("lutra/tensor/" + os.path.relpath(os.path.join(d, f), package).replace(os.sep, "/")
                     for f in fs if f.endswith(".lua"))
    return tuple(sorted(found)) + ("lutra/ffi.lua",)


TENSOR_TYPE = tensor_type_modules()
# lt_tensor's fields as lutra.ffi names them (lua_slot; ag_, view_ and slot_ are what older trees split
# their int64 `tag` into, kept so that figures.py counts them there; `.tag` is an option, as in opts.tag).
RAW = re.compile(r"\.(storage|shape_|stride_|dtype_|device_|refcount|lua_slot|ag_|view_|slot_)\b")



def raw_field_sites(path):
    """Reads and writes of lt_tensor's fields (as ffi.lua names them) in one Lua file, comments left out."""
    return sum(len(RAW.findall(line.split("--", 1)[0])) for line in lines(path))


def cuda_if_sites(path):
    return sum(1 for line in lines(path) if re.match(r"\s*#\s*(if|ifdef|ifndef|elif)\b.*LUTRA_HAVE_CUDA", line))
