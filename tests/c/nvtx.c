// A pooled program under an NVTX tool (the fake of tests/fake/nvtx_tool.c, named by
// NVTX_INJECTION64_PATH as compute-sanitizer names its own): which blocks the tool sees as
// regions at each step. Prints key=value lines the tests read.
//
// usage: nvtx
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
#define CHECK(call)                                                            \
  do {                                                                         \
    CUresult r_ = (call);                                                      \
    if (r_) {                                                                  \
      fprintf(stderr, "nvtx: %s failed: %d (line %d)\n", #call, r_, __LINE__); \
      exit(3);                                                                 \
    }                                                                          \
  } while (0)

static const char *(*region)(uint64_t, uint64_t *);
static void (*counts)(long[8]);

static void show(const char *tag, CUdeviceptr p) {
  uint64_t size;
  const char *name = region(p, &size);
  printf("%s size=%llu name=%s\n", tag, (unsigned long long)size, name && *name ? name : "-");
}

static void show_counts(const char *tag) {
  long c[8];
  counts(c);
  printf("%s heaps=%ld regions=%ld heap_regs=%ld heap_unregs=%ld region_regs=%ld "
         "region_unregs=%ld names=%ld violations=%ld\n",
         tag, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]);
}

int main(void) {
  void *tool = dlopen(getenv("NVTX_INJECTION64_PATH"), RTLD_NOW | RTLD_NOLOAD);
  void *d = dlopen("libcuda.so.1", RTLD_NOW);
  if (!d) return fprintf(stderr, "nvtx: %s\n", dlerror()), 2;
  CUresult (*Init)(unsigned) = dlsym(d, "cuInit");
  CUresult (*Retain)(void **, int) = dlsym(d, "cuDevicePrimaryCtxRetain");
  CUresult (*Set)(void *) = dlsym(d, "cuCtxSetCurrent");
  CUresult (*Alloc)(CUdeviceptr *, size_t) = dlsym(d, "cuMemAlloc_v2");
  CUresult (*Free)(CUdeviceptr) = dlsym(d, "cuMemFree_v2");
  CUresult (*AllocAsync)(CUdeviceptr *, size_t, void *) = dlsym(d, "cuMemAllocAsync");
  CUresult (*FreeAsync)(CUdeviceptr, void *) = dlsym(d, "cuMemFreeAsync");
  size_t (*reclaim)(int) = (size_t(*)(int))dlsym(RTLD_DEFAULT, "cudapool_reclaim");
  void *ctx;
  CHECK(Init(0));
  CHECK(Retain(&ctx, 0));
  CHECK(Set(ctx));
  CUdeviceptr a, b, c, e, f;
  CHECK(Alloc(&a, 1000));
  if (!tool) {
    // The tool is loaded at the first call that needs it: the first allocation.
    tool = dlopen(getenv("NVTX_INJECTION64_PATH"), RTLD_NOW | RTLD_NOLOAD);
  }
  if (!tool) return printf("tool=absent\n"), 0;
  region = (const char *(*)(uint64_t, uint64_t *))dlsym(tool, "fakenvtx_region");
  counts = (void (*)(long[8]))dlsym(tool, "fakenvtx_counts");
  CHECK(Alloc(&b, 1000));
  CHECK(Alloc(&c, 8 << 20));
  show("a", a);
  show("b", b);
  show("c", c);
  show("inside_a", a + 8);
  CHECK(Free(b));
  show("freed_b", b);
  CHECK(Alloc(&b, 1000));
  show("again_b", b);
  CHECK(AllocAsync(&e, 4096, 0));
  show("async_e", e);
  CHECK(FreeAsync(e, 0));
  show("freed_e", e);
  CHECK(AllocAsync(&f, 4096, 0));
  show("async_f", f);
  show_counts("held");
  CHECK(FreeAsync(f, 0));
  CHECK(Free(a));
  CHECK(Free(b));
  CHECK(Free(c));
  show_counts("freed");
  if (reclaim) reclaim(-1);
  show_counts("reclaimed");
  return 0;
}
