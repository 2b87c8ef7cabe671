#!/usr/bin/env python3
"""The layers of src/ import only downward, and no two files import each other in a circle;
src/ holds lib.rs, main.rs and one folder per layer (and cli/), and no source file of src/ or
tests/ is over 700 lines; no folder of scripts/, tests/, benches/ or docs/ holds more than 25
files.

Every reference to `crate::X` (X a top-level module) or `super::` in a file's code (comments and
doc comments aside) is a dependency, each name of a braced list (`use super::{A, B}`) apart, and
a name a module re-exports from its child (`pub use shim::Shim`) leads to that child: using
`super::Shim` depends on state/shim.rs, where it lives. A file may depend on its own layer's other modules and on
the layers below, never above. Then, among files, the dependency graph must have no cycle (a
parent module that declares its children with `mod x;` or re-exports them with `pub use` does
not depend on them by that alone).

usage: scripts/check-layers.py   (from anywhere; exits 1 and names the offence)
"""
import os
import re
import sys

# Each layer is a folder of src/ (the mechanisms are three); the tree is the diagram.
LAYERS = [
    ("base", ["base"]),
    ("mechanisms", ["driver", "limits", "pool"]),
    ("state", ["state"]),
    ("reporting", ["report"]),
    ("C ABI", ["abi"]),
]
RANK = {m: i for i, (_, mods) in enumerate(LAYERS) for m in mods}
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
SKIP = {"lib.rs", "main.rs"}
MAX_LINES = 700  # the crate root wires the layers together; main.rs is the CLI
MAX_FILES = 25


def module_files():
    """(module path as a list, file path) for every library source file."""
    for dirpath, _, files in os.walk(ROOT):
        rel = os.path.relpath(dirpath, ROOT)
        parts = [] if rel == "." else rel.split(os.sep)
        if parts and parts[0] == "cli":
            continue
        for f in sorted(files):
            if not f.endswith(".rs") or (not parts and f in SKIP):
                continue
            name = f[:-3]
            yield (parts if name == "mod" else parts + [name]), os.path.join(dirpath, f)


def code(path):
    """The file's text with comments (line and doc comments) removed."""
    out = []
    for line in open(path, encoding="utf-8"):
        stripped = line.lstrip()
        if stripped.startswith("//"):
            continue
        out.append(re.sub(r"//.*$", "", line))
    return "".join(out)


def main():
    files = dict((tuple(m), p) for m, p in module_files())
    errors = []
    deps = {m: set() for m in files}

    # What each module re-exports from its children (`pub use child::{A, B as C};`): a name
    # reached through the parent is the child's (`use super::Shim` depends on state/shim.rs,
    # where `Shim` lives, not on state/mod.rs, which only names it).
    reexports = {}
    for mod, path in files.items():
        for m in re.finditer(r"^\s*pub(?:\([^)]*\))?\s+use\s+(?:self::)?(\w+)::(\{[^}]*\}|\w+)\s*;", code(path), re.M):
            child = mod + (m.group(1),)
            if child not in files:
                continue
            for name in m.group(2).strip("{}").split(","):
                name = name.strip()
                if name:
                    reexports[(mod, name.split(" as ")[-1].strip())] = child

    def resolve(path):
        """The file of ours that `path` names: its longest module prefix that is a file,
        followed through the re-exports of that module."""
        for n in range(len(path), 0, -1):
            if tuple(path[:n]) in files:
                found = tuple(path[:n])
                # Followed down as far as the name is re-exported (a child's child).
                while n < len(path) and (found, path[n]) in reexports:
                    found = reexports[(found, path[n])]
                    path = list(found) + list(path[n:])
                    n = len(found)
                return found
        return None

    def targets(text, prefix):
        """Every path after `prefix` (`crate::`, `super::`), a braced list of names split into
        one path each (`super::{Live, Shim}`: `super::Live`, `super::Shim`)."""
        for m in re.finditer(r"\b" + prefix + r"((?:\w+::)*)(\{[^}]*\}|\w+)", text):
            head = m.group(1)
            for name in m.group(2).strip("{}").split(","):
                name = name.strip().split(" as ")[0].split("::")[0].strip()
                if name and name != "self":
                    yield (head + name).replace("::::", "::")
                elif name == "self" and head:
                    yield head.rstrip(":")

    for mod, path in files.items():
        text = code(path)
        top = mod[0]
        children = set()
        for m in re.finditer(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text, re.M):
            children.add(mod + (m.group(1),))
        # Re-exports of a module's own children declare, they do not depend.
        declared = re.sub(r"^\s*pub\s+use\s+(\w+)::[^;]*;", "", text, flags=re.M)
        for t in targets(declared, "crate::"):
            target = t.split("::")
            if target[0] not in RANK:
                continue
            if RANK[target[0]] > RANK.get(top, 99):
                errors.append(f"{path}: uses crate::{t}, a layer above ({LAYERS[RANK[target[0]]][0]} over {LAYERS[RANK[top]][0]})")
            dep = resolve(target)
            if dep and dep != mod:
                deps[mod].add(dep)
        parent = mod[:-1] if os.path.basename(path) != "mod.rs" else mod[:-1]
        for t in targets(declared, "super::"):
            target = list(parent) + [p for p in t.split("::") if p != "super"]
            dep = resolve(target)
            if dep and dep != mod and dep not in children:
                deps[mod].add(dep)
        for m in re.finditer(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+(\w+)::", declared, re.M):
            child = mod + (m.group(1),)
            if child in files:
                deps[mod].add(child)

    # Cycles, by depth-first search.
    state, stack = {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(deps[m]):
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                errors.append("import cycle: " + " -> ".join("::".join(c) for c in cycle))
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(deps):
        if m not in state:
            visit(m)
    # The tree is the diagram: src/ itself holds the crate's two roots and the layers' folders,
    # and no source file is longer than a reader can hold (tests included).
    for entry in sorted(os.listdir(ROOT)):
        full = os.path.join(ROOT, entry)
        if os.path.isfile(full) and entry not in SKIP:
            errors.append(f"src/{entry}: a loose file in src/ (put it in its layer's folder)")
        elif os.path.isdir(full) and entry not in RANK and entry != "cli":
            errors.append(f"src/{entry}/: a folder that is no layer of LAYERS (nor the CLI)")
    tests = os.path.join(ROOT, "..", "tests")
    for dirpath, _, names in [w for top in (ROOT, tests) for w in os.walk(top)]:
        for f in names:
            if f.endswith((".rs", ".c")):
                path = os.path.join(dirpath, f)
                n = sum(1 for _ in open(path, encoding="utf-8"))
                if n > MAX_LINES:
                    errors.append(f"{os.path.relpath(path, os.path.join(ROOT, '..'))}: {n} lines (at most {MAX_LINES}: split it by concern)")
    # A newcomer can read a folder: at most MAX_FILES files in any folder of scripts/, tests/,
    # benches/, docs/ (build outputs of the tests aside).
    top = os.path.join(ROOT, "..")
    for area in ("scripts", "tests", "benches", "docs"):
        for dirpath, dirnames, names in os.walk(os.path.join(top, area)):
            dirnames[:] = [d for d in dirnames if d not in ("target", "__pycache__")]
            if len(names) > MAX_FILES:
                errors.append(f"{os.path.relpath(dirpath, top)}/: {len(names)} files (at most {MAX_FILES}: lay it out by kind)")
    for e in errors:
        print(e)
    print(f"check-layers: {len(files)} files, {sum(len(d) for d in deps.values())} dependencies, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
