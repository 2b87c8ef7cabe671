"""PyTorch with caching off under cudapool: the Python module's figures against the tensors
held, and empty_cache() seen from outside by nvidia-smi."""
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cbindings", "python"))
import cudapool  # noqa: E402


def smi_used_mib():
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True,
    ).stdout
    for line in out.splitlines():
        pid, used = [x.strip() for x in line.split(",")]
        if int(pid) == os.getpid():
            return int(used)
    return None


torch.cuda.init()
print("cudapool", cudapool.version(), "pool", os.environ.get("CUDAPOOL_POOL", "split (default)"))
base = cudapool.memory_allocated()
tensors = [torch.empty(n, dtype=torch.float32, device="cuda") for n in (1 << 20, 3 << 20, 12345, 7 << 20)]
held = sum(t.numel() * t.element_size() for t in tensors)
print(f"tensors hold {held} bytes; cudapool.memory_allocated() - baseline = {cudapool.memory_allocated() - base}")
print("agree:", cudapool.memory_allocated() - base == held)
print("max_memory_allocated:", cudapool.max_memory_allocated())
big = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(8)]  # 2 GiB
torch.cuda.synchronize()
print(f"with 2 GiB more: nvidia-smi {smi_used_mib()} MiB, reserved {cudapool.memory_reserved() >> 20} MiB")
del big, tensors
torch.cuda.synchronize()
print(f"after del: allocated {cudapool.memory_allocated() >> 20} MiB, cached {cudapool.memory_stats()['cached_bytes'] >> 20} MiB, nvidia-smi {smi_used_mib()} MiB")
released = cudapool.empty_cache()
print(f"empty_cache() released {released >> 20} MiB; nvidia-smi now {smi_used_mib()} MiB, reserved {cudapool.memory_reserved() >> 20} MiB")
print(cudapool.memory_summary())
