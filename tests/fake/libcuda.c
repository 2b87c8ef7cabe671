// A fake libcuda.so.1 for testing cudapool without a GPU (DESIGN.md, test layer 2).
//
// Device memory is host memory. Devices: FAKECU_DEVICES (default 2), each with
// FAKECU_TOTAL_MEM bytes (default 1 GiB). Contexts are real objects with a per-thread current
// one, primary contexts with reference counts, and allocations that die with their context.
// Lifetimes are checked: a destroyed stream, event or context passed to any entry point aborts
// the process, naming the call (the real driver crashes; see "lifetimes" below).
// cuGetProcAddress/_v2 answer by base name, cudaVersion and flags the way the real driver does.
// Every entry point counts its calls: fakecu_calls("cuMemAlloc_v2").
//
// Build: cc -shared -fPIC -Wl,-Bsymbolic -O1 -o libcuda.so.1 libcuda.c -lpthread
// (-Bsymbolic as in the real driver: its own references never bind to a preloaded symbol.)
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct fake_ctx *CUcontext;

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_SUPPORTED = 801,
};

#define MAX_DEV 8
#define MAX_COUNTED 128

struct fake_ctx {
  int live;
  int dev;
  int primary;
};

struct fake_pool;
struct alloc {
  CUdeviceptr ptr;
  size_t size;   // the device memory it takes
  size_t mapped; // host bytes behind it
  struct fake_ctx *ctx;
  int low; // from mmap(MAP_32BIT), legacy v1
  struct alloc *next;
  struct fake_pool *pool; // from a driver pool (size 0: the pool's reserve holds the memory)
  size_t pool_bytes;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static int ndev = 2;
static size_t total_mem = (size_t)1 << 30;
static size_t used[MAX_DEV], peak[MAX_DEV];
static struct fake_ctx *primary[MAX_DEV];
static int primary_refs[MAX_DEV];
static struct alloc *allocs;
static __thread struct fake_ctx *current;
// Modelled device time, in ns (see "streams, events, modelled device work" below).
typedef unsigned long long ns_t;
static ns_t dev_now; // device time that has passed
static ns_t max2(ns_t a, ns_t b) { return a > b ? a : b; }

// Calls are counted per name literal, lock-free (the pointer of the literal is the key), so the
// fake costs little in benchmarks of the shim in front of it.
static struct {
  const char *_Atomic name;
  _Atomic long n;
} counted[MAX_COUNTED];

static void count(const char *name) {
  for (int i = 0; i < MAX_COUNTED; i++) {
    const char *seen = counted[i].name;
    if (!seen) {
      const char *expected = NULL;
      if (!__atomic_compare_exchange_n(&counted[i].name, &expected, name, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE))
        seen = expected;
      else
        seen = name;
    }
    if (seen == name) {
      counted[i].n++;
      return;
    }
  }
}

// ---- what tests read -------------------------------------------------------------------
long fakecu_calls(const char *name) {
  for (int i = 0; i < MAX_COUNTED && counted[i].name; i++)
    if (!strcmp(counted[i].name, name)) return counted[i].n;
  return 0;
}
size_t fakecu_used(int dev) { return dev >= 0 && dev < MAX_DEV ? used[dev] : 0; }
size_t fakecu_peak(int dev) { return dev >= 0 && dev < MAX_DEV ? peak[dev] : 0; }

// ---- devices and contexts -------------------------------------------------------------
CUresult cuInit(unsigned flags) {
  count("cuInit");
  if (flags) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  const char *d = getenv("FAKECU_DEVICES"), *m = getenv("FAKECU_TOTAL_MEM");
  if (d) ndev = atoi(d) > 0 && atoi(d) <= MAX_DEV ? atoi(d) : 1;
  if (m) total_mem = strtoull(m, NULL, 10);
  initialized = 1;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *v) {
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  *v = 12080;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
  count("cuDeviceGetCount");
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  *n = ndev;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
  count("cuDeviceGet");
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= ndev) return CUDA_ERROR_INVALID_DEVICE;
  *dev = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
  count("cuDeviceTotalMem_v2");
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = total_mem;
  return CUDA_SUCCESS;
}

// ---- lifetimes ----------------------------------------------------------------------------
// The real driver does not check a handle the program destroyed (a stream, an event, a
// context): it crashes, or worse. The fake never frees or reuses the objects behind its
// handles, so a destroyed one stays recognisable, and aborts, naming the call, when one comes
// back. Streams and events die with their context. A primary context keeps its handle across a
// reset (as on the real driver): used while inactive, it gets an error, not an abort.
static void destroyed(const char *api, const char *what, const void *h) {
  fprintf(stderr, "fakecu: %s was passed a destroyed %s (%p)\n", api, what, h);
  fflush(stderr);
  abort();
}
#define CTX_ALIVE(c, api) \
  do { if ((c) && !(c)->primary && !(c)->live) destroyed(api, "context", (c)); } while (0)

// Each device's UUID: fa ce 00 <physical index> ... . FAKECU_DEVICE_ORDER=1,0 makes ordinal 0
// the physical device 1 (as CUDA_VISIBLE_DEVICES reorders a real machine's GPUs).
CUresult cuDeviceGetUuid_v2(unsigned char *uuid, CUdevice dev) {
  count("cuDeviceGetUuid_v2");
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
  int physical = dev;
  const char *order = getenv("FAKECU_DEVICE_ORDER");
  for (int i = 0; order && *order; i++) {
    int p = atoi(order);
    if (i == dev) physical = p;
    order = strchr(order, ',');
    if (order) order++;
  }
  memset(uuid, 0, 16);
  uuid[0] = 0xfa, uuid[1] = 0xce, uuid[3] = (unsigned char)physical;
  for (int i = 4; i < 16; i++) uuid[i] = (unsigned char)(0x11 * (i - 3) + physical);
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetUuid(unsigned char *uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

static struct fake_ctx *new_ctx(int dev, int is_primary) {
  struct fake_ctx *c = calloc(1, sizeof *c);
  if (c) *c = (struct fake_ctx){1, dev, is_primary};
  return c;
}

static void kill_objects_of(struct fake_ctx *ctx);
static ns_t all_end(void);
// Frees every allocation of ctx, its streams and events, and the context itself. Caller holds
// mu.
static void kill_ctx(struct fake_ctx *ctx) {
  struct alloc **pp = &allocs;
  while (*pp) {
    struct alloc *a = *pp;
    if (a->ctx == ctx) {
      *pp = a->next;
      used[ctx->dev] -= a->size;
      munmap((void *)(uintptr_t)a->ptr, a->mapped);
      free(a);
    } else {
      pp = &a->next;
    }
  }
  kill_objects_of(ctx);
  ctx->live = 0;
  // A context's teardown waits for its work (the device's time moves past it): its memory may
  // come back in a new allocation at once without overlapping the dead context's work.
  dev_now = max2(dev_now, all_end());
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned flags, CUdevice dev) {
  (void)flags;
  count("cuCtxCreate_v2");
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&mu);
  struct fake_ctx *c = new_ctx(dev, 0);
  pthread_mutex_unlock(&mu);
  if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
  *pctx = c;
  current = c;
  return CUDA_SUCCESS;
}

static CUresult ctx_destroy(CUcontext ctx, const char *api) {
  CTX_ALIVE(ctx, api);
  if (!ctx || !ctx->live || ctx->primary) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  kill_ctx(ctx);
  pthread_mutex_unlock(&mu);
  if (current == ctx) current = NULL;
  return CUDA_SUCCESS;
}
CUresult cuCtxDestroy_v2(CUcontext ctx) { count("cuCtxDestroy_v2"); return ctx_destroy(ctx, "cuCtxDestroy_v2"); }
CUresult cuCtxDestroy(CUcontext ctx) { count("cuCtxDestroy"); return ctx_destroy(ctx, "cuCtxDestroy"); }

CUresult cuCtxSetCurrent(CUcontext ctx) {
  count("cuCtxSetCurrent");
  CTX_ALIVE(ctx, "cuCtxSetCurrent");
  if (ctx && !ctx->live) return CUDA_ERROR_INVALID_CONTEXT;
  current = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
  count("cuCtxGetCurrent");
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = current && current->live ? current : NULL;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *dev) {
  count("cuCtxGetDevice");
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  if (!current || !current->live) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = current->dev;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  count("cuDevicePrimaryCtxRetain");
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&mu);
  if (!primary[dev]) primary[dev] = new_ctx(dev, 1);
  primary[dev]->live = 1; // the same handle, active again after a reset
  primary_refs[dev]++;
  *pctx = primary[dev];
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}

static CUresult primary_release(CUdevice dev) {
  if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&mu);
  CUresult r = CUDA_SUCCESS;
  if (primary_refs[dev] <= 0) {
    r = CUDA_ERROR_INVALID_CONTEXT;
  } else if (--primary_refs[dev] == 0 && primary[dev] && primary[dev]->live) {
    kill_ctx(primary[dev]);
  }
  pthread_mutex_unlock(&mu);
  return r;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { count("cuDevicePrimaryCtxRelease_v2"); return primary_release(dev); }
CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { count("cuDevicePrimaryCtxRelease"); return primary_release(dev); }

// As the real driver: a reset destroys the context and its memory but does not release it;
// references taken before it must still be released.
static CUresult primary_reset(CUdevice dev) {
  if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&mu);
  if (primary[dev] && primary[dev]->live) kill_ctx(primary[dev]);
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) { count("cuDevicePrimaryCtxReset_v2"); return primary_reset(dev); }
CUresult cuDevicePrimaryCtxReset(CUdevice dev) { count("cuDevicePrimaryCtxReset"); return primary_reset(dev); }

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned *flags, int *active) {
  count("cuDevicePrimaryCtxGetState");
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&mu);
  *flags = 0;
  *active = primary[dev] && primary[dev]->live && primary_refs[dev] > 0;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}

// ---- memory ----------------------------------------------------------------------------
static CUresult do_alloc(CUdeviceptr *out, size_t size, int low) {
  if (!out || size == 0) return CUDA_ERROR_INVALID_VALUE;
  struct fake_ctx *ctx = current;
  if (!ctx || !ctx->live) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  if (used[ctx->dev] + size > total_mem) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  size_t mapped = (size + 4095) & ~(size_t)4095;
  void *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | (low ? MAP_32BIT : 0), -1, 0);
  if (p == MAP_FAILED) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  struct alloc *a = malloc(sizeof *a);
  *a = (struct alloc){(CUdeviceptr)(uintptr_t)p, size, mapped, ctx, low, allocs, NULL, 0};
  allocs = a;
  used[ctx->dev] += size;
  if (used[ctx->dev] > peak[ctx->dev]) peak[ctx->dev] = used[ctx->dev];
  pthread_mutex_unlock(&mu);
  *out = a->ptr;
  return CUDA_SUCCESS;
}

static void pool_unuse(struct fake_pool *pool, size_t bytes);
static CUresult do_free(CUdeviceptr ptr) {
  pthread_mutex_lock(&mu);
  for (struct alloc **pp = &allocs; *pp; pp = &(*pp)->next) {
    struct alloc *a = *pp;
    if (a->ptr == ptr) {
      *pp = a->next;
      used[a->ctx->dev] -= a->size;
      if (a->pool) pool_unuse(a->pool, a->pool_bytes);
      munmap((void *)(uintptr_t)a->ptr, a->mapped);
      free(a);
      pthread_mutex_unlock(&mu);
      return CUDA_SUCCESS;
    }
  }
  pthread_mutex_unlock(&mu);
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
  count("cuMemAlloc_v2");
  return do_alloc(dptr, size, 0);
}

static ns_t all_end(void);
CUresult cuMemFree_v2(CUdeviceptr ptr) {
  count("cuMemFree_v2");
  // The real cuMemFree waits for the device.
  pthread_mutex_lock(&mu);
  dev_now = max2(dev_now, all_end());
  pthread_mutex_unlock(&mu);
  return do_free(ptr);
}

// Legacy 32-bit entry points: addresses below 4 GiB.
CUresult cuMemAlloc(unsigned *dptr, unsigned size) {
  count("cuMemAlloc");
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr p;
  CUresult r = do_alloc(&p, size, 1);
  if (r == CUDA_SUCCESS) *dptr = (unsigned)p;
  return r;
}

CUresult cuMemFree(unsigned ptr) {
  count("cuMemFree");
  return do_free(ptr);
}

static size_t pitch_of(size_t width) { return (width + 511) & ~(size_t)511; }

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                            unsigned elem) {
  count("cuMemAllocPitch_v2");
  if (!dptr || !pitch || !width || !height || (elem != 4 && elem != 8 && elem != 16))
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = do_alloc(dptr, pitch_of(width) * height, 0);
  if (r == CUDA_SUCCESS) *pitch = pitch_of(width);
  return r;
}

CUresult cuMemAllocPitch(unsigned *dptr, unsigned *pitch, unsigned width, unsigned height,
                         unsigned elem) {
  count("cuMemAllocPitch");
  if (!dptr || !pitch || !width || !height || (elem != 4 && elem != 8 && elem != 16))
    return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr p;
  CUresult r = do_alloc(&p, pitch_of(width) * height, 1);
  if (r == CUDA_SUCCESS) {
    *dptr = (unsigned)p;
    *pitch = (unsigned)pitch_of(width);
  }
  return r;
}

// As the real driver (seen on an H100, driver 580): a NULL out-pointer is skipped, not refused.
static CUresult get_info(size_t *free_b, size_t *total_b) {
  if (!current || !current->live) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  if (free_b) *free_b = total_mem - used[current->dev];
  if (total_b) *total_b = total_mem;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
  count("cuMemGetInfo_v2");
  return get_info(free_b, total_b);
}

CUresult cuMemGetInfo(unsigned *free_b, unsigned *total_b) {
  count("cuMemGetInfo");
  size_t f, t;
  CUresult r = get_info(&f, &t);
  if (r == CUDA_SUCCESS) {
    if (free_b) *free_b = f > 0xffffffffu ? 0xffffffffu : (unsigned)f;
    if (total_b) *total_b = t > 0xffffffffu ? 0xffffffffu : (unsigned)t;
  }
  return r;
}

// Pinned host memory (cuMemHostAlloc): with unified addressing its device pointer is its host
// address, and the driver's address queries describe it like any allocation.
struct ipc_handle {
  unsigned char bytes[64];
};
#define MAX_HOST 64
static struct {
  void *p;
  size_t size;
} host_allocs[MAX_HOST];

// The allocation (device or pinned host) holding ptr: its start and size; 0 if none. Under mu.
static int find_range(CUdeviceptr ptr, CUdeviceptr *base, size_t *size) {
  for (struct alloc *a = allocs; a; a = a->next)
    if (ptr >= a->ptr && ptr < a->ptr + a->size) {
      *base = a->ptr, *size = a->size;
      return 1;
    }
  for (int i = 0; i < MAX_HOST; i++) {
    CUdeviceptr h = (CUdeviceptr)(uintptr_t)host_allocs[i].p;
    if (h && ptr >= h && ptr < h + host_allocs[i].size) {
      *base = h, *size = host_allocs[i].size;
      return 2;
    }
  }
  return 0;
}

// A memset or copy of n bytes at p that starts inside an allocation must end inside it, as the
// real driver checks (CUDA_ERROR_INVALID_VALUE otherwise).
static int overruns(CUdeviceptr p, size_t n) {
  CUdeviceptr b;
  size_t s;
  pthread_mutex_lock(&mu);
  int found = find_range(p, &b, &s);
  pthread_mutex_unlock(&mu);
  return found && p + n > b + s;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
  count("cuMemGetAddressRange_v2");
  CUdeviceptr b;
  size_t s;
  pthread_mutex_lock(&mu);
  int found = find_range(ptr, &b, &s);
  pthread_mutex_unlock(&mu);
  if (!found) return CUDA_ERROR_NOT_FOUND;
  if (base) *base = b;
  if (size) *size = s;
  return CUDA_SUCCESS;
}

// CU_POINTER_ATTRIBUTE_*: CONTEXT 1, MEMORY_TYPE 2 (host 1, device 2), RANGE_START_ADDR 11,
// RANGE_SIZE 12. Others are not modelled.
static CUresult pointer_attribute(void *data, int attr, CUdeviceptr ptr) {
  CUdeviceptr b;
  size_t s;
  pthread_mutex_lock(&mu);
  int found = find_range(ptr, &b, &s);
  pthread_mutex_unlock(&mu);
  if (!found) return CUDA_ERROR_INVALID_VALUE;
  switch (attr) {
  case 2: *(unsigned *)data = found == 1 ? 2 : 1; return CUDA_SUCCESS;
  case 11: *(CUdeviceptr *)data = b; return CUDA_SUCCESS;
  case 12: *(size_t *)data = s; return CUDA_SUCCESS;
  default: return CUDA_ERROR_NOT_SUPPORTED;
  }
}
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr ptr) {
  count("cuPointerGetAttribute");
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  return pointer_attribute(data, attr, ptr);
}
// Unlike the singular form, an address that is not allocated gets success: its memory type
// reads 0 and its range entries are left as they were (as the real driver does).
CUresult cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr ptr) {
  count("cuPointerGetAttributes");
  if (!attrs || !data) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < n; i++) {
    if (!data[i]) continue;
    if (pointer_attribute(data[i], attrs[i], ptr) == CUDA_ERROR_INVALID_VALUE && attrs[i] == 2)
      *(unsigned *)data[i] = 0;
  }
  return CUDA_SUCCESS;
}
// A legacy IPC handle names a whole device allocation: the importer maps it from its start.
CUresult cuIpcGetMemHandle(void *handle, CUdeviceptr ptr) {
  count("cuIpcGetMemHandle");
  CUdeviceptr b;
  size_t s;
  pthread_mutex_lock(&mu);
  int found = find_range(ptr, &b, &s);
  pthread_mutex_unlock(&mu);
  if (!handle || found != 1) return CUDA_ERROR_INVALID_VALUE;
  memset(handle, 0, 64);
  memcpy(handle, &b, sizeof b);
  memcpy((char *)handle + 8, &s, sizeof s);
  return CUDA_SUCCESS;
}

// Opening maps the whole allocation from its start. The fake shares one address space, so an
// open (allowed here in the exporting process itself) returns the allocation's own address.
// Stricter than the driver: a handle whose last 8 bytes are not zero is refused, so that a
// shim that leaves its own bytes in a handle is caught.
static int ipc_opens;
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, struct ipc_handle h, unsigned flags) {
  (void)flags;
  count("cuIpcOpenMemHandle_v2");
  CUdeviceptr b, found_b;
  size_t s, found_s;
  memcpy(&b, h.bytes, sizeof b);
  memcpy(&s, h.bytes + 8, sizeof s);
  for (int i = 56; i < 64; i++)
    if (h.bytes[i]) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&mu);
  int found = find_range(b, &found_b, &found_s);
  if (found == 1 && found_b == b && found_s == s) ipc_opens++;
  pthread_mutex_unlock(&mu);
  if (!p || found != 1 || found_b != b || found_s != s) return CUDA_ERROR_INVALID_HANDLE;
  *p = b;
  return CUDA_SUCCESS;
}
CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  count("cuIpcCloseMemHandle");
  CUdeviceptr b;
  size_t s;
  pthread_mutex_lock(&mu);
  int ok = find_range(p, &b, &s) == 1 && b == p && ipc_opens > 0;
  if (ok) ipc_opens--;
  pthread_mutex_unlock(&mu);
  return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
// Opens not yet closed.
int fakecu_ipc_opens(void) { return ipc_opens; }

CUresult cuMemGetAddressRange(unsigned *base, unsigned *size, unsigned ptr) {
  count("cuMemGetAddressRange");
  CUdeviceptr b;
  size_t s;
  CUresult r = cuMemGetAddressRange_v2(&b, &s, ptr);
  if (r == CUDA_SUCCESS) {
    if (base) *base = (unsigned)b;
    if (size) *size = (unsigned)s;
  }
  return r;
}

// ---- streams, events, modelled device work, graph capture --------------------------------
// CUstream: NULL or 0x1 = legacy, 0x2 = per-thread default, else a struct fake_stream.
//
// A GPU that lags the CPU. Device time (ns) is modelled: every work submission costs the CPU
// FAKECU_HOST_NS of it (default 1000), so device time passes as the program issues work; a
// kernel takes its grid's x dimension in microseconds. Work starts when its stream is free, after
// what the stream waits for (cuStreamWaitEvent), and with the driver's rules for the legacy
// stream: legacy work waits for all earlier work of blocking and per-thread streams, and those
// wait for earlier legacy work. Non-blocking streams wait for nothing but their own. An event
// completes when the work recorded before it has; synchronizing calls (cuEventSynchronize,
// cuStreamSynchronize, cuCtxSynchronize, cuMemFree, synchronous copies to the host) move device
// time forward to what they wait for. Nothing else does: while the program only issues work,
// the GPU stays behind.
//
// A race detector: every piece of work that touches device memory (a FAKECU_TOUCH kernel, a
// memset, a copy) is remembered with its device-time interval and address range; new work on
// an overlapping range that starts before earlier work has ended ran concurrently with it:
// fakecu_races() counts those. A pool that hands out a block while earlier work on another
// queue still uses it makes them.
//
// A "hold" is work that runs until the test finishes it (FAKECU_HOLD kernels, fakecu_hold()):
// events and stream queries wait for the holds their stream must wait for.
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_STREAM_CAPTURE_IMPLICIT 906
#define MAX_HOLDS 1024
#define EVENT_HOLDS 64
#define FAKECU_HOLD ((void *)0x401)
#define FAKECU_TOUCH ((void *)0x402)

struct fake_stream {
  int live;
  unsigned flags;
  struct fake_ctx *ctx;
  int capturing;
  int nwaits;
  int waits[EVENT_HOLDS]; // holds this stream's later work waits for (cuStreamWaitEvent)
  ns_t busy;              // when its last work ends
  ns_t wait_until;        // its next work starts no earlier (cuStreamWaitEvent)
  struct fake_stream *next; // every stream ever made (never freed: see "lifetimes")
};
struct fake_hold {
  int live;
  void *stream;
  int nonblocking;
};
struct fake_event {
  int live;
  struct fake_ctx *ctx; // the context it was created in
  int n;
  int holds[EVENT_HOLDS];
  ns_t at; // complete at this device time
  struct fake_event *next; // every event ever made (never freed)
};
static struct fake_stream *all_streams;
static struct fake_hold holds[MAX_HOLDS];
static struct fake_event *all_events;

// A stream or event the program destroyed (or whose context died) aborts the process.
static void stream_alive(void *s, const char *api) {
  if ((uintptr_t)s > 2 && !((struct fake_stream *)s)->live) destroyed(api, "stream", s);
}
static void event_alive(void *e, const char *api) {
  if (e && !((struct fake_event *)e)->live) destroyed(api, "event", e);
}
// Called with mu held, as a context dies.
static void kill_objects_of(struct fake_ctx *ctx) {
  for (struct fake_stream *st = all_streams; st; st = st->next)
    if (st->ctx == ctx) st->live = 0;
  for (struct fake_event *ev = all_events; ev; ev = ev->next)
    if (ev->ctx == ctx) ev->live = 0;
}
static int capturing_now;
static long capture_violations;
static long last_hold = -1;

static ns_t host_ns = 1000; // FAKECU_HOST_NS
static ns_t legacy_busy, legacy_wait;
static int legacy_nwaits, legacy_waits[EVENT_HOLDS]; // holds the legacy stream's later work waits for
static ns_t blocking_busy; // the end of all work of the legacy, blocking and per-thread streams
static __thread ns_t ptsz_busy, ptsz_wait;
static long races, works;
#define WORKS 4096
static struct {
  ns_t start, end;
  unsigned long long lo, hi;
} recent[WORKS];

static int is_legacy(void *s, int ptsz) { return (uintptr_t)s == 1 || (!s && !ptsz); }
static int is_ptsz(void *s, int ptsz) { return (uintptr_t)s == 2 || (!s && ptsz); }

static int is_nonblocking(void *s) {
  if ((uintptr_t)s <= 2) return 0;
  return (((struct fake_stream *)s)->flags & 1) != 0;
}

// When the work issued so far on stream s has ended (mu held).
static ns_t stream_end(void *s, int ptsz) {
  if (is_legacy(s, ptsz)) return blocking_busy;
  if (is_ptsz(s, ptsz)) return max2(ptsz_busy, legacy_busy);
  struct fake_stream *st = s;
  ns_t t = max2(st->busy, st->wait_until);
  return is_nonblocking(s) ? t : max2(t, legacy_busy);
}

// Issues work of `dur` ns on s touching [lo, lo + bytes) (bytes 0: none); returns its end.
// mu held.
static ns_t submit(void *s, int ptsz, ns_t dur, unsigned long long lo, size_t bytes) {
  dev_now += host_ns;
  ns_t start = dev_now, end;
  if (is_legacy(s, ptsz)) {
    start = max2(max2(start, blocking_busy), legacy_wait);
    end = legacy_busy = start + dur;
  } else if (is_ptsz(s, ptsz)) {
    start = max2(max2(start, ptsz_busy), max2(legacy_busy, ptsz_wait));
    end = ptsz_busy = start + dur;
  } else {
    struct fake_stream *st = s;
    start = max2(max2(start, st->busy), st->wait_until);
    if (!is_nonblocking(s)) start = max2(start, legacy_busy);
    end = st->busy = start + dur;
  }
  if (!is_nonblocking(s)) blocking_busy = max2(blocking_busy, end);
  if (bytes) {
    unsigned long long hi = lo + bytes;
    long n = works < WORKS ? works : WORKS;
    for (long i = 0; i < n; i++)
      if (recent[i].lo < hi && lo < recent[i].hi && recent[i].end > start && recent[i].start < end)
        races++;
    recent[works % WORKS].start = start;
    recent[works % WORKS].end = end;
    recent[works % WORKS].lo = lo;
    recent[works % WORKS].hi = hi;
    works++;
  }
  return end;
}

static ns_t copy_ns(size_t bytes) { return 1000 + bytes / 100; } // ~100 GB/s

static void init_time(void) {
  static int done;
  if (done) return;
  done = 1;
  const char *h = getenv("FAKECU_HOST_NS");
  if (h) host_ns = strtoull(h, NULL, 10);
}

static CUresult work(void *s, int ptsz, ns_t dur, unsigned long long lo, size_t bytes, int sync) {
  stream_alive(s, "a work call");
  pthread_mutex_lock(&mu);
  init_time();
  ns_t end = submit(s, ptsz, dur, lo, bytes);
  if (sync) dev_now = max2(dev_now, end);
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}

// Memsets and copies do their work on host memory at once; their modelled work is what the
// race detector and the clock see.
#define MEMSET(name, T, ptsz, sync)                                                             \
  CUresult name(CUdeviceptr p, T v, size_t n) {                                               \
    count(#name);                                                                             \
    if (overruns(p, n * sizeof(T))) return CUDA_ERROR_INVALID_VALUE;                          \
    for (size_t i = 0; i < n; i++) ((T *)(uintptr_t)p)[i] = v;                                \
    return work(NULL, ptsz, copy_ns(n * sizeof(T)), p, n * sizeof(T), sync);                  \
  }
#define MEMSET_ASYNC(name, T, ptsz)                                                             \
  CUresult name(CUdeviceptr p, T v, size_t n, void *s) {                                      \
    count(#name);                                                                             \
    if (overruns(p, n * sizeof(T))) return CUDA_ERROR_INVALID_VALUE;                          \
    for (size_t i = 0; i < n; i++) ((T *)(uintptr_t)p)[i] = v;                                \
    return work(s, ptsz, copy_ns(n * sizeof(T)), p, n * sizeof(T), 0);                        \
  }
MEMSET(cuMemsetD8_v2, unsigned char, 0, 0)
MEMSET(cuMemsetD8_v2_ptds, unsigned char, 1, 0)
MEMSET(cuMemsetD32_v2, unsigned, 0, 0)
MEMSET_ASYNC(cuMemsetD8Async, unsigned char, 0)
MEMSET_ASYNC(cuMemsetD8Async_ptsz, unsigned char, 1)
MEMSET_ASYNC(cuMemsetD32Async, unsigned, 0)

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
  count("cuMemcpyHtoD_v2");
  memcpy((void *)(uintptr_t)dst, src, n);
  return work(NULL, 0, copy_ns(n), dst, n, 1);
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
  count("cuMemcpyDtoH_v2");
  memcpy(dst, (void *)(uintptr_t)src, n);
  return work(NULL, 0, copy_ns(n), src, n, 1);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s) {
  count("cuMemcpyDtoDAsync_v2");
  memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
  return work(s, 0, copy_ns(n), dst, n, 0); // the race detector watches the destination
}

static CUresult hold_on(void *stream);
static CUresult launch(void *f, unsigned gx, void *s, void **params, int ptsz) {
  if (f == FAKECU_HOLD) return hold_on(ptsz && !s ? (void *)2 : s);
  unsigned long long lo = 0;
  size_t bytes = 0;
  if (f == FAKECU_TOUCH && params && params[0] && params[1]) {
    lo = *(CUdeviceptr *)params[0];
    bytes = *(size_t *)params[1];
  }
  return work(s, ptsz, (ns_t)gx * 1000, lo, bytes, 0);
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shmem, void *s, void **params, void **extra) {
  (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)extra;
  count("cuLaunchKernel");
  return launch(f, gx, s, params, 0);
}
CUresult cuLaunchKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned shmem, void *s, void **params,
                             void **extra) {
  (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)extra;
  count("cuLaunchKernel_ptsz");
  return launch(f, gx, s, params, 1);
}

static CUresult stream_create(void **ps, unsigned flags) {
  if (!ps) return CUDA_ERROR_INVALID_VALUE;
  if (!current || !current->live) return CUDA_ERROR_INVALID_CONTEXT;
  struct fake_stream *st = calloc(1, sizeof *st);
  if (!st) return CUDA_ERROR_OUT_OF_MEMORY;
  st->live = 1, st->flags = flags, st->ctx = current;
  pthread_mutex_lock(&mu);
  st->next = all_streams;
  all_streams = st;
  pthread_mutex_unlock(&mu);
  *ps = st;
  return CUDA_SUCCESS;
}
CUresult cuStreamCreate(void **ps, unsigned flags) { count("cuStreamCreate"); return stream_create(ps, flags); }
CUresult cuStreamCreateWithPriority(void **ps, unsigned flags, int prio) {
  (void)prio;
  count("cuStreamCreateWithPriority");
  return stream_create(ps, flags);
}
static CUresult stream_destroy(void *s, const char *api) {
  stream_alive(s, api);
  if ((uintptr_t)s <= 2) return CUDA_ERROR_INVALID_VALUE;
  ((struct fake_stream *)s)->live = 0; // its work keeps running, as on a real device
  return CUDA_SUCCESS;
}
CUresult cuStreamDestroy_v2(void *s) { count("cuStreamDestroy_v2"); return stream_destroy(s, "cuStreamDestroy_v2"); }
CUresult cuStreamDestroy(void *s) { count("cuStreamDestroy"); return stream_destroy(s, "cuStreamDestroy"); }
CUresult cuStreamGetCtx(void *s, CUcontext *pctx) {
  count("cuStreamGetCtx");
  stream_alive(s, "cuStreamGetCtx");
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if ((uintptr_t)s <= 2) {
    *pctx = current;
    return current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  }
  *pctx = ((struct fake_stream *)s)->ctx;
  return CUDA_SUCCESS;
}
static CUresult begin_capture(void *s) {
  stream_alive(s, "cuStreamBeginCapture");
  if ((uintptr_t)s <= 2) return CUDA_ERROR_INVALID_VALUE; // legacy cannot capture
  pthread_mutex_lock(&mu);
  ((struct fake_stream *)s)->capturing = 1;
  capturing_now++;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuStreamBeginCapture_v2(void *s, int mode) { (void)mode; count("cuStreamBeginCapture_v2"); return begin_capture(s); }
CUresult cuStreamBeginCapture_v2_ptsz(void *s, int mode) { (void)mode; count("cuStreamBeginCapture_v2_ptsz"); return begin_capture(s); }
static CUresult end_capture(void *s, void **graph) {
  stream_alive(s, "cuStreamEndCapture");
  if ((uintptr_t)s <= 2 || !((struct fake_stream *)s)->capturing) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  ((struct fake_stream *)s)->capturing = 0;
  capturing_now--;
  pthread_mutex_unlock(&mu);
  if (graph) *graph = (void *)0x6a;
  return CUDA_SUCCESS;
}
CUresult cuStreamEndCapture(void *s, void **graph) { count("cuStreamEndCapture"); return end_capture(s, graph); }
CUresult cuStreamEndCapture_ptsz(void *s, void **graph) { count("cuStreamEndCapture_ptsz"); return end_capture(s, graph); }
CUresult cuStreamIsCapturing(void *s, int *status) {
  count("cuStreamIsCapturing");
  stream_alive(s, "cuStreamIsCapturing");
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  *status = (uintptr_t)s > 2 && ((struct fake_stream *)s)->capturing ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult cuEventCreate(void **pe, unsigned flags) {
  (void)flags;
  count("cuEventCreate");
  if (!pe) return CUDA_ERROR_INVALID_VALUE;
  if (!current || !current->live) return CUDA_ERROR_INVALID_CONTEXT;
  struct fake_event *ev = calloc(1, sizeof *ev);
  if (!ev) return CUDA_ERROR_OUT_OF_MEMORY;
  ev->live = 1, ev->ctx = current;
  pthread_mutex_lock(&mu);
  ev->next = all_events;
  all_events = ev;
  pthread_mutex_unlock(&mu);
  *pe = ev;
  return CUDA_SUCCESS;
}
static CUresult event_record(void *e, void *s, int ptsz) {
  struct fake_event *ev = e;
  event_alive(e, "cuEventRecord");
  stream_alive(s, "cuEventRecord");
  if (!ev) return CUDA_ERROR_INVALID_VALUE;
  // As the real driver: the event and the stream must be of one context.
  struct fake_ctx *sctx = (uintptr_t)s > 2 ? ((struct fake_stream *)s)->ctx : current;
  if (!sctx || !sctx->live) return CUDA_ERROR_INVALID_CONTEXT;
  if (sctx != ev->ctx) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&mu);
  if (capturing_now && is_legacy(s, ptsz)) {
    // The real driver refuses, and the capture elsewhere is ruined.
    capture_violations++;
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  ev->n = 0;
  int nb = is_nonblocking(s);
  for (int i = 0; i < MAX_HOLDS && ev->n < EVENT_HOLDS; i++) {
    if (!holds[i].live) continue;
    if (nb ? holds[i].stream == s : !holds[i].nonblocking) ev->holds[ev->n++] = i;
  }
  ev->at = stream_end(s, ptsz);
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuEventRecord(void *e, void *s) { count("cuEventRecord"); return event_record(e, s, 0); }
CUresult cuEventRecord_ptsz(void *e, void *s) { count("cuEventRecord_ptsz"); return event_record(e, s, 1); }
static int event_done(struct fake_event *ev) {
  for (int i = 0; i < ev->n; i++)
    if (holds[ev->holds[i]].live) return 0;
  return ev->at <= dev_now;
}
static CUresult stream_wait_event(void *s, void *e, int ptsz) {
  struct fake_event *ev = e;
  event_alive(e, "cuStreamWaitEvent");
  stream_alive(s, "cuStreamWaitEvent");
  if (!ev) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  if (is_legacy(s, ptsz)) {
    for (int i = 0; i < ev->n && legacy_nwaits < EVENT_HOLDS; i++) legacy_waits[legacy_nwaits++] = ev->holds[i];
    legacy_wait = max2(legacy_wait, ev->at);
  } else if (is_ptsz(s, ptsz)) {
    ptsz_wait = max2(ptsz_wait, ev->at);
  } else {
    struct fake_stream *st = s;
    for (int i = 0; i < ev->n && st->nwaits < EVENT_HOLDS; i++) st->waits[st->nwaits++] = ev->holds[i];
    st->wait_until = max2(st->wait_until, ev->at);
  }
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) {
  (void)flags;
  count("cuStreamWaitEvent");
  return stream_wait_event(s, e, 0);
}
CUresult cuStreamWaitEvent_ptsz(void *s, void *e, unsigned flags) {
  (void)flags;
  count("cuStreamWaitEvent_ptsz");
  return stream_wait_event(s, e, 1);
}

// Whether work issued on stream s from now on waits for hold h (tests read it).
int fakecu_stream_waits_for(void *s, long h) {
  if ((uintptr_t)s == 1) {
    for (int i = 0; i < legacy_nwaits; i++)
      if (legacy_waits[i] == h) return 1;
    return 0;
  }
  if ((uintptr_t)s <= 2) return 0;
  struct fake_stream *st = s;
  for (int i = 0; i < st->nwaits; i++)
    if (st->waits[i] == h) return 1;
  return 0;
}

CUresult cuEventQuery(void *e) {
  count("cuEventQuery");
  struct fake_event *ev = e;
  event_alive(e, "cuEventQuery");
  if (!ev) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  int done = event_done(ev);
  pthread_mutex_unlock(&mu);
  return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
CUresult cuEventSynchronize(void *e) {
  count("cuEventSynchronize");
  struct fake_event *ev = e;
  event_alive(e, "cuEventSynchronize");
  if (!ev) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu); // waiting: the device finishes what the event waits for
  for (int i = 0; i < ev->n; i++) holds[ev->holds[i]].live = 0;
  dev_now = max2(dev_now, ev->at);
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuEventDestroy_v2(void *e) {
  count("cuEventDestroy_v2");
  struct fake_event *ev = e;
  event_alive(e, "cuEventDestroy_v2");
  if (!ev) return CUDA_ERROR_INVALID_VALUE;
  ev->live = 0;
  return CUDA_SUCCESS;
}

// The end of all work issued so far on every stream (mu held).
static ns_t all_end(void) {
  ns_t t = max2(blocking_busy, ptsz_busy);
  for (struct fake_stream *st = all_streams; st; st = st->next) t = max2(t, st->busy);
  return t;
}
CUresult cuCtxSynchronize(void) {
  count("cuCtxSynchronize");
  pthread_mutex_lock(&mu);
  dev_now = max2(dev_now, all_end());
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
static CUresult stream_query(void *s, int ptsz) {
  stream_alive(s, "cuStreamQuery");
  pthread_mutex_lock(&mu);
  int busy = stream_end(s, ptsz) > dev_now;
  int nb = is_nonblocking(s);
  for (int i = 0; i < MAX_HOLDS && !busy; i++)
    if (holds[i].live && (nb ? holds[i].stream == s : holds[i].stream == s || is_legacy(s, ptsz)))
      busy = 1;
  pthread_mutex_unlock(&mu);
  return busy ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
CUresult cuStreamQuery(void *s) { count("cuStreamQuery"); return stream_query(s, 0); }

// Test controls and readings of the modelled device.
long fakecu_races(void) { return races; }
unsigned long long fakecu_device_ns(void) { return dev_now; }
// How far the device lags: the end of everything issued minus what has run.
unsigned long long fakecu_lag_ns(void) {
  pthread_mutex_lock(&mu);
  ns_t t = all_end();
  pthread_mutex_unlock(&mu);
  return t > dev_now ? t - dev_now : 0;
}
long fakecu_last_hold(void) { return last_hold; }

static __thread struct fake_ctx *ctx_stack[16];
static __thread int ctx_depth;
CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  count("cuCtxPushCurrent_v2");
  CTX_ALIVE(ctx, "cuCtxPushCurrent_v2");
  if (!ctx || !ctx->live || ctx_depth == 16) return CUDA_ERROR_INVALID_CONTEXT;
  ctx_stack[ctx_depth++] = current;
  current = ctx;
  return CUDA_SUCCESS;
}
CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
  count("cuCtxPopCurrent_v2");
  if (!ctx_depth) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx) *pctx = current;
  current = ctx_stack[--ctx_depth];
  return CUDA_SUCCESS;
}


// ---- stream-ordered allocation and driver pools -----------------------------------------
// The fake runs no work, so a stream-ordered free takes effect at once. A pool reserves device
// memory in 2 MiB steps and keeps what is freed (release threshold: everything) until trimmed.
#define MAX_POOLS 16
#define POOL_STEP ((size_t)2 << 20)
struct fake_pool {
  int live;
  int dev; // -1: a host pool
  size_t reserved, in_use;
};
static struct fake_pool pools[MAX_POOLS]; // pools[d] for d < MAX_DEV: device d's default pool

static void pool_trim(struct fake_pool *pool, size_t keep);
// Called with mu held. A destroyed pool gives its memory back once its last allocation is freed.
static void pool_unuse(struct fake_pool *pool, size_t bytes) {
  pool->in_use -= bytes;
  if (!pool->live) pool_trim(pool, 0);
}

static CUresult pool_alloc(CUdeviceptr *out, size_t size, struct fake_pool *pool) {
  if (!out || size == 0 || !pool) return CUDA_ERROR_INVALID_VALUE;
  struct fake_ctx *ctx = current;
  if (!ctx || !ctx->live) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  size_t idle = pool->reserved - pool->in_use;
  size_t grow = size > idle ? (size - idle + POOL_STEP - 1) / POOL_STEP * POOL_STEP : 0;
  if (pool->dev >= 0 && used[pool->dev] + grow > total_mem) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  size_t mapped = (size + 4095) & ~(size_t)4095;
  void *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pool->reserved += grow;
  pool->in_use += size;
  if (pool->dev >= 0) {
    used[pool->dev] += grow;
    if (used[pool->dev] > peak[pool->dev]) peak[pool->dev] = used[pool->dev];
  }
  struct alloc *a = malloc(sizeof *a);
  *a = (struct alloc){(CUdeviceptr)(uintptr_t)p, 0, mapped, ctx, 0, allocs, pool, size};
  allocs = a;
  pthread_mutex_unlock(&mu);
  *out = a->ptr;
  return CUDA_SUCCESS;
}

static CUresult alloc_async(CUdeviceptr *p, size_t size, void *s) {
  stream_alive(s, "cuMemAllocAsync");
  struct fake_ctx *ctx = current;
  if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
  (void)s;
  return pool_alloc(p, size, &pools[ctx->dev]);
}
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, void *s) { count("cuMemAllocAsync"); return alloc_async(p, size, s); }
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, void *s) { count("cuMemAllocAsync_ptsz"); return alloc_async(p, size, s); }
CUresult cuMemFreeAsync(CUdeviceptr p, void *s) { count("cuMemFreeAsync"); stream_alive(s, "cuMemFreeAsync"); return do_free(p); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, void *s) { count("cuMemFreeAsync_ptsz"); stream_alive(s, "cuMemFreeAsync_ptsz"); return do_free(p); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, void *pool, void *s) {
  (void)s;
  count("cuMemAllocFromPoolAsync");
  return pool_alloc(p, size, pool);
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, void *pool, void *s) {
  (void)s;
  count("cuMemAllocFromPoolAsync_ptsz");
  return pool_alloc(p, size, pool);
}
struct loc_head { int kind, handle_types, location_type, location_id; };
CUresult cuMemPoolCreate(void **pool, const struct loc_head *props) {
  count("cuMemPoolCreate");
  if (!pool || !props) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  for (int i = MAX_DEV; i < MAX_POOLS; i++)
    if (!pools[i].live) {
      pools[i] = (struct fake_pool){1, props->location_type == 1 ? props->location_id : -1, 0, 0};
      *pool = &pools[i];
      pthread_mutex_unlock(&mu);
      return CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&mu);
  return CUDA_ERROR_OUT_OF_MEMORY;
}
static void pool_trim(struct fake_pool *pool, size_t keep) {
  size_t floor_ = (pool->in_use + POOL_STEP - 1) / POOL_STEP * POOL_STEP;
  if (keep > floor_) floor_ = (keep + POOL_STEP - 1) / POOL_STEP * POOL_STEP;
  if (pool->reserved > floor_) {
    if (pool->dev >= 0) used[pool->dev] -= pool->reserved - floor_;
    pool->reserved = floor_;
  }
}
CUresult cuMemPoolTrimTo(void *pool, size_t keep) {
  count("cuMemPoolTrimTo");
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  pool_trim(pool, keep);
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuMemPoolDestroy(void *pool) {
  count("cuMemPoolDestroy");
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  pool_trim(pool, 0);
  ((struct fake_pool *)pool)->live = 0;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuMemPoolGetAttribute(void *pool, int attr, void *value) {
  count("cuMemPoolGetAttribute");
  struct fake_pool *p = pool;
  if (!p || !value) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  unsigned long long v = attr == 5 ? p->reserved : attr == 7 ? p->in_use : 0;
  pthread_mutex_unlock(&mu);
  *(unsigned long long *)value = v;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetDefaultMemPool(void **pool, CUdevice d) {
  count("cuDeviceGetDefaultMemPool");
  if (!pool || d < 0 || d >= ndev) return CUDA_ERROR_INVALID_VALUE;
  pools[d].live = 1;
  pools[d].dev = d;
  *pool = &pools[d];
  return CUDA_SUCCESS;
}
size_t fakecu_pool_reserved(void *pool) { return ((struct fake_pool *)pool)->reserved; }

// ---- graphs with memory nodes -------------------------------------------------------------
// As the real driver (H100, driver 580, scripts/gpu/graph_mem.cu): an upload or launch maps the
// graph's memory nodes into one reserve per device, shared by every graph (it grows to the
// largest graph mapped since the last trim); instantiation takes nothing; only
// cuDeviceGraphMemTrim gives it back. The reserve is device memory (fakecu_used counts it).
#define MAX_GRAPH_NODES 16
struct fake_node {
  int type;      // 10: memory allocation; 0: anything else
  int dev;
  size_t bytes;
};
struct fake_graph {
  int nnodes;
  struct fake_node nodes[MAX_GRAPH_NODES];
};
struct fake_exec {
  size_t need[MAX_DEV];
  unsigned long long mapped_in[MAX_DEV];
};
static size_t graph_reserve[MAX_DEV];
static unsigned long long graph_epoch[MAX_DEV] = {1, 1, 1, 1, 1, 1, 1, 1};
static long graph_maps;

CUresult cuGraphCreate(void **g, unsigned flags) {
  (void)flags;
  count("cuGraphCreate");
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  *g = calloc(1, sizeof(struct fake_graph));
  return CUDA_SUCCESS;
}
CUresult cuGraphDestroy(void *g) { count("cuGraphDestroy"); free(g); return CUDA_SUCCESS; }
static struct fake_node *add_node(void *graph, int type) {
  struct fake_graph *g = graph;
  if (!g || g->nnodes == MAX_GRAPH_NODES) return NULL;
  struct fake_node *n = &g->nodes[g->nnodes++];
  n->type = type;
  return n;
}
// CUDA_MEM_ALLOC_NODE_PARAMS: pool properties (where at their head), access descriptors, size,
// address.
struct mem_alloc_node_params {
  int kind, handle_types, location_type, location_id;
  unsigned char props_rest[72];
  const void *access;
  size_t access_count;
  size_t bytesize;
  CUdeviceptr dptr;
};
CUresult cuGraphAddMemAllocNode(void **node, void *graph, const void *deps, size_t ndeps,
                                struct mem_alloc_node_params *p) {
  (void)deps; (void)ndeps;
  count("cuGraphAddMemAllocNode");
  if (!node || !p || !p->bytesize) return CUDA_ERROR_INVALID_VALUE;
  struct fake_node *n = add_node(graph, 10);
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  n->dev = p->location_id;
  n->bytes = p->bytesize;
  p->dptr = 0x7f0000000000ull; // a fixed virtual address; never touched
  *node = n;
  return CUDA_SUCCESS;
}
CUresult cuGraphAddEmptyNode(void **node, void *graph, const void *deps, size_t ndeps) {
  (void)deps; (void)ndeps;
  count("cuGraphAddEmptyNode");
  struct fake_node *n = add_node(graph, 0);
  if (!node || !n) return CUDA_ERROR_INVALID_VALUE;
  *node = n;
  return CUDA_SUCCESS;
}
CUresult cuGraphGetNodes(void *graph, void **nodes, size_t *n) {
  count("cuGraphGetNodes");
  struct fake_graph *g = graph;
  if (!g || !n) return CUDA_ERROR_INVALID_VALUE;
  if (nodes) {
    size_t k = *n < (size_t)g->nnodes ? *n : (size_t)g->nnodes;
    for (size_t i = 0; i < k; i++) nodes[i] = &g->nodes[i];
  }
  *n = g->nnodes;
  return CUDA_SUCCESS;
}
CUresult cuGraphNodeGetType(void *node, int *type) {
  count("cuGraphNodeGetType");
  if (!node || !type) return CUDA_ERROR_INVALID_VALUE;
  *type = ((struct fake_node *)node)->type;
  return CUDA_SUCCESS;
}
CUresult cuGraphMemAllocNodeGetParams(void *node, struct mem_alloc_node_params *p) {
  count("cuGraphMemAllocNodeGetParams");
  struct fake_node *n = node;
  if (!n || !p || n->type != 10) return CUDA_ERROR_INVALID_VALUE;
  memset(p, 0, sizeof *p);
  p->kind = 1;
  p->location_type = 1;
  p->location_id = n->dev;
  p->bytesize = n->bytes;
  p->dptr = 0x7f0000000000ull;
  return CUDA_SUCCESS;
}
static CUresult instantiate(void **exec, void *graph) {
  struct fake_graph *g = graph;
  if (!exec || !g) return CUDA_ERROR_INVALID_VALUE;
  struct fake_exec *x = calloc(1, sizeof *x);
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i].type == 10 && g->nodes[i].dev >= 0 && g->nodes[i].dev < MAX_DEV)
      x->need[g->nodes[i].dev] += g->nodes[i].bytes;
  *exec = x;
  return CUDA_SUCCESS;
}
CUresult cuGraphInstantiate(void **exec, void *graph, void **err, char *log, size_t n) {
  (void)err; (void)log; (void)n;
  count("cuGraphInstantiate");
  return instantiate(exec, graph);
}
CUresult cuGraphInstantiate_v2(void **exec, void *graph, void **err, char *log, size_t n) {
  (void)err; (void)log; (void)n;
  count("cuGraphInstantiate_v2");
  return instantiate(exec, graph);
}
CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
  (void)flags;
  count("cuGraphInstantiateWithFlags");
  return instantiate(exec, graph);
}
CUresult cuGraphInstantiateWithParams(void **exec, void *graph, void *params) {
  (void)params;
  count("cuGraphInstantiateWithParams");
  return instantiate(exec, graph);
}
CUresult cuGraphInstantiateWithParams_ptsz(void **exec, void *graph, void *params) {
  (void)params;
  count("cuGraphInstantiateWithParams_ptsz");
  return instantiate(exec, graph);
}
CUresult cuGraphExecDestroy(void *exec) { count("cuGraphExecDestroy"); free(exec); return CUDA_SUCCESS; }
// Maps what the graph needs; out-of-memory (and nothing mapped) if the device has no room.
static CUresult graph_map(void *exec) {
  struct fake_exec *x = exec;
  if (!x) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  for (int d = 0; d < MAX_DEV; d++) {
    if (!x->need[d] || x->mapped_in[d] == graph_epoch[d] || x->need[d] <= graph_reserve[d]) continue;
    if (used[d] + (x->need[d] - graph_reserve[d]) > total_mem) {
      pthread_mutex_unlock(&mu);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  for (int d = 0; d < MAX_DEV; d++) {
    if (!x->need[d]) continue;
    if (x->need[d] > graph_reserve[d]) {
      used[d] += x->need[d] - graph_reserve[d];
      if (used[d] > peak[d]) peak[d] = used[d];
      graph_reserve[d] = x->need[d];
    }
    x->mapped_in[d] = graph_epoch[d];
  }
  graph_maps++;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuGraphLaunch(void *exec, void *s) { count("cuGraphLaunch"); stream_alive(s, "cuGraphLaunch"); return graph_map(exec); }
CUresult cuGraphLaunch_ptsz(void *exec, void *s) { count("cuGraphLaunch_ptsz"); stream_alive(s, "cuGraphLaunch_ptsz"); return graph_map(exec); }
CUresult cuGraphUpload(void *exec, void *s) { count("cuGraphUpload"); stream_alive(s, "cuGraphUpload"); return graph_map(exec); }
CUresult cuGraphUpload_ptsz(void *exec, void *s) { count("cuGraphUpload_ptsz"); stream_alive(s, "cuGraphUpload_ptsz"); return graph_map(exec); }
CUresult cuDeviceGraphMemTrim(CUdevice d) {
  count("cuDeviceGraphMemTrim");
  if (d < 0 || d >= ndev) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  used[d] -= graph_reserve[d];
  graph_reserve[d] = 0;
  graph_epoch[d]++;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
// 0/2: used/reserved now (the same here: every mapped byte serves some graph); 1/3: their highs
// (not kept: answered as now).
CUresult cuDeviceGetGraphMemAttribute(CUdevice d, int attr, void *value) {
  count("cuDeviceGetGraphMemAttribute");
  if (d < 0 || d >= ndev || !value || attr < 0 || attr > 3) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  *(unsigned long long *)value = graph_reserve[d];
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
size_t fakecu_graph_reserve(int d) { return d >= 0 && d < MAX_DEV ? graph_reserve[d] : 0; }
long fakecu_graph_maps(void) { return graph_maps; }

CUresult cuStreamSynchronize(void *s) {
  count("cuStreamSynchronize");
  stream_alive(s, "cuStreamSynchronize");
  pthread_mutex_lock(&mu);
  int nb = is_nonblocking(s);
  for (int i = 0; i < MAX_HOLDS; i++)
    if (holds[i].live && (nb ? holds[i].stream == s : !holds[i].nonblocking)) holds[i].live = 0;
  dev_now = max2(dev_now, stream_end(s, 0));
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
// ---- host functions ----------------------------------------------------------------------
// cuLaunchHostFunc and cuStreamAddCallback: the function runs on the driver's own callback
// thread, one for the process, in the order they were enqueued, once the work its stream had
// before it has run (device time moves to it). Unlike the real driver, the fake lets a
// callback call the driver (free, destroy its stream), as the tests need.
struct host_call {
  void (*fn)(void *);                   // cuLaunchHostFunc
  void (*cb)(void *, CUresult, void *); // cuStreamAddCallback
  void *stream, *data;
  ns_t at;
  struct host_call *next;
};
static pthread_mutex_t host_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t host_cv = PTHREAD_COND_INITIALIZER;
static struct host_call *host_head, *host_tail;
static int host_thread_started;

static void *host_thread(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&host_mu);
    while (!host_head) pthread_cond_wait(&host_cv, &host_mu);
    struct host_call *c = host_head;
    host_head = c->next;
    if (!host_head) host_tail = NULL;
    pthread_mutex_unlock(&host_mu);
    pthread_mutex_lock(&mu);
    dev_now = max2(dev_now, c->at);
    pthread_mutex_unlock(&mu);
    if (c->fn) c->fn(c->data);
    else c->cb(c->stream, CUDA_SUCCESS, c->data);
    free(c);
  }
  return NULL;
}

static CUresult host_enqueue(void *s, void (*fn)(void *), void (*cb)(void *, CUresult, void *),
                             void *data, const char *api) {
  stream_alive(s, api);
  if (!fn && !cb) return CUDA_ERROR_INVALID_VALUE;
  struct host_call *c = calloc(1, sizeof *c);
  if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
  c->fn = fn, c->cb = cb, c->stream = s, c->data = data;
  pthread_mutex_lock(&mu);
  init_time();
  c->at = stream_end(s, 0);
  pthread_mutex_unlock(&mu);
  pthread_mutex_lock(&host_mu);
  if (!host_thread_started) {
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &a, host_thread, NULL)) {
      pthread_mutex_unlock(&host_mu);
      free(c);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    host_thread_started = 1;
  }
  if (host_tail) host_tail->next = c;
  else host_head = c;
  host_tail = c;
  pthread_cond_signal(&host_cv);
  pthread_mutex_unlock(&host_mu);
  return CUDA_SUCCESS;
}
CUresult cuLaunchHostFunc(void *s, void (*fn)(void *), void *data) {
  count("cuLaunchHostFunc");
  return host_enqueue(s, fn, NULL, data, "cuLaunchHostFunc");
}
CUresult cuStreamAddCallback(void *s, void (*cb)(void *, CUresult, void *), void *data,
                             unsigned flags) {
  count("cuStreamAddCallback");
  if (flags) return CUDA_ERROR_INVALID_VALUE;
  return host_enqueue(s, NULL, cb, data, "cuStreamAddCallback");
}

CUresult cuStreamBeginCaptureToGraph(void *s, void *g, const void *d, const void *e, size_t n,
                                     int mode) {
  (void)g, (void)d, (void)e, (void)n, (void)mode;
  count("cuStreamBeginCaptureToGraph");
  return begin_capture(s);
}

// ---- managed, host, virtual memory --------------------------------------------------------
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned flags) {
  (void)flags;
  count("cuMemAllocManaged");
  return do_alloc(p, size, 0);
}
CUresult cuMemHostAlloc(void **p, size_t size, unsigned flags) {
  (void)flags;
  count("cuMemHostAlloc");
  if (!p || !size) return CUDA_ERROR_INVALID_VALUE;
  *p = malloc(size);
  if (!*p) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_HOST; i++)
    if (!host_allocs[i].p) {
      host_allocs[i].p = *p, host_allocs[i].size = size;
      break;
    }
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags) {
  count("cuMemHostGetDevicePointer_v2");
  CUdeviceptr b;
  size_t s;
  pthread_mutex_lock(&mu);
  int found = find_range((CUdeviceptr)(uintptr_t)p, &b, &s);
  pthread_mutex_unlock(&mu);
  if (!d || flags || found != 2) return CUDA_ERROR_INVALID_VALUE;
  *d = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}
CUresult cuMemFreeHost(void *p) {
  count("cuMemFreeHost");
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_HOST; i++)
    if (p && host_allocs[i].p == p) host_allocs[i].p = NULL;
  pthread_mutex_unlock(&mu);
  free(p);
  return CUDA_SUCCESS;
}

#define MAX_PHYS 4096
#define MAX_MAPS 4096
struct fake_phys {
  int live, dev, refs, maps;
  size_t size;
};
static struct fake_phys phys[MAX_PHYS];
static struct {
  CUdeviceptr va;
  size_t size;
  int h; // index + 1 into phys
} vmaps[MAX_MAPS];
static void phys_check(int h) {
  struct fake_phys *p = &phys[h - 1];
  if (p->live && p->refs == 0 && p->maps == 0) {
    p->live = 0;
    if (p->dev >= 0) used[p->dev] -= p->size;
  }
}
CUresult cuMemCreate(unsigned long long *handle, size_t size, const struct loc_head *prop,
                     unsigned long long flags) {
  (void)flags;
  count("cuMemCreate");
  if (!handle || !prop || !size || size % POOL_STEP) return CUDA_ERROR_INVALID_VALUE;
  int dev = prop->location_type == 1 ? prop->location_id : -1;
  pthread_mutex_lock(&mu);
  if (dev >= 0 && used[dev] + size > total_mem) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  for (int i = 0; i < MAX_PHYS; i++)
    if (!phys[i].live) {
      phys[i] = (struct fake_phys){1, dev, 1, 0, size};
      if (dev >= 0) {
        used[dev] += size;
        if (used[dev] > peak[dev]) peak[dev] = used[dev];
      }
      *handle = (unsigned long long)(i + 1) << 20; // opaque, not an index
      pthread_mutex_unlock(&mu);
      return CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&mu);
  return CUDA_ERROR_OUT_OF_MEMORY;
}
static int phys_index(unsigned long long handle) {
  int h = (int)(handle >> 20);
  return h >= 1 && h <= MAX_PHYS && phys[h - 1].live ? h : 0;
}
CUresult cuMemRelease(unsigned long long handle) {
  count("cuMemRelease");
  pthread_mutex_lock(&mu);
  int h = phys_index(handle);
  if (!h || phys[h - 1].refs == 0) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_INVALID_VALUE;
  }
  phys[h - 1].refs--;
  phys_check(h);
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
// Reserved address ranges (the process's, not a context's: they outlive every context).
static long reserved_ranges;
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                             unsigned long long flags) {
  (void)addr, (void)flags;
  count("cuMemAddressReserve");
  if (!ptr || !size) return CUDA_ERROR_INVALID_VALUE;
  if (!align) align = POOL_STEP;
  // Over-reserve, then trim to an `align`-aligned range, as the real driver aligns.
  size_t span = size + align;
  char *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t start = ((uintptr_t)p + align - 1) / align * align;
  if (start > (uintptr_t)p) munmap(p, start - (uintptr_t)p);
  if ((uintptr_t)p + span > start + size)
    munmap((void *)(start + size), (uintptr_t)p + span - (start + size));
  *ptr = (CUdeviceptr)start;
  __atomic_add_fetch(&reserved_ranges, 1, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  count("cuMemAddressFree");
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_MAPS; i++)
    if (vmaps[i].h && vmaps[i].va >= ptr && vmaps[i].va < ptr + size) {
      pthread_mutex_unlock(&mu);
      fprintf(stderr, "fakecu: cuMemAddressFree of a range with memory still mapped\n");
      return CUDA_ERROR_INVALID_VALUE;
    }
  pthread_mutex_unlock(&mu);
  munmap((void *)(uintptr_t)ptr, size);
  __atomic_sub_fetch(&reserved_ranges, 1, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}
long fakecu_reserved_ranges(void) { return reserved_ranges; }
CUresult cuMemMap(CUdeviceptr va, size_t size, size_t offset, unsigned long long handle,
                  unsigned long long flags) {
  (void)offset, (void)flags;
  count("cuMemMap");
  pthread_mutex_lock(&mu);
  int h = phys_index(handle);
  for (int i = 0; h && i < MAX_MAPS; i++)
    if (!vmaps[i].h) {
      vmaps[i].va = va, vmaps[i].size = size, vmaps[i].h = h;
      phys[h - 1].maps++;
      // The host pages behind the reserved range become usable (memsets and copies run on them).
      mprotect((void *)(uintptr_t)va, size, PROT_READ | PROT_WRITE);
      pthread_mutex_unlock(&mu);
      return CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&mu);
  return CUDA_ERROR_INVALID_VALUE;
}
// Unlike cuMemFree, the real cuMemUnmap does not wait for the device: unmapping memory that
// work still in flight touches is a fault on a GPU. Here it counts as a race, and is reported.
static void unmapped_in_use(CUdeviceptr lo, size_t size) {
  long n = works < WORKS ? works : WORKS;
  for (long i = 0; i < n; i++)
    if (recent[i].lo < lo + size && lo < recent[i].hi && recent[i].end > dev_now) {
      races++;
      fprintf(stderr, "fakecu: cuMemUnmap of %#llx+%zu while device work still uses it\n",
              (unsigned long long)lo, size);
      return;
    }
}
CUresult cuMemUnmap(CUdeviceptr va, size_t size) {
  count("cuMemUnmap");
  pthread_mutex_lock(&mu);
  unmapped_in_use(va, size);
  int n = 0;
  for (int i = 0; i < MAX_MAPS; i++)
    if (vmaps[i].h && vmaps[i].va >= va && vmaps[i].va < va + size) {
      int h = vmaps[i].h;
      vmaps[i].h = 0;
      phys[h - 1].maps--;
      phys_check(h);
      void *p = (void *)(uintptr_t)vmaps[i].va;
      madvise(p, vmaps[i].size, MADV_DONTNEED);
      mprotect(p, vmaps[i].size, PROT_NONE);
      n++;
    }
  pthread_mutex_unlock(&mu);
  return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
// Access may be set only on mapped memory: every chunk of the range must be mapped.
CUresult cuMemSetAccess(CUdeviceptr va, size_t size, const void *desc, size_t count_) {
  count("cuMemSetAccess");
  if (!desc || !count_ || !size) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  size_t covered = 0;
  for (int i = 0; i < MAX_MAPS; i++)
    if (vmaps[i].h && vmaps[i].va >= va && vmaps[i].va < va + size) covered += vmaps[i].size;
  pthread_mutex_unlock(&mu);
  return covered == size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemGetAllocationGranularity(size_t *g, const struct loc_head *prop, int option) {
  (void)option;
  count("cuMemGetAllocationGranularity");
  if (!g || !prop) return CUDA_ERROR_INVALID_VALUE;
  *g = POOL_STEP;
  return CUDA_SUCCESS;
}
// Every pair of fake devices are peers.
CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
  count("cuDeviceCanAccessPeer");
  if (!can || dev < 0 || dev >= ndev || peer < 0 || peer >= ndev) return CUDA_ERROR_INVALID_DEVICE;
  *can = dev != peer;
  return CUDA_SUCCESS;
}
CUresult cuMemRetainAllocationHandle(unsigned long long *handle, void *addr) {
  count("cuMemRetainAllocationHandle");
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  CUdeviceptr a = (CUdeviceptr)(uintptr_t)addr;
  for (int i = 0; i < MAX_MAPS; i++)
    if (vmaps[i].h && a >= vmaps[i].va && a < vmaps[i].va + vmaps[i].size) {
      phys[vmaps[i].h - 1].refs++;
      *handle = (unsigned long long)vmaps[i].h << 20;
      pthread_mutex_unlock(&mu);
      return CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&mu);
  return CUDA_ERROR_INVALID_VALUE;
}

// ---- arrays ------------------------------------------------------------------------------
// Footprint: rows padded to 512 bytes, every mip level, the total rounded up to 2 MiB (so a
// naive texel count is never the right answer). Deferred-mapping arrays take nothing.
#define MAX_ARRAYS 64
struct desc3 { size_t w, h, d; unsigned format, channels, flags; };
struct desc2 { size_t w, h; unsigned format, channels; };
struct desc2v1 { unsigned w, h, format, channels; };
struct desc3v1 { unsigned w, h, d, format, channels, flags; };
struct mem_req { size_t size, alignment; unsigned reserved[4]; };
struct fake_array {
  int live, dev, deferred;
  size_t size;
};
static struct fake_array arrays[MAX_ARRAYS];
static size_t elem_bytes(unsigned f) {
  switch (f) {
    case 0x01: case 0x08: return 1;
    case 0x02: case 0x09: case 0x10: return 2;
    case 0x03: case 0x0a: case 0x20: return 4;
    default: return 0;
  }
}
static size_t footprint(struct desc3 d, unsigned levels) {
  size_t total = 0;
  for (unsigned l = 0; l < (levels ? levels : 1); l++) {
    size_t w = d.w >> l ? d.w >> l : 1, h = d.h ? (d.h >> l ? d.h >> l : 1) : 1,
           z = d.d ? (d.d >> l ? d.d >> l : 1) : 1;
    total += ((w * elem_bytes(d.format) * d.channels + 511) & ~(size_t)511) * h * z;
  }
  return (total + POOL_STEP - 1) / POOL_STEP * POOL_STEP;
}
size_t fakecu_array_footprint(size_t w, size_t h, size_t d, unsigned format, unsigned ch,
                              unsigned levels) {
  return footprint((struct desc3){w, h, d, format, ch, 0}, levels);
}
static CUresult array_make(void **out, struct desc3 d, unsigned levels) {
  if (!out || !d.w || !elem_bytes(d.format) || !d.channels) return CUDA_ERROR_INVALID_VALUE;
  struct fake_ctx *ctx = current;
  if (!ctx || !ctx->live) return CUDA_ERROR_INVALID_CONTEXT;
  int deferred = (d.flags & 0x80) != 0;
  size_t size = footprint(d, levels);
  pthread_mutex_lock(&mu);
  if (!deferred && used[ctx->dev] + size > total_mem) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  for (int i = 0; i < MAX_ARRAYS; i++)
    if (!arrays[i].live) {
      arrays[i] = (struct fake_array){1, ctx->dev, deferred, size};
      if (!deferred) {
        used[ctx->dev] += size;
        if (used[ctx->dev] > peak[ctx->dev]) peak[ctx->dev] = used[ctx->dev];
      }
      *out = &arrays[i];
      pthread_mutex_unlock(&mu);
      return CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&mu);
  return CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult cuArrayCreate_v2(void **out, const struct desc2 *d) {
  count("cuArrayCreate_v2");
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  return array_make(out, (struct desc3){d->w, d->h, 0, d->format, d->channels, 0}, 0);
}
CUresult cuArrayCreate(void **out, const struct desc2v1 *d) {
  count("cuArrayCreate");
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  return array_make(out, (struct desc3){d->w, d->h, 0, d->format, d->channels, 0}, 0);
}
CUresult cuArray3DCreate_v2(void **out, const struct desc3 *d) {
  count("cuArray3DCreate_v2");
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  return array_make(out, *d, 0);
}
CUresult cuArray3DCreate(void **out, const struct desc3v1 *d) {
  count("cuArray3DCreate");
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  return array_make(out, (struct desc3){d->w, d->h, d->d, d->format, d->channels, d->flags}, 0);
}
CUresult cuMipmappedArrayCreate(void **out, const struct desc3 *d, unsigned levels) {
  count("cuMipmappedArrayCreate");
  if (!d || !levels) return CUDA_ERROR_INVALID_VALUE;
  return array_make(out, *d, levels);
}
static CUresult array_destroy(void *a) {
  struct fake_array *arr = a;
  if (!arr || !arr->live) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  arr->live = 0;
  if (!arr->deferred) used[arr->dev] -= arr->size;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuArrayDestroy(void *a) { count("cuArrayDestroy"); return array_destroy(a); }
CUresult cuMipmappedArrayDestroy(void *a) { count("cuMipmappedArrayDestroy"); return array_destroy(a); }
static CUresult requirements(struct mem_req *r, void *a) {
  struct fake_array *arr = a;
  if (!r || !arr || !arr->live || !arr->deferred || getenv("FAKECU_NO_ARRAY_REQUIREMENTS"))
    return CUDA_ERROR_INVALID_VALUE;
  r->size = arr->size;
  r->alignment = 65536;
  return CUDA_SUCCESS;
}
CUresult cuArrayGetMemoryRequirements(struct mem_req *r, void *a, CUdevice d) {
  (void)d;
  count("cuArrayGetMemoryRequirements");
  return requirements(r, a);
}
CUresult cuMipmappedArrayGetMemoryRequirements(struct mem_req *r, void *a, CUdevice d) {
  (void)d;
  count("cuMipmappedArrayGetMemoryRequirements");
  return requirements(r, a);
}

// Test controls.
long fakecu_hold(void *stream) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_HOLDS; i++)
    if (!holds[i].live) {
      holds[i] = (struct fake_hold){1, stream, is_nonblocking(stream)};
      last_hold = i;
      pthread_mutex_unlock(&mu);
      return i;
    }
  pthread_mutex_unlock(&mu);
  return -1;
}
// A FAKECU_HOLD kernel: a hold on its stream.
static CUresult hold_on(void *stream) {
  return fakecu_hold(stream ? stream : (void *)1) >= 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
void fakecu_finish(long h) {
  if (h >= 0 && h < MAX_HOLDS) holds[h].live = 0;
}
int fakecu_running(long h) { return h >= 0 && h < MAX_HOLDS && holds[h].live; }
long fakecu_capture_violations(void) { return capture_violations; }

// ---- cuGetProcAddress ------------------------------------------------------------------
// One row per variant: base name, the first cudaVersion that gets it, whether it is the
// per-thread-default-stream variant. The real driver's rules: the newest variant whose
// version is <= the caller's; with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (2), the
// _ptds/_ptsz variant where one exists.
CUresult cuGetProcAddress(const char *, void **, int, unsigned long long);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

struct proc {
  const char *base;
  int version;
  int ptds;
  void *fn;
};

static const struct proc procs[] = {
    {"cuInit", 2000, 0, (void *)cuInit},
    {"cuDriverGetVersion", 2020, 0, (void *)cuDriverGetVersion},
    {"cuDeviceGet", 2000, 0, (void *)cuDeviceGet},
    {"cuDeviceGetCount", 2000, 0, (void *)cuDeviceGetCount},
    {"cuDeviceTotalMem", 3020, 0, (void *)cuDeviceTotalMem_v2},
    {"cuDeviceGetUuid", 9020, 0, (void *)cuDeviceGetUuid},
    {"cuDeviceGetUuid", 11040, 0, (void *)cuDeviceGetUuid_v2},
    {"cuCtxCreate", 3020, 0, (void *)cuCtxCreate_v2},
    {"cuCtxDestroy", 2000, 0, (void *)cuCtxDestroy},
    {"cuCtxDestroy", 4000, 0, (void *)cuCtxDestroy_v2},
    {"cuCtxSetCurrent", 4000, 0, (void *)cuCtxSetCurrent},
    {"cuCtxGetCurrent", 4000, 0, (void *)cuCtxGetCurrent},
    {"cuCtxGetDevice", 2000, 0, (void *)cuCtxGetDevice},
    {"cuDevicePrimaryCtxRetain", 7000, 0, (void *)cuDevicePrimaryCtxRetain},
    {"cuDevicePrimaryCtxRelease", 7000, 0, (void *)cuDevicePrimaryCtxRelease},
    {"cuDevicePrimaryCtxRelease", 11000, 0, (void *)cuDevicePrimaryCtxRelease_v2},
    {"cuDevicePrimaryCtxReset", 7000, 0, (void *)cuDevicePrimaryCtxReset},
    {"cuDevicePrimaryCtxReset", 11000, 0, (void *)cuDevicePrimaryCtxReset_v2},
    {"cuDevicePrimaryCtxGetState", 7000, 0, (void *)cuDevicePrimaryCtxGetState},
    {"cuMemAlloc", 2000, 0, (void *)cuMemAlloc},
    {"cuMemAlloc", 3020, 0, (void *)cuMemAlloc_v2},
    {"cuMemFree", 2000, 0, (void *)cuMemFree},
    {"cuMemFree", 3020, 0, (void *)cuMemFree_v2},
    {"cuMemAllocPitch", 2000, 0, (void *)cuMemAllocPitch},
    {"cuMemAllocPitch", 3020, 0, (void *)cuMemAllocPitch_v2},
    {"cuMemGetInfo", 2000, 0, (void *)cuMemGetInfo},
    {"cuMemGetInfo", 3020, 0, (void *)cuMemGetInfo_v2},
    {"cuMemGetAddressRange", 2000, 0, (void *)cuMemGetAddressRange},
    {"cuMemGetAddressRange", 3020, 0, (void *)cuMemGetAddressRange_v2},
    {"cuMemsetD8", 3020, 0, (void *)cuMemsetD8_v2},
    {"cuMemsetD8", 7000, 1, (void *)cuMemsetD8_v2_ptds},
    {"cuMemsetD32", 3020, 0, (void *)cuMemsetD32_v2},
    {"cuMemsetD8Async", 3020, 0, (void *)cuMemsetD8Async},
    {"cuMemsetD8Async", 7000, 1, (void *)cuMemsetD8Async_ptsz},
    {"cuMemsetD32Async", 3020, 0, (void *)cuMemsetD32Async},
    {"cuMemcpyDtoDAsync", 3020, 0, (void *)cuMemcpyDtoDAsync_v2},
    {"cuLaunchKernel", 4000, 0, (void *)cuLaunchKernel},
    {"cuLaunchKernel", 7000, 1, (void *)cuLaunchKernel_ptsz},
    {"cuStreamQuery", 2000, 0, (void *)cuStreamQuery},
    {"cuCtxSynchronize", 2000, 0, (void *)cuCtxSynchronize},
    {"cuStreamCreate", 2000, 0, (void *)cuStreamCreate},
    {"cuStreamCreateWithPriority", 5050, 0, (void *)cuStreamCreateWithPriority},
    {"cuStreamDestroy", 2000, 0, (void *)cuStreamDestroy},
    {"cuStreamDestroy", 4000, 0, (void *)cuStreamDestroy_v2},
    {"cuStreamGetCtx", 9020, 0, (void *)cuStreamGetCtx},
    {"cuStreamBeginCapture", 10010, 0, (void *)cuStreamBeginCapture_v2},
    {"cuStreamBeginCapture", 10010, 1, (void *)cuStreamBeginCapture_v2_ptsz},
    {"cuStreamEndCapture", 10000, 0, (void *)cuStreamEndCapture},
    {"cuStreamEndCapture", 10000, 1, (void *)cuStreamEndCapture_ptsz},
    {"cuStreamIsCapturing", 10000, 0, (void *)cuStreamIsCapturing},
    {"cuEventCreate", 2000, 0, (void *)cuEventCreate},
    {"cuEventRecord", 2000, 0, (void *)cuEventRecord},
    {"cuEventRecord", 7000, 1, (void *)cuEventRecord_ptsz},
    {"cuEventQuery", 2000, 0, (void *)cuEventQuery},
    {"cuStreamWaitEvent", 3020, 0, (void *)cuStreamWaitEvent},
    {"cuStreamWaitEvent", 7000, 1, (void *)cuStreamWaitEvent_ptsz},
    {"cuEventSynchronize", 2000, 0, (void *)cuEventSynchronize},
    {"cuEventDestroy", 4000, 0, (void *)cuEventDestroy_v2},
    {"cuCtxPushCurrent", 4000, 0, (void *)cuCtxPushCurrent_v2},
    {"cuCtxPopCurrent", 4000, 0, (void *)cuCtxPopCurrent_v2},
    {"cuMemcpyHtoD", 3020, 0, (void *)cuMemcpyHtoD_v2},
    {"cuMemcpyDtoH", 3020, 0, (void *)cuMemcpyDtoH_v2},
    {"cuMemAllocAsync", 11020, 0, (void *)cuMemAllocAsync},
    {"cuMemAllocAsync", 11020, 1, (void *)cuMemAllocAsync_ptsz},
    {"cuMemFreeAsync", 11020, 0, (void *)cuMemFreeAsync},
    {"cuMemFreeAsync", 11020, 1, (void *)cuMemFreeAsync_ptsz},
    {"cuMemAllocFromPoolAsync", 11020, 0, (void *)cuMemAllocFromPoolAsync},
    {"cuMemAllocFromPoolAsync", 11020, 1, (void *)cuMemAllocFromPoolAsync_ptsz},
    {"cuMemPoolCreate", 11020, 0, (void *)cuMemPoolCreate},
    {"cuMemPoolDestroy", 11020, 0, (void *)cuMemPoolDestroy},
    {"cuMemPoolTrimTo", 11020, 0, (void *)cuMemPoolTrimTo},
    {"cuMemPoolGetAttribute", 11020, 0, (void *)cuMemPoolGetAttribute},
    {"cuDeviceGetDefaultMemPool", 11020, 0, (void *)cuDeviceGetDefaultMemPool},
    {"cuStreamSynchronize", 2000, 0, (void *)cuStreamSynchronize},
    {"cuLaunchHostFunc", 10000, 0, (void *)cuLaunchHostFunc},
    {"cuStreamAddCallback", 5000, 0, (void *)cuStreamAddCallback},
    {"cuStreamBeginCaptureToGraph", 12030, 0, (void *)cuStreamBeginCaptureToGraph},
    {"cuMemAllocManaged", 6000, 0, (void *)cuMemAllocManaged},
    {"cuMemHostAlloc", 2020, 0, (void *)cuMemHostAlloc},
    {"cuMemFreeHost", 2000, 0, (void *)cuMemFreeHost},
    {"cuMemHostGetDevicePointer", 3020, 0, (void *)cuMemHostGetDevicePointer_v2},
    {"cuPointerGetAttribute", 4000, 0, (void *)cuPointerGetAttribute},
    {"cuPointerGetAttributes", 7000, 0, (void *)cuPointerGetAttributes},
    {"cuIpcGetMemHandle", 4010, 0, (void *)cuIpcGetMemHandle},
    {"cuIpcOpenMemHandle", 11000, 0, (void *)cuIpcOpenMemHandle_v2},
    {"cuIpcCloseMemHandle", 4010, 0, (void *)cuIpcCloseMemHandle},
    {"cuMemCreate", 10020, 0, (void *)cuMemCreate},
    {"cuMemRelease", 10020, 0, (void *)cuMemRelease},
    {"cuMemAddressReserve", 10020, 0, (void *)cuMemAddressReserve},
    {"cuMemAddressFree", 10020, 0, (void *)cuMemAddressFree},
    {"cuMemMap", 10020, 0, (void *)cuMemMap},
    {"cuMemUnmap", 10020, 0, (void *)cuMemUnmap},
    {"cuMemRetainAllocationHandle", 11000, 0, (void *)cuMemRetainAllocationHandle},
    {"cuArrayCreate", 2000, 0, (void *)cuArrayCreate},
    {"cuArrayCreate", 3020, 0, (void *)cuArrayCreate_v2},
    {"cuArray3DCreate", 2000, 0, (void *)cuArray3DCreate},
    {"cuArray3DCreate", 3020, 0, (void *)cuArray3DCreate_v2},
    {"cuMipmappedArrayCreate", 5000, 0, (void *)cuMipmappedArrayCreate},
    {"cuArrayDestroy", 2000, 0, (void *)cuArrayDestroy},
    {"cuMipmappedArrayDestroy", 5000, 0, (void *)cuMipmappedArrayDestroy},
    {"cuArrayGetMemoryRequirements", 11060, 0, (void *)cuArrayGetMemoryRequirements},
    {"cuMipmappedArrayGetMemoryRequirements", 11060, 0, (void *)cuMipmappedArrayGetMemoryRequirements},
    {"cuGraphCreate", 10000, 0, (void *)cuGraphCreate},
    {"cuGraphDestroy", 10000, 0, (void *)cuGraphDestroy},
    {"cuGraphAddMemAllocNode", 11040, 0, (void *)cuGraphAddMemAllocNode},
    {"cuGraphAddEmptyNode", 10000, 0, (void *)cuGraphAddEmptyNode},
    {"cuGraphGetNodes", 10000, 0, (void *)cuGraphGetNodes},
    {"cuGraphNodeGetType", 10000, 0, (void *)cuGraphNodeGetType},
    {"cuGraphMemAllocNodeGetParams", 11040, 0, (void *)cuGraphMemAllocNodeGetParams},
    {"cuGraphInstantiate", 10000, 0, (void *)cuGraphInstantiate},
    {"cuGraphInstantiate", 11000, 0, (void *)cuGraphInstantiate_v2},
    {"cuGraphInstantiateWithFlags", 11040, 0, (void *)cuGraphInstantiateWithFlags},
    {"cuGraphInstantiateWithParams", 12000, 0, (void *)cuGraphInstantiateWithParams},
    {"cuGraphInstantiateWithParams", 12000, 1, (void *)cuGraphInstantiateWithParams_ptsz},
    {"cuGraphExecDestroy", 10000, 0, (void *)cuGraphExecDestroy},
    {"cuGraphLaunch", 10000, 0, (void *)cuGraphLaunch},
    {"cuGraphLaunch", 10000, 1, (void *)cuGraphLaunch_ptsz},
    {"cuGraphUpload", 11010, 0, (void *)cuGraphUpload},
    {"cuGraphUpload", 11010, 1, (void *)cuGraphUpload_ptsz},
    {"cuDeviceGraphMemTrim", 11040, 0, (void *)cuDeviceGraphMemTrim},
    {"cuDeviceGetGraphMemAttribute", 11040, 0, (void *)cuDeviceGetGraphMemAttribute},
    {"cuGetProcAddress", 11030, 0, (void *)cuGetProcAddress},
    {"cuGetProcAddress", 12000, 0, (void *)cuGetProcAddress_v2},
};

// 0 found, 1 no such symbol, 2 version not sufficient (CUdriverProcAddressQueryResult).
static int lookup(const char *sym, void **pfn, int version, unsigned long long flags) {
  const struct proc *best = NULL;
  int known = 0;
  int want_ptds = (flags & 2) != 0;
  for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
    const struct proc *p = &procs[i];
    if (strcmp(p->base, sym)) continue;
    known = 1;
    if (p->version > version) continue;
    if (p->ptds && !want_ptds) continue;
    if (!best || p->ptds > best->ptds || (p->ptds == best->ptds && p->version > best->version))
      best = p;
  }
  *pfn = best ? best->fn : NULL;
  return best ? 0 : known ? 2 : 1;
}

CUresult cuGetProcAddress(const char *sym, void **pfn, int version, unsigned long long flags) {
  count("cuGetProcAddress");
  if (!sym || !pfn) return CUDA_ERROR_INVALID_VALUE;
  return lookup(sym, pfn, version, flags) == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version, unsigned long long flags,
                             int *status) {
  count("cuGetProcAddress_v2");
  if (!sym || !pfn) return CUDA_ERROR_INVALID_VALUE;
  // As the real driver (seen on an H100, driver 580): a missing symbol is CUDA_SUCCESS with a
  // NULL function and the reason in *status.
  int s = lookup(sym, pfn, version, flags);
  if (status) *status = s;
  return status || s == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
