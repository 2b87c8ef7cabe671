"""torch.empty + del from Python: ns per pair by size (PyTorch's caching allocator when it is
on; cudaMalloc/cudaFree, under cudapool or not, when PYTORCH_NO_CUDA_MEMORY_CACHING=1)."""
import statistics
import time

import torch

torch.cuda.init()
for size in [512, 4096, 65536, 1 << 20, 16 << 20, 256 << 20]:
    for _ in range(50):
        del_me = torch.empty(size, dtype=torch.uint8, device="cuda")
        del del_me
    runs = []
    for _ in range(5):
        n = 2000
        t = time.perf_counter_ns()
        for _ in range(n):
            x = torch.empty(size, dtype=torch.uint8, device="cuda")
            del x
        runs.append((time.perf_counter_ns() - t) / n)
    print(f"size={size} ns={statistics.median(runs):.1f}")
