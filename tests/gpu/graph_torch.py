"""PyTorch's CUDA graphs with the cudaMallocAsync backend: the captured allocations become the
graph's memory nodes. Captures a step that makes 1 GiB of temporaries, replays it 5 times.
Exit 0 if it ran, 3 if the replay (or capture) ran out of memory, 1 otherwise."""
import os

import torch

x = torch.ones(1 << 20, device="cuda")
s = torch.cuda.Stream()
g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            y = (x.repeat(256) * 2).sum()  # 1 GiB of temporaries, freed inside the graph
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    print("replayed, y =", y.item(), "free/total MiB:", [v >> 20 for v in torch.cuda.mem_get_info()])
except RuntimeError as e:  # torch.OutOfMemoryError is one too
    print(type(e).__name__ + ":", str(e).splitlines()[0], flush=True)
    # A graph that never ran cannot free its output: PyTorch's free of it at exit gets the
    # driver's CUDA_ERROR_INVALID_VALUE and aborts. Leave without that free.
    os._exit(3 if "out of memory" in str(e) else 1)
