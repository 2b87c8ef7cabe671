"""cudapool from Python: the memory statistics of this process's cudapool, with torch.cuda's names.

Works in any process that runs under cudapool (``LD_PRELOAD=libcudapool.so`` or
``cudapool run -- python ...``); no build step, only ctypes. ``device`` is a CUDA ordinal as the
program sees it; ``None`` means every device (figures summed). A torch.device or "cuda:N" works
too.

    import cudapool
    x = torch.empty(1 << 20, device="cuda")
    cudapool.memory_allocated()      # bytes the program holds
    cudapool.empty_cache()           # give cached blocks back to the driver
    print(cudapool.memory_summary())

Installed with pip, the package also holds the library itself (``library_path()``), and
``python -m cudapool run -- prog`` runs a program under it.
"""

import ctypes
import os
import re

__all__ = [
    "CudapoolNotLoaded",
    "library_path",
    "is_loaded",
    "version",
    "memory_stats",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "empty_cache",
    "memory_summary",
    "snapshot",
    "set_memory_limit",
    "group_stats",
    "set_oom_handler",
    "sleep",
    "wake",
    "is_asleep",
    "NotInGroup",
    "SleepRefused",
]

FIELDS = [
    "allocated_bytes",
    "peak_allocated_bytes",
    "reserved_bytes",
    "peak_reserved_bytes",
    "cached_bytes",
    "live_allocations",
    "segments",
    "alloc_calls",
    "free_calls",
    "cache_hits",
    "driver_allocs",
    "driver_frees",
    "reclaim_retries",
    "ooms",
    "hard_limit",
    "soft_limit",
    "requested_bytes",
    "peak_requested_bytes",
    "overhead_bytes",
    "asleep_bytes",
    "sleep_state",
    "panics",
]

#: The names of ``memory_stats()["sleep_state"]``'s values.
SLEEP_STATES = ("awake", "falling asleep", "asleep", "waking")


class _Stats(ctypes.Structure):
    # Mirrors cudapool_stats in include/cudapool.h.
    _fields_ = [("struct_size", ctypes.c_size_t), ("device", ctypes.c_int32), ("_pad", ctypes.c_uint32)] + [
        (name, ctypes.c_uint64) for name in FIELDS
    ]


class _GroupStats(ctypes.Structure):
    # Mirrors cudapool_group_stats in include/cudapool.h.
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("device", ctypes.c_int32),
        ("_pad", ctypes.c_uint32),
        ("members", ctypes.c_uint64),
        ("reserved_bytes", ctypes.c_uint64),
        ("limit", ctypes.c_uint64),
        ("process_reserved_bytes", ctypes.c_uint64),
        ("name", ctypes.c_char * 72),
    ]


class CudapoolNotLoaded(RuntimeError):
    """Raised when the process does not run under cudapool."""


class NotInGroup(RuntimeError):
    """Raised by group_stats when the process is in no group (CUDAPOOL_GROUP unset)."""


def _source_tree_builds(name):
    """``name`` in the builds of the source tree this package sits in (``cbindings/python/cudapool``
    -> the tree's ``target/release``, then ``target/debug``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", "..", ".."))
    return [os.path.join(root, "target", profile, name) for profile in ("release", "debug")]


def library_path():
    """The path of ``libcudapool.so`` to preload: ``$CUDAPOOL_LIB`` if set, else the one installed
    in this package (pip), else a build of the source tree this package sits in
    (``target/release``, then ``target/debug``). Raises FileNotFoundError naming every place it
    looked."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = os.environ.get("CUDAPOOL_LIB")
    if env:
        if os.path.isfile(env):
            return os.path.abspath(env)
        raise FileNotFoundError(f"CUDAPOOL_LIB={env} is not a file")
    places = [os.path.join(here, "libcudapool.so")] + _source_tree_builds("libcudapool.so")
    for p in places:
        if os.path.isfile(p):
            return os.path.realpath(p)
    raise FileNotFoundError(
        "libcudapool.so not found; tried " + ", ".join(os.path.normpath(p) for p in places)
        + ". Install cudapool with pip, build the source tree (scripts/demo.sh or cargo build"
        " --release), or set CUDAPOOL_LIB"
    )


_LIB = None


def _lib():
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL(None)
        try:
            lib.cudapool_get_stats
        except AttributeError:
            try:
                how = f"LD_PRELOAD={library_path()}"
            except FileNotFoundError:
                how = "LD_PRELOAD=<the path of libcudapool.so>"
            raise CudapoolNotLoaded(
                f"cudapool is not loaded in this process: start it with {how} python ..., "
                "or `python -m cudapool run -- python ...`"
            ) from None
        lib.cudapool_get_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_Stats)]
        lib.cudapool_get_stats.restype = ctypes.c_int
        lib.cudapool_reclaim.argtypes = [ctypes.c_int]
        lib.cudapool_reclaim.restype = ctypes.c_size_t
        lib.cudapool_reset_peak_stats.argtypes = [ctypes.c_int]
        lib.cudapool_reset_peak_stats.restype = ctypes.c_int
        lib.cudapool_set_memory_limit.argtypes = [ctypes.c_int, ctypes.c_size_t]
        lib.cudapool_set_memory_limit.restype = ctypes.c_int
        lib.cudapool_set_memory_limit_text.argtypes = [
            ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
        ]
        lib.cudapool_set_memory_limit_text.restype = ctypes.c_int
        lib.cudapool_memory_status.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.cudapool_memory_status.restype = ctypes.c_int
        lib.cudapool_snapshot.argtypes = [ctypes.c_char_p]
        lib.cudapool_snapshot.restype = ctypes.c_int
        lib.cudapool_snapshot_torch.argtypes = [ctypes.c_char_p]
        lib.cudapool_snapshot_torch.restype = ctypes.c_int
        lib.cudapool_version.argtypes = []
        lib.cudapool_version.restype = ctypes.c_char_p
        lib.cudapool_get_group_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_GroupStats)]
        lib.cudapool_get_group_stats.restype = ctypes.c_int
        lib.cudapool_set_oom_handler.argtypes = [_OOM_HANDLER_TYPE, ctypes.c_void_p]
        lib.cudapool_set_oom_handler.restype = ctypes.c_int
        for name in ("cudapool_sleep", "cudapool_wake"):
            getattr(lib, name).argtypes = [ctypes.c_int]
            getattr(lib, name).restype = ctypes.c_int
        _LIB = lib
    return _LIB


def _check(code, what, device=None):
    if code == 3:
        raise CudapoolNotLoaded(f"{what}: cudapool is loaded but not active (CUDAPOOL_DISABLE=1, a bad CUDAPOOL_* value, or no driver)")
    if code == 1 and device is not None and device != -1:
        raise ValueError(f"{what}: device {device} is not a device of this process")
    if code == 1:
        raise ValueError(f"{what}: invalid argument")
    if code != 0:
        raise RuntimeError(f"{what} failed with CUDA error {code}")


def _checked_device(device, what):
    """`device` as an ordinal, checked against the devices the process has (-1 always is)."""
    d = _device(device)
    if d != -1:
        s = _Stats(struct_size=ctypes.sizeof(_Stats))
        _check(_lib().cudapool_get_stats(d, ctypes.byref(s)), what, d)
    return d


def _device(device):
    if device is None:
        return -1
    if isinstance(device, int):
        return device
    if not isinstance(device, str) and hasattr(device, "type"):  # torch.device
        return -1 if device.index is None else int(device.index)
    m = re.fullmatch(r"(?:cuda:)?(\d+)", str(device).strip())
    if not m:
        raise ValueError(f"not a CUDA device: {device!r}")
    return int(m.group(1))


def is_loaded():
    """Whether this process runs under cudapool."""
    try:
        _lib()
        return True
    except CudapoolNotLoaded:
        return False


def version():
    """The library's version, e.g. "0.1.0"."""
    return _lib().cudapool_version().decode()


def memory_stats(device=None, _what="memory_stats"):
    """Every counter of `device` (None: all devices summed) as a dict: cudapool's names, and
    torch.cuda.memory_stats' names for the ones they share."""
    s = _Stats(struct_size=ctypes.sizeof(_Stats))
    d = _device(device)
    _check(_lib().cudapool_get_stats(d, ctypes.byref(s)), _what, d)
    out = {name: getattr(s, name) for name in FIELDS}
    out.update(
        {
            "allocated_bytes.all.current": s.allocated_bytes,
            "allocated_bytes.all.peak": s.peak_allocated_bytes,
            "requested_bytes.all.current": s.requested_bytes,
            "requested_bytes.all.peak": s.peak_requested_bytes,
            "reserved_bytes.all.current": s.reserved_bytes,
            "reserved_bytes.all.peak": s.peak_reserved_bytes,
            "active.all.current": s.live_allocations,
            "num_alloc_retries": s.reclaim_retries,
            "num_ooms": s.ooms,
            "num_device_alloc": s.driver_allocs,
            "num_device_free": s.driver_frees,
        }
    )
    return out


def group_stats(device=0):
    """The process's group (CUDAPOOL_GROUP) on one GPU: its name, members, every member's
    reserved bytes together, the group's limit (0: none) and this process's part. Raises
    NotInGroup when the process is in no group."""
    d = _device(device)
    if d < 0:
        raise ValueError("group_stats needs one device")
    g = _GroupStats(struct_size=ctypes.sizeof(_GroupStats))
    code = _lib().cudapool_get_group_stats(d, ctypes.byref(g))
    if code == 801:
        raise NotInGroup("this process is in no group: set CUDAPOOL_GROUP=NAME to join one")
    _check(code, "group_stats", d)
    return {
        "name": g.name.decode(),
        "members": g.members,
        "reserved_bytes": g.reserved_bytes,
        "limit": g.limit,
        "process_reserved_bytes": g.process_reserved_bytes,
    }


_OOM_HANDLER_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p)
_OOM_HANDLER = None  # the C callback kept alive while installed


def set_oom_handler(fn):
    """Calls ``fn(device, bytes)`` when an allocation is about to fail with out-of-memory, after
    cudapool gave its own cache back: on the allocating thread, with no cudapool lock held. It
    may free memory; a true result asks for one more try. An exception it raises counts as no
    retry. ``None`` removes it."""
    global _OOM_HANDLER
    if fn is None:
        _check(_lib().cudapool_set_oom_handler(_OOM_HANDLER_TYPE(), None), "set_oom_handler")
        _OOM_HANDLER = None
        return

    def call(device, nbytes, _data):
        try:
            return 1 if fn(device, nbytes) else 0
        except BaseException:  # never unwind into C
            import traceback

            traceback.print_exc()
            return 0

    cb = _OOM_HANDLER_TYPE(call)
    _check(_lib().cudapool_set_oom_handler(cb, None), "set_oom_handler")
    _OOM_HANDLER = cb


class SleepRefused(RuntimeError):
    """A sleep that did not happen (the process stays awake), or a wake that found no room in
    time (the contents stay on the host); the message says why."""


def sleep(device=-1):
    """Puts this process to sleep on `device` (-1: every device) once its device work has
    drained: live blocks of expandable segments are copied to host memory, cached ones dropped,
    and the device memory given back, every address kept. The next launch, copy or allocation
    wakes it first. Returns when it is asleep; raises SleepRefused when it stays awake."""
    d = _device(device)
    code = _lib().cudapool_sleep(d)
    if code == 600:
        raise SleepRefused("sleep: device work did not drain within 30 s (a graph capture under way?)")
    if code == 2:
        raise SleepRefused("sleep: not enough host memory for the copy")
    _check(code, "sleep", d)


def wake(device=-1):
    """Wakes this process: its memory mapped again at the same addresses and filled back.
    Raises SleepRefused when no room came within CUDAPOOL_WAKE_TIMEOUT."""
    d = _device(device)
    code = _lib().cudapool_wake(d)
    if code == 2:
        raise SleepRefused("wake: no room within CUDAPOOL_WAKE_TIMEOUT; the contents stay on the host")
    _check(code, "wake", d)


def is_asleep(device=None):
    """Whether this process is asleep (or falling asleep, or waking)."""
    return memory_stats(device, "is_asleep")["sleep_state"] != 0


def memory_allocated(device=None):
    """Bytes the program holds now."""
    return memory_stats(device, "memory_allocated")["allocated_bytes"]


def max_memory_allocated(device=None):
    """Peak of memory_allocated since start or the last reset_peak_memory_stats."""
    return memory_stats(device, "max_memory_allocated")["peak_allocated_bytes"]


def memory_reserved(device=None):
    """Bytes held from the driver: allocated plus cached."""
    return memory_stats(device, "memory_reserved")["reserved_bytes"]


def max_memory_reserved(device=None):
    """Peak of memory_reserved."""
    return memory_stats(device, "max_memory_reserved")["peak_reserved_bytes"]


def reset_peak_memory_stats(device=None):
    """Sets both peaks to the current values."""
    d = _device(device)
    _check(_lib().cudapool_reset_peak_stats(d), "reset_peak_memory_stats", d)


def empty_cache(device=None):
    """Gives every cached block back to the driver (after the device work that may still touch
    it); returns the bytes released."""
    return _lib().cudapool_reclaim(_checked_device(device, "empty_cache"))


def memory_summary(device=None, abbreviated=False):
    """The human-readable status of every device (`device` and `abbreviated` are accepted for
    torch.cuda compatibility)."""
    lib = _lib()
    need = lib.cudapool_memory_status(None, 0)
    if need < 0:
        raise CudapoolNotLoaded("memory_summary: cudapool is loaded but not active")
    buf = ctypes.create_string_buffer(need + 1)
    lib.cudapool_memory_status(buf, need + 1)
    return buf.value.decode()


def snapshot(path, format="json"):
    """Writes a snapshot to `path`: ``format="json"``, cudapool's own (devices, segments, blocks,
    live allocations); ``format="torch"``, PyTorch's snapshot pickle (segments with their blocks,
    and the ``CUDAPOOL_HISTORY`` events as ``device_traces``) for pytorch.org/memory_viz and
    ``python -m torch.cuda._memory_viz``."""
    if format == "json":
        code = _lib().cudapool_snapshot(str(path).encode())
    elif format == "torch":
        code = _lib().cudapool_snapshot_torch(str(path).encode())
    else:
        raise ValueError(f"snapshot format {format!r}: json or torch")
    if code == 304:
        raise OSError(f"cudapool could not write {path}")
    _check(code, "snapshot")
    return path


def set_memory_limit(limit, device=None):
    """Sets the hard limit of `device` (None: every device used so far); 0 removes it. `limit`
    is bytes, or any text CUDAPOOL_MEMORY_LIMIT takes, read by the library's own parser: a SIZE
    ("8GiB", "1.5G"), a percentage of the device's memory ("50%"), or a per-device list
    ("0=8GiB,1=50%", with device None). Raises ValueError, with the library's words, for a bad
    value or a device the process does not have."""
    d = _device(device)
    if isinstance(limit, bool) or not isinstance(limit, (int, str)):
        raise ValueError(f"a memory limit is bytes or a SIZE, not {limit!r}")
    if isinstance(limit, int):
        if limit < 0:
            raise ValueError("a memory limit cannot be negative")
        _check(_lib().cudapool_set_memory_limit(d, limit), "set_memory_limit", d)
        return
    why = ctypes.create_string_buffer(512)
    code = _lib().cudapool_set_memory_limit_text(d, limit.encode(), why, len(why))
    if code == 1:
        raise ValueError(f"set_memory_limit: {why.value.decode()}")
    _check(code, "set_memory_limit", d)
