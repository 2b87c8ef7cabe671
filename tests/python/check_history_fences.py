"""A free that waits for a fence is recorded `free_completed` only once its fence is done (run by
tests/preload/ under CUDAPOOL_HISTORY, against the fake driver, whose GPU lags).

usage: check_history_fences.py SNAPSHOT_PATH
Work on two streams (one held busy) makes the context use fences; a 3 MiB block freed then is
`free_requested` at once and `free_completed` only after the held work is finished and the
pool has taken the block back.
"""
import ctypes
import os
import pickle
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cbindings", "python"))
import cudapool  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_driver import allocate, driver  # noqa: E402

cu = driver()
cu.fakecu_last_hold.restype = ctypes.c_long
cu.fakecu_finish.argtypes = [ctypes.c_long]
cu.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [ctypes.c_uint, ctypes.c_void_p,
                                                                         ctypes.c_void_p, ctypes.c_void_p]
HOLD, KERNEL = 0x401, 0x1000
a, b = ctypes.c_void_p(), ctypes.c_void_p()
assert cu.cuStreamCreate(ctypes.byref(a), 0) == 0 and cu.cuStreamCreate(ctypes.byref(b), 0) == 0
assert cu.cuLaunchKernel(HOLD, 1, 1, 1, 1, 1, 1, 0, b, None, None) == 0
hold = cu.fakecu_last_hold()
assert cu.cuLaunchKernel(KERNEL, 1, 1, 1, 1, 1, 1, 0, a, None, None) == 0
r, p = allocate(cu, 3 << 20)
assert r == 0, r
assert cu.cuMemFree_v2(p) == 0


def trace(path):
    assert cudapool.snapshot(path, format="torch") == path
    return [(e["action"], e["addr"]) for e in pickle.load(open(path, "rb"))["device_traces"][0]]


path = sys.argv[1]
before = trace(path)
assert ("free_requested", p) in before, before
assert ("free_completed", p) not in before, ("completed while its fence waits", before)
cu.fakecu_finish(hold)
assert cu.cuCtxSynchronize() == 0
# A miss takes the block back from its done fence (it may serve this very request).
r, q = allocate(cu, 3 << 20)
assert r == 0, r
after = trace(path)
assert ("free_completed", p) in after, after
assert after.index(("free_requested", p)) < after.index(("free_completed", p))
print("history fences: ok")
