// The chaos suite's client (tests/chaos.rs): a program under LD_PRELOAD against the fake driver
// that is made to meet what a shared node throws at it. It reaches the driver by dlsym, as
// most runtimes do.
//
//   chaos race WAY ROUNDS THREADS   THREADS threads allocate random sizes (1 B to 4 MiB), each
//                                   keeping at most 4 live, ROUNDS rounds of 400 steps. WAY:
//                                   sync (cuMemAlloc/cuMemFree) or async (cuMemAllocAsync and
//                                   cuMemFreeAsync on a stream per thread). What they hold at
//                                   once stays far below the device, so every out-of-memory
//                                   answer is a false one: prints "race ooms=N" and exits 1 if
//                                   N > 0.
//   chaos churn SEED                allocates and frees random sizes (1 to 8 MiB) forever, up
//                                   to 8 live, printing "alive n=STEPS" every 50 steps, and
//                                   after any step that ends 100 ms or more after the last
//                                   line (a group at its limit answers after asking the others
//                                   to lend, up to 200 ms a step): a group member to be killed
//                                   at any instant, whose silence means one call that hangs.
//   chaos once [hold]               one 1 MiB allocation: prints "once ok us=N", N the
//                                   microseconds from the first driver call (set-up and a
//                                   group's join included) to the allocation's answer; with
//                                   hold, keeps it until its stdin closes. Then frees it.
//   chaos hold DIR MEMBER           (no CUDA) a neighbour's live writer: locks every file of
//                                   DIR where cudapool's writers hold theirs, then sleeps.
//   chaos fill SIZE SECONDS [kill|create|pool]
//                                   blocks of SIZE until refused ("fill n=N"), held SECONDS,
//                                   then freed, or with kill, the process SIGKILLs itself;
//                                   with create, physical memory by cuMemCreate instead;
//                                   with pool, from a driver pool of its own
//                                   (cuMemPoolCreate, cuMemAllocFromPoolAsync).
//   chaos oom N                     N allocations of 2 GiB (more than the fake device has):
//                                   prints "oom ooms=N", the out-of-memory answers it got.
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_min.h"

static CUresult (*Init)(unsigned);
static CUresult (*DeviceGet)(CUdevice *, int);
static CUresult (*Retain)(CUcontext *, CUdevice);
static CUresult (*SetCurrent)(CUcontext);
static CUresult (*Alloc)(CUdeviceptr *, size_t);
static CUresult (*Free)(CUdeviceptr);
static CUresult (*AllocAsync)(CUdeviceptr *, size_t, void *);
static CUresult (*FreeAsync)(CUdeviceptr, void *);
static CUresult (*StreamCreate)(void **, unsigned);
static CUresult (*StreamSynchronize)(void *);
static CUresult (*Create)(unsigned long long *, size_t, const void *, unsigned long long);
static CUresult (*Release)(unsigned long long);
static CUresult (*PoolCreate)(void **, const void *);
static CUresult (*AllocFromPool)(CUdeviceptr *, size_t, void *, void *);
static CUresult (*PoolDestroy)(void *);
static CUcontext ctx;

static void *need(void *lib, const char *name) {
  void *f = dlsym(lib, name);
  if (!f) {
    fprintf(stderr, "chaos: no %s\n", name);
    exit(3);
  }
  return f;
}

static void setup(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "chaos: %s\n", dlerror());
    exit(3);
  }
  Init = need(lib, "cuInit");
  DeviceGet = need(lib, "cuDeviceGet");
  Retain = need(lib, "cuDevicePrimaryCtxRetain");
  SetCurrent = need(lib, "cuCtxSetCurrent");
  Alloc = need(lib, "cuMemAlloc_v2");
  Free = need(lib, "cuMemFree_v2");
  AllocAsync = need(lib, "cuMemAllocAsync");
  FreeAsync = need(lib, "cuMemFreeAsync");
  StreamCreate = need(lib, "cuStreamCreate");
  StreamSynchronize = need(lib, "cuStreamSynchronize");
  Create = need(lib, "cuMemCreate");
  Release = need(lib, "cuMemRelease");
  PoolCreate = need(lib, "cuMemPoolCreate");
  AllocFromPool = need(lib, "cuMemAllocFromPoolAsync");
  PoolDestroy = need(lib, "cuMemPoolDestroy");
  CUdevice d;
  if (Init(0) || DeviceGet(&d, 0) || Retain(&ctx, d) || SetCurrent(ctx)) {
    fprintf(stderr, "chaos: no context\n");
    exit(3);
  }
}

// xorshift: each thread its own sequence.
static uint64_t next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static int async_way;
static int rounds_left;
static long false_ooms;
static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;

enum { SLOTS = 4, STEPS = 400 };

static void *racer(void *arg) {
  uint64_t seed = (uintptr_t)arg * 0x9e3779b97f4a7c15ull + (uint64_t)getpid();
  SetCurrent(ctx);
  void *stream = NULL;
  if (async_way && StreamCreate(&stream, 0)) return NULL;
  CUdeviceptr live[SLOTS] = {0};
  for (int i = 0; i < STEPS; i++) {
    int k = (int)(next(&seed) % SLOTS);
    if (live[k]) {
      if (async_way) FreeAsync(live[k], stream);
      else Free(live[k]);
      live[k] = 0;
    }
    size_t size = 1 + (size_t)(next(&seed) % (4u << 20));
    CUresult r = async_way ? AllocAsync(&live[k], size, stream) : Alloc(&live[k], size);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      pthread_mutex_lock(&m);
      false_ooms++;
      pthread_mutex_unlock(&m);
      live[k] = 0;
    } else if (r != CUDA_SUCCESS) {
      fprintf(stderr, "chaos: alloc %zu: error %d\n", size, r);
      exit(3);
    }
  }
  for (int k = 0; k < SLOTS; k++) {
    if (!live[k]) continue;
    if (async_way) FreeAsync(live[k], stream);
    else Free(live[k]);
  }
  if (stream) StreamSynchronize(stream);
  return NULL;
}

static int race(int argc, char **argv) {
  if (argc < 3) return 2;
  async_way = !strcmp(argv[0], "async");
  rounds_left = atoi(argv[1]);
  int threads = atoi(argv[2]);
  if (threads < 1 || threads > 64) return 2;
  for (int round = 0; round < rounds_left; round++) {
    pthread_t t[64];
    for (int i = 0; i < threads; i++)
      pthread_create(&t[i], NULL, racer, (void *)(uintptr_t)(round * 64 + i + 1));
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  }
  printf("race ooms=%ld\n", false_ooms);
  return false_ooms ? 1 : 0;
}

static int churn(int argc, char **argv) {
  uint64_t seed = (argc > 0 ? strtoull(argv[0], NULL, 10) : 1) * 2654435761ull + 1;
  CUdeviceptr live[8] = {0};
  size_t sizes[8] = {0};
  setvbuf(stdout, NULL, _IOLBF, 0);
  struct timespec said, now;
  clock_gettime(CLOCK_MONOTONIC, &said);
  for (long n = 1;; n++) {
    int k = (int)(next(&seed) % 8);
    if (live[k]) {
      if (Free(live[k])) {
        fprintf(stderr, "chaos: free failed\n");
        return 3;
      }
      live[k] = 0;
    }
    sizes[k] = (1 + next(&seed) % 8) << 20;
    CUresult r = Alloc(&live[k], sizes[k]);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) live[k] = 0; // the group is full: fine
    else if (r != CUDA_SUCCESS) {
      fprintf(stderr, "chaos: alloc error %d\n", r);
      return 3;
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    long ms = (now.tv_sec - said.tv_sec) * 1000 + (now.tv_nsec - said.tv_nsec) / 1000000;
    if (n % 50 == 0 || ms >= 100) {
      printf("alive n=%ld\n", n);
      said = now;
    }
  }
}

// A neighbour's live writer: holds a record lock on one byte of every file in DIR (byte 0 of a
// page, MEMBER of a ledger: where cudapool's own writers hold theirs), says so, and sleeps.
static int hold(const char *dir, long member) {
  DIR *d = opendir(dir);
  if (!d) return perror(dir), 1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    int fd = open(path, O_RDWR);
    if (fd < 0) return perror(path), 1;
    struct flock f = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_len = 1};
    f.l_start = strncmp(e->d_name, "page-", 5) ? member : 0;
    if (fcntl(fd, F_SETLK, &f)) return perror(path), 1;
    n++;
  }
  printf("holding %d\n", n);
  fflush(stdout);
  for (;;) pause();
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: chaos race|churn|once ...\n");
    return 2;
  }
  if (!strcmp(argv[1], "hold") && argc > 3) return hold(argv[2], atol(argv[3]));
  // `starve SCENARIO ...`: the first CUDA calls made with every descriptor taken (opened until
  // EMFILE), the descriptors closed after, then SCENARIO: what a job process could do to hide
  // its job from a look-up that needs a descriptor.
  int starved[65536], nstarved = 0;
  if (!strcmp(argv[1], "starve") && argc > 2) {
    // The driver is loaded first (a second dlopen of it needs no descriptor).
    if (!dlopen("libcuda.so.1", RTLD_NOW)) return 3;
    int fd;
    while (nstarved < 65536 && (fd = open("/dev/null", O_RDONLY)) >= 0) starved[nstarved++] = fd;
    argc--;
    argv++;
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  setup();
  if (nstarved) {
    CUdeviceptr first;
    if (Alloc(&first, 1 << 20) == CUDA_SUCCESS) Free(first);
    for (int i = 0; i < nstarved; i++) close(starved[i]);
    printf("starved %d descriptors\n", nstarved);
    fflush(stdout);
  }
  if (!strcmp(argv[1], "race")) return race(argc - 2, argv + 2);
  if (!strcmp(argv[1], "churn")) return churn(argc - 2, argv + 2);
  if (!strcmp(argv[1], "once")) {
    CUdeviceptr p;
    CUresult r = Alloc(&p, 1 << 20);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (r) {
      fprintf(stderr, "chaos: once: error %d\n", r);
      return 1;
    }
    long us = (t1.tv_sec - t0.tv_sec) * 1000000L + (t1.tv_nsec - t0.tv_nsec) / 1000;
    printf("once ok us=%ld\n", us);
    fflush(stdout);
    if (argc > 2 && !strcmp(argv[2], "hold")) {
      char buf[64];
      while (read(0, buf, sizeof buf) > 0) {
      }
    }
    Free(p);
    return 0;
  }
  if (!strcmp(argv[1], "fill") && argc > 3) {
    // Blocks of SIZE until refused, held SECONDS, then freed (or, with "kill", the process
    // ends itself with SIGKILL while holding them: the OOM killer's way).
    size_t size = strtoull(argv[2], NULL, 10);
    double seconds = atof(argv[3]);
    static CUdeviceptr held[4096];
    int n = 0;
    // With "create": physical memory of the program's own (cuMemCreate on device 0, as
    // PyTorch's expandable segments make it), which cudapool passes through and counts.
    // With "pool": from a driver pool of the program's own (cuMemPoolCreate on device 0,
    // cuMemAllocFromPoolAsync on the legacy stream), which cudapool charges as it grows.
    int create = argc > 4 && !strcmp(argv[4], "create");
    int from_pool = argc > 4 && !strcmp(argv[4], "pool");
    struct {
      int kind, handle_types, location_type, location_id;
      void *win32;
      unsigned char rest[64];
    } prop = {1, 0, 1, 0, NULL, {0}};
    void *pool = NULL;
    if (from_pool && PoolCreate(&pool, &prop) != CUDA_SUCCESS) {
      fprintf(stderr, "chaos: cuMemPoolCreate failed\n");
      return 3;
    }
    while (n < 4096 && (create      ? Create((unsigned long long *)&held[n], size, &prop, 0)
                        : from_pool ? AllocFromPool(&held[n], size, pool, NULL)
                                    : Alloc(&held[n], size)) == CUDA_SUCCESS)
      n++;
    printf("fill n=%d\n", n);
    fflush(stdout);
    struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
    if (argc > 4 && !strcmp(argv[4], "kill")) raise(SIGKILL);
    for (int i = 0; i < n; i++) create ? Release(held[i]) : from_pool ? FreeAsync(held[i], NULL) : Free(held[i]);
    if (pool) PoolDestroy(pool);
    return 0;
  }
  if (!strcmp(argv[1], "oom") && argc > 2) {
    // N allocations the size of the whole device: each one an out-of-memory answer.
    int n = atoi(argv[2]), ooms = 0;
    for (int i = 0; i < n; i++) {
      CUdeviceptr p = 0;
      if (Alloc(&p, (size_t)1 << 31) == CUDA_ERROR_OUT_OF_MEMORY) ooms++;
      else if (p) Free(p);
    }
    printf("oom ooms=%d\n", ooms);
    return 0;
  }
  fprintf(stderr, "chaos: unknown scenario %s\n", argv[1]);
  return 2;
}
