#!/usr/bin/env python3
"""The docs say what is true of the tree (issue 46), checked in CI by scripts/test.sh:

- every function `include/cudapool.h` declares, and every public name of the Python package
  (its `__all__`), is on docs/api.md;
- every repository path the README, CONTRIBUTING.md and docs/*.md name exists (a path that
  starts with one of the tree's folders; `target/` and `dist/` are build outputs, not checked),
  and so does every relative path in a code span that names a source or script file
  (`csrc/nvtx_mem.c` was named for years after the file moved);
- every `CUDAPOOL_*` variable the docs name is one cudapool knows (src/base/config/names.rs).

The worked outputs (the README's example, docs/api.md's print_status) are compared with what
the programs print by tests/preload/newcomer_nvml_oom.rs.
"""
import ast
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
problems = []


def read(rel):
    with open(os.path.join(ROOT, rel)) as f:
        return f.read()


api = read("docs/api.md")
for name in sorted(set(re.findall(r"\b(cudapool_[a-z_]+)\s*\(", read("include/cudapool.h")))):
    if name not in api:
        problems.append(f"docs/api.md does not name {name} (include/cudapool.h declares it)")
tree = ast.parse(read("cbindings/python/cudapool/__init__.py"))
for node in tree.body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
        for elt in node.value.elts:
            if not re.search(r"\b" + re.escape(elt.value) + r"\b", api):
                problems.append(f"docs/api.md does not name the Python package's {elt.value}")

docs = ["README.md", "CONTRIBUTING.md"] + sorted(
    os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md")
)
FOLDERS = "src|tests|scripts|benches|docs|deploy|include|cbindings|third_party|\\.ci"
path_re = re.compile(r"(?<![\w./$-])((?:" + FOLDERS + r")/[A-Za-z0-9_./*-]*[A-Za-z0-9_*])")
known = set(re.findall(r'"(CUDAPOOL_[A-Z_]+)"', read("src/base/config/names.rs")))
SOURCE_EXT = (".rs", ".c", ".h", ".cu", ".py", ".sh", ".md", ".yml", ".yaml", ".toml", ".cmake", ".pc.in")
BUILT = ("target/", "dist/", ".samples/", ".whl/", "build/", "/", "~", "$", "http")
span_re = re.compile(r"`([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+)`")
for doc in docs:
    text = read(doc)
    for n, line in enumerate(text.splitlines(), 1):
        for m in span_re.finditer(line):
            p = m.group(1)
            if p.startswith(BUILT) or not p.endswith(SOURCE_EXT):
                continue
            if not os.path.exists(os.path.join(ROOT, p)):
                problems.append(f"{doc}:{n}: names {p} in code, which is not in the tree")
        for m in path_re.finditer(line):
            p = m.group(1)
            if "*" in p or "<" in p:
                continue
            if not os.path.exists(os.path.join(ROOT, p)):
                problems.append(f"{doc}:{n}: names {p}, which is not in the tree")
        for v in re.findall(r"\b(CUDAPOOL_[A-Z_]+[A-Z])\b", line):
            # The header's macros: its version and the sleep states.
            if v not in known and not v.startswith(("CUDAPOOL_VERSION", "CUDAPOOL_STATE_")):
                problems.append(f"{doc}:{n}: names {v}, a variable cudapool does not know")

# The README is the front door: what it does, the two commands, an example, the variables, one
# speed and one memory table, the limits; detail lives in docs/.
readme_lines = read("README.md").count("\n")
if readme_lines > 300:
    problems.append(f"README.md: {readme_lines} lines, more than 300 (move detail into docs/)")

# The project stands on its own: no file cites a contract or design file it does not have, or
# a folder outside the clone (what a reader needs is in docs/).
ELSEWHERE = re.compile(r"\bSPEC\.md\b|\bDESIGN\.md\b|\.\./shared\b")
for top in ["src", "tests", "scripts", "docs", "benches", "deploy", "cbindings", "include", "dist"]:
    for folder, _, names in os.walk(os.path.join(ROOT, top)):
        if os.path.relpath(folder, ROOT).startswith(os.path.join("docs", "gpu")):
            continue  # records of runs, kept as they were
        for name in names:
            path = os.path.join(folder, name)
            try:
                text = open(path, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            for n, line in enumerate(text.splitlines(), 1):
                if ELSEWHERE.search(line) and os.path.basename(path) != "check-docs.py":
                    problems.append(f"{os.path.relpath(path, ROOT)}:{n}: cites a file outside the project")
for name in ["README.md", "CONTRIBUTING.md", "Cargo.toml", "pyproject.toml", "setup.py", "build.rs"]:
    for n, line in enumerate(read(name).splitlines(), 1):
        if ELSEWHERE.search(line):
            problems.append(f"{name}:{n}: cites a file outside the project")

for p in problems:
    print(p)
print(f"check-docs: {len(docs)} pages, {len(problems)} problems")
sys.exit(1 if problems else 0)
