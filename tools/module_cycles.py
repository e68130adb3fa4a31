#!/usr/bin/env python3
"""Module cycles among sibling modules of the tenantfs library.

A cycle is two or more modules under one parent that use each other, directly or through
other siblings (for example `cache` -> `store` -> `cache`, or `base::store` <-> `base::tree`).
A child using its parent's items is not one (the parent is its context). Each source file is
a module (`src/a/b.rs` is `crate::a::b`, `src/a/mod.rs` is `crate::a`); a reference is any
`crate::`, `super::` or `self::` path in it, or a name imported by `use super::{...}`, resolved
to the longest known module prefix. Prints every cycle; exits 1 if there is one.

usage: python3 tools/module_cycles.py [SRC_DIR]
"""

import os
import re
import sys


def modules(src):
    """Module path (tuple) -> file, for every .rs file under src (the binary's main.rs too,
    as the root of its own tree)."""
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib"):
                parts = parts[:-1]
            if parts == ["main"]:
                continue  # the binary: not part of the library's module tree
            mods[tuple(parts)] = os.path.join(root, f)
    return mods


PATH = re.compile(r"\b(crate|super|self)((?:::\w+)+)")
USE_GROUP = re.compile(r"\buse\s+(crate|super|self)((?:::\w+)*)::\{([^;]*)\}\s*;", re.S)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def resolve(mod, head, rest, mods):
    """The module a path from `mod` names (the longest known prefix), or None."""
    if head == "crate":
        base = ()
    elif head == "self":
        base = mod
    else:
        base = mod[:-1]
    parts = list(base)
    names = [p for p in rest.split("::") if p]
    while names and names[0] == "super":
        parts = parts[:-1]
        names.pop(0)
    best = tuple(parts) if tuple(parts) in mods else None
    for n in names:
        parts.append(n)
        if tuple(parts) in mods:
            best = tuple(parts)
        else:
            break
    return best


def references(mod, path, mods):
    text = strip_comments(open(path).read())
    # `#[cfg(test)] mod tests { ... }` blocks are the module's own tests: they count too.
    refs = set()
    for m in USE_GROUP.finditer(text):
        head, prefix, group = m.group(1), m.group(2), m.group(3)
        for item in re.split(r"[,{}\s]+", group):
            item = item.strip()
            if item and item not in ("self", "*"):
                target = resolve(mod, head, prefix + "::" + item.split("::")[0], mods)
                if target is not None:
                    refs.add(target)
    for m in PATH.finditer(text):
        target = resolve(mod, m.group(1), m.group(2), mods)
        if target is not None:
            refs.add(target)
    return refs


def sccs(nodes, edges):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
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

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "src"
    mods = modules(src)
    # Edges between siblings: from the child of P that holds the user to the child of P that
    # holds the target, for every common ancestor P of the two.
    edges = {}
    for mod, path in mods.items():
        for target in references(mod, path, mods):
            n = 0
            while n < min(len(mod), len(target)) and mod[n] == target[n]:
                n += 1
            if n == len(mod) or n == len(target):
                continue  # one contains the other: parent and descendant
            parent = mod[:n]
            a, b = mod[: n + 1], target[: n + 1]
            edges.setdefault(parent, {}).setdefault(a, set()).add(b)
    cycles = []
    for parent, graph in sorted(edges.items()):
        nodes = set(graph) | {w for ws in graph.values() for w in ws}
        for comp in sccs(nodes, graph):
            cycles.append(" <-> ".join("::".join(c) for c in comp))
    for c in cycles:
        print("cycle:", c)
    print(f"{len(mods)} modules, {len(cycles)} cycles")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
