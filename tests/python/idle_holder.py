"""Holds three allocations (1000, 3 MiB and 12345 bytes) and then makes no allocator call for
SECONDS: the process `cudapool snapshot PID` must answer anyway (run by tests/preload.rs).

usage: idle_holder.py SECONDS
"""
import ctypes, sys, time
cu = ctypes.CDLL("libcuda.so.1")
u64 = ctypes.c_uint64
cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), ctypes.c_size_t]
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
cu.cuInit(0); cu.cuDeviceGet(ctypes.byref(dev), 0); cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev); cu.cuCtxSetCurrent(ctx)
ptrs = []
for s in (1000, 3 << 20, 12345):
    p = u64(); assert cu.cuMemAlloc_v2(ctypes.byref(p), s) == 0; ptrs.append(p.value)
print("ready", flush=True)
time.sleep(float(sys.argv[1]))
