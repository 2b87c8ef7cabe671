"""A cached pair in C++, cudapool against PyTorch's own caching allocator, in lockstep (issue 26).

The target "a cached pair at 100 ns" is PyTorch's kind of figure: its caching allocator serves a
hit in C++ (`c10::cuda::CUDACachingAllocator::raw_alloc` + `raw_delete`) without the driver. On
the H100 host every figure moves with a host mode (the same binary, cudapool's own test client
on its fake driver included, reads about 150 ns a pair or about 260 ns: docs/benchmarks.md), so
figures from different processes or moments do not compare. Here one process holds both
allocators: PyTorch's caching allocator serves its hits itself (they never reach the driver),
while `cuMemAlloc`/`cuMemFree` and `cudaMalloc`/`cudaFree` go to cudapool, preloaded. Each turn
times, back to back, a few milliseconds of each row; the figure is each row's ratio to PyTorch's
row *within the turn*, its median and spread over the rounds. Workers (one per cudapool kind,
all pinned to one core) take turns, so the kinds also see the same moments. A last worker runs
the floor: `benches/gpu/callcount.c`'s one-slot stub in cudapool's place (its `cuMemAlloc` row
is what any preloaded allocator costs at least; its `cudaMalloc` row, the runtime's own cost).

    python3 benches/gpu/cpp_lockstep.py [ROUNDS]     (default 30; on the device, needs nvcc/ninja)

CUDAPOOL_LIB (default target/release/libcudapool.so), KINDS (its workers, default
split,binned,simple,expandable), BASE_LIB (a second build's split worker, or several as
LABEL=PATH,LABEL=PATH), CORE (default 5), SIZES (default 512,4096,1048576,16777216).
"""
import os
import subprocess
import sys

from lockstep import label, ratio, run, spread

PAIRS = 20000  # a few milliseconds a row at 100-300 ns a pair

SOURCE = r"""
#include <chrono>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda.h>
#include <cuda_runtime.h>

static double now_ns() {
  return std::chrono::duration<double, std::nano>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}
// ns per pair over n pairs; kind 0: PyTorch's caching allocator, 1: cuMemAlloc, 2: cudaMalloc.
double pairs(int64_t kind, int64_t size, int64_t n) {
  double t = now_ns();
  if (kind == 0) {
    for (int64_t i = 0; i < n; i++)
      c10::cuda::CUDACachingAllocator::raw_delete(
          c10::cuda::CUDACachingAllocator::raw_alloc(size));
  } else if (kind == 1) {
    for (int64_t i = 0; i < n; i++) {
      CUdeviceptr p;
      if (cuMemAlloc(&p, size) != CUDA_SUCCESS) return -1;
      cuMemFree(p);
    }
  } else {
    for (int64_t i = 0; i < n; i++) {
      void *p;
      if (cudaMalloc(&p, size) != cudaSuccess) return -1;
      cudaFree(p);
    }
  }
  return (now_ns() - t) / n;
}
"""
ROWS = ["PyTorch's caching allocator (raw_alloc + raw_delete)", "cuMemAlloc + cuMemFree", "cudaMalloc + cudaFree"]


def extension():
    import torch
    from torch.utils.cpp_extension import load_inline

    torch.cuda.init()
    return load_inline("cudapool_cpp_pairs", SOURCE, functions=["pairs"], with_cuda=True,
                       extra_ldflags=["-lcuda"], verbose=False)


def worker():
    ext = extension()
    sizes = [int(s) for s in sys.argv[2].split(",")]
    for size in sizes:
        for kind in range(len(ROWS)):
            ext.pairs(kind, size, 2000)
    print("ready", flush=True)
    for line in sys.stdin:
        size, n = map(int, line.split())
        print(" ".join(f"{ext.pairs(k, size, n):.1f}" for k in range(len(ROWS))), flush=True)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    core = int(os.environ.get("CORE", "5"))
    sizes = os.environ.get("SIZES", "512,4096,1048576,16777216")
    lib = os.environ.get("CUDAPOOL_LIB", os.path.abspath("target/release/libcudapool.so"))
    base = os.environ.get("BASE_LIB", "")
    extension()  # built once here, loaded by the workers
    workers = []
    for k in os.environ.get("KINDS", "split,binned,simple,expandable").split(","):
        if k == "expandable":
            workers.append(("cudapool split expandable", {"LD_PRELOAD": lib, "CUDAPOOL_SEGMENTS": "expandable"}))
        elif k:
            workers.append((f"cudapool {k}", {"LD_PRELOAD": lib, "CUDAPOOL_POOL": k}))
    stub = "/tmp/cudapool_stub.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", stub, "benches/gpu/callcount.c", "-ldl"], check=True)
    workers.append(("floor: one-slot stub", {"LD_PRELOAD": stub, "STUB_POOL": "1"}))
    for b in filter(None, base.split(",")):
        name, path = b.split("=", 1) if "=" in b else ("base build", b)
        workers.append((f"cudapool split ({name})", {"LD_PRELOAD": os.path.abspath(path)}))
    answers = run(__file__, workers, core, sizes, rounds, PAIRS)
    sizes = [int(s) for s in sizes.split(",")]
    ns = {(w, k, size): [float(a[k]) for a in v]
          for (w, size), v in answers.items() for k in range(len(ROWS))}
    print(f"# C++ pairs in lockstep: {rounds} rounds, {len(workers)} workers pinned to core {core}, "
          f"{PAIRS} pairs a row a turn, rows back to back in one process")
    print()
    print("ns per pair: median of the rounds [25th-75th percentile]")
    print("| worker | row | " + " | ".join(label(s) for s in sizes) + " |")
    print("| --- | --- |" + " --- |" * len(sizes))
    for w, (wname, _) in enumerate(workers):
        for k, row in enumerate(ROWS):
            cells = []
            for s in sizes:
                v = ns[w, k, s]
                cells.append("failed" if min(v) < 0 else spread(v))
            print(f"| {wname} | {row} | " + " | ".join(cells) + " |")
    print()
    print("against PyTorch's caching allocator in the same process and turn: median ratio "
          "[25th-75th percentile]; a spread that holds 1.00 is no difference")
    print("| worker | row | " + " | ".join(label(s) for s in sizes) + " |")
    print("| --- | --- |" + " --- |" * len(sizes))
    for w, (wname, _) in enumerate(workers):
        for k, row in enumerate(ROWS[1:], 1):
            cells = [ratio([a / b for a, b in zip(ns[w, k, s], ns[w, 0, s])]) for s in sizes]
            print(f"| {wname} | {row} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker()
    else:
        main()
