"""PyTorch with its caching allocator off, under cudapool: what the shim saw, and the limit."""
import ctypes
import os
import sys

import torch


class Stats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("device", ctypes.c_int32), ("pad", ctypes.c_uint32)] + [
        (n, ctypes.c_uint64)
        for n in "allocated peak_allocated reserved peak_reserved cached live segments alloc_calls "
        "free_calls cache_hits driver_allocs driver_frees retries ooms hard_limit soft_limit".split()
    ]


def shim_stats():
    lib = ctypes.CDLL(None)
    try:
        get = lib.cudapool_get_stats
    except AttributeError:
        return None
    s = Stats(struct_size=ctypes.sizeof(Stats))
    r = get(0, ctypes.byref(s))
    return {k: getattr(s, k) for k, _ in Stats._fields_[3:]} if r == 0 else {"error": r}


print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
print("PYTORCH_NO_CUDA_MEMORY_CACHING =", os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING"))
free, total = torch.cuda.mem_get_info()
print(f"torch.cuda.mem_get_info(): free {free / 2**20:.1f} MiB, total {total / 2**20:.1f} MiB")

# A few training steps of a small MLP: many allocations of many sizes.
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(20):
    x = torch.randn(256, 1024, device="cuda")
    y = torch.randint(0, 10, (256,), device="cuda")
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.cuda.synchronize()
print(f"20 training steps, final loss {loss.item():.4f}")
print("shim after training:", shim_stats())

a = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
a.fill_(1)
torch.cuda.synchronize()
print("512 MiB tensor: ok, a[-1] =", a[-1].item())
print("shim with 512 MiB held:", shim_stats())
big = int(float(os.environ.get("TORCH_CHECK_BIG_GIB", "2")) * 2**30)
try:
    b = torch.empty(big, dtype=torch.uint8, device="cuda")
    print(f"{big / 2**30:.0f} GiB tensor: allocated (no error)")
    del b
except Exception as e:  # noqa: BLE001 - the class is what we want to see
    print(f"{big / 2**30:.0f} GiB tensor: {type(e).__module__}.{type(e).__name__}:", str(e).splitlines()[0][:160])
del a
print("shim at the end:", shim_stats())
sys.stdout.flush()
