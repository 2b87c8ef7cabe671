"""An NCCL all-reduce captured in a CUDA graph on two GPUs (torchrun --nproc_per_node 2), as
serving engines capture their tensor-parallel steps: each rank captures a step of a matmul
and an all-reduce into a graph with PyTorch's cache on, replays it 20 times with new inputs
and checks every result against eager. Prints one line per rank: "rank R: N of 20 replays
right, ok" (or the error).

usage: torchrun --nproc_per_node 2 tests/gpu/capture/nccl_capture.py
"""
import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
torch.manual_seed(rank)
w = torch.randn(1024, 1024, device="cuda")
x = torch.randn(64, 1024, device="cuda")


def step(inp):
    y = inp @ w
    dist.all_reduce(y)
    return y


s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        step(x)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    out = step(x)
right = 0
for i in range(20):
    x.copy_(torch.randn_like(x))
    g.replay()
    want = step(x.clone())
    torch.cuda.synchronize()
    right += bool(torch.allclose(out, want, rtol=1e-4, atol=1e-3))
print(f"rank {rank}: {right} of 20 replays right{', ok' if right == 20 else ''}", flush=True)
dist.destroy_process_group()
