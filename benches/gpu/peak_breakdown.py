"""Where a cudapool process's reserved memory went at its peak (issue 45, item 4): replays the
history of a snapshot in PyTorch's format (`cudapool.snapshot(path, format="torch")` under
`CUDAPOOL_HISTORY=N`) and, at the moment reserved memory was highest, splits it into what the
program held, what it had freed but was waiting for its fence ("pending"), and what was cached
free; then the sizes of the free pieces and of the live blocks at that moment.

usage: python3 benches/gpu/peak_breakdown.py SNAPSHOT.pickle [DEVICE]
"""
import collections
import pickle
import sys

MIB = 2**20


def main():
    snap = pickle.load(open(sys.argv[1], "rb"))
    dev = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    trace = snap["device_traces"][dev]
    live, pending = {}, {}
    reserved = allocated = 0
    best = None
    for i, e in enumerate(trace):
        a, addr, size = e["action"], e["addr"], e["size"]
        if a == "alloc":
            live[addr] = size
            allocated += size
        elif a == "free_requested":
            if addr in live:
                pending[addr] = live.pop(addr)
                allocated -= pending[addr]
        elif a == "free_completed":
            pending.pop(addr, None)
        elif a in ("segment_alloc", "segment_map"):
            reserved += size
        elif a in ("segment_free", "segment_unmap"):
            reserved -= size
        if best is None or reserved > best[0]:
            best = (reserved, i, allocated, sum(pending.values()), dict(live), dict(pending))
    if best is None:
        sys.exit("no history in this snapshot (run with CUDAPOOL_HISTORY=N)")
    r, i, al, pe, lv, pd = best
    print(f"events {len(trace)}; peak reserved at event {i}: {r / MIB:.1f} MiB (the history's own count:"
          f" it starts at the oldest event kept)")
    print(f"  held by the program {al / MIB:.1f} MiB in {len(lv)} blocks")
    print(f"  freed, waiting for a fence {pe / MIB:.1f} MiB in {len(pd)} blocks")
    print(f"  cached free {(r - al - pe) / MIB:.1f} MiB")
    sizes = collections.Counter()
    for s in lv.values():
        sizes["<1 MiB" if s < MIB else "1-2 MiB" if s < 2 * MIB else "2-64 MiB" if s < 64 * MIB else ">=64 MiB"] += s
    print("  live bytes by block size:", {k: f"{v / MIB:.1f} MiB" for k, v in sorted(sizes.items())})
    # The segments now (at the snapshot, not at the peak): how full each is.
    segs = [s for s in snap["segments"] if s["device"] == dev]
    total = sum(s["total_size"] for s in segs)
    used = sum(s["allocated_size"] for s in segs)
    print(f"now: {len(segs)} segments, {total / MIB:.1f} MiB, {used / MIB:.1f} MiB of it held")
    by_origin = collections.Counter()
    for s in segs:
        by_origin[s.get("origin", "?")] += s["total_size"]
    print("  by origin:", {k: f"{v / MIB:.1f} MiB" for k, v in by_origin.items()})


if __name__ == "__main__":
    main()
