// Graph capture scenarios of the client, against the fake driver's capture rules
// (tests/fake/libcuda_streams.c: the modes, the calls a capture forbids, the legacy stream's
// implicit synchronization). Each is a legal program: whatever cudapool does on its own behalf
// meanwhile must leave every capture intact.
//
//   capture MODE KIND   one thread captures on a stream of KIND (blocking | nonblocking) in
//                       MODE (global | thread_local | relaxed), 20 times; during each capture
//                       it allocates itself (relaxed, as PyTorch does for its graph pool) and
//                       a second thread allocates, frees, misses the pool, trims and reclaims
//                       (in the relaxed mode where MODE is global, as a legal program must)
//   capture_breaks      the program itself synchronizes its capturing stream: the driver's own
//                       error, and the pool still serves afterwards
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

#define LEGACY ((void *)1)
#define MIB ((size_t)1 << 20)

enum { GLOBAL = 0, THREAD_LOCAL = 1, RELAXED = 2 };

static CUresult (*exchange)(int *);
static CUresult (*sync_stream)(void *);
static size_t (*reclaim)(int);
static volatile int want, done, stop; // burst requests of the first thread, served by the second
static int capture_mode;
static long b_steps, b_ooms, b_errors;

// The second thread's burst: allocations of new sizes (pool misses), work, frees, a trim.
static void burst(void *w, int round) {
  CUdeviceptr p[6] = {0};
  for (int i = 0; i < 6; i++) {
    size_t size = (size_t)(1 + (round * 6 + i) % 37) * MIB + 4096 * (size_t)i;
    CUresult r = cu.MemAlloc(&p[i], size);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      b_ooms++;
      p[i] = 0;
      continue;
    }
    if (r != CUDA_SUCCESS) {
      fprintf(stderr, "client: second thread's alloc: %d\n", r);
      b_errors++;
      p[i] = 0;
      continue;
    }
    touch(w, p[i], 4096, 2);
  }
  for (int i = 0; i < 6; i++)
    if (p[i] && cu.MemFree(p[i]) != CUDA_SUCCESS) b_errors++;
  if (round % 3 == 0 && reclaim) reclaim(0); // the program asks cudapool to give cache back
  b_steps++;
}

static void *second(void *arg) {
  void *w = arg;
  CHECK(cu.CtxSetCurrent(primary));
  for (int round = 0;; round++) {
    while (want == done && !stop) sched_yield();
    if (want == done) break;
    // Where a capture of another thread is global, a legal program allocates in the relaxed
    // mode (as PyTorch's caching allocator does around cudaMalloc during a capture).
    int mode = RELAXED;
    if (capture_mode == GLOBAL) CHECK(exchange(&mode));
    burst(w, round);
    if (capture_mode == GLOBAL) CHECK(exchange(&mode));
    __atomic_add_fetch(&done, 1, __ATOMIC_SEQ_CST);
  }
  return NULL;
}

static void ask_burst(void) {
  int target = __atomic_add_fetch(&want, 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&done, __ATOMIC_SEQ_CST) < target) sched_yield();
}

static int capture(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "client: capture MODE KIND\n");
    return 2;
  }
  capture_mode = !strcmp(argv[0], "global") ? GLOBAL : !strcmp(argv[0], "thread_local") ? THREAD_LOCAL : RELAXED;
  unsigned flags = !strcmp(argv[1], "nonblocking") ? 1 : 0;
  exchange = fake_fn("cuThreadExchangeStreamCaptureMode");
  reclaim = (size_t(*)(int))dlsym(RTLD_DEFAULT, "cudapool_reclaim");
  long (*invalidations)(void) = (long (*)(void))fake_fn("fakecu_capture_invalidations");
  const char *(*breaker)(void) = (const char *(*)(void))fake_fn("fakecu_capture_breaker");
  void *s, *w;
  CHECK(cu.StreamCreate(&s, flags));
  CHECK(cu.StreamCreate(&w, 1));
  // Work on the capturing stream and on the legacy stream before: both are queues cudapool
  // knows (and would query, fence or retire).
  CUdeviceptr buf;
  CHECK(cu.MemAlloc(&buf, 8 * MIB));
  touch(s, buf, 4096, 5);
  touch(LEGACY, buf, 4096, 5);
  pthread_t t;
  pthread_create(&t, NULL, second, w);
  ask_burst(); // fences and pending frees from before any capture
  int failed = 0, first_failed = -1;
  CUresult first_rc = 0;
  for (int i = 0; i < 20; i++) {
    CHECK(cu.BeginCapture(s, capture_mode));
    touch(s, buf, 4096, 1);
    ask_burst();
    // The capturing thread's own allocation, a miss (a new size), made in the relaxed mode.
    int mode = RELAXED;
    CHECK(exchange(&mode));
    CUdeviceptr mine;
    CUresult r = cu.MemAlloc(&mine, (size_t)(40 + i) * MIB);
    CHECK(exchange(&mode));
    if (r == CUDA_SUCCESS) touch(s, mine, 4096, 1);
    ask_burst();
    void *graph = NULL;
    CUresult end = cu.EndCapture(s, &graph);
    if (end != CUDA_SUCCESS || !graph) {
      if (!failed) first_failed = i, first_rc = end;
      failed++;
    }
    if (r == CUDA_SUCCESS) CHECK(cu.MemFree(mine));
    ask_burst(); // between captures: fences, retirements and trims may run again
  }
  stop = 1;
  pthread_join(t, NULL);
  CHECK(cu.MemFree(buf));
  printf("capture mode=%s kind=%s captures=20 failed=%d first_failed=%d first_rc=%d invalidations=%ld "
         "breaker=%s b_steps=%ld b_ooms=%ld b_errors=%ld races=%ld\n",
         argv[0], argv[1], failed, first_failed, (int)first_rc, invalidations(),
         *breaker() ? breaker() : "none", b_steps, b_ooms, b_errors, races());
  print_stats("capture_end");
  return 0;
}

// The program breaks its own capture: the driver's error reaches it unchanged, and the pool
// goes on serving.
static int capture_breaks(void) {
  sync_stream = fake_fn("cuStreamSynchronize");
  void *s;
  CHECK(cu.StreamCreate(&s, 0));
  CUdeviceptr a, b;
  CHECK(cu.MemAlloc(&a, 4 * MIB));
  touch(s, a, 4096, 1);
  CHECK(cu.BeginCapture(s, GLOBAL));
  CUresult sync = sync_stream(s);
  void *graph = (void *)1;
  CUresult end = cu.EndCapture(s, &graph);
  CHECK(cu.MemFree(a));
  CHECK(cu.MemAlloc(&b, 4 * MIB));
  printf("breaks sync=%d end=%d graph_null=%d reused=%d\n", (int)sync, (int)end, graph == NULL, a == b);
  CHECK(cu.MemFree(b));
  print_stats("breaks_end");
  return 0;
}

// A capture's temporary: the capturing thread allocates a block, captures work on it and frees
// it before the capture ends (PyTorch with its cache off does this); the graph names the block
// at every replay, so cudapool must neither reuse it nor give it back. Prints the stats as
// "during" (after the capture), "after" (an idle wait) and "reclaimed" (after cudapool_reclaim),
// then "kept reused=" for a new allocation of the same size.
static int capture_free(void) {
  void *s;
  CHECK(cu.StreamCreate(&s, 0));
  CUdeviceptr warm, tmp, b;
  CHECK(cu.MemAlloc(&warm, 64 * MIB));
  CHECK(cu.BeginCapture(s, RELAXED));
  CHECK(cu.MemAlloc(&tmp, 64 * MIB));
  touch(s, tmp, 4096, 1);
  CHECK(cu.MemFree(tmp));
  void *graph = NULL;
  CHECK(cu.EndCapture(s, &graph));
  print_stats("during");
  // Past an idle window of CUDAPOOL_CACHE_IDLE (the test sets 100ms).
  nanosleep(&(struct timespec){0, 500000000}, NULL);
  print_stats("after");
  // A reclaim gives back everything cached, waiting for its fences.
  size_t (*reclaim)(int) = (size_t(*)(int))dlsym(RTLD_DEFAULT, "cudapool_reclaim");
  if (reclaim) reclaim(-1);
  print_stats("reclaimed");
  CHECK(cu.MemAlloc(&b, 64 * MIB));
  printf("kept reused=%d\n", b == tmp);
  CHECK(cu.MemFree(b));
  CHECK(cu.MemFree(warm));
  return 0;
}

int capture_scenario(const char *name, int argc, char **argv) {
  if (!strcmp(name, "capture")) return capture(argc, argv);
  if (!strcmp(name, "capture_breaks")) return capture_breaks();
  if (!strcmp(name, "capture_free")) return capture_free();
  return -1;
}
