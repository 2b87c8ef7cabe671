"""cudapool.sleep(), wake() and is_asleep() against the fake driver (run by tests/preload):
a block's contents survive a sleep and a wake by the API, and a sleep and a wake by a copy;
memory_stats() shows the asleep bytes and the state; a bad device is a ValueError.
Prints "sleep: ok".
"""
import ctypes
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "cbindings", "python"))
sys.path.insert(0, here)
import cudapool  # noqa: E402
import fake_driver  # noqa: E402

cu = fake_driver.driver()
cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
size = 8 << 20
r, p = fake_driver.allocate(cu, size)
assert r == 0, r
data = bytes((i * 7 + 3) % 251 for i in range(size))
assert cu.cuMemcpyHtoD_v2(p, data, size) == 0


def read():
    back = ctypes.create_string_buffer(size)
    assert cu.cuMemcpyDtoH_v2(back, p, size) == 0  # a copy: it wakes the process first
    return back.raw


assert cudapool.SLEEP_STATES[cudapool.memory_stats()["sleep_state"]] == "awake"
cudapool.sleep()
s = cudapool.memory_stats()
assert cudapool.is_asleep() and cudapool.SLEEP_STATES[s["sleep_state"]] == "asleep", s
assert s["asleep_bytes"] == size, s
cudapool.wake()
assert not cudapool.is_asleep() and cudapool.memory_stats()["asleep_bytes"] == 0
assert read() == data, "woken by the API"
cudapool.sleep(0)
assert cudapool.is_asleep(0)
assert read() == data, "woken by a copy"
assert not cudapool.is_asleep()
for bad in (7, "cuda:9"):
    try:
        cudapool.sleep(bad)
        sys.exit(f"sleep({bad!r}) was taken")
    except ValueError:
        pass
assert cu.cuMemFree_v2(p) == 0
print("sleep: ok")
