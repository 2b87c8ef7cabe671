"""CUDA graph capture under cudapool, as PyTorch programs and serving engines do it: each case in
a fresh process, in each PyTorch mode, beside PyTorch alone. A case that passes alone must pass
under cudapool, in the same mode; where PyTorch itself refuses a case in a mode, its own
message is printed (docs/frameworks.md quotes it) and the row says so.

    python3 tests/gpu/capture/capture_check.py LIB WORKDIR [CASE...]

Cases:
  capture      20 captures, each of a step whose allocations miss the cache (new sizes), each
               replayed and checked against eager
  shared_pool  one graph per batch size captured into one shared pool
               (torch.cuda.graph(g, pool=torch.cuda.graph_pool_handle())), replayed, checked
  compile      torch.compile(mode="reduce-overhead") over three batch sizes, checked
  threads      one thread captures (thread-local mode) while another allocates and frees
  vmm_pool     a cuMemCreate/cuMemMap allocator behind torch.cuda.MemPool (vLLM's sleep mode,
               SGLang's memory saver) under a 2 GiB limit: counted, refused past the limit,
               given back when released (cudapool only)
  sizing       an engine's sizing: after a profile run, 90 % of the smaller of the free memory
               cuMemGetInfo and NVML report, taken as one cache; the process stays within its
               8 GiB limit (cudapool only)
Prints "PASS | what | detail" / "FAIL | what | detail" rows and "capture check: N passed, M failed".
"""
import concurrent.futures
import os
import re
import subprocess
import sys

LIB = os.path.abspath(sys.argv[1])
WORK = sys.argv[2]
ONLY = sys.argv[3:]
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
os.makedirs(WORK, exist_ok=True)

PRELUDE = r'''
import os, sys, threading
sys.path.insert(0, os.path.join(ROOT, "cbindings", "python"))
import torch
torch.manual_seed(0)
dev = torch.device("cuda")
def net(width):
    return torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.GELU(), torch.nn.Linear(width, 256)).to(dev)
def captured(m, x, warm=2, **graph):
    # PyTorch's recipe: warm up on a side stream, then capture; the graph and its output.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warm):
            m(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, **graph):
        y = m(x)
    return g, y
'''

CASES = {}

CASES["capture"] = r'''
ok = 0
for i in range(20):
    m = net(512 + 64 * i)  # a new size each time: the capture's allocations miss the cache
    x = torch.randn(32 + i, 256, device=dev)
    g, y = captured(m, x)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    ok += bool(torch.allclose(y, m(x), atol=1e-5))
print(f"result {ok} of 20 graphs replayed right")
assert ok == 20
'''

CASES["shared_pool"] = r'''
m = net(1024)
pool = torch.cuda.graph_pool_handle()
graphs = {}
for bs in (64, 32, 16, 8, 4, 2, 1):
    x = torch.randn(bs, 256, device=dev)
    g, y = captured(m, x, pool=pool)
    graphs[bs] = (g, x, y)
ok = 0
for r in range(50):
    for bs, (g, x, y) in graphs.items():
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        ok += bool(torch.allclose(y, m(x), atol=1e-5))
print(f"result {ok} of {50 * len(graphs)} replays right ({len(graphs)} graphs, one pool)")
assert ok == 50 * len(graphs)
'''

CASES["compile"] = r'''
m = net(1024)
f = torch.compile(m, mode="reduce-overhead")
ok = n = 0
for it in range(6):
    for bs in (8, 16, 32):
        x = torch.randn(bs, 256, device=dev)
        with torch.no_grad():
            y = f(x).clone()
            ok += bool(torch.allclose(y, m(x), atol=1e-4))
        n += 1
print(f"result {ok} of {n} compiled calls right")
assert ok == n
'''

CASES["threads"] = r'''
stop = threading.Event()
errors = []
done = [0]
def churn():
    torch.cuda.set_device(0)
    s = torch.cuda.Stream()
    try:
        with torch.cuda.stream(s):
            i = 0
            while not stop.is_set():
                a = torch.full(((1 + i % 7) << 18,), float(i), device=dev)
                b = a * 2
                if float(b[-1]) != 2.0 * i:
                    errors.append(i)
                del a, b
                i += 1
            done[0] = i
    except BaseException as e:
        errors.append(repr(e))
t = threading.Thread(target=churn, daemon=True)
t.start()
ok = 0
m = net(768)
try:
  for i in range(20):
    x = torch.randn(16 + i, 256, device=dev)
    g, y = captured(m, x, warm=1, capture_error_mode="thread_local")
    g.replay()
    torch.cuda.synchronize()
    ok += bool(torch.allclose(y, m(x), atol=1e-5))
finally:
  stop.set()
  t.join(timeout=30)
print(f"result {ok} of 20 captures right while the other thread made {done[0]} steps, errors {errors[:3]}")
assert ok == 20 and not errors and done[0] > 0
'''

CASES["vmm_pool"] = r'''
import cudapool
MIB = 1 << 20
alloc = torch.cuda.memory.CUDAPluggableAllocator(os.environ["VMM_ALLOC"], "vmm_malloc", "vmm_free")
pool = torch.cuda.MemPool(alloc.allocator())
base = cudapool.memory_stats(0)["reserved_bytes"]
held, refused = [], None
with torch.cuda.use_mem_pool(pool):
    for i in range(16):
        try:
            held.append(torch.empty(256 * MIB, dtype=torch.uint8, device=dev))
        except torch.OutOfMemoryError as e:
            refused = str(e).splitlines()[0][:80]
            break
peak = cudapool.memory_stats(0)["reserved_bytes"] - base
del held
torch.cuda.synchronize()
del pool  # the pool's blocks go back to its allocator once the pool is gone
import gc
gc.collect()
torch.cuda.empty_cache()
after = cudapool.memory_stats(0)["reserved_bytes"] - base
print(f"result counted {peak // MIB} MiB in the pool, refused: {refused is not None}, after release {after // MIB} MiB")
assert refused is not None and 1024 * MIB <= peak <= 2048 * MIB and after <= 2 * MIB
'''

CASES["sizing"] = r'''
import ctypes, cudapool
MIB = 1 << 20
m = net(2048)
for _ in range(3):  # the profile run
    m(torch.randn(512, 256, device=dev)).sum().backward()
torch.cuda.synchronize()
free_cuda, total = torch.cuda.mem_get_info()
nv = ctypes.CDLL("libnvidia-ml.so.1")
assert nv.nvmlInit_v2() == 0
h = ctypes.c_void_p()
# NVML numbers GPUs its own way (not CUDA_VISIBLE_DEVICES'): this GPU by its UUID.
uuid = ("GPU-" + str(torch.cuda.get_device_properties(dev).uuid)).encode()
assert nv.nvmlDeviceGetHandleByUUID(uuid, ctypes.byref(h)) == 0
mem = (ctypes.c_ulonglong * 3)()
assert nv.nvmlDeviceGetMemoryInfo(h, mem) == 0
free_nvml = mem[1]
take = int(0.9 * min(free_cuda, free_nvml))
cache = torch.empty(take, dtype=torch.uint8, device=dev)
cache.fill_(1)
torch.cuda.synchronize()
s = cudapool.memory_stats(0)
limit = 8 << 30
print(f"result cuMemGetInfo free {free_cuda // MIB} MiB of {total // MIB}, NVML free {free_nvml // MIB} MiB; "
      f"took {take // MIB} MiB; cudapool reserved {s['reserved_bytes'] // MIB} MiB, limit {limit // MIB}")
assert total <= limit and s["reserved_bytes"] <= limit and s["ooms"] == 0
'''

VMM_ALLOC_C = r'''
#include <cuda.h>
#include <stddef.h>
#include <string.h>
// A cuMemCreate/cuMemMap allocator as vLLM's CuMemAllocator makes one: one handle per
// allocation, mapped into its own reserved range.
static size_t round_up(size_t n, size_t g) { return (n + g - 1) / g * g; }
void *vmm_malloc(ssize_t size, int device, void *stream) {
  (void)stream;
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  size_t g = 0;
  if (cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) return NULL;
  size_t n = round_up((size_t)size, g);
  CUmemGenericAllocationHandle h;
  if (cuMemCreate(&h, n, &p, 0)) return NULL;
  CUdeviceptr va;
  if (cuMemAddressReserve(&va, n, g, 0, 0)) { cuMemRelease(h); return NULL; }
  if (cuMemMap(va, n, 0, h, 0)) { cuMemAddressFree(va, n); cuMemRelease(h); return NULL; }
  CUmemAccessDesc a;
  memset(&a, 0, sizeof a);
  a.location = p.location;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (cuMemSetAccess(va, n, &a, 1)) { cuMemUnmap(va, n); cuMemAddressFree(va, n); cuMemRelease(h); return NULL; }
  cuMemRelease(h); /* the mapping keeps it */
  return (void *)va;
}
void vmm_free(void *ptr, ssize_t size, int device, void *stream) {
  (void)device, (void)stream;
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  size_t g = 0;
  cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  size_t n = round_up((size_t)size, g);
  cuStreamSynchronize(stream);
  cuMemUnmap((CUdeviceptr)ptr, n);
  cuMemAddressFree((CUdeviceptr)ptr, n);
}
'''

# mode name -> (environment, under cudapool)
MODES = {
    "alone": ({}, False),
    "cache on": ({}, True),
    "cache on, expandable": ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, True),
    "pooled": ({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, True),
    "pooled, alone": ({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, False),
    "cache off": ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, True),
    "cache off, alone": ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, False),
}
ONLY_CUDAPOOL = {"vmm_pool": {"CUDAPOOL_MEMORY_LIMIT": "2GiB"}, "sizing": {"CUDAPOOL_MEMORY_LIMIT": "8GiB"}}


def run(case, mode):
    env_extra, shim = MODES[mode]
    env = dict(os.environ)
    env.update(env_extra)
    env.update(ONLY_CUDAPOOL.get(case, {}))
    env["VMM_ALLOC"] = os.path.join(WORK, "vmm_alloc.so")
    if shim:
        env["LD_PRELOAD"] = LIB
    else:
        env.pop("LD_PRELOAD", None)
    code = f"ROOT = {ROOT!r}\n" + PRELUDE + CASES[case]
    try:
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = f"timed out: {e}", 124
    name = f"{case}-{mode.replace(' ', '_').replace(',', '')}"
    with open(os.path.join(WORK, name + ".log"), "w") as f:
        f.write(out)
    result = next((l[len("result "):] for l in out.splitlines() if l.startswith("result ")), "")
    err = next((l for l in out.splitlines() if re.match(r"^[\w.]*(Error|Exception)\b.*: ", l)), "")
    if not err:
        err = next((l for l in reversed(out.splitlines()) if l.strip()), "")
    return rc, result, err[:200]


def main():
    so = os.path.join(WORK, "vmm_alloc.so")
    src = os.path.join(WORK, "vmm_alloc.c")
    with open(src, "w") as f:
        f.write(VMM_ALLOC_C)
    inc = "/usr/local/cuda/include"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-I", inc, "-o", so, src, "-lcuda"], check=True)
    jobs = []
    for case in CASES:
        if ONLY and case not in ONLY:
            continue
        modes = ["cache on"] if case in ONLY_CUDAPOOL else list(MODES)
        if case == "compile":  # slow to compile: PyTorch's own segments once
            modes.remove("cache on, expandable")
        jobs += [(case, mode) for mode in modes]
    # Six processes at a time: the GPU has room, and compile-heavy cases overlap.
    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        results = dict(zip(jobs, pool.map(lambda j: run(*j), jobs)))
    passed = failed = 0
    for case, mode in jobs:
        rc, result, err = results[(case, mode)]
        if not MODES[mode][1]:
            print(f"INFO | {case}, PyTorch {mode} | rc {rc}: {result or err}")
            continue
        verdict = "PASS" if rc == 0 else "FAIL"
        alone = results.get((case, mode + ", alone"))
        if rc != 0 and alone is not None and alone[0] != 0:
            verdict = "PASS"
            result = f"PyTorch refuses it in this mode without cudapool too: {alone[2]}"
        print(f"{verdict} | capture: {case}, {mode} | {result or err}")
        if verdict == "PASS":
            passed += 1
        else:
            failed += 1
    print(f"capture check: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
