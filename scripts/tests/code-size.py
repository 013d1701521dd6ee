#!/usr/bin/env python3
"""No production function over 80 lines and no production file over 600 lines (issue 48).

Covers the crates a newcomer reads to add a kind: pipelines, connectors, operators, formats.
Production code is a file's lines up to its `#[cfg(test)]` module; files named tests.rs, or
under tests/ or benches/, are tests. A function runs from its `fn` line to the closing brace at
the same indentation (rustfmt's layout). The runtime's hot path is the latency issue's to
reshape and is left out here. `--list` prints every function and file over the limits, longest
first, and exits 0; without it the script fails when any is over. scripts/test.sh runs it.
"""
import pathlib
import re
import sys

FUNCTION_LIMIT = 80
FILE_LIMIT = 600
CRATES = ["pipelines", "connectors", "operators", "formats"]

root = pathlib.Path(__file__).resolve().parents[2]
fn_line = re.compile(r"^(\s*)(?:pub(?:\([^)]*\))? )?(?:const )?(?:async )?(?:unsafe )?"
                     r"(?:extern \"C\" )?fn (\w+)")


def production_lines(path):
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "#[cfg(test)]" and i + 1 < len(lines) \
                and re.match(r"\s*(pub )?mod \w+", lines[i + 1]):
            return lines[:i]
    return lines


def functions(lines):
    for i, line in enumerate(lines):
        m = fn_line.match(line)
        if not m:
            continue
        indent = m.group(1)
        # The signature may wrap; a declaration without a body ends in `;`.
        j = i
        while j < len(lines) and not lines[j].rstrip().endswith(("{", ";")):
            j += 1
        if j >= len(lines) or lines[j].rstrip().endswith(";"):
            continue
        if lines[j].rstrip().endswith("}") or lines[j].strip().endswith("{ }"):
            continue
        close = indent + "}"
        for k in range(j + 1, len(lines)):
            if lines[k].rstrip() == close:
                yield m.group(2), i + 1, k - i + 1
                break


def is_test(path):
    parts = path.relative_to(root).parts
    return path.name == "tests.rs" or "tests" in parts or "benches" in parts


long_functions, long_files = [], []
for crate in CRATES:
    for path in sorted((root / crate / "src").rglob("*.rs")):
        if is_test(path):
            continue
        lines = production_lines(path)
        rel = path.relative_to(root)
        if len(lines) > FILE_LIMIT:
            long_files.append((len(lines), str(rel)))
        for name, line, length in functions(lines):
            if length > FUNCTION_LIMIT:
                long_functions.append((length, f"{rel}:{line} {name}"))

long_functions.sort(reverse=True)
long_files.sort(reverse=True)
if "--list" in sys.argv:
    for length, where in long_functions:
        print(f"fn   {length:4} {where}")
    for length, where in long_files:
        print(f"file {length:4} {where}")
    sys.exit(0)
problems = [f"function of {n} lines (limit {FUNCTION_LIMIT}): {w}" for n, w in long_functions]
problems += [f"file of {n} production lines (limit {FILE_LIMIT}): {w}" for n, w in long_files]
if problems:
    sys.exit("code-size: split these into named steps or modules:\n  " + "\n  ".join(problems))
print(f"code-size: no function over {FUNCTION_LIMIT} lines, no file over {FILE_LIMIT} "
      f"production lines in {', '.join(CRATES)}")
