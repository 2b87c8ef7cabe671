// The ways the driver takes device memory for a process besides its allocations (issue 52),
// one step after another, each answer printed, reaching the driver through dlsym as most
// runtimes do. Runs on the fake driver (tests/preload/overhead.rs) and on a GPU
// (tests/gpu/programs/holes.sh, with a PTX image and nvidia-smi).
//
//   holes  (settings from the environment; a step left unset is skipped)
//     HOLES_ALLOC1, HOLES_ALLOC2   two cuMemAlloc sizes (bytes), both kept
//     HOLES_STACK, HOLES_HEAP      cuCtxSetLimit(CU_LIMIT_STACK_SIZE / MALLOC_HEAP_SIZE) values
//     HOLES_MODULE                 a file whose bytes cuModuleLoadData loads
//     HOLES_CTXS                   how many cuCtxCreate_v2 contexts to make (kept)
//     HOLES_SMI=1                  after each step, the process's memory as nvidia-smi says
//   Prints "step NAME rc=N [smi_mib=M]", then "free_mib=F" before and after giving everything
//   back ("back NAME rc=N").
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudapool.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef unsigned long long CUdeviceptr;

static void *lib;
static void *sym(const char *n) {
  void *p = dlsym(lib, n);
  if (!p) {
    fprintf(stderr, "holes: no %s\n", n);
    exit(2);
  }
  return p;
}

static void smi(void) {
  if (!getenv("HOLES_SMI")) return;
  char cmd[160];
  snprintf(cmd, sizeof cmd,
           "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' '$1==%d {print $2}'",
           (int)getpid());
  FILE *f = popen(cmd, "r");
  long mib = -1;
  if (f) {
    if (fscanf(f, "%ld", &mib) != 1) mib = -1;
    pclose(f);
  }
  printf(" smi_mib=%ld", mib);
}

static void step(const char *name, CUresult r) {
  printf("step %s rc=%d", name, r);
  smi();
  printf("\n");
  fflush(stdout);
}

static size_t env_size(const char *n) {
  const char *v = getenv(n);
  return v ? strtoull(v, NULL, 10) : 0;
}

static CUresult (*race_set_limit)(int, size_t);
static CUresult (*race_set_current)(CUcontext);
static CUcontext race_ctx;
static size_t race_size;

static void *race_heap(void *arg) {
  (void)arg;
  race_set_current(race_ctx);
  race_set_limit(2, race_size);
  return NULL;
}

int main(void) {
  lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "holes: cannot load libcuda.so.1 (%s)\n", dlerror());
    return 2;
  }
  CUresult (*init)(unsigned) = sym("cuInit");
  CUresult (*get)(CUdevice *, int) = sym("cuDeviceGet");
  CUresult (*retain)(CUcontext *, CUdevice) = sym("cuDevicePrimaryCtxRetain");
  CUresult (*set_current)(CUcontext) = sym("cuCtxSetCurrent");
  CUresult (*alloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
  CUresult (*set_limit)(int, size_t) = sym("cuCtxSetLimit");
  CUresult (*load)(CUmodule *, const void *) = sym("cuModuleLoadData");
  CUresult (*unload)(CUmodule) = sym("cuModuleUnload");
  CUresult (*create)(CUcontext *, unsigned, CUdevice) = sym("cuCtxCreate_v2");
  CUresult (*destroy)(CUcontext) = sym("cuCtxDestroy_v2");
  CUresult (*info)(size_t *, size_t *) = sym("cuMemGetInfo_v2");
  CUdevice dev;
  CUcontext primary;
  if (init(0) || get(&dev, 0) || retain(&primary, dev) || set_current(primary)) {
    fprintf(stderr, "holes: no device\n");
    return 2;
  }
  step("context", 0);
  CUdeviceptr p1 = 0, p2 = 0;
  if (env_size("HOLES_ALLOC1")) step("alloc1", alloc(&p1, env_size("HOLES_ALLOC1")));
  if (env_size("HOLES_ALLOC2")) step("alloc2", alloc(&p2, env_size("HOLES_ALLOC2")));
  CUresult stack = -1, heap = -1;
  if (env_size("HOLES_STACK")) step("stack", stack = set_limit(0, env_size("HOLES_STACK")));
  if (env_size("HOLES_HEAP")) step("heap", heap = set_limit(2, env_size("HOLES_HEAP")));
  // HOLES_HEAP_RACE=N: N threads set the heap to HOLES_HEAP_RACE_SIZE at once.
  int racers = (int)env_size("HOLES_HEAP_RACE");
  if (racers > 0) {
    race_set_limit = set_limit;
    race_set_current = set_current;
    race_ctx = primary;
    race_size = env_size("HOLES_HEAP_RACE_SIZE");
    pthread_t t[16];
    for (int i = 0; i < racers && i < 16; i++) pthread_create(&t[i], NULL, race_heap, NULL);
    for (int i = 0; i < racers && i < 16; i++) pthread_join(t[i], NULL);
    heap = 0;
    step("heap_race", 0);
  }
  CUmodule mod = NULL;
  CUresult mod_rc = -1;
  const char *path = getenv("HOLES_MODULE");
  if (path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
      fprintf(stderr, "holes: cannot read %s\n", path);
      return 2;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *image = calloc(1, n + 1);
    if (fread(image, 1, n, f) != (size_t)n) return 2;
    fclose(f);
    step("module", mod_rc = load(&mod, image));
    free(image);
  }
  int nctx = (int)env_size("HOLES_CTXS");
  CUcontext ctxs[64] = {0};
  for (int i = 0; i < nctx && i < 64; i++) {
    CUresult r = create(&ctxs[i], 0, dev);
    char name[32];
    snprintf(name, sizeof name, "ctx%d", i + 1);
    step(name, r);
    if (r) ctxs[i] = NULL;
  }
  set_current(primary);
  size_t free_b = 0, total_b = 0;
  info(&free_b, &total_b);
  printf("free_mib=%zu total_mib=%zu\n", free_b >> 20, total_b >> 20);
  // cudapool's own figures, when it is there.
  int (*get_stats)(int, cudapool_stats *) = (int (*)(int, cudapool_stats *))dlsym(RTLD_DEFAULT, "cudapool_get_stats");
  cudapool_stats st = {.struct_size = sizeof st};
  if (get_stats && get_stats(0, &st) == 0)
    printf("cudapool reserved_mib=%llu overhead_mib=%llu\n", (unsigned long long)st.reserved_bytes >> 20,
           (unsigned long long)st.overhead_bytes >> 20);
  // Everything back: contexts, the module, the limits at their defaults.
  for (int i = 0; i < nctx && i < 64; i++)
    if (ctxs[i]) printf("back ctx%d rc=%d\n", i + 1, destroy(ctxs[i]));
  set_current(primary);
  if (!mod_rc) printf("back module rc=%d\n", unload(mod));
  if (!stack) printf("back stack rc=%d\n", set_limit(0, 1024));
  if (!heap) printf("back heap rc=%d\n", set_limit(2, 8 << 20));
  info(&free_b, &total_b);
  printf("free_mib=%zu total_mib=%zu\n", free_b >> 20, total_b >> 20);
  if (get_stats && get_stats(0, &st) == 0)
    printf("cudapool_after reserved_mib=%llu overhead_mib=%llu\n", (unsigned long long)st.reserved_bytes >> 20,
           (unsigned long long)st.overhead_bytes >> 20);
  (void)p1, (void)p2;
  return 0;
}
