"""What each way of running PyTorch under cudapool keeps (issue 45): one row per mode, one
column per thing a PyTorch user relies on, each cell checked in a fresh process on the GPU,
never read from docs. Prints a Markdown table and, with --json, the raw results.

    python3 tests/gpu/torch_modes.py [LIB] [--json FILE]

Modes: PyTorch alone (the reference); PyTorch's cache on with cudapool preloaded (limit and
stats only); the pooled mode (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync: cudapool
serves every tensor through the stream-ordered API); PyTorch's cache off
(PYTORCH_NO_CUDA_MEMORY_CACHING=1: cudapool serves every tensor).

Columns:
  oom       the exception an allocation past the limit raises (cudapool's 2 GiB limit; for
            PyTorch alone, more than the GPU has)
  stats     torch.cuda.memory_allocated/reserved/max_* agree with cudapool.memory_stats()
            within 2 MiB while 256 MiB is held and after it is freed (PyTorch alone: they
            read what is held)
  empty     empty_cache gives the cache back (reserved falls) and reset_peak_memory_stats
            brings max_memory_allocated down to what is held
  snapshot  torch.cuda.memory._snapshot() works (what memory_viz reads)
  graphs    a CUDA graph captured with torch.cuda.graph replays with the right result
  compile   torch.compile(mode="reduce-overhead") runs and gives the right result
  ipc       a CUDA tensor sent to a child through torch.multiprocessing reads right there
  mempool   torch.cuda.MemPool with use_mem_pool allocates
  lend      two processes of one cudapool group under a 4 GiB group limit, which counts each
            member's context (about 0.5 GiB on an H100) and the driver's own memory: one frees
            2 GiB it held, the other then gets 2 GiB (the idle cache lent back; without it the
            two need about 5.6 GiB)
"""
import json
import os
import subprocess
import sys

LIB = os.path.abspath(next((a for a in sys.argv[1:] if a.endswith(".so")), "target/release/libcudapool.so"))
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MIB = 1 << 20

CHILD = r'''
import json, os, sys, traceback
sys.path.insert(0, os.path.join(ROOT, "cbindings", "python"))
import torch, cudapool
out = {}
def check(name, fn):
    try:
        out[name] = fn()
    except BaseException as e:
        out[name] = "no: " + type(e).__name__ + ": " + str(e).splitlines()[0][:120]
MIB = 1 << 20
loaded = cudapool.is_loaded()

def figures():
    t = dict(allocated=torch.cuda.memory_allocated(), reserved=torch.cuda.memory_reserved(),
             max_allocated=torch.cuda.max_memory_allocated(), max_reserved=torch.cuda.max_memory_reserved())
    if not loaded:
        return t, None
    s = cudapool.memory_stats(0)
    return t, dict(allocated=s["allocated_bytes"], reserved=s["reserved_bytes"],
                   max_allocated=s["peak_allocated_bytes"], max_reserved=s["peak_reserved_bytes"])

def stats():
    x = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    held = figures()
    del x
    torch.cuda.synchronize()
    freed = figures()
    def agree(t, c, key):
        return abs(t[key] - c[key]) <= 2 * MIB
    if not loaded or OWN_CACHE:
        ok = held[0]["allocated"] >= 256 * MIB and freed[0]["allocated"] < held[0]["allocated"]
        return ("yes" if ok else "no") + f" (PyTorch's own: allocated {held[0]['allocated'] // MIB} MiB while 256 held)"
    bad = [f"{w}:{k} torch {t[k] // MIB} vs cudapool {c[k] // MIB} MiB"
           for w, (t, c) in (("held", held), ("freed", freed)) for k in t if not agree(t, c, k)]
    return "yes (within 2 MiB)" if not bad else "no: " + "; ".join(bad)

def empty():
    x = torch.empty(512 * MIB, dtype=torch.uint8, device="cuda")
    del x
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    peak = torch.cuda.max_memory_allocated()
    held = torch.cuda.memory_allocated()
    ok = after + 256 * MIB <= before and peak <= held + 2 * MIB
    return ("yes" if ok else "no") + f" (reserved {before // MIB} -> {after // MIB} MiB; peak after reset {peak // MIB} MiB)"

def snapshot():
    torch.cuda.memory._record_memory_history(max_entries=1000)
    y = torch.empty(MIB, device="cuda")
    s = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    return "yes (%d segments)" % len(s["segments"])

def graphs():
    static = torch.randn(1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            out = (static * 2).sum()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = (static * 2 + 1).sum()
    static.copy_(torch.ones(1024, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    return "yes" if abs(out.item() - 3072.0) < 1e-3 else f"no: {out.item()}"

def compiled():
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda()
    f = torch.compile(m, mode="reduce-overhead")
    x = torch.randn(16, 64, device="cuda")
    for _ in range(4):
        y = f(x)
    ok = torch.allclose(y, m(x), atol=1e-4)
    return "yes" if ok else "no: wrong result"

def mempool():
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        z = torch.ones(4 * MIB, device="cuda")
    return "yes" if float(z.sum()) == 4 * MIB else "no"

def oom():
    try:
        torch.empty(OOM_BYTES, dtype=torch.uint8, device="cuda")
        return "no error"
    except Exception as e:
        return type(e).__module__ + "." + type(e).__name__

if __name__ == "__main__":
    for name, fn in [("stats", stats), ("empty", empty), ("snapshot", snapshot), ("graphs", graphs),
                     ("mempool", mempool), ("compile", compiled), ("oom", oom)]:
        if name in CHECKS:
            check(name, fn)
    print("RESULT " + json.dumps(out), flush=True)
'''

IPC = r'''
import sys, torch, torch.multiprocessing as mp

def child(q, r):
    t = q.get(timeout=60)
    r.put(float(t.sum()))

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(q, r), daemon=True)
    p.start()
    t = torch.full((1 << 20,), 7.0, device="cuda")
    try:
        # The parent shares the tensor when it is pickled: an allocator that cannot share it
        # raises here (put() would only lose the error in its feeder thread).
        from multiprocessing.reduction import ForkingPickler
        ForkingPickler.dumps(t)
        q.put(t)
        got = r.get(timeout=60)
        print("RESULT " + ("yes" if got == 7.0 * (1 << 20) else f"no: {got}"))
    except Exception as e:
        print("RESULT no: " + type(e).__name__ + ": " + str(e).splitlines()[0][:100])
'''

LEND = r'''
import os, sys, time, torch
MIB = 1 << 20
role, flag = sys.argv[1], sys.argv[2]
if role == "lender":
    x = torch.empty(2048 * MIB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    del x
    torch.cuda.synchronize()
    open(flag, "w").close()
    time.sleep(20)
else:
    while not os.path.exists(flag):
        time.sleep(0.05)
    try:
        y = torch.empty(2048 * MIB, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        print("RESULT yes")
    except Exception as e:
        print("RESULT no: " + type(e).__name__)
'''

MODES = [
    ("PyTorch alone (no cudapool)", {}, False),
    ("cache on: PyTorch's own cache, cudapool limits and counts", {}, True),
    ("pooled: `PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync`", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, True),
    ("cache off: `PYTORCH_NO_CUDA_MEMORY_CACHING=1`", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, True),
]
COLUMNS = ["oom", "stats", "empty", "snapshot", "graphs", "compile", "ipc", "mempool", "lend"]


def env_for(extra, shim):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("CUDAPOOL_", "PYTORCH_"))}
    e.pop("LD_PRELOAD", None)
    e.update(extra)
    if shim:
        e["LD_PRELOAD"] = LIB
    return e


def run_checks(extra, shim, checks):
    e = env_for(extra, shim)
    if shim:
        e["CUDAPOOL_MEMORY_LIMIT"] = "2GiB"
    code = CHILD.replace("OWN_CACHE", repr(shim and not extra)).replace("OOM_BYTES", str(3 << 30 if shim else 400 << 30)) \
        .replace("CHECKS", repr(checks)).replace("ROOT", repr(ROOT))
    path = f"/tmp/torch_modes_child_{os.getpid()}.py"
    with open(path, "w") as f:
        f.write(code)
    p = subprocess.run([sys.executable, path], env=e, capture_output=True, text=True, timeout=540)
    line = next((l for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
    if not line:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {c: f"failed: {tail[:100]}" for c in checks}
    return json.loads(line[7:])


def ipc(extra, shim):
    path = f"/tmp/torch_modes_ipc_{os.getpid()}.py"
    with open(path, "w") as f:
        f.write(IPC)
    try:
        p = subprocess.run([sys.executable, path], env=env_for(extra, shim), capture_output=True, text=True, timeout=150)
    except subprocess.TimeoutExpired:
        return "no: hung"
    line = next((l for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
    return line[7:] if line else "failed: " + (p.stderr.strip().splitlines() or ["?"])[-1][:100]


def lend(extra, shim):
    if not shim:
        return "n/a (no group)"
    e = env_for(extra, shim)
    e.update(CUDAPOOL_GROUP=f"modes{os.getpid()}", CUDAPOOL_GROUP_LIMIT="4GiB")
    flag = f"/tmp/torch_modes_flag_{os.getpid()}"
    if os.path.exists(flag):
        os.remove(flag)
    a = subprocess.Popen([sys.executable, "-c", LEND, "lender", flag], env=e, stdout=subprocess.PIPE, text=True)
    b = subprocess.run([sys.executable, "-c", LEND, "borrower", flag], env=e, capture_output=True, text=True, timeout=120)
    a.kill()
    a.wait()
    line = next((l for l in b.stdout.splitlines() if l.startswith("RESULT ")), "RESULT failed: " + b.stderr[-100:])
    return line[7:]


def main():
    results = {}
    for name, extra, shim in MODES:
        r = run_checks(extra, shim, ["stats", "empty", "snapshot", "graphs", "mempool", "compile", "oom"])
        r["ipc"] = ipc(extra, shim)
        r["lend"] = lend(extra, shim)
        results[name] = r
        print(f"{name}: {json.dumps(r)}", file=sys.stderr, flush=True)
    print("| mode | " + " | ".join(COLUMNS) + " |")
    print("| --- |" + " --- |" * len(COLUMNS))
    for name, r in results.items():
        print(f"| {name} | " + " | ".join(str(r.get(c, "")).replace("|", "/") for c in COLUMNS) + " |")
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
