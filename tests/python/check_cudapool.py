"""The cudapool Python package (cbindings/python/cudapool) against the fake driver (run by tests/preload.rs).

usage: check_cudapool.py loaded SNAPSHOT_PATH | absent
Allocates through ctypes the way CuPy and Numba reach the driver, then checks every function.
"""
import ctypes
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cbindings", "python"))
import cudapool  # noqa: E402

if sys.argv[1] == "absent":
    assert not cudapool.is_loaded()
    try:
        cudapool.memory_allocated()
    except cudapool.CudapoolNotLoaded as e:
        print("absent:", e)
        sys.exit(0)
    sys.exit("no error without cudapool")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_driver  # noqa: E402

cu = fake_driver.driver()
free = cu.cuMemFree_v2


def allocate(size):
    return fake_driver.allocate(cu, size)


print("version", cudapool.version())
sizes = [1 << 20, 3 << 20, 5000]
ptrs = []
for s in sizes:
    r, p = allocate(s)
    assert r == 0, r
    ptrs.append(p)
asked = sum(sizes)
# Under split (the default) each block is the request rounded up to 512 bytes.
held = sum((n + 511) // 512 * 512 for n in sizes)
assert cudapool.memory_allocated() == held, (cudapool.memory_allocated(), held)
assert cudapool.memory_allocated(0) == held
assert cudapool.memory_allocated("cuda:0") == held
assert cudapool.max_memory_allocated() == held
assert cudapool.memory_reserved() >= held
stats = cudapool.memory_stats()
assert stats["allocated_bytes.all.current"] == held
assert stats["requested_bytes"] == stats["requested_bytes.all.current"] == asked, stats
assert stats["peak_requested_bytes"] == stats["requested_bytes.all.peak"] == asked, stats
assert stats["alloc_calls"] == 3 and stats["live_allocations"] == 3


class _OldStats(ctypes.Structure):
    # cudapool_stats as a program built before the requested fields were appended sees it.
    _fields_ = [("struct_size", ctypes.c_size_t), ("device", ctypes.c_int32), ("_pad", ctypes.c_uint32)] + [
        (name, ctypes.c_uint64) for name in cudapool.FIELDS[:16]
    ] + [("after", ctypes.c_uint64)]


old = _OldStats(struct_size=ctypes.sizeof(_OldStats) - 8, after=0xDEADBEEF)
as_new = ctypes.cast(ctypes.pointer(old), ctypes.POINTER(cudapool._Stats))
assert cudapool._lib().cudapool_get_stats(0, as_new) == 0
assert old.struct_size == ctypes.sizeof(_OldStats) - 8, old.struct_size
assert old.after == 0xDEADBEEF, "nothing written past what an older caller sized"
assert old.allocated_bytes == held and old.soft_limit == 0
for p in ptrs:
    assert free(p) == 0
assert cudapool.memory_allocated() == 0
assert cudapool.memory_stats()["requested_bytes"] == 0
assert cudapool.max_memory_allocated() == held
cudapool.reset_peak_memory_stats()
assert cudapool.max_memory_allocated() == 0
assert cudapool.memory_stats()["peak_requested_bytes"] == 0
cached = cudapool.memory_stats()["cached_bytes"]
assert cached > 0 and cudapool.memory_reserved() == cached
released = cudapool.empty_cache()
assert released == cached, (released, cached)
assert cudapool.memory_reserved() == 0
summary = cudapool.memory_summary()
assert "device 0" in summary and "memory status" in summary, summary
assert cudapool.snapshot(sys.argv[2]) == sys.argv[2]
snap = json.load(open(sys.argv[2]))
assert snap["devices"][0]["stats"]["allocated_bytes"] == 0
assert snap["devices"][0]["stats"]["free_calls"] == 3
cudapool.set_memory_limit("8MiB")
assert allocate(9 << 20)[0] == 2, "over the limit set from Python"
cudapool.set_memory_limit(0)
r, p = allocate(9 << 20)
assert r == 0 and free(p) == 0
# Every form the library takes, read by the library's own parser (the fake device: 1 GiB).
cudapool.set_memory_limit("50%", device=0)
assert cudapool.memory_stats(0)["hard_limit"] == 512 << 20, cudapool.memory_stats(0)["hard_limit"]
cudapool.set_memory_limit("0=1.5MiB")
assert cudapool.memory_stats(0)["hard_limit"] == 3 << 19
cudapool.set_memory_limit("1GB", device="cuda:0")
assert cudapool.memory_stats(0)["hard_limit"] == 10**9
cudapool.set_memory_limit(0)
assert cudapool.memory_stats(0)["hard_limit"] == 0
for bad, says in [
    ("lots", "is not a size"),
    ("-1", "negative"),
    ("150%", "more than 0% and at most 100%"),
    ("0=1GiB,0=2GiB", "listed twice"),
    ("7=1GiB", "device 7"),
]:
    try:
        cudapool.set_memory_limit(bad)
        sys.exit(f"{bad!r} accepted")
    except ValueError as e:
        assert says in str(e), (bad, str(e))
assert cudapool.memory_stats(0)["hard_limit"] == 0, "nothing set by a bad value"
# A device the process does not have (the fake has 2): an error, as the header says.
for call in [
    lambda: cudapool.memory_stats(7),
    lambda: cudapool.memory_allocated(7),
    lambda: cudapool.reset_peak_memory_stats(7),
    lambda: cudapool.empty_cache(7),
    lambda: cudapool.set_memory_limit(1 << 30, device=7),
    lambda: cudapool.set_memory_limit("1GiB", device=7),
]:
    try:
        call()
        sys.exit("device 7 accepted")
    except ValueError as e:
        assert "device 7" in str(e), str(e)
# A getter's error names the getter the user called, not the one it is built on.
try:
    cudapool.memory_allocated(5)
    sys.exit("device 5 accepted")
except ValueError as e:
    assert str(e).startswith("memory_allocated: device 5"), str(e)
assert cudapool.memory_stats(1)["allocated_bytes"] == 0, "device 1 is one of the fake's two"
assert "overhead_bytes" in cudapool.memory_stats(0)
try:
    cudapool.snapshot("/nonexistent-dir/x.json")
    sys.exit("unwritable snapshot path accepted")
except OSError:
    pass
print("python: ok")
