// Reuse-safety scenarios of the client, against the fake driver's modelled device (a GPU that
// lags the CPU, and a race detector: tests/fake/libcuda.c). Device work goes through the
// client's own cuLaunchKernel (linked, by dlsym, or by cuGetProcAddress), as a real program's
// does, so the shim sees it.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client.h"

#define MB20 ((size_t)20 << 20)
#define LEGACY ((void *)1)
#define PER_THREAD ((void *)2)
#define HOLD_KERNEL ((void *)0x401)
#define TOUCH_KERNEL ((void *)0x402)

// A kernel on `s` that runs until the test finishes it; returns its hold.
long launch_hold(void *s) {
  CHECK(cu.LaunchKernel(HOLD_KERNEL, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
  return ((long (*)(void))fake_fn("fakecu_last_hold"))();
}

// A kernel on `s` that runs for `us` microseconds of device time and touches [p, p + n).
void touch(void *s, CUdeviceptr p, size_t n, unsigned us) {
  void *params[] = {&p, &n};
  CHECK(cu.LaunchKernel(TOUCH_KERNEL, us, 1, 1, 1, 1, 1, 0, s, params, NULL));
}

long races(void) { return ((long (*)(void))fake_fn("fakecu_races"))(); }

struct other {
  CUdeviceptr got;
  size_t size;
};
static void *alloc_on_other_thread(void *arg) {
  struct other *o = arg;
  CHECK(cu.CtxSetCurrent(primary));
  CHECK(cu.MemAlloc(&o->got, o->size));
  return NULL;
}
static CUdeviceptr other_thread_alloc(size_t size) {
  struct other o = {0, size};
  pthread_t t;
  pthread_create(&t, NULL, alloc_on_other_thread, &o);
  pthread_join(t, NULL);
  return o.got;
}

static void *touch_on_own_stream(void *arg) {
  CHECK(cu.CtxSetCurrent(primary));
  CUdeviceptr p;
  CHECK(cu.MemAlloc(&p, 4096));
  touch(NULL, p, 4096, 1); // this thread's default stream (its own with gpa-ptsz)
  *(CUdeviceptr *)arg = p;
  return NULL;
}

// One thread on its per-thread default stream is one queue: it reuses its blocks at once.
// A second thread's work on its own per-thread stream makes two: reuse waits for fences.
static int ptds(void) {
  CUdeviceptr p;
  CHECK(cu.MemAlloc(&p, 4096));
  CHECK(cu.MemsetD8(p, 7, 4096));
  CHECK(cu.MemFree(p));
  printf("memset=%ld memset_ptds=%ld\n", fake_calls("cuMemsetD8_v2"),
         fake_calls("cuMemsetD8_v2_ptds"));
  CUdeviceptr ballast, a, b, c, other;
  CHECK(cu.MemAlloc(&ballast, (size_t)512 << 20)); // a fenced free is small against this
  CHECK(cu.MemAlloc(&a, MB20));
  long h = launch_hold(NULL);
  CHECK(cu.MemFree(a));
  CHECK(cu.MemAlloc(&b, MB20));
  printf("one_thread_reuse=%d\n", b == a);
  pthread_t t;
  pthread_create(&t, NULL, touch_on_own_stream, &other);
  pthread_join(t, NULL);
  CHECK(cu.MemFree(b));
  long waits = fake_calls("cuStreamWaitEvent") + fake_calls("cuStreamWaitEvent_ptsz");
  CHECK(cu.MemAlloc(&c, MB20));
  int (*running)(long) = (int (*)(long))fake_fn("fakecu_running");
  int busy = c == b && running(h);
  touch(NULL, c, 4096, 1); // this thread's default stream
  // Busy is safe only handed over: this thread's next work waited on the device.
  int handed = waits < fake_calls("cuStreamWaitEvent") + fake_calls("cuStreamWaitEvent_ptsz");
  printf("second_thread_reuse_while_busy=%d handed_over=%d\n", busy && !handed, busy && handed);
  printf("ptds_races=%ld\n", races());
  return 0;
}

static int reuse(void) {
  void (*finish)(long) = (void (*)(long))fake_fn("fakecu_finish");
  int (*running)(long) = (int (*)(long))fake_fn("fakecu_running");
  long (*violations)(void) = (long (*)(void))fake_fn("fakecu_capture_violations");
  int (*waits_for)(void *, long) = (int (*)(void *, long))fake_fn("fakecu_stream_waits_for");
  CUdeviceptr a, b, c, d, e, f;
  // 1. All work on the legacy stream: one queue, any thread reuses at once.
  CHECK(cu.MemAlloc(&a, MB20));
  long h = launch_hold(LEGACY); // a kernel on the legacy stream still reads a
  CHECK(cu.MemFree(a));
  CHECK(cu.MemAlloc(&b, MB20));
  printf("same_thread_immediate=%d\n", b == a); // stream order keeps it safe
  CHECK(cu.MemFree(b));
  c = other_thread_alloc(MB20);
  printf("other_thread_immediate=%d\n", c == a); // the same queue
  CHECK(cu.MemFree(c));
  // The first work on a new stream must not overlap the kernel that may still read a reused
  // block: the stream is made to wait for the legacy stream's work.
  void *late;
  CHECK(cu.StreamCreate(&late, 1));
  printf("created_stream_waits=%d\n", waits_for(late, h));
  touch(late, 0, 0, 1);
  printf("late_stream_waits=%d\n", waits_for(late, h));
  CHECK(cu.StreamDestroy(late));
  finish(h);
  // 2. Work on a non-blocking stream and on legacy: a free waits for a fence.
  CUdeviceptr ballast;
  CHECK(cu.MemAlloc(&ballast, (size_t)512 << 20)); // a fenced free is small against this
  void *s;
  CHECK(cu.StreamCreate(&s, 1));
  CHECK(cu.MemAlloc(&d, MB20));
  long h2 = launch_hold(s);
  touch(LEGACY, 0, 0, 1);
  CHECK(cu.MemFree(d));
  CHECK(cu.MemAlloc(&e, MB20));
  // Reused while the kernel runs is safe only handed over: the other queue's next work then
  // waits for the kernel on the device. Busy and unprotected is the bug.
  int busy = e == d && running(h2);
  touch(LEGACY, e, 4096, 1);
  printf("reused_while_busy=%d handed_over=%d\n", busy && !waits_for(LEGACY, h2),
         busy && waits_for(LEGACY, h2));
  CHECK(cu.MemFree(e));
  finish(h2);
  CHECK(cu.MemAlloc(&f, MB20));
  printf("reused_after_fence=%d\n", f == d || f == e || f == c || f == a);
  CHECK(cu.MemFree(f));
  // 3. A stream destroyed while its work still runs: that work is still fenced.
  void *s3;
  CHECK(cu.StreamCreate(&s3, 1));
  CUdeviceptr x, y, z;
  CHECK(cu.MemAlloc(&x, 2 * MB20));
  long h3 = launch_hold(s3);
  CHECK(cu.MemFree(x));
  CHECK(cu.StreamDestroy(s3));
  CHECK(cu.MemAlloc(&y, 2 * MB20));
  busy = y == x && running(h3);
  touch(LEGACY, y, 4096, 1);
  printf("reused_while_destroyed_stream_busy=%d\n", busy && !waits_for(LEGACY, h3));
  finish(h3);
  CHECK(cu.MemFree(y));
  CHECK(cu.MemAlloc(&z, 2 * MB20));
  printf("reused_after_destroyed_stream=%d\n", z == x || z == y);
  CHECK(cu.MemFree(z));
  CHECK(cu.MemFree(ballast));
  // 4. No event while a graph is being captured (an event on the legacy stream would ruin it).
  long before = fake_calls("cuEventRecord");
  CHECK(cu.BeginCapture(s, 0));
  CUdeviceptr g[4];
  for (int i = 0; i < 4; i++) CHECK(cu.MemAlloc(&g[i], 3 * MB20));
  for (int i = 0; i < 4; i++) touch(s, g[i], 4096, 1); // captured, not run
  for (int i = 0; i < 4; i++) CHECK(cu.MemFree(g[i]));
  for (int i = 0; i < 4; i++) CHECK(cu.MemAlloc(&g[i], 3 * MB20));
  for (int i = 0; i < 4; i++) CHECK(cu.MemFree(g[i]));
  void *graph;
  CHECK(cu.EndCapture(s, &graph));
  printf("records_during_capture=%ld capture_violations=%ld\n",
         fake_calls("cuEventRecord") - before, violations());
  CHECK(cu.StreamDestroy(s));
  printf("reuse_races=%ld\n", races());
  print_stats("reuse_end");
  return 0;
}

// Under a limit, a freed block whose fence is not done yet: the shim waits for it and serves
// the request from the cache, instead of failing or going back to the driver.
static int pressure(void) {
  int (*running)(long) = (int (*)(long))fake_fn("fakecu_running");
  void *s;
  CHECK(cu.StreamCreate(&s, 1));
  touch(LEGACY, 0, 0, 1); // two queues: a free waits for a fence
  CUdeviceptr a, b;
  CHECK(cu.MemAlloc(&a, 2 * MB20));
  long h = launch_hold(s);
  CHECK(cu.MemFree(a));
  CUresult r = cu.MemAlloc(&b, 2 * MB20);
  int busy = running(h);
  if (r == CUDA_SUCCESS) touch(LEGACY, b, 4096, 1);
  int (*waits_for)(void *, long) = (int (*)(void *, long))fake_fn("fakecu_stream_waits_for");
  // Safe: waited for on the host, or handed over (the legacy stream waits for the kernel).
  printf("pressure=%d waited=%d handed_over=%d same=%d\n", r, !busy, busy && waits_for(LEGACY, h),
         b == a);
  if (r == CUDA_SUCCESS) CHECK(cu.MemFree(b));
  print_stats("pressure_end");
  return 0;
}

// ---- a training loop on a GPU that lags -----------------------------------------------------
// Each step allocates activations layer by layer (with temporaries), then frees them in reverse
// with gradients, every buffer touched by kernels. The CPU runs far ahead of the modelled GPU
// (kernels of 20-40 us, 1 us of CPU per launch). Layouts:
//   legacy       all work on the legacy stream (no stream created)
//   idle-stream  a stream is created and never used; work on the legacy stream
//   own-stream   all work on one stream the program created
//   threads      four threads, each its own loop, all on the legacy stream
//   two-streams  forward on the legacy stream, backward on a second one (ordered after the
//                forward by the program's event): two queues, so frees wait for fences
// Prints the live peak (what the program held at most), races and the shim's figures.
#define LAYERS 12
static size_t layer_size(int l) { return ((size_t)(l % 4) + 1) * (2 << 20) + (size_t)l * 4096; }

struct loop {
  void *fwd, *bwd;
  int steps;
  size_t live, peak;
  void *ev; // two-streams: the forward's end
};

static CUresult (*event_create)(void **, unsigned);
static CUresult (*event_record)(void *, void *);
static CUresult (*stream_wait_event)(void *, void *, unsigned);

static CUdeviceptr take(struct loop *L, size_t n) {
  CUdeviceptr p;
  CHECK(cu.MemAlloc(&p, n));
  L->live += n;
  if (L->live > L->peak) L->peak = L->live;
  return p;
}
static void give(struct loop *L, CUdeviceptr p, size_t n) {
  CHECK(cu.MemFree(p));
  L->live -= n;
}

static void *train(void *arg) {
  struct loop *L = arg;
  CHECK(cu.CtxSetCurrent(primary));
  for (int step = 0; step < L->steps; step++) {
    CUdeviceptr act[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
      act[l] = take(L, layer_size(l));
      touch(L->fwd, act[l], layer_size(l), 30);
      CUdeviceptr tmp = take(L, layer_size(l) / 2);
      touch(L->fwd, tmp, layer_size(l) / 2, 20);
      give(L, tmp, layer_size(l) / 2);
    }
    if (L->ev) {
      CHECK(event_record(L->ev, L->fwd));
      CHECK(stream_wait_event(L->bwd, L->ev, 0));
    }
    for (int l = LAYERS - 1; l >= 0; l--) {
      CUdeviceptr grad = take(L, layer_size(l));
      touch(L->bwd, grad, layer_size(l), 40);
      touch(L->bwd, act[l], layer_size(l), 20);
      give(L, act[l], layer_size(l));
      give(L, grad, layer_size(l));
    }
  }
  return NULL;
}

// A driver entry point by name (through the shim's dlsym when preloaded).
static void *sym(const char *name) { return dlsym(driver ? driver : RTLD_DEFAULT, name); }

static int lag(int argc, char **argv) {
  const char *layout = argc > 0 ? argv[0] : "legacy";
  int steps = argc > 1 ? atoi(argv[1]) : 16;
  struct loop L = {LEGACY, LEGACY, steps, 0, 0, NULL};
  void *s = NULL;
  int nthreads = 1;
  if (!strcmp(layout, "idle-stream")) {
    CHECK(cu.StreamCreate(&s, 1));
  } else if (!strcmp(layout, "own-stream")) {
    CHECK(cu.StreamCreate(&s, 1));
    L.fwd = L.bwd = s;
  } else if (!strcmp(layout, "threads")) {
    nthreads = 4;
  } else if (!strcmp(layout, "two-streams")) {
    CHECK(cu.StreamCreate(&s, 1));
    L.bwd = s;
    event_create = sym("cuEventCreate");
    event_record = sym("cuEventRecord");
    stream_wait_event = sym("cuStreamWaitEvent");
    if (!event_create || !event_record || !stream_wait_event) {
      fprintf(stderr, "client: no event entry points\n");
      return 4;
    }
    CHECK(event_create(&L.ev, 2));
  } else if (strcmp(layout, "legacy")) {
    fprintf(stderr, "client: unknown layout %s\n", layout);
    return 2;
  }
  struct loop each[4];
  pthread_t t[4];
  for (int i = 0; i < nthreads; i++) {
    each[i] = L;
    pthread_create(&t[i], NULL, train, &each[i]);
  }
  size_t peak = 0;
  for (int i = 0; i < nthreads; i++) {
    pthread_join(t[i], NULL);
    peak += each[i].peak; // the threads' peaks may coincide
  }
  unsigned long long (*lag_ns)(void) = (unsigned long long (*)(void))fake_fn("fakecu_lag_ns");
  printf("lag layout=%s live_peak=%zu races=%ld waits=%ld lag_ns=%llu\n", layout, peak, races(),
         fake_calls("cuEventSynchronize"), lag_ns());
  print_stats("lag_end");
  return 0;
}

// ---- the boundary of one-queue reuse --------------------------------------------------------
static void sleep_ms(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&t, NULL);
}

// switch: a long kernel on the legacy stream reads `a`; the program frees it, gets the block
// back at once (one queue), and the first work on a new stream overwrites it.
// return: the same, but the second stream had work long ago and went idle (retired).
static int boundary(const char *which) {
  void *s;
  CHECK(cu.StreamCreate(&s, 1));
  CUdeviceptr a, b;
  if (!strcmp(which, "return")) {
    touch(s, 0, 0, 1);
    touch(LEGACY, 0, 0, 1);
    // Idle for longer than a probation; the shim looks at its queues on slow paths.
    for (int i = 0; i < 40; i++) {
      CUdeviceptr p;
      CHECK(cu.MemAlloc(&p, MB20 + (size_t)i * 4096));
      touch(LEGACY, p, 4096, 1);
      CHECK(cu.MemFree(p));
      sleep_ms(10);
    }
    CHECK(cu.MemAlloc(&a, MB20));
    CHECK(cu.MemFree(a));
    CHECK(cu.MemAlloc(&b, MB20));
    printf("one_queue_again=%d\n", b == a);
    CHECK(cu.MemFree(b));
  }
  long before = races();
  CHECK(cu.MemAlloc(&a, MB20));
  touch(LEGACY, a, MB20, 1000); // a long kernel reads a
  CHECK(cu.MemFree(a));
  CHECK(cu.MemAlloc(&b, MB20));
  touch(s, b, MB20, 10); // the stream's first work since: overwrites b
  printf("boundary %s reused=%d races=%ld\n", which, b == a, races() - before);
  CHECK(cu.MemFree(b));
  CHECK(cu.StreamDestroy(s));
  return 0;
}

// unmap: a long kernel reads a large block the program then frees (one queue: the block is
// ready for the next allocation at once). Giving memory back must wait for the device: a driver
// free does by itself, an unmap (expandable segments) does not. Through the reclaim of the C API
// (`reclaim`), or a free above the soft limit (`soft`, run with CUDAPOOL_SOFT_LIMIT).
static int unmap_scenario(const char *how) {
  size_t (*reclaim)(int) = (size_t(*)(int))dlsym(RTLD_DEFAULT, "cudapool_reclaim");
  long before = races();
  CUdeviceptr a, b;
  CHECK(cu.MemAlloc(&a, MB20));
  CHECK(cu.MemAlloc(&b, MB20));
  touch(LEGACY, a, MB20, 1000); // a long kernel reads a
  CHECK(cu.MemFree(a));
  size_t back = 0;
  if (!strcmp(how, "reclaim") && reclaim) back = reclaim(0);
  // The device's memory may be another block's now: new work on it must not race the kernel.
  CUdeviceptr c;
  CHECK(cu.MemAlloc(&c, MB20));
  touch(LEGACY, c, MB20, 10);
  CHECK(cu.MemFree(b));
  CHECK(cu.MemFree(c));
  if (reclaim) back += reclaim(0);
  size_t (*used)(int) = (size_t(*)(int))fake_fn("fakecu_used");
  printf("unmap %s released=%zu races=%ld used=%zu\n", how, back, races() - before, used(0));
  return 0;
}

// ---- the stream-ordered hand-over (issue 26) -------------------------------------------------
// Several queues are active (streams a and b, the legacy stream, and a second thread's stream
// or per-thread default stream), so a free waits for a fence. A long kernel on a uses a block;
// it is freed, and the next allocation of that size takes it back before the kernel ends: the
// pool hands the fence over (every queue's next work waits for it on the device) instead of
// waiting on the host. Then the block is used: on b (`other-stream`); on the legacy stream
// (`legacy`); by the second thread on the stream it created (`other-thread`) or on its
// per-thread default stream (`per-thread`); each also with stream a destroyed at once after
// the hand-over (`...+destroy`: the fake driver aborts on a dead handle). Every queue that
// uses the block had work before the hand-over, so only the hand-over's waits order it after
// the kernel. With `...+ctx` a second context ran device work first: another context's queues
// owe nothing to this one's fences, so the pool waits on the host instead. With `late-ctx`
// a second context begins device work right after the hand-over, on the block itself (its
// only use): it must wait for the fence the first context owes. Prints whether the block came
// back, the races and the host waits.
struct second {
  int own_stream, use;
  CUdeviceptr p;
  pthread_barrier_t ready, handed;
};
static void *second_thread(void *arg) {
  struct second *t = arg;
  CHECK(cu.CtxSetCurrent(primary));
  void *s = PER_THREAD;
  if (t->own_stream) CHECK(cu.StreamCreate(&s, 1));
  CUdeviceptr mine;
  CHECK(cu.MemAlloc(&mine, 4096));
  touch(s, mine, 4096, 1); // an active queue before the hand-over
  pthread_barrier_wait(&t->ready);
  pthread_barrier_wait(&t->handed);
  if (t->use) touch(s, t->p, MB20, 10);
  if (t->own_stream) CHECK(cu.StreamDestroy(s));
  CHECK(cu.MemFree(mine));
  return NULL;
}
static int handover(const char *how) {
  int other_stream = !strncmp(how, "other-stream", 12), legacy = !strncmp(how, "legacy", 6);
  int other_thread = !strncmp(how, "other-thread", 12), per_thread = !strncmp(how, "per-thread", 10);
  int late_ctx = !strcmp(how, "late-ctx");
  if (!other_stream && !legacy && !other_thread && !per_thread && !late_ctx) {
    fprintf(stderr, "client: unknown hand-over %s\n", how);
    return 2;
  }
  if (strstr(how, "+ctx")) {
    CUcontext other;
    CUdeviceptr o;
    CHECK(cu.CtxCreate(&other, 0, 0));
    CHECK(cu.MemAlloc(&o, 4096));
    touch(LEGACY, o, 4096, 1);
    CHECK(cu.MemFree(o));
    CHECK(cu.CtxSetCurrent(primary));
  }
  struct second t;
  memset(&t, 0, sizeof t);
  t.own_stream = other_thread, t.use = other_thread || per_thread;
  pthread_barrier_init(&t.ready, NULL, 2);
  pthread_barrier_init(&t.handed, NULL, 2);
  pthread_t th;
  pthread_create(&th, NULL, second_thread, &t);
  void *a, *b;
  CHECK(cu.StreamCreate(&a, 1));
  CHECK(cu.StreamCreate(&b, 1));
  CUdeviceptr x[3], p, q;
  void *queues[3] = {a, b, LEGACY};
  for (int i = 0; i < 3; i++) {
    CHECK(cu.MemAlloc(&x[i], 4096));
    touch(queues[i], x[i], 4096, 1); // active queues
  }
  pthread_barrier_wait(&t.ready);
  long before = races(), waits = fake_calls("cuEventSynchronize");
  CHECK(cu.MemAlloc(&p, MB20));
  touch(a, p, MB20, 5000); // 5 ms of device time
  CHECK(cu.MemFree(p));
  CHECK(cu.MemAlloc(&q, MB20));
  if (strstr(how, "+destroy")) CHECK(cu.StreamDestroy(a));
  if (late_ctx) {
    CUcontext late;
    CHECK(cu.CtxCreate(&late, 0, 0));
    touch(LEGACY, q, MB20, 10); // the other context's first work, on the handed block
    CHECK(cu.CtxSetCurrent(primary));
  }
  t.p = q;
  if (other_stream) touch(b, q, MB20, 10);
  if (legacy) touch(LEGACY, q, MB20, 10);
  pthread_barrier_wait(&t.handed);
  pthread_join(th, NULL);
  printf("handover %s reused=%d races=%ld host_waits=%ld\n", how, q == p, races() - before,
         fake_calls("cuEventSynchronize") - waits);
  CHECK(cu.MemFree(q));
  for (int i = 0; i < 3; i++) CHECK(cu.MemFree(x[i]));
  return 0;
}

// Stitching near a limit, through the real driver path: six 32 MiB blocks under a 256 MiB
// limit, the second and fourth freed, then a 64 MiB request. No free block holds it and less
// than 1/8 of the limit would be left after a growth, so the growth maps the freed blocks'
// handles a second time (32 of 2 MiB) instead of taking memory: the device's memory in use
// stays, one cuMemSetAccess covers the whole run, and every live block keeps its bytes.
static int stitch(void) {
  const size_t mib = (size_t)1 << 20, n = 32 * mib;
  size_t (*used)(int) = (size_t(*)(int))fake_fn("fakecu_used");
  CUdeviceptr b[6];
  unsigned char *h = malloc(2 * n);
  for (int i = 0; i < 6; i++) {
    CHECK(cu.MemAlloc(&b[i], n));
    memset(h, 0x10 + i, n);
    CHECK(cu.MemcpyHtoD(b[i], h, n));
  }
  CHECK(((CUresult(*)(void))sym("cuCtxSynchronize"))());
  CHECK(cu.MemFree(b[1]));
  CHECK(cu.MemFree(b[3]));
  size_t before = used(dev);
  long access = fake_calls("cuMemSetAccess"), maps = fake_calls("cuMemMap");
  CUdeviceptr g;
  CHECK(cu.MemAlloc(&g, 2 * n));
  size_t after = used(dev);
  long access_calls = fake_calls("cuMemSetAccess") - access;
  long map_calls = fake_calls("cuMemMap") - maps;
  memset(h, 0x5a, 2 * n);
  CHECK(cu.MemcpyHtoD(g, h, 2 * n));
  int ok = 1;
  for (int i = 0; i < 6 && ok; i++) {
    if (i == 1 || i == 3) continue;
    CHECK(cu.MemcpyDtoH(h, b[i], n));
    for (size_t k = 0; k < n && ok; k += 4096) ok = h[k] == 0x10 + i;
  }
  CHECK(cu.MemcpyDtoH(h, g, 2 * n));
  for (size_t k = 0; k < 2 * n && ok; k += 4096) ok = h[k] == 0x5a;
  free(h);
  printf("stitch new_mib=%zu set_access=%ld maps=%ld intact=%d\n",
         (after - before) / mib, access_calls, map_calls, ok);
  for (int i = 0; i < 6; i++)
    if (i != 1 && i != 3) CHECK(cu.MemFree(b[i]));
  CHECK(cu.MemFree(g));
  size_t (*reclaim)(int) = (size_t(*)(int))dlsym(RTLD_DEFAULT, "cudapool_reclaim");
  if (reclaim) reclaim(dev);
  printf("stitch_end used_mib=%zu\n", used(dev) / mib);
  return 0;
}

int reuse_scenario(const char *name, int argc, char **argv) {
  if (!strcmp(name, "stitch")) return stitch();
  if (!strcmp(name, "handover")) return handover(argc > 0 ? argv[0] : "other-stream");
  if (!strcmp(name, "ptds")) return ptds();
  if (!strcmp(name, "reuse")) return reuse();
  if (!strcmp(name, "pressure")) return pressure();
  if (!strcmp(name, "lag")) return lag(argc, argv);
  if (!strcmp(name, "switch") || !strcmp(name, "return")) return boundary(name);
  if (!strcmp(name, "unmap")) return unmap_scenario(argc > 0 ? argv[0] : "reclaim");
  return -1;
}
