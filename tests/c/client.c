// A CUDA driver-API client that reaches the driver the three ways real programs do:
//   link   - calls symbols resolved at link time (built with -DLINKED, -lcuda)
//   dlsym  - dlopen("libcuda.so.1") + dlsym(handle, "cuMemAlloc_v2"), like PyTorch/CuPy/JAX
//   gpa    - dlsym "cuGetProcAddress_v2", asks it for "cuGetProcAddress" itself, then for every
//            entry point by base name and version, like the CUDA runtime (gpa-ptsz: flag 2)
// and runs one scenario. Prints key=value lines that the tests read.
//
// usage: client MODE SCENARIO [args...]
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client.h"

struct api cu;
void *driver;
static const char *mode;
CUdevice dev;
CUcontext primary;

static const char *me = "client";

static void *must(void *p, const char *name) {
  if (!p) {
    if (!strcmp(name, "libcuda.so.1"))
      fprintf(stderr,
              "%s: cannot load libcuda.so.1: no NVIDIA driver here; scripts/demo.sh lays out a fake "
              "one in target/demo (put that folder on LD_LIBRARY_PATH, or run target/demo/sample)\n",
              me);
    else
      fprintf(stderr, "%s: cannot get %s\n", me, name);
    exit(4);
  }
  return p;
}

typedef CUresult (*gpa2_t)(const char *, void **, int, unsigned long long, int *);
typedef CUresult (*gpa1_t)(const char *, void **, int, unsigned long long);
static gpa2_t gpa;
static unsigned long long gpa_flags;

static void *by_gpa(const char *base, int version) {
  void *fn = NULL;
  int status = -1;
  CUresult r = gpa(base, &fn, version, gpa_flags, &status);
  if (r != CUDA_SUCCESS || status != 0) return NULL;
  return fn;
}

static void load(void) {
  if (!strcmp(mode, "link")) {
#ifdef LINKED
    cu = (struct api){cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease,
                      cuDevicePrimaryCtxReset, cuCtxCreate, cuCtxDestroy, cuCtxSetCurrent,
                      cuCtxPushCurrent, cuCtxPopCurrent, cuMemAlloc, cuMemFree, cuMemAllocPitch, cuMemGetInfo, cuMemGetAddressRange,
                      cuMemsetD8, cuMemcpyHtoD, cuMemcpyDtoH, cuMemAlloc_v1, cuMemFree_v1,
                      cuStreamCreate, cuStreamDestroy, cuStreamBeginCapture, cuStreamEndCapture,
                      cuLaunchKernel, cuLaunchHostFunc, cuStreamAddCallback};
    return;
#else
    fprintf(stderr, "client: built without -DLINKED\n");
    exit(2);
#endif
  }
  driver = must(dlopen("libcuda.so.1", RTLD_NOW), "libcuda.so.1");
  if (!strcmp(mode, "dlsym")) {
#define SYM(field, name) cu.field = must(dlsym(driver, name), name)
    SYM(Init, "cuInit");
    SYM(DeviceGet, "cuDeviceGet");
    SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    SYM(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    SYM(PrimaryCtxReset, "cuDevicePrimaryCtxReset_v2");
    cu.CtxCreate = dlsym(driver, "cuCtxCreate_v2");
    SYM(CtxDestroy, "cuCtxDestroy_v2");
    SYM(CtxSetCurrent, "cuCtxSetCurrent");
    SYM(CtxPushCurrent, "cuCtxPushCurrent_v2");
    SYM(CtxPopCurrent, "cuCtxPopCurrent_v2");
    SYM(MemAlloc, "cuMemAlloc_v2");
    SYM(MemFree, "cuMemFree_v2");
    SYM(MemAllocPitch, "cuMemAllocPitch_v2");
    SYM(MemGetInfo, "cuMemGetInfo_v2");
    SYM(MemGetAddressRange, "cuMemGetAddressRange_v2");
    SYM(MemsetD8, "cuMemsetD8_v2");
    cu.MemcpyHtoD = dlsym(driver, "cuMemcpyHtoD_v2");
    cu.MemcpyDtoH = dlsym(driver, "cuMemcpyDtoH_v2");
    cu.MemAlloc1 = dlsym(driver, "cuMemAlloc");
    cu.MemFree1 = dlsym(driver, "cuMemFree");
    cu.StreamCreate = dlsym(driver, "cuStreamCreate");
    cu.StreamDestroy = dlsym(driver, "cuStreamDestroy_v2");
    cu.BeginCapture = dlsym(driver, "cuStreamBeginCapture_v2");
    cu.EndCapture = dlsym(driver, "cuStreamEndCapture");
    cu.LaunchKernel = dlsym(driver, "cuLaunchKernel");
    cu.LaunchHostFunc = dlsym(driver, "cuLaunchHostFunc");
    cu.StreamAddCallback = dlsym(driver, "cuStreamAddCallback");
    return;
  }
  if (!strncmp(mode, "gpa", 3)) {
    gpa_flags = !strcmp(mode, "gpa-ptsz") ? 2 : 0;
    gpa2_t first = must(dlsym(driver, "cuGetProcAddress_v2"), "cuGetProcAddress_v2");
    // Like libcudart: ask for cuGetProcAddress itself, at 12000 and at 11030.
    void *v2 = NULL, *v1 = NULL;
    int st;
    CHECK(first("cuGetProcAddress", &v2, 12000, 0, &st));
    CHECK(first("cuGetProcAddress", &v1, 11030, 0, &st));
    must(v1, "cuGetProcAddress@11030");
    gpa = must(v2, "cuGetProcAddress@12000");
    printf("gpa_self_is_first=%d\n", (void *)gpa == (void *)first);
    // The 11.3 entry point must answer too.
    void *probe = NULL;
    CHECK(((gpa1_t)v1)("cuMemAlloc", &probe, 3020, 0));
    printf("gpa_v1_alloc_is_v2_alloc=%d\n", probe == by_gpa("cuMemAlloc", 3020));
#define GPA(field, base, ver) cu.field = must(by_gpa(base, ver), base)
    GPA(Init, "cuInit", 2000);
    GPA(DeviceGet, "cuDeviceGet", 2000);
    GPA(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000);
    GPA(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 11000);
    GPA(PrimaryCtxReset, "cuDevicePrimaryCtxReset", 11000);
    cu.CtxCreate = by_gpa("cuCtxCreate", 3020);
    GPA(CtxDestroy, "cuCtxDestroy", 4000);
    GPA(CtxSetCurrent, "cuCtxSetCurrent", 4000);
    GPA(CtxPushCurrent, "cuCtxPushCurrent", 4000);
    GPA(CtxPopCurrent, "cuCtxPopCurrent", 4000);
    GPA(MemAlloc, "cuMemAlloc", 3020);
    GPA(MemFree, "cuMemFree", 3020);
    GPA(MemAllocPitch, "cuMemAllocPitch", 3020);
    GPA(MemGetInfo, "cuMemGetInfo", 3020);
    GPA(MemGetAddressRange, "cuMemGetAddressRange", 3020);
    GPA(MemsetD8, "cuMemsetD8", 7000);
    cu.MemcpyHtoD = by_gpa("cuMemcpyHtoD", 3020);
    cu.MemcpyDtoH = by_gpa("cuMemcpyDtoH", 3020);
    cu.MemAlloc1 = by_gpa("cuMemAlloc", 2000);
    cu.MemFree1 = by_gpa("cuMemFree", 2000);
    cu.StreamCreate = by_gpa("cuStreamCreate", 2000);
    cu.StreamDestroy = by_gpa("cuStreamDestroy", 4000);
    cu.BeginCapture = by_gpa("cuStreamBeginCapture", 10010);
    cu.EndCapture = by_gpa("cuStreamEndCapture", 10000);
    cu.LaunchKernel = by_gpa("cuLaunchKernel", 12000);
    cu.LaunchHostFunc = by_gpa("cuLaunchHostFunc", 12000);
    cu.StreamAddCallback = by_gpa("cuStreamAddCallback", 12000);
    // A name the driver lacks: NOT_FOUND with status 1, unchanged by any shim.
    void *none = (void *)1;
    int status = -1;
    CUresult r = gpa("cuNoSuchFunction", &none, 12000, 0, &status);
    printf("gpa_missing=%d status=%d null=%d\n", r, status, none == NULL);
    return;
  }
  fprintf(stderr, "client: unknown mode %s\n", mode);
  exit(2);
}

static void setup(void) {
  CHECK(cu.Init(0));
  const char *d = getenv("CLIENT_DEVICE");
  CHECK(cu.DeviceGet(&dev, d ? atoi(d) : 0));
  CHECK(cu.PrimaryCtxRetain(&primary, dev));
  CHECK(cu.CtxSetCurrent(primary));
}

// ---- what the shim saw, through its C API (absent when not preloaded) -------------------
struct stats {
  size_t struct_size;
  int32_t device, pad;
  uint64_t allocated, peak_allocated, reserved, peak_reserved, cached, live, segments;
  uint64_t alloc_calls, free_calls, cache_hits, driver_allocs, driver_frees, retries, ooms;
  uint64_t hard_limit, soft_limit, requested, peak_requested;
};

// The shim's answer for device `d` (its figures in *s), or SHIM_ABSENT when it is not preloaded.
#define SHIM_ABSENT (-1000)
static int shim_stats(int d, struct stats *s) {
  int (*get)(int, struct stats *) = dlsym(RTLD_DEFAULT, "cudapool_get_stats");
  *s = (struct stats){.struct_size = sizeof *s};
  return get ? get(d, s) : SHIM_ABSENT;
}

void print_stats(const char *tag) {
  struct stats s;
  int r = shim_stats(dev, &s);
  if (r == SHIM_ABSENT) {
    printf("%s shim=absent\n", tag);
    return;
  }
  printf("%s shim=present r=%d allocated=%llu peak=%llu reserved=%llu live=%llu segments=%llu "
         "alloc_calls=%llu free_calls=%llu driver_allocs=%llu driver_frees=%llu ooms=%llu "
         "limit=%llu retries=%llu cached=%llu hits=%llu requested=%llu peak_requested=%llu\n",
         tag, r, (unsigned long long)s.allocated, (unsigned long long)s.peak_allocated,
         (unsigned long long)s.reserved, (unsigned long long)s.live,
         (unsigned long long)s.segments, (unsigned long long)s.alloc_calls,
         (unsigned long long)s.free_calls, (unsigned long long)s.driver_allocs,
         (unsigned long long)s.driver_frees, (unsigned long long)s.ooms,
         (unsigned long long)s.hard_limit, (unsigned long long)s.retries,
         (unsigned long long)s.cached, (unsigned long long)s.cache_hits,
         (unsigned long long)s.requested, (unsigned long long)s.peak_requested);
}

long fake_calls(const char *name) {
  long (*f)(const char *) = dlsym(driver ? driver : RTLD_DEFAULT, "fakecu_calls");
  return f ? f(name) : -1;
}

static size_t fake_peak(int d) {
  size_t (*f)(int) = dlsym(driver ? driver : RTLD_DEFAULT, "fakecu_peak");
  return f ? f(d) : 0;
}

void *fake_fn(const char *name) {
  return must(dlsym(driver ? driver : RTLD_DEFAULT, name), name);
}

// ---- scenarios --------------------------------------------------------------------------
static int basic(void) {
  size_t sizes[] = {1 << 20, 4096, 3 << 20};
  CUdeviceptr p[3];
  for (int i = 0; i < 3; i++) {
    CHECK(cu.MemAlloc(&p[i], sizes[i]));
    CHECK(cu.MemsetD8(p[i], (unsigned char)i, sizes[i]));
  }
  print_stats("held");
  for (int i = 0; i < 3; i++) CHECK(cu.MemFree(p[i]));
  print_stats("freed");
  printf("driver_alloc_calls=%ld\n", fake_calls("cuMemAlloc_v2"));
  return 0;
}

static int limit(int argc, char **argv) {
  size_t chunk = argc > 0 ? strtoull(argv[0], NULL, 10) : (8 << 20);
  CUdeviceptr held[4096];
  int n = 0;
  CUresult r = CUDA_SUCCESS;
  while (n < 4096 && (r = cu.MemAlloc(&held[n], chunk)) == CUDA_SUCCESS) n++;
  printf("fits=%d err=%d\n", n, r);
  size_t f = 0, t = 0;
  CHECK(cu.MemGetInfo(&f, &t));
  printf("full_free=%zu full_total=%zu\n", f, t);
  print_stats("full");
  for (int i = 0; i < n; i++) CHECK(cu.MemFree(held[i]));
  CUdeviceptr again;
  r = cu.MemAlloc(&again, chunk);
  printf("again=%d\n", r);
  if (r == CUDA_SUCCESS) CHECK(cu.MemFree(again));
  return 0;
}

static int getinfo(void) {
  size_t f = 0, t = 0;
  CHECK(cu.MemGetInfo(&f, &t));
  printf("free=%zu total=%zu\n", f, t);
  CUdeviceptr p;
  CHECK(cu.MemAlloc(&p, 10 << 20));
  CHECK(cu.MemGetInfo(&f, &t));
  printf("after_free=%zu after_total=%zu\n", f, t);
  CHECK(cu.MemFree(p));
  return 0;
}

static int bad(void) {
  CUdeviceptr p = 0, q = 0;
  printf("null_out=%d\n", cu.MemAlloc(NULL, 1024));
  printf("zero_size=%d\n", cu.MemAlloc(&p, 0));
  int x;
  printf("bogus_free=%d\n", cu.MemFree((CUdeviceptr)(uintptr_t)&x));
  CHECK(cu.MemAlloc(&q, 4096));
  printf("interior_free=%d\n", cu.MemFree(q + 16));
  printf("first_free=%d\n", cu.MemFree(q));
  printf("double_free=%d\n", cu.MemFree(q));
  size_t f = 0, limited = 0, total = 0;
  printf("getinfo_null=%d\n", cu.MemGetInfo(&f, NULL));
  // One NULL out-pointer: the other must still see the limit.
  CHECK(cu.MemGetInfo(&limited, &total));
  printf("getinfo_free_only=%d\n", f == limited);
  printf("pitch_null=%d\n", cu.MemAllocPitch(NULL, &f, 64, 64, 4));
  printf("pitch_elem=%d\n", cu.MemAllocPitch(&p, &f, 64, 64, 3));
  printf("driver_free_calls=%ld\n", fake_calls("cuMemFree_v2"));
  // Still usable afterwards, and nothing leaked in the accounting.
  CHECK(cu.MemAlloc(&q, 4096));
  CHECK(cu.MemsetD8(q, 1, 4096));
  CHECK(cu.MemFree(q));
  print_stats("after");
  return 0;
}

struct worker {
  int id, iters;
  size_t max_size;
  long errors, ooms, ok;
};

static void *work(void *arg) {
  struct worker *w = arg;
  CHECK(cu.CtxSetCurrent(primary));
  uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(w->id + 1);
  CUdeviceptr held[4] = {0};
  size_t sizes[4] = {0};
  for (int i = 0; i < w->iters; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    int slot = (int)(s % 4);
    if (held[slot]) {
      // Every byte must still carry this thread's stamp: any overlap with another block
      // that someone else stamped shows here.
      unsigned char *b = (unsigned char *)(uintptr_t)held[slot];
      for (size_t k = 0; k < sizes[slot]; k += 97)
        if (b[k] != (unsigned char)(w->id + 1)) {
          w->errors++;
          break;
        }
      if (cu.MemFree(held[slot]) != CUDA_SUCCESS) w->errors++;
      held[slot] = 0;
      continue;
    }
    size_t size = 1 + (size_t)((s >> 8) % w->max_size);
    CUresult r = cu.MemAlloc(&held[slot], size);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      w->ooms++;
      held[slot] = 0;
      continue;
    }
    if (r != CUDA_SUCCESS) {
      w->errors++;
      held[slot] = 0;
      continue;
    }
    sizes[slot] = size;
    w->ok++;
    CHECK(cu.MemsetD8(held[slot], (unsigned char)(w->id + 1), size));
  }
  for (int k = 0; k < 4; k++)
    if (held[k] && cu.MemFree(held[k]) != CUDA_SUCCESS) w->errors++;
  return NULL;
}

static int threads(int argc, char **argv) {
  int nt = argc > 0 ? atoi(argv[0]) : 16;
  int iters = argc > 1 ? atoi(argv[1]) : 2000;
  size_t max_size = argc > 2 ? strtoull(argv[2], NULL, 10) : (1 << 20);
  pthread_t th[64];
  struct worker w[64];
  if (nt > 64) nt = 64;
  for (int i = 0; i < nt; i++) {
    w[i] = (struct worker){i, iters, max_size, 0, 0, 0};
    pthread_create(&th[i], NULL, work, &w[i]);
  }
  long errors = 0, ooms = 0, ok = 0;
  for (int i = 0; i < nt; i++) {
    pthread_join(th[i], NULL);
    errors += w[i].errors, ooms += w[i].ooms, ok += w[i].ok;
  }
  printf("threads=%d ok=%ld errors=%ld ooms=%ld driver_peak=%zu\n", nt, ok, errors, ooms,
         fake_peak(dev));
  print_stats("end");
  return 0;
}

static int ctx(void) {
  CUdeviceptr p;
  // A primary context reset drops its blocks.
  CHECK(cu.MemAlloc(&p, 1 << 20));
  CHECK(cu.MemAlloc(&p, 2 << 20));
  print_stats("primary_held");
  CHECK(cu.PrimaryCtxReset(dev));
  print_stats("primary_reset");
  // A reset does not release: the reference from setup() is still held. Take a second one,
  // then release both; the last release destroys the context and its blocks.
  CHECK(cu.PrimaryCtxRetain(&primary, dev));
  CHECK(cu.CtxSetCurrent(primary));
  CHECK(cu.MemAlloc(&p, 1 << 20));
  CHECK(cu.PrimaryCtxRelease(dev)); // one left: still alive
  print_stats("primary_one_ref_left");
  CHECK(cu.PrimaryCtxRelease(dev)); // last: destroyed
  print_stats("primary_released");
  // A created context: destroy drops its blocks.
  if (cu.CtxCreate) {
    CUcontext c;
    CHECK(cu.CtxCreate(&c, 0, dev));
    CHECK(cu.MemAlloc(&p, 3 << 20));
    print_stats("created_held");
    CHECK(cu.CtxDestroy(c));
    print_stats("created_destroyed");
  }
  // Memory the driver still holds for the process: nothing of the dead contexts' pools (with
  // expandable segments, the mapped memory and the reserved range outlive a context unless
  // they are given back).
  size_t (*used)(int) = (size_t(*)(int))fake_fn("fakecu_used");
  size_t (*ranges)(void) = (size_t(*)(void))fake_fn("fakecu_reserved_ranges");
  printf("after_contexts used=%zu ranges=%zu\n", used ? used(dev) : 0, ranges ? ranges() : 0);
  // And the shim still works on a fresh context.
  CHECK(cu.PrimaryCtxRetain(&primary, dev));
  CHECK(cu.CtxSetCurrent(primary));
  CHECK(cu.MemAlloc(&p, 1 << 20));
  CHECK(cu.MemFree(p));
  print_stats("fresh");
  return 0;
}

static int pitch(void) {
  CUdeviceptr p;
  size_t row = 0;
  CHECK(cu.MemAllocPitch(&p, &row, 1000, 100, 4));
  printf("pitch=%zu\n", row);
  print_stats("pitched");
  CHECK(cu.MemFree(p));
  print_stats("freed");
  return 0;
}

static int range(void) {
  CUdeviceptr p, base = 0;
  size_t size = 0;
  CHECK(cu.MemAlloc(&p, 1 << 20));
  CHECK(cu.MemGetAddressRange(&base, &size, p + 100));
  printf("base_ok=%d size=%zu\n", base == p, size);
  CHECK(cu.MemFree(p));
  return 0;
}

static int legacy(void) {
  if (!cu.MemAlloc1 || !cu.MemFree1) {
    printf("legacy=absent\n");
    return 0;
  }
  unsigned p = 0;
  CHECK(cu.MemAlloc1(&p, 1 << 20));
  print_stats("legacy_held");
  CHECK(cu.MemFree1(p));
  print_stats("legacy_freed");
  return 0;
}

// Alloc+free pairs through whatever is preloaded: ns per pair on each thread, and the total.
struct pairs_arg {
  size_t size;
  long n;
  double ns;
};
static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}
static void *pairs_thread(void *arg) {
  struct pairs_arg *a = arg;
  CHECK(cu.CtxSetCurrent(primary));
  CUdeviceptr p;
  for (int i = 0; i < 1000; i++) {
    CHECK(cu.MemAlloc(&p, a->size));
    CHECK(cu.MemFree(p));
  }
  double t = now_ns();
  for (long i = 0; i < a->n; i++) {
    CHECK(cu.MemAlloc(&p, a->size));
    CHECK(cu.MemFree(p));
  }
  a->ns = (now_ns() - t) / a->n;
  return NULL;
}
static int pairs(int argc, char **argv) {
  size_t size = argc > 0 ? strtoull(argv[0], NULL, 10) : 4096;
  long n = argc > 1 ? atol(argv[1]) : 200000;
  int nt = argc > 2 ? atoi(argv[2]) : 1;
  pthread_t th[64];
  struct pairs_arg a[64];
  double t = now_ns();
  for (int i = 0; i < nt; i++) {
    a[i] = (struct pairs_arg){size, n, 0};
    pthread_create(&th[i], NULL, pairs_thread, &a[i]);
  }
  for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
  double wall = now_ns() - t;
  printf("pairs size=%zu threads=%d ns_per_pair=%.1f mpairs=%.3f\n", size, nt, a[0].ns,
         nt * n / wall * 1e3);
  return 0;
}

// Every way a thread changes its current context, each followed by an allocation that must land
// in the new context's device (the shim knows the context without asking the driver: issue 14).
// Prints "switch ok", or "switch WRONG" with the step.
static uint64_t requested_on(int d) {
  struct stats s;
  return shim_stats(d, &s) == 0 ? s.requested : 0;
}
// Allocates `size` in the current context: the device it landed on (whose requested bytes grew
// by `size`), or -1 - the error.
static int alloc_lands(size_t size) {
  uint64_t before[2] = {requested_on(0), requested_on(1)};
  CUdeviceptr p;
  CUresult r = cu.MemAlloc(&p, size);
  if (r != CUDA_SUCCESS) return -1 - (int)r;
  int d = requested_on(0) == before[0] + size ? 0 : requested_on(1) == before[1] + size ? 1 : 9;
  CHECK(cu.MemFree(p));
  return d;
}
static int switch_wrong;
static void expect(const char *step, int got, int want) {
  if (got != want) {
    printf("switch WRONG at %s: got %d, want %d\n", step, got, want);
    switch_wrong = 1;
  }
}
static CUcontext thread_ctx;
static int thread_got;
static void *switch_thread(void *arg) {
  (void)arg;
  CHECK(cu.CtxSetCurrent(thread_ctx));
  thread_got = alloc_lands(5000);
  return NULL;
}
static int switch_scenario(void) {
  CUcontext p0 = primary, p1, c, popped;
  CHECK(cu.PrimaryCtxRetain(&p1, 1));
  const int no_ctx = -1 - CUDA_ERROR_INVALID_CONTEXT;
  CHECK(cu.CtxSetCurrent(p1));
  expect("set p1", alloc_lands(1000), 1);
  CHECK(cu.CtxSetCurrent(p0));
  expect("set p0", alloc_lands(1100), 0);
  CHECK(cu.CtxPushCurrent(p1));
  expect("push p1", alloc_lands(1200), 1);
  CHECK(cu.CtxPopCurrent(&popped));
  expect("pop to p0", alloc_lands(1300), 0);
  CHECK(cu.CtxSetCurrent(p1));
  CHECK(cu.CtxPushCurrent(p0));
  expect("push p0 on p1", alloc_lands(1400), 0);
  CHECK(cu.CtxPopCurrent(&popped));
  expect("pop to p1", alloc_lands(1500), 1);
  // A failed set changes nothing, and the next allocation still knows where it is.
  expect("failed push", cu.CtxPushCurrent(NULL) != CUDA_SUCCESS, 1);
  expect("after failed push", alloc_lands(1600), 1);
  if (cu.CtxCreate) {
    // Created on device 0 while p1 is current: the new context is current.
    CHECK(cu.CtxCreate(&c, 0, 0));
    expect("create on 0", alloc_lands(1700), 0);
    CHECK(cu.CtxDestroy(c));
    expect("destroyed current", alloc_lands(1800), no_ctx);
  }
  CHECK(cu.CtxSetCurrent(p1));
  expect("set p1 again", alloc_lands(1900), 1);
  CHECK(cu.CtxSetCurrent(NULL));
  expect("set none", alloc_lands(2000), no_ctx);
  // Another thread's context is its own.
  CHECK(cu.CtxSetCurrent(p1));
  thread_ctx = p0;
  pthread_t t;
  pthread_create(&t, NULL, switch_thread, NULL);
  pthread_join(t, NULL);
  expect("other thread on p0", thread_got, 0);
  expect("this thread still on p1", alloc_lands(2100), 1);
  // A reset of the current primary context: the next allocation finds what the driver says.
  CHECK(cu.PrimaryCtxReset(1));
  CHECK(cu.PrimaryCtxRetain(&p1, 1));
  CHECK(cu.CtxSetCurrent(p1));
  expect("after reset", alloc_lands(2200), 1);
  printf("switch %s\n", switch_wrong ? "WRONG" : "ok");
  return switch_wrong;
}

// Leaves two allocations live at exit (CUDAPOOL_TRACK reports them) and writes a snapshot.
static __attribute__((noinline)) CUdeviceptr leaky_helper(size_t size) {
  CUdeviceptr p;
  CHECK(cu.MemAlloc(&p, size));
  return p;
}
#include "client_holding.c"
#include "trace.c"

int main(int argc, char **argv) {
  const char *slash = strrchr(argv[0], '/');
  me = slash ? slash + 1 : argv[0];
  if (argc < 3) {
    fprintf(stderr,
            "usage: %s link|dlsym|gpa|gpa-ptsz SCENARIO [args]\n"
            "  how it reaches the driver: linked, dlopen+dlsym, or cuGetProcAddress\n"
            "  SCENARIO: sample (the demo's workload), basic, limit, getinfo, threads, ctx, pitch,\n"
            "  range, legacy, pairs, ... (tests/c/client.c lists them all)\n"
            "  e.g. %s dlsym sample\n",
            me, me);
    return 2;
  }
  mode = argv[1];
  const char *scenario = argv[2];
  setvbuf(stdout, NULL, _IOLBF, 0);
  load();
  setup();
  if (!strcmp(scenario, "basic")) return basic();
  if (!strcmp(scenario, "limit")) return limit(argc - 3, argv + 3);
  if (!strcmp(scenario, "getinfo")) return getinfo();
  if (!strcmp(scenario, "bad")) return bad();
  if (!strcmp(scenario, "threads")) return threads(argc - 3, argv + 3);
  if (!strcmp(scenario, "ctx")) return ctx();
  if (!strcmp(scenario, "pitch")) return pitch();
  if (!strcmp(scenario, "range")) return range();
  if (!strcmp(scenario, "legacy")) return legacy();
  if (!strcmp(scenario, "sample")) return sample();
  if (!strcmp(scenario, "pairs")) return pairs(argc - 3, argv + 3);
  if (!strcmp(scenario, "ctxswitch")) return switch_scenario();
  if (!strcmp(scenario, "leak")) return leak(argc - 3, argv + 3);
  if (!strcmp(scenario, "hold")) return hold_memory(argc - 3, argv + 3);
  if (!strcmp(scenario, "park")) return park(argc - 3, argv + 3);
  if (!strcmp(scenario, "take")) return take(argc - 3, argv + 3);
  if (!strcmp(scenario, "cache")) return cache(argc - 3, argv + 3);
  if (!strcmp(scenario, "churn")) return churn(argc - 3, argv + 3);
  if (!strcmp(scenario, "timed")) return timed(argc - 3, argv + 3);
  int r = reuse_scenario(scenario, argc - 3, argv + 3);
  if (r >= 0) return r;
  r = lifetime_scenario(scenario, argc - 3, argv + 3);
  if (r >= 0) return r;
  r = capture_scenario(scenario, argc - 3, argv + 3);
  if (r >= 0) return r;
  r = sleep_scenario(scenario, argc - 3, argv + 3);
  if (r >= 0) return r;
  r = trace_scenario(scenario, argc - 3, argv + 3);
  if (r >= 0) return r;
  fprintf(stderr, "client: unknown scenario %s\n", scenario);
  return 2;
}
