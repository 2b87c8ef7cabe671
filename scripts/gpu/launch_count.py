"""Under scripts/gpu/worktrace.so: kernel launches the tracer saw in one training step against
the kernels PyTorch's profiler (CUPTI) saw in the same step. Equal counts mean every launch went
through an entry point the tracer (and cudapool) can watch.

usage: LD_PRELOAD=worktrace.so python3 launch_count.py gpt|cnn
"""
import ctypes
import os
import subprocess
import sys

import torch
from torch.profiler import ProfilerActivity, profile

here = os.path.dirname(os.path.abspath(__file__))
which = sys.argv[1]
argv = [os.path.join(here, "train_mem.py"), which, "--steps", "1", "--warmup", "2"]
lib = ctypes.CDLL(None)
lib.worktrace_launches.restype = ctypes.c_long
# Run train_mem.py's definitions and warm-up in this process, then profile one more step.
sys.argv = argv
g = {"__name__": "train_mem", "__file__": argv[0]}
exec(compile(open(argv[0]).read(), argv[0], "exec"), g)
torch.cuda.synchronize()
before = lib.worktrace_launches()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    g["step"]()
    torch.cuda.synchronize()
seen = lib.worktrace_launches() - before
kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
names = [e.name for e in kernels]
k = [n for n in names if not n.startswith(("Memcpy", "Memset"))]
print(f"launch_count {which}: tracer saw {seen} launches, profiler saw {len(k)} kernels "
      f"({len(names) - len(k)} memcpy/memset)")
