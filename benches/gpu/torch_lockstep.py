"""torch.empty + del from Python, every allocator in lockstep (issue 26, part 3).

On the H100 host a Python pair reads about 2.5 us or about 5 us, and the mode changes while a
process runs (one row of bench-gpu.sh read 2.6 us at 64 KiB and 4.8 us at 1 MiB). Rows run one
process after another cannot be told apart. Here every row is a live worker process, pinned to
the same core, and the workers take turns: a few milliseconds of pairs each, row after row,
round after round. Rows measured a few milliseconds apart see the same machine state, so each
row's ratio to PyTorch's own allocator *within a round* is the figure. Its median and spread
over the rounds are what the kinds are compared by.

    python3 benches/gpu/torch_lockstep.py [ROUNDS]     (default 40; on the device)

Rows: PyTorch's caching allocator; caching off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) under
cudapool split, binned, simple and split with expandable segments (CUDAPOOL_LIB, default
target/release/libcudapool.so), and split of a second build when BASE_LIB names one. CORE picks
the core (default 5), SIZES the sizes (default 512,4096,1048576,16777216).
"""
import os
import statistics
import sys
import time

from lockstep import label, ratio, run, spread

PAIRS = 2000  # a few milliseconds a turn


def worker():
    import torch

    torch.cuda.init()
    sizes = [int(s) for s in sys.argv[2].split(",")]
    for size in sizes:
        for _ in range(200):
            x = torch.empty(size, dtype=torch.uint8, device="cuda")
            del x
    print("ready", flush=True)
    for line in sys.stdin:
        size, n = map(int, line.split())
        best = []
        for _ in range(3):
            t = time.perf_counter_ns()
            for _ in range(n):
                x = torch.empty(size, dtype=torch.uint8, device="cuda")
                del x
            best.append((time.perf_counter_ns() - t) / n)
        print(f"{statistics.median(best):.1f}", flush=True)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    core = int(os.environ.get("CORE", "5"))
    sizes = os.environ.get("SIZES", "512,4096,1048576,16777216")
    lib = os.environ.get("CUDAPOOL_LIB", os.path.abspath("target/release/libcudapool.so"))
    base = os.environ.get("BASE_LIB", "")
    off = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "LD_PRELOAD": lib}
    rows = [("PyTorch's caching allocator", {})]
    for k in ["split", "binned", "simple"]:
        rows.append((f"caching off, cudapool {k}", dict(off, CUDAPOOL_POOL=k)))
    rows.append(("caching off, cudapool split expandable", dict(off, CUDAPOOL_SEGMENTS="expandable")))
    if base:
        rows.append(("caching off, cudapool split (base build)", dict(off, LD_PRELOAD=base)))
    answers = run(__file__, rows, core, sizes, rounds, PAIRS)
    sizes = [int(s) for s in sizes.split(",")]
    ns = {(i, size): [float(a[0]) for a in v] for (i, size), v in answers.items()}
    gov = "unknown"
    try:
        gov = open(f"/sys/devices/system/cpu/cpu{core}/cpufreq/scaling_governor").read().strip()
    except OSError:
        pass
    print(f"# torch.empty+del in lockstep: {rounds} rounds, {len(rows)} workers pinned to core {core} "
          f"(governor {gov}), {PAIRS} pairs a turn (median of 3)")
    print()
    print("ns per pair: median of the rounds [25th-75th percentile]")
    print("| row | " + " | ".join(label(s) for s in sizes) + " |")
    print("| --- |" + " --- |" * len(sizes))
    for i, (name, _) in enumerate(rows):
        cells = [spread(ns[i, s]) for s in sizes]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    print("against PyTorch's own, the same round: median ratio [25th-75th percentile]; a spread that holds 1.00 is no difference")
    print("| row | " + " | ".join(label(s) for s in sizes) + " |")
    print("| --- |" + " --- |" * len(sizes))
    for i, (name, _) in enumerate(rows[1:], 1):
        cells = [ratio([a / b for a, b in zip(ns[i, s], ns[0, s])]) for s in sizes]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    spans = "; ".join(f"{label(s)} {min(ns[0, s]):.0f}-{max(ns[0, s]):.0f}" for s in sizes)
    print(f"PyTorch's own, fastest and slowest turn (ns): {spans}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker()
    else:
        main()
