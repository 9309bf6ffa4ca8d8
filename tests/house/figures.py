#!/usr/bin/env python3
"""tests/house/figures.py — how walkable the source tree is, in numbers (issue 12's figures).

Run from the repository root: python3 tests/house/figures.py. It prints files and lines per folder, the
largest files and functions, include and call circles between C modules (foo.c + foo.h count as one
module), require circles between Lua modules, the #if sites on LUTRA_HAVE_CUDA, raw lt_tensor field sites
in Lua outside the tensor type, and where the pieces of one op are found by name.
"""
import collections, os, re, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from house import *  # noqa: E402,F403


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
    sites = collections.Counter({p: cuda_if_sites(p) for p in paths})
    sites = {p: n for p, n in sites.items() if n}
    print(f"  {sum(sites.values())} sites in {len(sites)} files: " + " ".join(sorted(sites)))

    print("== raw lt_tensor fields read or written in Lua outside the tensor type")
    raw = {p: raw_field_sites(p) for p in paths if p.endswith(".lua") and not p.endswith(TENSOR_TYPE)}
    raw = {p: n for p, n in raw.items() if n}
    print(f"  {sum(raw.values())} sites in {len(raw)} modules")

    print("== the pieces of one op, by name (source, tests, benchmarks)")
    everywhere = files(ROOTS + ["tests", "bench"])
    for op, pattern in (("layer_norm", r"layer_?norm|rms_?norm"), ("attention", r"attention"),
                        ("cross_entropy", r"cross_?entropy")):
        named = [p for p in everywhere if op in os.path.basename(p)]
        holding = [p for p in everywhere if re.search(pattern, "\n".join(lines(p)), re.I)]
        print(f"  {op}: find -name '*{op}*' gives {len(named)} files; {len(holding)} files mention it")

if __name__ == "__main__":
    main()
