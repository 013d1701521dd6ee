#!/usr/bin/env python3
"""docs/architecture.md's crate table names every crate of the workspace, and nothing else.

The table's first column holds each crate's folder (`dataflow/`) or, for the CLI, `riffle`
(`src/`); the workspace's members come from Cargo.toml. scripts/test.sh runs it.
"""
import pathlib
import re
import sys
import tomllib

root = pathlib.Path(__file__).resolve().parents[2]
members = set(tomllib.loads((root / "Cargo.toml").read_text())["workspace"]["members"])
members.add("src")  # the root package: the `riffle` CLI
doc = (root / "docs/architecture.md").read_text()
table = re.search(r"^\| crate \| job \|\n\|---\|---\|\n((?:\|.*\n)+)", doc, re.M)
if not table:
    sys.exit("architecture-crates: docs/architecture.md has no `| crate | job |` table")
listed = set()
for row in table.group(1).splitlines():
    first = row.split("|")[1]
    folder = re.search(r"`([a-z_-]+)/`|\(root, `(src)/`\)", first)
    if not folder:
        sys.exit(f"architecture-crates: no crate folder in the row `{first.strip()}`")
    listed.add(folder.group(1) or folder.group(2))
missing, extra = sorted(members - listed), sorted(listed - members)
if missing or extra:
    sys.exit(f"architecture-crates: docs/architecture.md's crate table lacks {missing} "
             f"and lists {extra} that the workspace does not have")
count = re.search(r"Riffle is (\w+) library crates", doc)
words = {"six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}
libraries = len(members - {"src", "python", "fuzz"})
if not count or words.get(count.group(1)) != libraries:
    sys.exit(f"architecture-crates: docs/architecture.md should say `Riffle is ... library crates` "
             f"with {libraries} (the workspace's members but python/ and fuzz/)")
print(f"architecture-crates: ok: {len(listed)} crates in the table, {libraries} libraries")
