#!/usr/bin/env python3
"""The host cost of the whole library, build against build, without a GPU: a recorded trace
played through the driver API (the test client's `trace` scenario) against the fake driver's
lagging device, each allocation used by a kernel and freed with cuMemFree, under each library
in turn; rounds interleaved; prints each library's median ns an operation (an allocation and
its kernel's launch, or a free) over the trace's second half, with the spread, and the ratio to
the first. Hooks, fences and the pool are all in it; the kernels touch nothing (no race
detector), so the figure is the host's. With --callgrind, each library runs once under
valgrind's callgrind instead and the instructions the library's hooks execute are printed (the
same on every run and machine), beside the pool's reserved bytes and driver allocations at the
end, which say that each build ran its own pool (valgrind cannot reserve the address space of a
large arena: the fake device then has 8.5 GiB, enough for the traces of benches/traces).

usage: python3 scripts/host-cost.py LIB [LIB ...] [--trace FILE] [--streams 1|2] [--rounds 11]
           [--callgrind [--after-warmup]]

--after-warmup counts the trace's second half alone (the whole trace less its first half of
lines, run apart): what a training job's steady steps cost, without the warm-up's growths.

Needs the test fixtures (`cargo test --release --test preload` builds target/tmp/preload).
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
FIXTURES = os.path.join(ROOT, "target", "tmp", "preload")


def play(lib, trace, streams, wrapper=(), memory=64 << 30):
    """One run of the trace scenario: its `trace` and `trace_end` lines as dicts."""
    env = dict(os.environ, FAKECU_TOTAL_MEM=str(memory), FAKECU_DEVICES="1",
               LD_LIBRARY_PATH=FIXTURES, LD_PRELOAD=os.path.abspath(lib))
    r = subprocess.run([*wrapper, os.path.join(FIXTURES, "client_linked"), "link", "trace", trace,
                        str(streams), "20", "0"], env=env, capture_output=True, text=True)
    lines = {l.split()[0]: dict(kv.split("=", 1) for kv in l.split()[1:] if "=" in kv)
             for l in r.stdout.splitlines() if l.startswith("trace")}
    if r.returncode != 0 or "trace" not in lines:
        sys.exit(f"host-cost: {lib}: exit {r.returncode}\n{r.stdout}{r.stderr[-2000:]}")
    return lines


def one(lib, trace, streams):
    return float(play(lib, trace, streams)["trace"]["ns_per_op"])


def counted_after_warmup(lib, trace, streams):
    """The hooks' instructions over the trace's second half (the whole trace's, less those of its
    first half of lines alone), and the pool's end figures."""
    with open(trace) as f:
        lines = f.readlines()
    with tempfile.NamedTemporaryFile("w", suffix=".ops") as half:
        half.writelines(lines[:len(lines) // 2])
        half.flush()
        first = counted(lib, half.name, streams)[0]
    whole, reserved, allocs = counted(lib, trace, streams)
    return whole - first, reserved, allocs


def counted(lib, trace, streams):
    """The hooks' instructions under callgrind, and the pool's end figures."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cg.out")
        lines = play(lib, trace, streams, ("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"),
                     memory=17 << 29)
        text = subprocess.run(["callgrind_annotate", "--inclusive=yes", out], capture_output=True,
                              text=True).stdout
    hook = 0
    for l in text.splitlines():
        m = re.match(r"^\s*([\d,]+) .*cudapool::abi::hooks::guard::hook\b", l)
        if m:
            hook = max(hook, int(m.group(1).replace(",", "")))
    end = lines.get("trace_end", {})
    return hook, int(end.get("reserved", 0)), int(end.get("driver_allocs", 0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("libs", nargs="+")
    ap.add_argument("--trace", default=os.path.join(ROOT, "benches", "traces", "bert.cudapool.ops"))
    ap.add_argument("--streams", type=int, default=1, choices=[1, 2])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--callgrind", action="store_true", help="count instructions instead of timing")
    ap.add_argument("--after-warmup", action="store_true",
                    help="with --callgrind: the trace's second half only (two runs a library)")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(FIXTURES, "client_linked")):
        sys.exit("host-cost: no test client: run `cargo test --release --test preload` first")
    for lib in a.libs:
        if not os.path.isfile(lib):
            sys.exit(f"host-cost: {lib}: no such library")
    if a.after_warmup and not a.callgrind:
        sys.exit("host-cost: --after-warmup counts instructions: add --callgrind")
    if a.callgrind:
        if not (shutil.which("valgrind") and shutil.which("callgrind_annotate")):
            sys.exit("host-cost: --callgrind needs valgrind (apt-get install valgrind)")
        count = counted_after_warmup if a.after_warmup else counted
        rows = {lib: count(lib, a.trace, a.streams) for lib in a.libs}
        first = rows[a.libs[0]][0] or 1
        part = ", its second half" if a.after_warmup else ""
        print(f"{os.path.basename(a.trace)}{part}, {a.streams} stream(s), callgrind: the hooks' "
              "instructions, ratio to the first, reserved MiB and driver allocations at the end")
        for lib, (hook, reserved, allocs) in rows.items():
            print(f"  {hook:>13,}  {hook / first:.3f}  {reserved / 2**20:8.0f} MiB  {allocs:5}  {lib}")
        return
    ns = {lib: [] for lib in a.libs}
    for r in range(a.rounds):
        order = a.libs[r % len(a.libs):] + a.libs[:r % len(a.libs)]
        for lib in order:
            ns[lib].append(one(lib, a.trace, a.streams))
    first = statistics.median(ns[a.libs[0]])
    print(f"{os.path.basename(a.trace)}, {a.streams} stream(s), {a.rounds} rounds: ns an operation, "
          "median [min-max], ratio to the first")
    for lib in a.libs:
        m = statistics.median(ns[lib])
        print(f"  {m:8.1f} [{min(ns[lib]):.1f}-{max(ns[lib]):.1f}]  {m / first:.3f}  {lib}")


if __name__ == "__main__":
    main()
