"""A snapshot in PyTorch's format, read back with Python's pickle and checked field by field
(run by tests/preload.rs under CUDAPOOL_HISTORY and CUDAPOOL_TRACK=2, against the fake driver).

usage: check_torch_snapshot.py SNAPSHOT_PATH
Checks: blocks tile their segments; the active blocks are exactly the live allocations, with the
sizes asked for and the frames of the call; the trace holds every allocation, free and segment
in order, and its sizes add up to what is held.
"""
import ctypes
import os
import pickle
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cbindings", "python"))
import cudapool  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_driver import allocate, driver, size_t, u64  # noqa: E402

cu = driver()
sizes = [1000, 5000, 3 << 20, 1000]
ptrs = []
for s in sizes:
    r, p = allocate(cu, s)
    assert r == 0, r
    ptrs.append(p)
assert cu.cuMemFree_v2(ptrs[1]) == 0
held = {ptrs[i]: sizes[i] for i in (0, 2, 3)}


# Virtual-memory mapped memory (as NCCL makes its buffers): counted, no live allocation.
class Prop(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("handle_types", ctypes.c_int), ("location_type", ctypes.c_int),
                ("location_id", ctypes.c_int), ("win32", ctypes.c_void_p), ("rest", ctypes.c_ubyte * 128)]


VMM = 2 << 20
handle, va = u64(), u64()
assert cu.cuMemCreate(ctypes.byref(handle), size_t(VMM), ctypes.byref(Prop(kind=1, location_type=1)), u64(0)) == 0
assert cu.cuMemAddressReserve(ctypes.byref(va), size_t(VMM), size_t(0), u64(0), u64(0)) == 0
assert cu.cuMemMap(va, size_t(VMM), size_t(0), handle, u64(0)) == 0

path = sys.argv[1]
assert cudapool.snapshot(path, format="torch") == path
data = pickle.load(open(path, "rb"))
assert set(data) >= {"segments", "device_traces", "allocator_settings"}, data.keys()

vmm = [s for s in data["segments"] if s["origin"] == "vmm"]
assert [(s["address"], s["total_size"]) for s in vmm] == [(va.value, VMM)], vmm
active = {}
for seg in [s for s in data["segments"] if s["origin"] != "vmm"]:
    assert seg["device"] == 0 and seg["stream"] == 0
    addr = seg["address"]
    for b in seg["blocks"]:
        assert b["address"] == addr, ("blocks tile the segment", seg)
        assert b["state"] in ("active_allocated", "active_pending_free", "inactive"), b
        addr += b["size"]
        if b["state"] == "active_allocated":
            active[b["address"]] = b
    assert addr == seg["address"] + seg["total_size"], ("blocks cover the segment", seg)
    assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
    assert seg["requested_size"] == sum(b["requested_size"] for b in seg["blocks"] if b["state"] == "active_allocated")
assert set(active) == set(held), (sorted(active), sorted(held))
for p, n in held.items():
    b = active[p]
    assert b["requested_size"] == n and b["size"] >= n, b
    assert b["frames"] and all({"filename", "line", "name"} <= set(f) for f in b["frames"]), b

trace = data["device_traces"][0]
times = [e["time_us"] for e in trace]
assert times == sorted(times), "events in order"
allocs = [e for e in trace if e["action"] == "alloc"]
assert [e["addr"] for e in allocs] == ptrs and [e["size"] for e in allocs] == sizes, allocs
assert all(e["frames"] for e in allocs), "frames under CUDAPOOL_TRACK=2"
order = [(e["action"], e["addr"]) for e in trace]
i_alloc = order.index(("alloc", ptrs[1]))
i_req = order.index(("free_requested", ptrs[1]))
i_done = order.index(("free_completed", ptrs[1]))
assert i_alloc < i_req < i_done, order
# A block lies in memory a segment event brought earlier: a segment allocated, or memory
# mapped into an expandable one.
segs = [e for e in trace if e["action"] in ("segment_alloc", "segment_map")]
for a in allocs:
    inside = [s for s in segs if s["addr"] <= a["addr"] < s["addr"] + s["size"]]
    assert inside and order.index((inside[0]["action"], inside[0]["addr"])) < order.index(("alloc", a["addr"])), a
freed = sum(e["size"] for e in trace if e["action"] == "free_completed")
assert sum(e["size"] for e in allocs) - freed == sum(held.values())
print(f"torch snapshot: ok, {len(data['segments'])} segments, {len(trace)} events")
