"""Sleep and wake with PyTorch: tensors (large, and small), a matmul's result before the sleep
and after the wake (the wake is the matmul's own launch), the process's GPU memory by nvidia-smi
awake and asleep, and a CUDA graph captured before the sleep replayed after it. Run under
cudapool in one PyTorch allocator mode (the caller sets PYTORCH_* as it likes):

    python3 sleep_torch.py MODE_NAME

Prints "row MODE used_awake_mib= used_asleep_mib= asleep_mib= same= graph= is_asleep=" and
exits 0 when the results are bit for bit the same.
"""
import os
import subprocess
import sys

import torch

import cudapool


def used_mib():
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True).stdout
    for line in out.splitlines():
        pid, used = [v.strip() for v in line.split(",")]
        if int(pid) == os.getpid():
            return int(used)
    return -1


mode = sys.argv[1] if len(sys.argv) > 1 else "default"
torch.manual_seed(0)
x = torch.randn(8192, 8192, device="cuda")  # 256 MiB each
w = torch.randn(8192, 8192, device="cuda")
small = [torch.randn(100 + i, device="cuda") for i in range(50)]
ref = (x @ w).cpu()
ref_small = [s.sum().item() for s in small]
# A graph captured before the sleep.
static_in = torch.randn(1024, 1024, device="cuda")
static_out = torch.empty_like(static_in)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    static_out.copy_(static_in * 2)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    static_out.copy_(static_in * 2)
torch.cuda.synchronize()
awake = used_mib()
cudapool.sleep()
asleep = used_mib()
asleep_bytes = cudapool.memory_stats()["asleep_bytes"]
was_asleep = cudapool.is_asleep()
got = (x @ w).cpu()  # the launch wakes it
same = torch.equal(got, ref) and [s.sum().item() for s in small] == ref_small
static_in.fill_(3.0)
g.replay()
torch.cuda.synchronize()
graph_ok = bool((static_out == 6.0).all().item())
print(f"row {mode} used_awake_mib={awake} used_asleep_mib={asleep} "
      f"asleep_mib={asleep_bytes >> 20} same={int(same)} graph={int(graph_ok)} "
      f"is_asleep={int(was_asleep)} awake_after={int(not cudapool.is_asleep())}")
sys.exit(0 if same and graph_ok and was_asleep and not cudapool.is_asleep() else 1)
