#!/usr/bin/env python3
"""The host cost of the whole library, build against build, without a GPU: a recorded trace
played through the driver API (the test client's `trace` scenario) against the fake driver's
lagging device, each allocation used by a kernel and freed with cuMemFree, under each library
in turn; rounds interleaved; prints each library's median ns an operation (an allocation and
its kernel's launch, or a free) over the trace's second half, with the spread, and the ratio to
the first. Hooks, fences and the pool are all in it; the kernels touch nothing (no race
detector), so the figure is the host's.

usage: python3 scripts/host-cost.py LIB [LIB ...] [--trace FILE] [--streams 1|2] [--rounds 11]

Needs the test fixtures (`cargo test --release --test preload` builds target/tmp/preload).
"""
import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
FIXTURES = os.path.join(ROOT, "target", "tmp", "preload")


def one(lib, trace, streams):
    env = dict(os.environ, FAKECU_TOTAL_MEM=str(64 << 30), FAKECU_DEVICES="1",
               LD_LIBRARY_PATH=FIXTURES, LD_PRELOAD=os.path.abspath(lib))
    r = subprocess.run([os.path.join(FIXTURES, "client_linked"), "link", "trace", trace,
                        str(streams), "20", "0"], env=env, capture_output=True, text=True)
    line = next((l for l in r.stdout.splitlines() if l.startswith("trace ")), None)
    if r.returncode != 0 or line is None:
        sys.exit(f"host-cost: {lib}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    return float(dict(kv.split("=") for kv in line.split()[1:])["ns_per_op"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("libs", nargs="+")
    ap.add_argument("--trace", default=os.path.join(ROOT, "benches", "traces", "bert.cudapool.ops"))
    ap.add_argument("--streams", type=int, default=1, choices=[1, 2])
    ap.add_argument("--rounds", type=int, default=11)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(FIXTURES, "client_linked")):
        sys.exit("host-cost: no test client: run `cargo test --release --test preload` first")
    for lib in a.libs:
        if not os.path.isfile(lib):
            sys.exit(f"host-cost: {lib}: no such library")
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
