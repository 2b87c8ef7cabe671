"""What growing the pool costs: the first allocation of SIZE in a fresh process (the pool takes
it from the driver), then freed and allocated again (from the cache), per mode. Indicative
(one run per mode).

usage: python3 benches/gpu/growth.py LIB [SIZE_MIB]
"""
import os
import subprocess
import sys

LIB = os.path.abspath(sys.argv[1])
MIB = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
CHILD = r'''
import time, torch
torch.empty(1, device="cuda"); torch.cuda.synchronize()
t = time.perf_counter(); x = torch.empty(MIB << 20, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize(); first = time.perf_counter() - t
del x; torch.cuda.synchronize()
t = time.perf_counter(); x = torch.empty(MIB << 20, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize(); again = time.perf_counter() - t
print(f"first {first * 1e3:.1f} ms, again {again * 1e3:.3f} ms")
'''.replace("MIB", str(MIB))
MODES = [
    ("torch", {}),
    ("torch-exp", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    ("cp", {"LD_PRELOAD": LIB, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}),
    ("cp-classic", {"LD_PRELOAD": LIB, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "CUDAPOOL_SEGMENTS": "classic"}),
    ("cp-pooled", {"LD_PRELOAD": LIB, "PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
]
for name, extra in MODES:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(extra)
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
    print(f"{name}: {p.stdout.strip() or p.stderr.strip().splitlines()[-1]}")
