"""Where a training step's time goes, host or device: one job of benches/gpu/models.py under
PyTorch's profiler (CUPTI, in-process: no injection library, so cudapool runs as it does
without a tool), after a warm-up. Prints one JSON line: the steps' wall time, the time the GPU
was busy (the union of kernels, copies and sets), the calls and host time of cudaMalloc and
cudaFree (with PyTorch's cache off, each is one of cudapool's allocations or frees, hooks and
pool included), and the same figures a step.

    python3 benches/gpu/step_profile.py JOB [--warmup 20] [--steps 10]

Run it once per build, each in a process of its own, for instance with PyTorch's cache off and
cudapool preloaded:

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=target/release/libcudapool.so \\
        python3 benches/gpu/step_profile.py bert
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def union(intervals):
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("job")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    import torch
    from models import build

    step = build(a.job)
    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    device, calls = [], {}
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, name, dur = e.get("cat", ""), e.get("name", ""), float(e.get("dur", 0))
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            device.append((float(e["ts"]), float(e["ts"]) + dur))
        elif cat == "cuda_runtime" and name in ("cudaMalloc", "cudaFree"):
            n, t = calls.get(name, (0, 0.0))
            calls[name] = (n + 1, t + dur)
    busy_us = union(device)
    n = a.steps
    out = {
        "job": a.job,
        "preload": os.path.basename(os.environ.get("LD_PRELOAD", "")) or None,
        "steps": n,
        "wall_ms_per_step": wall * 1e3 / n,
        "gpu_busy_ms_per_step": busy_us / 1e3 / n,
        "gpu_idle_ms_per_step": wall * 1e3 / n - busy_us / 1e3 / n,
    }
    for name, (count, us) in sorted(calls.items()):
        out[f"{name}_per_step"] = count / n
        out[f"{name}_us_each"] = us / count
        out[f"{name}_ms_per_step"] = us / 1e3 / n
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
