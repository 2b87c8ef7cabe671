// A fake libcuda.so.1 for testing cudapool without a GPU (docs/design.md, "Tests": the second layer).
//
// Device memory is host memory. Devices: FAKECU_DEVICES (default 2), each with
// FAKECU_TOTAL_MEM bytes (default 1 GiB). Contexts are real objects with a per-thread current
// one, primary contexts with reference counts, and allocations that die with their context.
// Lifetimes are checked: a destroyed stream, event or context passed to any entry point aborts
// the process, naming the call (the real driver crashes; see "lifetimes" below).
// cuGetProcAddress/_v2 answer by base name, cudaVersion and flags the way the real driver does.
// Every entry point counts its calls: fakecu_calls("cuMemAlloc_v2").
//
// FAKECU_BOARD=DIR: what the driver knows of each process, kept where another process reads it
// (the fake NVML's per-process memory, as the real driver keeps it in the kernel): this
// process's bytes per device, every change, in DIR/<pid> (MAX_DEV native 64-bit words).
// With FAKECU_SHARED=1 too, the processes share the devices, as on a real GPU: room is the
// device's total less what every live process of the board holds (`taken`), so memory one
// process gives back is what another can take.
//
// This file holds devices, contexts, lifetimes and plain memory; it includes the rest at its
// end, one file per concern (libcuda_streams.c, libcuda_pools_graphs.c,
// libcuda_memory_apis.c, libcuda_lookup.c, libcuda_checkpoint.c), so that they share its state.
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
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

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
  size_t limit[3]; // stack, printf FIFO, heap (0: the default), libcuda_overhead.c
  size_t taken;    // device memory it holds besides allocations (limits, modules, itself)
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
// Every call that takes the driver's mutex waits while another process holds this one locked
// or checkpointed (libcuda_checkpoint.c).
static int ck_lock_mu(pthread_mutex_t *m);
static void ck_start(const char *board);
#define pthread_mutex_lock(m) ck_lock_mu(m)
static int initialized;
static int ndev = 2;
static size_t total_mem = (size_t)1 << 30;
static size_t used_here[MAX_DEV], peak[MAX_DEV];
// This process's bytes per device: `used_here`, or its page of FAKECU_BOARD once cuInit ran.
static size_t *used = used_here;
static const char *shared_board; // FAKECU_BOARD with FAKECU_SHARED=1: see `taken`
static struct fake_ctx *primary[MAX_DEV];
static int primary_refs[MAX_DEV];
static struct alloc *allocs;
static __thread struct fake_ctx *current;
// Modelled device time, in ns (see "streams, events, modelled device work" below).
typedef unsigned long long ns_t;
static ns_t dev_now; // device time that has passed
// Graph capture's rules (libcuda_streams.c): a "potentially unsafe" call during a capture.
static CUresult capture_unsafe(const char *api);
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

// What device `dev` holds for every process: this one's bytes, and with a shared board every
// live process's page of it (a dead process's memory went with it). Called under `mu`.
static size_t taken(int dev) {
  if (!shared_board) return used[dev];
  size_t sum = used[dev];
  DIR *d = opendir(shared_board);
  if (!d) return sum;
  struct dirent *e;
  while ((e = readdir(d))) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end || pid <= 0 || pid == (long)getpid() || (kill((pid_t)pid, 0) != 0 && errno != EPERM)) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", shared_board, e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    size_t words[MAX_DEV] = {0};
    if (pread(fd, words, sizeof words, 0) == (ssize_t)sizeof words) sum += words[dev];
    close(fd);
  }
  closedir(d);
  return sum;
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
  const char *board = getenv("FAKECU_BOARD");
  if (board && used == used_here) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%d", board, (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0 && ftruncate(fd, sizeof used_here) == 0) {
      void *p = mmap(NULL, sizeof used_here, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        memcpy(p, used_here, sizeof used_here);
        used = p;
      }
    }
    if (fd >= 0) close(fd);
    const char *sh = getenv("FAKECU_SHARED");
    if (sh && !strcmp(sh, "1") && used != used_here) {
      shared_board = board;
      ck_start(board);
    }
  }
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
  if (c) *c = (struct fake_ctx){1, dev, is_primary, {0, 0, 0}, 0};
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
  // What the driver took for it besides allocations (limits, modules, a context of its own).
  used[ctx->dev] -= ctx->taken;
  ctx->taken = 0;
  for (int i = 0; i < 3; i++) ctx->limit[i] = 0;
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
  const char *cm = getenv("FAKECU_CTX_MEM");
  size_t ctx_mem = cm ? strtoull(cm, NULL, 10) : 0;
  pthread_mutex_lock(&mu);
  if (taken(dev) + ctx_mem > total_mem) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  struct fake_ctx *c = new_ctx(dev, 0);
  if (c) {
    c->taken = ctx_mem;
    used[dev] += ctx_mem;
    if (used[dev] > peak[dev]) peak[dev] = used[dev];
  }
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
  if (taken(ctx->dev) + size > total_mem) {
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
  CUresult c = capture_unsafe("cuMemAlloc_v2");
  if (c) return c;
  return do_alloc(dptr, size, 0);
}

static ns_t all_end(void);
CUresult cuMemFree_v2(CUdeviceptr ptr) {
  count("cuMemFree_v2");
  CUresult c = capture_unsafe("cuMemFree_v2");
  if (c) return c;
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
  if (free_b) {
    size_t t = taken(current->dev);
    *free_b = t < total_mem ? total_mem - t : 0;
  }
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

#include "libcuda_streams.c"
#include "libcuda_pools_graphs.c"
#include "libcuda_memory_apis.c"
#include "libcuda_overhead.c"
#include "libcuda_lookup.c"
#include "libcuda_checkpoint.c"
