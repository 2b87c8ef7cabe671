"""Two ranks over NCCL under cudapool (torchrun --nproc_per_node 2): after an all-reduce, each
rank's snapshot in PyTorch's format shows NCCL's buffers (virtual-memory mappings, or counted
allocations when NCCL_CUMEM_ENABLE=0) beside PyTorch's own memory; PyTorch's _memory_viz reads
it. Prints one line per rank: "rank R: segments by origin {...}, nccl-like bytes N, ok".

usage: torchrun --nproc_per_node 2 tests/gpu/nccl_snapshot.py OUT_DIR
"""
import collections
import os
import pickle
import sys

import torch
import torch.distributed as dist
from torch.cuda import _memory_viz

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cbindings", "python"))
import cudapool  # noqa: E402

out = sys.argv[1]
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
x = torch.full((64 << 20,), float(rank + 1), device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
assert x[0].item() == 3.0, x[0].item()
path = os.path.join(out, f"nccl_rank{rank}.pickle")
cudapool.snapshot(path, format="torch")
data = pickle.load(open(path, "rb"))
mine = [s for s in data["segments"] if s["device"] == rank]
by_origin = collections.Counter(s["origin"] for s in mine)
outside = sum(s["total_size"] for s in mine if s["origin"] in ("vmm", "counted", "driver_pool"))
_memory_viz.segsum(data)
ok = outside > 0
print(f"rank {rank}: segments by origin {dict(by_origin)}, memory outside the pool {outside} bytes, {'ok' if ok else 'NO NCCL MEMORY'}", flush=True)
dist.destroy_process_group()
