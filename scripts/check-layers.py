#!/usr/bin/env python3
"""The layers of src/ import only downward, and no two files import each other in a circle;
src/ holds lib.rs, main.rs and one folder per layer (and cli/), and no source file of src/ or
tests/ is over 700 lines; no folder of scripts/, tests/, benches/ or docs/ holds more than 25
files.

A file depends on what a reader of it must open: every path through `crate::`, `self::` or
`super::` (chains of `super::` counted; glob imports `use super::*` too) in its code, comments
aside, each name of a braced list apart; and every child it names (`use child::X`, or
`child::f()` inline). Inside an inline module (`mod tests { ... }`), `super::` is the file
itself. A name a module re-exports from its own child (`pub use shim::Shim`, `pub use x::*`)
leads to that child: using `super::Shim` depends on state/shim.rs, where it lives; a name it
passes on from a sibling (`pub use super::x::f`) is its own. A visibility (`pub(in path)`) is
no use. A library file may depend on its own layer's other modules and on the layers below,
never above; the CLI's files (cli/) have no layer, but their circles count. The driver's raw
table (`call!`) is named only in driver/ and abi/ (the capture rule, src/driver/own.rs), and
report/ never names the state's `Shim` (it reads through `state::View`). Among all files the
dependency graph must have no cycle (a parent module that declares its children with `mod x;`
or re-exports them with `pub use` does not depend on them by that alone).

usage: scripts/check-layers.py   (from anywhere; exits 1 and names the offence)
       scripts/check-layers.py --self-test   (the reading, on planted trees)
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
    """(module path as a list, file path) for every source file of the library and of the CLI
    (cli/: the binary's modules, whose layer rules do not apply, but whose circles count)."""
    for dirpath, _, files in os.walk(ROOT):
        rel = os.path.relpath(dirpath, ROOT)
        parts = [] if rel == "." else rel.split(os.sep)
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
    # A visibility (`pub(in crate::pool::split)`) names where an item may be seen, not a use.
    return re.sub(r"pub\(in [^)]*\)", "pub", "".join(out))


def inline_modules(text):
    """The text outside inline modules (`mod tests { ... }`), and each inline module's name and
    body: inside one, `super::` is the file's own module."""
    inner = []
    while True:
        m = re.search(r"^[ \t]*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*\{", text, re.M)
        if not m:
            return text, inner
        i, depth = m.end(), 1
        while depth and i < len(text):
            depth += (text[i] == "{") - (text[i] == "}")
            i += 1
        inner.append((m.group(1), text[m.end():i - 1]))
        text = text[:m.start()] + text[i:]


# A path of Rust: `super::super::x::{A, B}`, `crate::base::cu::*`, `self::child::f`.
PATH = re.compile(r"\b((?:(?:self|super|crate)::)+)((?:\w+::)*)(\{[^}]*\}|\w+|\*)")
USE = r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+"


def base_of(prefix, here):
    """The module a path's prefix (`crate::`, `self::`, `super::super::`) starts from, in module
    `here` (a file's module, or an inline module inside it)."""
    if prefix.startswith("crate"):
        return []
    base = list(here)
    for _ in range(prefix.count("super")):
        base = base[:-1]
    return base


def main():
    files = dict((tuple(m), p) for m, p in module_files())
    errors = []
    deps = {m: set() for m in files}
    texts = {m: code(p) for m, p in files.items()}
    # Where a name is defined (for a glob re-export, `pub use child::*`).
    defined = {
        m: set(re.findall(r"^\s*pub(?:\([^)]*\))?\s+(?:unsafe\s+)?(?:fn|struct|enum|trait|const|static|type|mod|union)\s+(\w+)", t, re.M))
        for m, t in texts.items()
    }

    # What each module re-exports from its children (`pub use child::{A, B as C};`, `pub use
    # child::*`): a name reached through the module is where it lives (`use super::Shim`
    # depends on state/shim.rs, where `Shim` lives, not on state/mod.rs, which only names it).
    # A name a module passes on from a sibling (`pub use super::x::f`) is the module's: a
    # reader of `super::m::f` opens m first.
    reexports, globs = {}, {}
    for mod, path in files.items():
        for m in re.finditer(r"^\s*pub(?:\([^)]*\))?\s+use\s+((?:(?:self|super|crate)::)*)((?:\w+::)*)(\{[^}]*\}|\w+|\*)\s*;", texts[mod], re.M):
            prefix, head, names = m.groups()
            if prefix not in ("", "self::"):
                continue  # a sibling's or another layer's name, passed on: the path depends here
            target = tuple(list(mod) + [p for p in head.split("::") if p])
            if names == "*":
                globs.setdefault(mod, []).append(target)
                continue
            for name in names.strip("{}").split(","):
                name = name.strip()
                if name:
                    inner = name.split(" as ")[0].strip().split("::")
                    reexports[(mod, name.split(" as ")[-1].strip())] = target + tuple(inner[:-1])

    def longest(path):
        for n in range(len(path), 0, -1):
            if tuple(path[:n]) in files:
                return tuple(path[:n]), n
        return None, 0

    def resolve(path):
        """The file of ours that `path` names: its longest module prefix that is a file,
        followed through the re-exports of that module (explicit or glob)."""
        found, n = longest(path)
        for _ in range(8):
            if found is None or n >= len(path):
                break
            name = path[n]
            if (found, name) in reexports:
                path = list(reexports[(found, name)]) + list(path[n:])
                found, n = longest(path)
            elif name not in defined[found] and any(name in defined.get(g, ()) for g in globs.get(found, [])):
                found = next(g for g in globs[found] if name in defined.get(g, ()))
                break
            else:
                break
        return found

    for mod, path in files.items():
        text = texts[mod]
        top = mod[0]
        children = {mod + (c,) for c in re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text, re.M)}
        outer, inner = inline_modules(text)
        # A file module's `super` is its folder's module; mod.rs's, the folder above.
        here = list(mod)
        for body, where in [(outer, here)] + [(b, here + [n]) for n, b in inner]:
            # Re-exports of a module's own children declare, they do not depend.
            declared = re.sub(r"^\s*pub(?:\([^)]*\))?\s+use\s+(?:self::)?(\w+)::[^;]*;", lambda m: "" if mod + (m.group(1),) in children else m.group(0), body, flags=re.M)
            for m in PATH.finditer(declared):
                prefix, head, names = m.groups()
                start = base_of(prefix, where)
                for name in names.strip("{}").split(","):
                    name = name.strip().split(" as ")[0].strip()
                    if not name:
                        continue
                    target = start + [p for p in head.split("::") if p]
                    if name not in ("*", "self"):
                        target += name.split("::")[:1]
                    if prefix.startswith("crate") and top != "cli" and target and target[0] in RANK:
                        if RANK[target[0]] > RANK.get(top, 99):
                            errors.append(f"{path}: uses crate::{'::'.join(target)}, a layer above ({LAYERS[RANK[target[0]]][0]} over {LAYERS[RANK[top]][0]})")
                    dep = resolve(target)
                    if dep and dep != mod:
                        deps[mod].add(dep)
            # A child named from its parent (`use child::X`, `child::f()` inline).
            for c in children:
                for m in re.finditer(r"(?<![:\w])" + c[-1] + r"((?:::\w+)+)", declared):
                    dep = resolve(list(c) + [p for p in m.group(1).split("::") if p])
                    if dep and dep != mod:
                        deps[mod].add(dep)

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
    # The capture rule (src/driver/own.rs): the driver's table is named (`call!`) only where the
    # program's own calls pass through (abi/) and in the driver itself; every other layer calls
    # the driver's typed methods, and those CUDA forbids during a capture only through `Own`,
    # which takes an `OwnCalls` permission.
    for mod, path in files.items():
        if mod[0] in ("driver", "abi"):
            continue
        for n, line in enumerate(texts[mod].splitlines(), 1):
            if re.search(r"(?<![\w])call!\s*\(", line):
                rel = os.path.relpath(path, os.path.join(ROOT, ".."))
                errors.append(f"{rel}:{n}: `call!` names the driver's table outside driver/ and abi/ (call the driver's methods; those forbidden during a capture through `Driver::own`)")
    # Reporting reads the state through `state::View` only (`state::view()`): no file of report/
    # names the `Shim` (comments aside), so what it may see is the trait's list.
    for mod, path in files.items():
        if mod[0] != "report":
            continue
        for n, line in enumerate(texts[mod].splitlines(), 1):
            if re.search(r"\bShim\b", line.split("//")[0]):
                rel = os.path.relpath(path, os.path.join(ROOT, ".."))
                errors.append(f"{rel}:{n}: report/ names the state's `Shim` (read through `state::View`: `state::view()`)")
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


def self_test():
    """The reading above, on a planted tree: each kind of circle it must see is seen, and what
    is no use (an inline test module's `super::*`, a visibility) makes none."""
    import contextlib
    import io
    import tempfile
    global ROOT
    cases = {
        # a child's glob import of its parent, the parent naming the child inline
        "glob and inline child": {"pool/mod.rs": "mod a;\nfn f() { a::g() }\n", "pool/a.rs": "use super::*;\npub fn g() {}\n"},
        # a name passed on from a sibling is the sibling's re-exporter's
        "sibling re-export": {"pool/mod.rs": "mod a;\nmod b;\nmod c;\n", "pool/a.rs": "pub use super::c::f;\nuse super::b::h;\n", "pool/b.rs": "pub fn h() { super::a::f() }\n", "pool/c.rs": "pub fn f() {}\n"},
        # super::super from a grandchild
        "super::super": {"pool/mod.rs": "mod x;\npub fn top() { x::y::z() }\n", "pool/x/mod.rs": "pub mod y;\n", "pool/x/y.rs": "pub fn z() { super::super::top() }\n"},
        # the CLI's files count
        "cli": {"cli/a.rs": "fn f() { super::b::g() }\npub fn h() {}\n", "cli/b.rs": "pub fn g() { super::a::h() }\n"},
    }
    clean = {
        "test module and visibility": {"pool/mod.rs": "mod a;\nfn f() { a::g() }\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n", "pool/a.rs": "pub(in crate::pool) fn g() {}\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n"},
    }
    failed = 0
    # One file planted at each place, and whether the rule refuses it there.
    planted = [
        # The driver's table named in state/: refused; in abi/: the program's call, passed through.
        ("call!", "fn f(d: &D) { call!(d, ctx_synchronize()); }\n", "`call!` names the driver's table",
         (("state/a.rs", True), ("abi/a.rs", False))),
        # The Shim named in report/: refused; in state/: its own.
        ("Shim", "// the Shim is read through View\nfn f() { let s = Shim::active(); }\n",
         "names the state's `Shim`", (("report/a.rs", True), ("state/a.rs", False))),
    ]
    def report_on(tree):
        """What the check prints for the source tree `tree` (path under src/ -> text)."""
        global ROOT
        with tempfile.TemporaryDirectory() as d:
            for rel, text in tree.items():
                os.makedirs(os.path.dirname(os.path.join(d, "src", rel)), exist_ok=True)
                with open(os.path.join(d, "src", rel), "w") as f:
                    f.write(text)
            ROOT = os.path.join(d, "src")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                main()
            return out.getvalue()

    for rule, text, says, places in planted:
        for where, refused in places:
            out = report_on({where: text})
            if (says in out) != refused:
                failed += 1
                print(f"FAIL {rule} in {where}: {'refused' if refused else 'allowed'} expected\n{out}")
    for name, tree in list(cases.items()) + list(clean.items()):
        out = report_on(tree)
        if ("import cycle" in out) != (name in cases):
            failed += 1
            print(f"FAIL {name}: {'a circle' if name in cases else 'none'} expected\n{out}")
    print(f"check-layers self-test: {len(cases) + len(clean) + 4 - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(self_test() if sys.argv[1:] == ["--self-test"] else main())
