// Lifetime scenarios of the client: the program destroys its streams and contexts on one thread
// while others free, allocate and reclaim (as NVIDIA's simpleCallback sample does). The fake
// driver aborts when a destroyed stream, event or context reaches it (tests/fake/libcuda.c), so
// a shim that passes the program's dead handle to the driver fails these at once. Plus the
// scenarios run under injected driver faults (CUDAPOOL_FAULTS, set by the test).
//
// Each prints a line "TAG key=value ..." and the shim's figures; the tests read them.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client.h"

#define LEGACY ((void *)1)
#define MIB ((size_t)1 << 20)

static void sleep_us(long us) {
  struct timespec t = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&t, NULL);
}

// The shim's own reclaim (cudapool_reclaim), or NULL when the shim is not loaded.
static size_t (*shim_reclaim(void))(int) {
  return (size_t(*)(int))dlsym(RTLD_DEFAULT, "cudapool_reclaim");
}

static size_t fake_used(void) { return ((size_t(*)(int))fake_fn("fakecu_used"))(dev); }

// The shim's figures beside the fake's own: reserved must equal what the driver holds.
static void figures(const char *tag) {
  print_stats(tag);
  printf("%s_driver used=%zu\n", tag, fake_used());
}

// Gives every cached block back (when the shim is loaded) and prints the figures.
static void settle(const char *tag) {
  size_t (*reclaim)(int) = shim_reclaim();
  if (reclaim) reclaim(-1);
  figures(tag);
}

// ---- streams destroyed while other threads free ---------------------------------------------
// simpleCallback in miniature: each of `n` threads makes a stream, allocates a block and runs a
// kernel on it; then, at one moment, half of them destroy their stream and then free, while the
// other half free and then destroy. A free seals a fence over every queue the context used, the
// streams being destroyed among them.
struct crowd {
  int n, rounds;
  pthread_barrier_t start, done;
};
struct member {
  struct crowd *c;
  int id;
  long errors;
};

static void *crowd_member(void *arg) {
  struct member *m = arg;
  struct crowd *c = m->c;
  CHECK(cu.CtxSetCurrent(primary));
  for (int r = 0; r < c->rounds; r++) {
    void *s;
    CUdeviceptr b;
    size_t size = 3 * MIB / 2 + (size_t)m->id * 4096;
    CHECK(cu.StreamCreate(&s, 0));
    CHECK(cu.MemAlloc(&b, size));
    touch(s, b, size, 5);
    pthread_barrier_wait(&c->start);
    if ((m->id + r) % 2) {
      if (cu.StreamDestroy(s) != CUDA_SUCCESS) m->errors++;
      if (cu.MemFree(b) != CUDA_SUCCESS) m->errors++;
    } else {
      if (cu.MemFree(b) != CUDA_SUCCESS) m->errors++;
      if (cu.StreamDestroy(s) != CUDA_SUCCESS) m->errors++;
    }
    pthread_barrier_wait(&c->done);
  }
  return NULL;
}

static int streams_die(int argc, char **argv) {
  struct crowd c = {argc > 1 ? atoi(argv[1]) : 8, argc > 0 ? atoi(argv[0]) : 400, {{0}}, {{0}}};
  if (c.n < 2 || c.n > 64) c.n = 8;
  pthread_barrier_init(&c.start, NULL, (unsigned)c.n);
  pthread_barrier_init(&c.done, NULL, (unsigned)c.n);
  pthread_t t[64];
  struct member m[64];
  for (int i = 0; i < c.n; i++) {
    m[i] = (struct member){&c, i, 0};
    pthread_create(&t[i], NULL, crowd_member, &m[i]);
  }
  long errors = 0;
  for (int i = 0; i < c.n; i++) {
    pthread_join(t[i], NULL);
    errors += m[i].errors;
  }
  printf("streams_die rounds=%d threads=%d errors=%ld races=%ld\n", c.rounds, c.n, errors,
         races());
  settle("streams_die_end");
  return 0;
}

// ---- a stream destroyed while the blocks it used wait for their fence ------------------------
static CUresult (*free_async)(CUdeviceptr, void *);

static int stream_fenced(void) {
  int (*running)(long) = (int (*)(long))fake_fn("fakecu_running");
  void (*finish)(long) = (void (*)(long))fake_fn("fakecu_finish");
  CUdeviceptr ballast, x, y, z;
  CHECK(cu.MemAlloc(&ballast, 512 * MIB)); // a fenced free is small against this
  void *s;
  CHECK(cu.StreamCreate(&s, 1));
  touch(LEGACY, 0, 0, 1); // two queues: frees wait for fences
  CHECK(cu.MemAlloc(&x, 20 * MIB));
  long h = launch_hold(s);
  touch(s, x, 20 * MIB, 10); // queued behind the hold: x is still to be written
  CHECK(cu.MemFree(x));
  CHECK(cu.StreamDestroy(s));
  // Housekeeping runs on the slow paths (queue retirement, the unwatched-work check): none of
  // it may touch s now. Longer than a probation, with work and misses on the legacy stream.
  for (int i = 0; i < 30; i++) {
    CUdeviceptr p;
    CHECK(cu.MemAlloc(&p, 2 * MIB + (size_t)i * 4096));
    touch(LEGACY, p, 4096, 1);
    CHECK(cu.MemFree(p));
    sleep_us(10000);
  }
  CHECK(cu.MemAlloc(&y, 20 * MIB));
  // x may come back while the hold runs only handed over: the legacy stream's next work then
  // waits for the destroyed stream's last work on the device.
  int (*waits_for)(void *, long) = (int (*)(void *, long))fake_fn("fakecu_stream_waits_for");
  int early = y == x && running(h);
  touch(LEGACY, y, 20 * MIB, 1);
  early = early && !waits_for(LEGACY, h);
  finish(h);
  CHECK(cu.MemFree(y));
  CHECK(cu.MemAlloc(&z, 20 * MIB));
  CHECK(cu.MemFree(z));
  // The event recorded as a stream died is shared by the fences sealed while it was pending;
  // once it completes, it must outlive them (a destroyed event must never be asked about).
  void *s1;
  CUdeviceptr v, w, big;
  CHECK(cu.StreamCreate(&s1, 1));
  CHECK(cu.MemAlloc(&v, 4 * MIB));
  long h1 = launch_hold(s1);
  touch(s1, v, 4 * MIB, 10);
  CHECK(cu.MemFree(v));
  CHECK(cu.StreamDestroy(s1)); // its last work: pending behind the hold
  CHECK(cu.MemAlloc(&w, 4 * MIB));
  CHECK(cu.MemFree(w)); // sealed: a fence that holds the destroyed stream's event
  finish(h1); // that event completes
  CHECK(cu.MemAlloc(&w, 3 * MIB));
  CHECK(cu.MemFree(w)); // the next seal looks at the completed event
  CHECK(cu.MemAlloc(&big, 64 * MIB)); // a miss: the older fence is asked about
  CHECK(cu.MemFree(big));
  // A stream-ordered free on a stream destroyed right after.
  free_async = dlsym(driver ? driver : RTLD_DEFAULT, "cuMemFreeAsync");
  if (free_async) {
    void *s2;
    CUdeviceptr a;
    CHECK(cu.StreamCreate(&s2, 1));
    CHECK(cu.MemAlloc(&a, 4 * MIB));
    touch(s2, a, 4 * MIB, 50);
    CHECK(free_async(a, s2));
    CHECK(cu.StreamDestroy(s2));
    CUdeviceptr b;
    CHECK(cu.MemAlloc(&b, 4 * MIB));
    touch(LEGACY, b, 4 * MIB, 1);
    CHECK(cu.MemFree(b));
  }
  CHECK(cu.MemFree(ballast));
  printf("stream_fenced reused_while_busy=%d races=%ld\n", early, races());
  settle("stream_fenced_end");
  return 0;
}

// ---- contexts destroyed or reset while other threads free and reclaim in them ----------------
struct victim {
  CUdeviceptr blocks[8];
  size_t size;
  long errors, freed;
};

// Frees the victim's blocks from a thread whose current context is the primary one (the
// victim, or another context: a free may name any context's block).
static void *free_blocks(void *arg) {
  struct victim *v = arg;
  cu.CtxSetCurrent(primary); // fails once the primary context is reset: the frees go on
  for (int i = 0; i < 8; i++) {
    // Before the destroy: freed. After it: the driver's answer for an unknown pointer.
    CUresult r = cu.MemFree(v->blocks[i]);
    if (r == CUDA_SUCCESS) v->freed++;
    else if (r != CUDA_ERROR_INVALID_VALUE) {
      fprintf(stderr, "client: a free during a context's teardown returned %d\n", r);
      v->errors++;
    }
  }
  return NULL;
}

static void *reclaim_a_few(void *arg) {
  (void)arg;
  size_t (*reclaim)(int) = shim_reclaim();
  for (int i = 0; reclaim && i < 4; i++) reclaim(-1);
  return NULL;
}

struct ender {
  CUcontext ctx; // destroy it, or (NULL) reset the primary context
  CUresult r;
};
static void *end_context(void *arg) {
  struct ender *e = arg;
  e->r = e->ctx ? cu.CtxDestroy(e->ctx) : cu.PrimaryCtxReset(dev);
  return NULL;
}

// Fills `v` with eight blocks in the current context, each written by a kernel on one of
// two fresh streams of it (so that its frees wait for fences).
static void fill(struct victim *v, int round) {
  *v = (struct victim){{0}, MIB + (size_t)(round % 7) * 65536, 0, 0};
  void *s[2];
  CHECK(cu.StreamCreate(&s[0], 1));
  CHECK(cu.StreamCreate(&s[1], 0));
  for (int i = 0; i < 8; i++) {
    CHECK(cu.MemAlloc(&v->blocks[i], v->size));
    touch(s[i % 2], v->blocks[i], v->size, 20);
  }
}

static int ctx_die(int argc, char **argv) {
  int rounds = argc > 0 ? atoi(argv[0]) : 100;
  long errors = 0, freed = 0, end_errors = 0;
  for (int r = 0; r < rounds; r++) {
    int reset = r % 2; // odd rounds reset the primary context, even ones destroy a created one
    struct victim v;
    struct ender e = {NULL, 0};
    if (reset || !cu.CtxCreate) {
      CHECK(cu.CtxSetCurrent(primary));
      fill(&v, r);
    } else {
      CUcontext c;
      CHECK(cu.CtxCreate(&c, 0, dev)); // current on this thread
      fill(&v, r);
      e.ctx = c;
      CHECK(cu.CtxSetCurrent(primary));
    }
    pthread_t f, rc, d;
    pthread_create(&f, NULL, free_blocks, &v);
    pthread_create(&rc, NULL, reclaim_a_few, NULL);
    pthread_create(&d, NULL, end_context, &e);
    pthread_join(f, NULL);
    pthread_join(rc, NULL);
    pthread_join(d, NULL);
    errors += v.errors, freed += v.freed;
    if (e.r != CUDA_SUCCESS) end_errors++;
    if (reset) {
      // The reset keeps the handle; the program retains it again and goes on.
      CHECK(cu.PrimaryCtxRetain(&primary, dev));
      CHECK(cu.CtxSetCurrent(primary));
    }
  }
  // The shim still serves the program.
  CUdeviceptr p;
  CHECK(cu.CtxSetCurrent(primary));
  CHECK(cu.MemAlloc(&p, MIB));
  touch(LEGACY, p, MIB, 1);
  CHECK(cu.MemFree(p));
  printf("ctx_die rounds=%d errors=%ld end_errors=%ld freed=%ld races=%ld\n", rounds, errors,
         end_errors, freed, races());
  settle("ctx_die_end");
  return 0;
}

// ---- host callbacks that free and destroy from the driver's callback thread -----------------
struct job {
  void *stream;
  CUdeviceptr block;
};
static pthread_mutex_t jobs_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t jobs_cv = PTHREAD_COND_INITIALIZER;
static long jobs_done, job_errors;

static void finish_job(struct job *j) {
  long err = 0;
  if (cu.CtxSetCurrent(primary) != CUDA_SUCCESS) err++;
  if (cu.MemFree(j->block) != CUDA_SUCCESS) err++;
  if (cu.StreamDestroy(j->stream) != CUDA_SUCCESS) err++;
  free(j);
  pthread_mutex_lock(&jobs_mu);
  jobs_done++;
  job_errors += err;
  pthread_cond_broadcast(&jobs_cv);
  pthread_mutex_unlock(&jobs_mu);
}
static void host_func(void *data) { finish_job(data); }
static void stream_callback(void *stream, CUresult status, void *data) {
  (void)stream;
  if (status != CUDA_SUCCESS) job_errors++;
  finish_job(data);
}

struct producer {
  int id, rounds;
};
static void *produce(void *arg) {
  struct producer *p = arg;
  CHECK(cu.CtxSetCurrent(primary));
  for (int r = 0; r < p->rounds; r++) {
    struct job *j = malloc(sizeof *j);
    size_t size = MIB + (size_t)((p->id * 7 + r) % 5) * 65536;
    CHECK(cu.StreamCreate(&j->stream, (unsigned)(r % 2)));
    CHECK(cu.MemAlloc(&j->block, size));
    touch(j->stream, j->block, size, 10);
    if ((p->id + r) % 2) CHECK(cu.LaunchHostFunc(j->stream, host_func, j));
    else CHECK(cu.StreamAddCallback(j->stream, stream_callback, j, 0));
    // Meanwhile, work of this thread's own on the legacy stream, and a block of its own.
    CUdeviceptr own;
    CHECK(cu.MemAlloc(&own, 2 * MIB));
    touch(LEGACY, own, 2 * MIB, 1);
    CHECK(cu.MemFree(own));
  }
  return NULL;
}

static int callbacks(int argc, char **argv) {
  int rounds = argc > 0 ? atoi(argv[0]) : 200, n = argc > 1 ? atoi(argv[1]) : 4;
  if (!cu.LaunchHostFunc || !cu.StreamAddCallback) {
    fprintf(stderr, "client: no host function entry points\n");
    return 4;
  }
  if (n < 1 || n > 16) n = 4;
  pthread_t t[16];
  struct producer p[16];
  for (int i = 0; i < n; i++) {
    p[i] = (struct producer){i, rounds};
    pthread_create(&t[i], NULL, produce, &p[i]);
  }
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
  pthread_mutex_lock(&jobs_mu);
  while (jobs_done < (long)rounds * n) pthread_cond_wait(&jobs_cv, &jobs_mu);
  pthread_mutex_unlock(&jobs_mu);
  printf("callbacks rounds=%d threads=%d done=%ld errors=%ld races=%ld\n", rounds, n, jobs_done,
         job_errors, races());
  settle("callbacks_end");
  return 0;
}

// ---- under injected driver faults (CUDAPOOL_FAULTS, set by the test) ------------------------
// alloc:   five 24 MiB blocks, each a new driver allocation; the test fails one of them.
// record:  a two-queue loop of allocations and frees whose fences the test makes fail to record.
// query:   the same loop, with fences whose queries fail.
// wait:    the first work on a new queue, whose ordering wait the test makes fail, writes a block
//          reused at once while a long kernel on the legacy stream still reads it.
// free:    two reclaims; the test makes the first driver free fail.
static void loop(int iters) {
  void *s;
  CHECK(cu.StreamCreate(&s, 1));
  CUdeviceptr held[4] = {0};
  for (int i = 0; i < iters; i++) {
    int k = i % 4;
    if (held[k]) CHECK(cu.MemFree(held[k]));
    size_t size = MIB + (size_t)(i % 3) * 65536;
    CHECK(cu.MemAlloc(&held[k], size));
    touch(i % 2 ? s : LEGACY, held[k], size, 20);
  }
  for (int k = 0; k < 4; k++) CHECK(cu.MemFree(held[k]));
  CHECK(cu.StreamDestroy(s));
}

static int faults(int argc, char **argv) {
  const char *which = argc > 0 ? argv[0] : "alloc";
  if (!strcmp(which, "alloc")) {
    CUdeviceptr p[5];
    int rc[5];
    for (int i = 0; i < 5; i++) {
      rc[i] = cu.MemAlloc(&p[i], 24 * MIB);
      if (rc[i] != CUDA_SUCCESS) p[i] = 0;
    }
    figures("faults_held");
    CUdeviceptr again;
    int again_rc = cu.MemAlloc(&again, 24 * MIB);
    printf("faults alloc rcs=%d,%d,%d,%d,%d again=%d\n", rc[0], rc[1], rc[2], rc[3], rc[4],
           again_rc);
    if (again_rc == CUDA_SUCCESS) CHECK(cu.MemFree(again));
    for (int i = 0; i < 5; i++)
      if (p[i]) CHECK(cu.MemFree(p[i]));
  } else if (!strcmp(which, "record") || !strcmp(which, "query")) {
    loop(400);
    printf("faults %s races=%ld\n", which, races());
  } else if (!strcmp(which, "wait")) {
    CUdeviceptr a, b;
    void *s;
    CHECK(cu.StreamCreate(&s, 1));
    CHECK(cu.MemAlloc(&a, 8 * MIB));
    touch(LEGACY, a, 8 * MIB, 1000); // a long kernel reads a
    CHECK(cu.MemFree(a));
    CHECK(cu.MemAlloc(&b, 8 * MIB)); // one queue: reused at once
    touch(s, b, 8 * MIB, 10); // the stream's first work: its ordering wait fails
    CHECK(cu.MemFree(b));
    CHECK(cu.StreamDestroy(s));
    loop(100);
    printf("faults wait reused=%d races=%ld\n", a == b, races());
  } else if (!strcmp(which, "free")) {
    CUdeviceptr p[3];
    for (int i = 0; i < 3; i++) CHECK(cu.MemAlloc(&p[i], 24 * MIB));
    for (int i = 0; i < 3; i++) CHECK(cu.MemFree(p[i]));
    settle("faults_first_reclaim");
    printf("faults free\n");
  } else {
    fprintf(stderr, "client: unknown fault scenario %s\n", which);
    return 2;
  }
  settle("faults_end");
  return 0;
}

// ---- a program that uses what it destroyed (the fake driver must stop it) -------------------
static int misuse(int argc, char **argv) {
  const char *what = argc > 0 ? argv[0] : "stream";
  if (!strcmp(what, "stream")) {
    void *s;
    CHECK(cu.StreamCreate(&s, 0));
    CHECK(cu.StreamDestroy(s));
    touch(s, 0, 0, 1);
  } else if (!strcmp(what, "event")) {
    CUresult (*create)(void **, unsigned) = dlsym(driver, "cuEventCreate");
    CUresult (*destroy)(void *) = dlsym(driver, "cuEventDestroy_v2");
    CUresult (*query)(void *) = dlsym(driver, "cuEventQuery");
    void *e;
    CHECK(create(&e, 0));
    CHECK(destroy(e));
    query(e);
  } else if (cu.CtxCreate) {
    CUcontext c;
    CHECK(cu.CtxCreate(&c, 0, dev));
    CHECK(cu.CtxDestroy(c));
    cu.CtxPushCurrent(c);
  }
  printf("misuse %s went unnoticed\n", what);
  return 0;
}

// "panic_once [none]": a panic inside cudapool, injected (debug builds:
// cudapool_debug_panic_next; "none": not) into the second of three 4 MiB allocations, after
// the first was freed into the cache: "alloc I rc=R" for each, "free I rc=R", then "panic
// stats r=R panics=P hits=H reused=U" (hits: cache hits; reused: the third got the first's
// cached block).
static int panic_once(int argc, char **argv) {
  int inject = !(argc > 0 && !strcmp(argv[0], "none"));
  void (*arm)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "cudapool_debug_panic_next");
  if (!arm) {
    printf("panic unavailable\n");
    return 0;
  }
  CUdeviceptr p[3] = {0};
  for (int i = 0; i < 3; i++) {
    if (i == 1 && inject) arm();
    printf("alloc %d rc=%d\n", i, (int)cu.MemAlloc(&p[i], 4 * MIB));
    if (i == 0) printf("free 0 rc=%d\n", (int)cu.MemFree(p[0]));
  }
  printf("free 2 rc=%d\n", (int)cu.MemFree(p[2]));
  struct {
    size_t struct_size;
    int32_t device, pad;
    uint64_t f[22];
  } s = {.struct_size = sizeof s};
  int (*get)(int, void *) = (int (*)(int, void *))dlsym(RTLD_DEFAULT, "cudapool_get_stats");
  int r = get ? get(0, &s) : -1;
  printf("panic stats r=%d panics=%llu hits=%llu reused=%d\n", r, (unsigned long long)s.f[21],
         (unsigned long long)s.f[9], p[2] == p[0]);
  return 0;
}

int lifetime_scenario(const char *name, int argc, char **argv) {
  if (!strcmp(name, "panic_once")) return panic_once(argc, argv);
  if (!strcmp(name, "misuse")) return misuse(argc, argv);
  if (!strcmp(name, "streams-die")) return streams_die(argc, argv);
  if (!strcmp(name, "stream-fenced")) return stream_fenced();
  if (!strcmp(name, "ctx-die")) return ctx_die(argc, argv);
  if (!strcmp(name, "callbacks")) return callbacks(argc, argv);
  if (!strcmp(name, "faults")) return faults(argc, argv);
  return -1;
}
