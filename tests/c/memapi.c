// Every device-memory API besides cuMemAlloc, reached the way frameworks reach them (dlsym on
// the driver's handle, or cuGetProcAddress_v2 like the CUDA runtime; gpa-ptsz asks with the
// per-thread-default-stream flag). Prints key=value lines the tests read; run it under a limit.
//
// usage: memapi MODE async|counted|graphs|defaultpool
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long Handle;
#define MIB ((size_t)1 << 20)

struct loc_head {
  int kind, handle_types, location_type, location_id;
};
// CUmemAllocationProp / CUmemPoolProps: the head above, then fields left zero.
struct prop {
  struct loc_head head;
  void *win32;
  unsigned char rest[128];
};
struct desc2 {
  size_t w, h;
  unsigned format, channels;
};
struct desc3 {
  size_t w, h, d;
  unsigned format, channels, flags;
};
struct stats {
  size_t struct_size;
  int32_t device, pad;
  uint64_t allocated, peak_allocated, reserved, peak_reserved, cached, live, segments;
  uint64_t alloc_calls, free_calls, cache_hits, driver_allocs, driver_frees, retries, ooms;
  uint64_t hard_limit, soft_limit;
};

static void *driver;
static const char *mode;

typedef CUresult (*gpa_t)(const char *, void **, int, unsigned long long, int *);
static void *get(const char *base, int version) {
  if (!strcmp(mode, "dlsym")) {
    // The names the driver exports: the newest variant of each.
    static const char *const v2[] = {"cuCtxCreate", "cuArrayCreate", "cuArray3DCreate",
                                     "cuStreamDestroy", "cuMemFree", "cuMemAlloc",
                                     "cuStreamBeginCapture", NULL};
    char name[128];
    snprintf(name, sizeof name, "%s", base);
    for (int i = 0; v2[i]; i++)
      if (!strcmp(base, v2[i]) && version >= 3020) snprintf(name, sizeof name, "%s_v2", base);
    void *p = dlsym(driver, name);
    if (!p) fprintf(stderr, "memapi: no %s\n", name), exit(4);
    return p;
  }
  static gpa_t gpa;
  if (!gpa) gpa = (gpa_t)dlsym(driver, "cuGetProcAddress_v2");
  void *p = NULL;
  int status = -1;
  unsigned long long flags = !strcmp(mode, "gpa-ptsz") ? 2 : 0;
  if (gpa(base, &p, version, flags, &status) || status || !p)
    fprintf(stderr, "memapi: no %s@%d\n", base, version), exit(4);
  return p;
}

#define CHECK(call)                                                              \
  do {                                                                           \
    CUresult r_ = (call);                                                        \
    if (r_) {                                                                    \
      fprintf(stderr, "memapi: %s failed: %d (line %d)\n", #call, r_, __LINE__); \
      exit(3);                                                                   \
    }                                                                            \
  } while (0)

static struct stats stats(void) {
  int (*f)(int, struct stats *) = (int (*)(int, struct stats *))dlsym(RTLD_DEFAULT, "cudapool_get_stats");
  struct stats s = {.struct_size = sizeof s};
  if (!f || f(0, &s)) fprintf(stderr, "memapi: no stats\n"), exit(5);
  return s;
}
static void show(const char *tag) {
  struct stats s = stats();
  size_t (*used)(int) = (size_t(*)(int))dlsym(driver, "fakecu_used");
  printf("%s allocated=%llu reserved=%llu live=%llu ooms=%llu device_used=%zu\n", tag,
         (unsigned long long)s.allocated, (unsigned long long)s.reserved,
         (unsigned long long)s.live, (unsigned long long)s.ooms, used ? used(0) : 0);
}
static long calls(const char *name) {
  long (*f)(const char *) = (long (*)(const char *))dlsym(driver, "fakecu_calls");
  return f(name);
}

// ---- entry points -------------------------------------------------------------------------
static CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, void *);
static CUresult (*MemFreeAsync)(CUdeviceptr, void *);
static CUresult (*MemAllocFromPoolAsync)(CUdeviceptr *, size_t, void *, void *);
static CUresult (*StreamCreate)(void **, unsigned);
static CUresult (*LaunchKernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                unsigned, void *, void **, void **);

static void setup(void) {
  driver = dlopen("libcuda.so.1", RTLD_NOW);
  if (!driver) fprintf(stderr, "memapi: no driver\n"), exit(4);
  CUresult (*Init)(unsigned) = get("cuInit", 2000);
  CUresult (*Retain)(void **, int) = get("cuDevicePrimaryCtxRetain", 7000);
  CUresult (*SetCurrent)(void *) = get("cuCtxSetCurrent", 4000);
  void *ctx;
  CHECK(Init(0));
  CHECK(Retain(&ctx, 0));
  CHECK(SetCurrent(ctx));
  MemAllocAsync = get("cuMemAllocAsync", 11020);
  MemFreeAsync = get("cuMemFreeAsync", 11020);
  MemAllocFromPoolAsync = get("cuMemAllocFromPoolAsync", 11020);
  StreamCreate = get("cuStreamCreate", 2000);
  LaunchKernel = get("cuLaunchKernel", 4000);
}

// A kernel on `s` (through the shim, which sees the work): one that runs until the test
// finishes it (returns its hold), or (hold = 0) one of a microsecond.
static long launch(void *s, int hold) {
  CHECK(LaunchKernel(hold ? (void *)0x401 : (void *)0x402, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
  return hold ? ((long (*)(void))dlsym(driver, "fakecu_last_hold"))() : -1;
}

static int async_scenario(void) {
  long driver_allocs = calls("cuMemAllocAsync") + calls("cuMemAllocAsync_ptsz");
  CUdeviceptr a, b, c;
  // The default stream: pooled, stream-ordered reuse.
  CHECK(MemAllocAsync(&a, 3 * MIB, NULL));
  show("held");
  CHECK(MemFreeAsync(a, NULL));
  CHECK(MemAllocAsync(&b, 3 * MIB, NULL));
  printf("default_stream reused=%d\n", a == b);
  CHECK(MemFreeAsync(b, NULL));
  void (*finish)(long) = (void (*)(long))dlsym(driver, "fakecu_finish");
  // Two non-blocking streams with work: a kernel still runs on s1 when the block is freed
  // there.
  void *s1, *s2;
  CHECK(StreamCreate(&s1, 1));
  CHECK(StreamCreate(&s2, 1));
  launch(s2, 0);
  // 6 MiB: a whole segment each, so only the freed block itself could serve the same size.
  CHECK(MemAllocAsync(&a, 6 * MIB, s1));
  long k = launch(s1, 1);
  CHECK(MemFreeAsync(a, s1));
  CHECK(MemAllocAsync(&b, 6 * MIB, s2));
  CHECK(MemAllocAsync(&c, 6 * MIB, s1));
  printf("streams other_stream_got_it=%d same_stream_got_it=%d\n", a == b, a == c);
  finish(k);
  CHECK(MemFreeAsync(b, s2));
  CHECK(MemFreeAsync(c, s1));
  printf("pooled driver_async_allocs=%ld\n",
         calls("cuMemAllocAsync") + calls("cuMemAllocAsync_ptsz") - driver_allocs);
  show("freed");
  // The limit (64 MiB in the test): 48 MiB fits, another 48 MiB does not.
  CHECK(MemAllocAsync(&a, 48 * MIB, s1));
  CUresult r = MemAllocAsync(&b, 48 * MIB, s2);
  printf("limit second=%d\n", r);
  CHECK(MemFreeAsync(a, s1));
  // A capture: the allocation goes to the driver (a graph's memory node, charged when the graph
  // is uploaded or launched).
  CUresult (*Begin)(void *, int) = get("cuStreamBeginCapture", 10010);
  CUresult (*End)(void *, void **) = get("cuStreamEndCapture", 10000);
  long before = calls("cuMemAllocAsync") + calls("cuMemAllocAsync_ptsz");
  CHECK(Begin(s1, 0));
  CHECK(MemAllocAsync(&a, 7 * MIB, s1));
  show("captured");
  CHECK(MemFreeAsync(a, s1));
  void *graph;
  CHECK(End(s1, &graph));
  printf("capture driver_allocs=%ld\n",
         calls("cuMemAllocAsync") + calls("cuMemAllocAsync_ptsz") - before);
  show("after_capture");
  // A free of a pointer the shim never handed out gets the driver's answer.
  printf("bad_free r=%d\n", MemFreeAsync((CUdeviceptr)0xdead000, s1));
  return 0;
}

static int counted_scenario(void) {
  CUdeviceptr p, q;
  // Managed memory.
  CUresult (*AllocManaged)(CUdeviceptr *, size_t, unsigned) = get("cuMemAllocManaged", 6000);
  CUresult (*Free)(CUdeviceptr) = get("cuMemFree", 3020);
  CHECK(AllocManaged(&p, 40 * MIB, 1));
  show("managed_held");
  printf("managed second=%d\n", AllocManaged(&q, 40 * MIB, 1));
  CHECK(Free(p));
  show("managed_freed");

  // A driver pool on device 0: what it reserves counts, idle or not.
  CUresult (*PoolCreate)(void **, const struct prop *) = get("cuMemPoolCreate", 11020);
  CUresult (*PoolTrim)(void *, size_t) = get("cuMemPoolTrimTo", 11020);
  CUresult (*PoolDestroy)(void *) = get("cuMemPoolDestroy", 11020);
  struct prop props = {.head = {1, 0, 1, 0}};
  void *pool, *s;
  CHECK(PoolCreate(&pool, &props));
  CHECK(StreamCreate(&s, 0));
  CHECK(MemAllocFromPoolAsync(&p, 40 * MIB, pool, s));
  show("pool_held");
  printf("pool second=%d\n", MemAllocFromPoolAsync(&q, 40 * MIB, pool, s));
  CHECK(MemFreeAsync(p, s));
  show("pool_idle");
  CHECK(MemAllocFromPoolAsync(&p, 40 * MIB, pool, s)); // from the pool's idle reserve
  CHECK(MemFreeAsync(p, s));
  CHECK(PoolTrim(pool, 0));
  show("pool_trimmed");
  CHECK(MemAllocFromPoolAsync(&p, 40 * MIB, pool, s));
  CHECK(PoolDestroy(pool)); // deferred by the driver while p lives
  show("pool_destroyed");
  CHECK(MemFreeAsync(p, s));
  show("pool_gone");
  // The device's default pool, and a pool in host memory (not counted).
  CUresult (*DefaultPool)(void **, int) = get("cuDeviceGetDefaultMemPool", 11020);
  CHECK(DefaultPool(&pool, 0));
  CHECK(MemAllocFromPoolAsync(&p, 10 * MIB, pool, s));
  show("default_pool_held");
  CHECK(MemFreeAsync(p, s));
  CHECK(PoolTrim(pool, 0));
  struct prop host = {.head = {1, 0, 2, 0}};
  void *hpool;
  CHECK(PoolCreate(&hpool, &host));
  CHECK(MemAllocFromPoolAsync(&p, 100 * MIB, hpool, s));
  show("host_pool_held");
  CHECK(MemFreeAsync(p, s));

  // Physical memory: counted until released and unmapped.
  CUresult (*Create)(Handle *, size_t, const struct prop *, unsigned long long) =
      get("cuMemCreate", 10020);
  CUresult (*Release)(Handle) = get("cuMemRelease", 10020);
  CUresult (*Reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long) =
      get("cuMemAddressReserve", 10020);
  CUresult (*Map)(CUdeviceptr, size_t, size_t, Handle, unsigned long long) = get("cuMemMap", 10020);
  CUresult (*Unmap)(CUdeviceptr, size_t) = get("cuMemUnmap", 10020);
  CUresult (*RetainHandle)(Handle *, void *) = get("cuMemRetainAllocationHandle", 11000);
  struct prop pp = {.head = {1, 0, 1, 0}};
  Handle h, h2, again;
  CUdeviceptr va;
  CHECK(Create(&h, 40 * MIB, &pp, 0));
  show("vmm_held");
  printf("vmm second=%d\n", Create(&h2, 40 * MIB, &pp, 0));
  CHECK(Reserve(&va, 40 * MIB, 0, 0, 0));
  CHECK(Map(va, 40 * MIB, 0, h, 0));
  CHECK(RetainHandle(&again, (void *)(uintptr_t)va));
  CHECK(Release(again));
  CHECK(Release(h));
  show("vmm_released_mapped");
  CHECK(Unmap(va, 40 * MIB));
  show("vmm_unmapped");
  struct prop hp = {.head = {1, 0, 2, 0}};
  CHECK(Create(&h, 100 * MIB, &hp, 0));
  show("vmm_host");
  CHECK(Release(h));

  // Arrays: their real footprint, from the driver.
  CUresult (*ArrayCreate)(void **, const struct desc2 *) = get("cuArrayCreate", 3020);
  CUresult (*Array3DCreate)(void **, const struct desc3 *) = get("cuArray3DCreate", 3020);
  CUresult (*MipCreate)(void **, const struct desc3 *, unsigned) = get("cuMipmappedArrayCreate", 5000);
  CUresult (*ArrayDestroy)(void *) = get("cuArrayDestroy", 2000);
  CUresult (*MipDestroy)(void *) = get("cuMipmappedArrayDestroy", 5000);
  size_t (*fp)(size_t, size_t, size_t, unsigned, unsigned, unsigned) =
      (size_t(*)(size_t, size_t, size_t, unsigned, unsigned, unsigned))dlsym(driver, "fakecu_array_footprint");
  void *a2, *a3, *mip, *big;
  struct desc2 d2 = {1000, 1000, 0x20, 1}; // float, rows padded
  struct desc3 d3 = {100, 100, 100, 0x01, 4, 0};
  struct desc3 dm = {1024, 1024, 0, 0x20, 1, 0};
  CHECK(ArrayCreate(&a2, &d2));
  CHECK(Array3DCreate(&a3, &d3));
  CHECK(MipCreate(&mip, &dm, 5));
  printf("arrays expected=%zu\n", fp(1000, 1000, 0, 0x20, 1, 0) + fp(100, 100, 100, 1, 4, 0) +
                                      fp(1024, 1024, 0, 0x20, 1, 5));
  show("arrays_held");
  struct desc3 dbig = {4096, 4096, 0, 0x20, 1, 0}; // 64 MiB: past the limit
  printf("arrays_big r=%d\n", Array3DCreate(&big, &dbig));
  CHECK(ArrayDestroy(a2));
  CHECK(ArrayDestroy(a3));
  CHECK(MipDestroy(mip));
  show("arrays_freed");

  // Host memory is not device memory.
  CUresult (*HostAlloc)(void **, size_t, unsigned) = get("cuMemHostAlloc", 2020);
  CUresult (*FreeHost)(void *) = get("cuMemFreeHost", 2000);
  void *hostp;
  CHECK(HostAlloc(&hostp, 100 * MIB, 0));
  show("host_held");
  CHECK(FreeHost(hostp));
  return 0;
}

// Graph memory nodes (issue 35): what the driver maps for graphs counts against the limit
// (64 MiB in the test) and in the stats; a launch that cannot fit is refused before it runs.
struct node_params {
  struct loc_head head;
  unsigned char props_rest[72];
  const void *access;
  size_t access_count;
  size_t bytesize;
  CUdeviceptr dptr;
};
static void *graph_of(size_t bytes) {
  CUresult (*Create)(void **, unsigned) = get("cuGraphCreate", 10000);
  CUresult (*AddAlloc)(void **, void *, const void *, size_t, struct node_params *) =
      get("cuGraphAddMemAllocNode", 11040);
  CUresult (*AddEmpty)(void **, void *, const void *, size_t) = get("cuGraphAddEmptyNode", 10000);
  void *g, *n;
  CHECK(Create(&g, 0));
  CHECK(AddEmpty(&n, g, NULL, 0));
  if (bytes) {
    struct node_params p = {.head = {1, 0, 1, 0}, .bytesize = bytes};
    CHECK(AddAlloc(&n, g, NULL, 0, &p));
  }
  return g;
}
static void show_graphs(const char *tag) {
  struct stats s = stats();
  size_t (*reserve)(int) = (size_t(*)(int))dlsym(driver, "fakecu_graph_reserve");
  size_t (*used)(int) = (size_t(*)(int))dlsym(driver, "fakecu_used");
  long (*maps)(void) = (long (*)(void))dlsym(driver, "fakecu_graph_maps");
  printf("%s reserved=%llu allocated=%llu ooms=%llu graph_reserve=%zu device_used=%zu maps=%ld\n",
         tag, (unsigned long long)s.reserved, (unsigned long long)s.allocated,
         (unsigned long long)s.ooms, reserve(0), used(0), maps());
}
static int graphs_scenario(void) {
  CUresult (*WithFlags)(void **, void *, unsigned long long) = get("cuGraphInstantiateWithFlags", 11040);
  CUresult (*Legacy)(void **, void *, void **, char *, size_t) = get("cuGraphInstantiate", 11000);
  CUresult (*WithParams)(void **, void *, void *) = get("cuGraphInstantiateWithParams", 12000);
  CUresult (*Launch)(void *, void *) = get("cuGraphLaunch", 10000);
  CUresult (*Upload)(void *, void *) = get("cuGraphUpload", 11010);
  CUresult (*Trim)(int) = get("cuDeviceGraphMemTrim", 11040);
  CUresult (*ExecDestroy)(void *) = get("cuGraphExecDestroy", 10000);
  CUresult (*Alloc)(CUdeviceptr *, size_t) = get("cuMemAlloc", 3020);
  CUresult (*Free)(CUdeviceptr) = get("cuMemFree", 3020);
  void *s, *a, *b, *c, *none;
  CHECK(StreamCreate(&s, 1));
  unsigned char params[64] = {0};
  CHECK(WithFlags(&a, graph_of(40 * MIB), 0));
  CHECK(Legacy(&b, graph_of(100 * MIB), NULL, NULL, 0));
  CHECK(WithParams(&c, graph_of(20 * MIB), params));
  CHECK(WithFlags(&none, graph_of(0), 0));
  show_graphs("instantiated");
  CHECK(Upload(a, s));
  show_graphs("uploaded");
  CHECK(Launch(a, s));
  CHECK(Launch(c, s)); // fits in what the driver holds for graphs already
  show_graphs("launched");
  // An ordinary allocation that fits only once the graphs' idle memory is given back.
  CUdeviceptr p;
  CHECK(Alloc(&p, 30 * MIB));
  show_graphs("eager");
  CHECK(Free(p)); // cached by the pool
  // The graph was unmapped by that trim: its launch needs 40 MiB again, and gets it once the
  // pool's cache is given back.
  CHECK(Launch(a, s));
  show_graphs("relaunched");
  CHECK(Trim(0));
  show_graphs("trimmed");
  CHECK(Launch(a, s));
  // 100 MiB can never fit under 64 MiB: refused, not run (the idle graph memory was given
  // back trying).
  printf("big launch=%d upload=%d\n", Launch(b, s), Upload(b, s));
  show_graphs("big_refused");
  CHECK(Launch(none, s)); // no memory nodes: never checked
  CHECK(ExecDestroy(a));
  CHECK(ExecDestroy(b));
  CHECK(ExecDestroy(c));
  CHECK(ExecDestroy(none));
  return 0;
}

// The device's default pool, as PyTorch's backend:cudaMallocAsync reads it: its reserved and
// used figures, current and high, against cudapool's own; the highs reset; a trim to 0 with
// the memory freed; another pool keeps the driver's figures.
static void pool_figures(const char *tag, void *pool) {
  CUresult (*Get)(void *, int, void *) = get("cuMemPoolGetAttribute", 11020);
  unsigned long long v[4] = {0};
  for (int i = 0; i < 4; i++) CHECK(Get(pool, 5 + i, &v[i]));
  struct stats s = stats();
  printf("%s reserved=%llu reserved_high=%llu used=%llu used_high=%llu cp_reserved=%llu "
         "cp_peak_reserved=%llu cp_allocated=%llu cp_peak_allocated=%llu\n",
         tag, v[0], v[1], v[2], v[3], (unsigned long long)s.reserved,
         (unsigned long long)s.peak_reserved, (unsigned long long)s.allocated,
         (unsigned long long)s.peak_allocated);
}
static int default_pool_scenario(void) {
  CUresult (*DefaultPool)(void **, int) = get("cuDeviceGetDefaultMemPool", 11020);
  CUresult (*Set)(void *, int, void *) = get("cuMemPoolSetAttribute", 11020);
  CUresult (*TrimTo)(void *, size_t) = get("cuMemPoolTrimTo", 11020);
  CUresult (*PoolCreate)(void **, struct prop *) = get("cuMemPoolCreate", 11020);
  void *pool;
  CHECK(DefaultPool(&pool, 0));
  CUdeviceptr a, b;
  CHECK(MemAllocAsync(&a, 8 * MIB, NULL));
  CHECK(MemAllocAsync(&b, 4 * MIB, NULL));
  pool_figures("held", pool);
  CHECK(MemFreeAsync(b, NULL));
  pool_figures("freed_b", pool);
  unsigned long long zero = 0, one = 1;
  CUresult bad = Set(pool, 6, &one);
  CHECK(Set(pool, 6, &zero));
  CHECK(Set(pool, 8, &zero));
  pool_figures("reset", pool);
  CHECK(MemFreeAsync(a, NULL));
  CHECK(TrimTo(pool, 0));
  pool_figures("trimmed", pool);
  // Another pool: the driver's own figures.
  struct prop props = {{1, 0, 1, 0}, NULL, {0}};
  void *other;
  CHECK(PoolCreate(&other, &props));
  CUdeviceptr c;
  CHECK(MemAllocFromPoolAsync(&c, 3 * MIB, other, NULL));
  CUresult (*Get)(void *, int, void *) = get("cuMemPoolGetAttribute", 11020);
  unsigned long long used = 0, reserved = 0;
  CHECK(Get(other, 7, &used));
  CHECK(Get(other, 5, &reserved));
  printf("other used=%llu reserved=%llu set_bad_rc=%d\n", used, reserved, bad);
  CHECK(MemFreeAsync(c, NULL));
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) return fprintf(stderr, "usage: memapi MODE async|counted|graphs\n"), 2;
  mode = argv[1];
  setup();
  if (!strcmp(argv[2], "async")) return async_scenario();
  if (!strcmp(argv[2], "counted")) return counted_scenario();
  if (!strcmp(argv[2], "graphs")) return graphs_scenario();
  if (!strcmp(argv[2], "defaultpool")) return default_pool_scenario();
  fprintf(stderr, "memapi: unknown scenario %s\n", argv[2]);
  return 2;
}
