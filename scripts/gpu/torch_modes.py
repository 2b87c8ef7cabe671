"""What each way of running PyTorch under cudapool keeps and loses (issue 35): for each mode,
in a fresh process, the exception an allocation past the limit raises, torch.cuda's own
figures, whether torch.cuda.memory._snapshot() works, and the cost of torch.empty + del at
1 MiB (median of 7 rounds of 20,000, one run: indicative). Prints a Markdown table.

    python3 scripts/gpu/torch_modes.py [LIB]      (LIB: target/release/libcudapool.so)
"""
import json
import os
import subprocess
import sys

LIB = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/libcudapool.so")
CHILD = r'''
import json, time, statistics, torch
out = {}
x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
out["memory_allocated_MiB"] = torch.cuda.memory_allocated() >> 20
try:
    torch.cuda.memory._record_memory_history(max_entries=1000)
    s = torch.cuda.memory._snapshot()
    out["snapshot"] = "yes (%d segments)" % len(s["segments"])
except Exception as e:
    out["snapshot"] = "no: " + type(e).__name__
del x
rounds = []
for _ in range(7):
    t = time.perf_counter()
    for _ in range(20000):
        y = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        del y
    rounds.append((time.perf_counter() - t) / 20000 * 1e9)
out["ns_per_pair_1MiB"] = round(statistics.median(rounds))
try:
    z = torch.empty(OOM_BYTES, dtype=torch.uint8, device="cuda")
    out["oom"] = "no error"
except Exception as e:
    out["oom"] = type(e).__module__ + "." + type(e).__name__
print("RESULT " + json.dumps(out))
'''
MODES = [
    ("PyTorch's own allocator, no cudapool", {}, False),
    ("PyTorch's cache on, cudapool preloaded (limit and stats only)", {}, True),
    ("PyTorch's cache off (PYTORCH_NO_CUDA_MEMORY_CACHING=1), cudapool serves every tensor", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, True),
    ("PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, cudapool serves every tensor", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, True),
    ("PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, no cudapool", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, False),
]
print("| mode | allocation past the limit raises | torch.cuda.memory_allocated (256 MiB held) | torch.cuda.memory._snapshot() | torch.empty+del, 1 MiB, ns |")
print("| --- | --- | --- | --- | --- |")
for name, env, shim in MODES:
    e = dict(os.environ, **env)
    e.pop("LD_PRELOAD", None)
    if shim:
        e["LD_PRELOAD"] = LIB
        e["CUDAPOOL_MEMORY_LIMIT"] = "2GiB"
        code = CHILD.replace("OOM_BYTES", str(3 << 30))
    else:
        code = CHILD.replace("OOM_BYTES", str(400 << 30))
    p = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=300)
    line = next((l for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
    if not line:
        print(f"| {name} | failed: {p.stderr.strip().splitlines()[-1:]} | | | |")
        continue
    r = json.loads(line[7:])
    print(f"| {name} | `{r['oom']}` | {r['memory_allocated_MiB']} MiB | {r['snapshot']} | {r['ns_per_pair_1MiB']} |")
