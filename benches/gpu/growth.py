"""What growing the pool costs: COUNT allocations of SIZE in a fresh process, each kept (so each
takes memory from the driver: the pool grows), timed together; then all freed and allocated
again (from the cache). Each mode in a fresh process, modes interleaved over ROUNDS rounds;
prints each mode's median and range.

usage: python3 benches/gpu/growth.py LIB [SIZE_MIB] [COUNT] [ROUNDS]
  e.g. growth.py target/release/libcudapool.so 4096 1    (the first 4 GiB tensor)
       growth.py target/release/libcudapool.so 100 40    (40 tensors of 100 MiB)
"""
import os
import statistics
import subprocess
import sys

LIB = os.path.abspath(sys.argv[1])
MIB = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
COUNT = int(sys.argv[3]) if len(sys.argv) > 3 else 1
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 3
CHILD = r'''
import time, torch
torch.empty(1, device="cuda"); torch.cuda.synchronize()
t = time.perf_counter()
xs = [torch.empty(MIB << 20, dtype=torch.uint8, device="cuda") for _ in range(COUNT)]
torch.cuda.synchronize(); first = time.perf_counter() - t
del xs; torch.cuda.synchronize()
t = time.perf_counter()
xs = [torch.empty(MIB << 20, dtype=torch.uint8, device="cuda") for _ in range(COUNT)]
torch.cuda.synchronize(); again = time.perf_counter() - t
print(f"{first * 1e3:.3f} {again * 1e3:.3f}")
'''.replace("MIB", str(MIB)).replace("COUNT", str(COUNT))
MODES = [
    ("torch", {}),
    ("torch-exp", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    ("cp", {"LD_PRELOAD": LIB, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}),
    ("cp-classic", {"LD_PRELOAD": LIB, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "CUDAPOOL_SEGMENTS": "classic"}),
    ("cp-pooled", {"LD_PRELOAD": LIB, "PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
]
times = {name: ([], []) for name, _ in MODES}
for _ in range(ROUNDS):
    for name, extra in MODES:
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        env.update(extra)
        p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
        try:
            first, again = map(float, p.stdout.split())
        except ValueError:
            print(f"{name}: failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
            continue
        times[name][0].append(first)
        times[name][1].append(again)
print(f"{COUNT} x {MIB} MiB, {ROUNDS} rounds: median ms [min-max]")
for name, (first, again) in times.items():
    if first:
        print(f"{name:<11} first {statistics.median(first):8.2f} [{min(first):.2f}-{max(first):.2f}]"
              f"   again {statistics.median(again):7.3f} [{min(again):.3f}-{max(again):.3f}]")
