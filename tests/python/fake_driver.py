"""The driver as the Python tests reach it: through ctypes, as CuPy and Numba do. Loads
libcuda.so.1 (the fake one, on LD_LIBRARY_PATH) and makes device 0's primary context current.
"""
import ctypes

u64, size_t = ctypes.c_uint64, ctypes.c_size_t


def driver():
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), size_t]
    cu.cuMemFree_v2.argtypes = [u64]
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    return cu


def allocate(cu, size):
    """(result code, address) of cuMemAlloc_v2(size)."""
    p = u64()
    r = cu.cuMemAlloc_v2(ctypes.byref(p), size)
    return r, p.value
