// What a program reads of its GPUs through NVML (issue 35; tests/preload.rs): for each NVML
// device, nvmlDeviceGetMemoryInfo and _v2, one line each:
//   nvml i=I total=T used=U free=F            nvml2 i=I total=T reserved=R used=U free=F
// Built twice: looking NVML up with dlopen + dlsym (as pynvml does), and -DLINKED against
// libnvidia-ml.so (as C tools do). `nvml HOLD_MIB` first allocates HOLD_MIB on CUDA device 0
// through the driver (dlopen + dlsym) and keeps it.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

#ifdef LINKED
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);
#define GET(f) f
#else
static void *nvml;
static void *need(const char *name) {
  void *f = dlsym(nvml, name);
  if (!f) {
    fprintf(stderr, "nvml: no %s\n", name);
    exit(3);
  }
  return f;
}
#define GET(f) ((f##_t *)need(#f))
typedef nvmlReturn_t nvmlInit_v2_t(void);
typedef nvmlReturn_t nvmlDeviceGetCount_v2_t(unsigned int *);
typedef nvmlReturn_t nvmlDeviceGetHandleByIndex_v2_t(unsigned int, nvmlDevice_t *);
typedef nvmlReturn_t nvmlDeviceGetMemoryInfo_t(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t nvmlDeviceGetMemoryInfo_v2_t(nvmlDevice_t, nvmlMemory_v2_t *);
#endif

static void hold(size_t mib) {
  void *cu = dlopen("libcuda.so.1", RTLD_NOW);
  if (!cu) exit(3);
  int (*init)(unsigned) = (int (*)(unsigned))dlsym(cu, "cuInit");
  int (*retain)(void **, int) = (int (*)(void **, int))dlsym(cu, "cuDevicePrimaryCtxRetain");
  int (*set)(void *) = (int (*)(void *))dlsym(cu, "cuCtxSetCurrent");
  int (*alloc)(unsigned long long *, size_t) =
      (int (*)(unsigned long long *, size_t))dlsym(cu, "cuMemAlloc_v2");
  void *ctx;
  unsigned long long p;
  if (init(0) || retain(&ctx, 0) || set(ctx) || alloc(&p, mib << 20)) {
    fprintf(stderr, "nvml: cannot hold %zu MiB\n", mib);
    exit(3);
  }
}

int main(int argc, char **argv) {
  if (argc > 1) hold((size_t)atol(argv[1]));
#ifndef LINKED
  nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!nvml) {
    fprintf(stderr, "nvml: %s\n", dlerror());
    return 3;
  }
#endif
  unsigned n = 0;
  if (GET(nvmlInit_v2)() || GET(nvmlDeviceGetCount_v2)(&n)) return 3;
  for (unsigned i = 0; i < n; i++) {
    nvmlDevice_t d;
    nvmlMemory_t m;
    nvmlMemory_v2_t m2 = {.version = NVML_MEMORY_V2};
    if (GET(nvmlDeviceGetHandleByIndex_v2)(i, &d) || GET(nvmlDeviceGetMemoryInfo)(d, &m) ||
        GET(nvmlDeviceGetMemoryInfo_v2)(d, &m2))
      return 3;
    printf("nvml i=%u total=%llu used=%llu free=%llu\n", i, m.total, m.used, m.free);
    printf("nvml2 i=%u total=%llu reserved=%llu used=%llu free=%llu\n", i, m2.total, m2.reserved,
           m2.used, m2.free);
  }
  return 0;
}
