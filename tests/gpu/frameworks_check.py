"""One framework under cudapool: a small real workload, then a request past the limit.

usage: frameworks_check.py cupy|numba|jax   (run with LD_PRELOAD=libcudapool.so)
Prints what the shim counted and the framework's own error for the oversized request.
"""
import ctypes
import os
import sys


def shim_counts():
    lib = ctypes.CDLL(None)
    try:
        get = lib.cudapool_get_stats
    except AttributeError:
        return "shim not loaded"
    buf = (ctypes.c_uint64 * 20)()
    buf[0] = 8 * 20  # struct_size: enough for every field
    if get(0, buf) != 0:
        return "shim inactive"
    # struct_size, device/pad, allocated, peak, reserved, peak, cached, live, segments, allocs, frees
    return f"allocs={buf[9]} frees={buf[10]} allocated={buf[2]} peak={buf[3]} limit={buf[16]}"


def too_big(fn):
    try:
        fn()
        return "no error"
    except Exception as e:  # noqa: BLE001 - the class is the point
        return f"{type(e).__module__}.{type(e).__name__}: {str(e).splitlines()[0][:140]}"


which = sys.argv[1]
big = int(float(os.environ.get("BIG_GIB", "2")) * 2**30)
if which == "cupy":
    import cupy

    cupy.cuda.set_allocator(None)  # CuPy's own pool off: every array is a driver allocation
    a = cupy.arange(1 << 22, dtype=cupy.float32)
    b = (a * 2).sum()
    print("cupy", cupy.__version__, "sum", float(b), "|", shim_counts())
    print("cupy oversized:", too_big(lambda: cupy.empty(big, dtype=cupy.uint8)))
elif which == "numba":
    import numpy as np
    from numba import cuda

    d = cuda.to_device(np.arange(1 << 22, dtype=np.float32))
    out = d.copy_to_host()
    del d
    import gc

    gc.collect()
    cuda.current_context().deallocations.clear()
    print("numba ok", float(out[-1]), "|", shim_counts())
    print("numba oversized:", too_big(lambda: cuda.device_array(big, dtype=np.uint8)))
elif which == "jax":
    import jax
    import jax.numpy as jnp

    x = jnp.ones((1024, 1024), dtype=jnp.float32)
    f = jax.jit(lambda m: (m @ m).sum())
    g = jax.grad(lambda m: (m * m).sum())(x)
    print("jax", jax.__version__, float(f(x)), float(g.sum()), "|", shim_counts())
    print("jax oversized:", too_big(lambda: jnp.ones((big // 4,), dtype=jnp.float32).block_until_ready()))
