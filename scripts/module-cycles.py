#!/usr/bin/env python3
"""Module import circles in the workspace's crates: exits 1 and names them when there are any.

A module (one file) depends on another when it names it or an item in it (`use`, or a path in
the code: `crate::kafka::client::drain`, `super::reader::Feed`, `reader::Feed` for a child).
A module naming one of its own ancestors is not counted: the module tree makes a parent a
child's namespace (`use super::Error`). Test code is left out (files named `tests.rs` or
`*_tests.rs`, folders named `tests`, and a file's trailing `#[cfg(test)] mod tests`).
Circles are strongly connected components of two or more modules.

Usage: scripts/module-cycles.py [crate-dir ...]   (default: every workspace member and src/)
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)(::\{)?")
GROUP_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^}]*)\}")
COMMENT_RE = re.compile(r"//[^\n]*")


def modules_of(src):
    """Module path (tuple) → file, for every non-test file under `src`."""
    mods = {}
    for dirpath, dirnames, files in os.walk(src):
        dirnames[:] = [d for d in dirnames if d != "tests"]
        for f in files:
            if not f.endswith(".rs") or f == "tests.rs" or f.endswith("_tests.rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)[:-3].split(os.sep)
            if rel[-1] in ("lib", "main", "mod"):
                rel = rel[:-1]
            mods[tuple(rel)] = os.path.join(dirpath, f)
    return mods


def code_of(path):
    text = open(path, encoding="utf-8").read()
    cut = re.search(r"\n#\[cfg\(test\)\]\s*\nmod tests\s*\{", text)
    if cut:
        text = text[: cut.start()]
    return COMMENT_RE.sub("", text)


def resolve(current, head, rest, mods):
    """The longest known module named by `head::rest` seen from `current`."""
    if head == "crate":
        base = ()
    elif head == "self":
        base = current
    else:
        base = current
        names = list(rest)
        base = base[:-1]
        while names and names[0] == "super":
            names.pop(0)
            base = base[:-1]
        rest = names
    path = base + tuple(rest)
    while path and path not in mods:
        path = path[:-1]
    return path


def edges_of(current, path, mods):
    code = code_of(path)
    found = set()
    for m in GROUP_RE.finditer(code):
        head, prefix, group = m.group(1), m.group(2), m.group(3)
        prefix = [p for p in prefix.split("::") if p]
        for item in group.split(","):
            item = item.strip().split(" as ")[0]
            names = prefix + [n for n in item.split("::") if n and n != "self"]
            found.add(resolve(current, head, names, mods))
    for m in PATH_RE.finditer(code):
        if m.group(3):
            continue
        found.add(resolve(current, m.group(1), [p for p in m.group(2).split("::") if p], mods))
    children = {k[-1] for k in mods if len(k) == len(current) + 1 and k[: len(current)] == current}
    for child in children:
        if re.search(r"(?<![:\w])" + re.escape(child) + r"::", code):
            found.add(current + (child,))
    # A module's own ancestors (and itself) are its namespace, not a dependency.
    return {t for t in found if t != current[: len(t)]}


def circles(graph):
    """Tarjan's strongly connected components with more than one node."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

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

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def members():
    text = open(os.path.join(ROOT, "Cargo.toml"), encoding="utf-8").read()
    listed = re.search(r"members\s*=\s*\[([^\]]*)\]", text)
    names = re.findall(r'"([^"]+)"', listed.group(1)) if listed else []
    return ["."] + names


def main():
    crates = sys.argv[1:] or members()
    failed = False
    checked = 0
    for crate in crates:
        src = os.path.join(ROOT, crate, "src")
        if not os.path.isdir(src):
            continue
        mods = modules_of(src)
        graph = {m: edges_of(m, f, mods) for m, f in mods.items()}
        checked += len(mods)
        for comp in circles(graph):
            failed = True
            names = ["::".join(m) or "(root)" for m in comp]
            print(f"module-cycles: {crate}: circle between {', '.join(names)}")
    if not failed:
        print(f"module-cycles: no circles among {checked} modules")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
