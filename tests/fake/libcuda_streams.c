// Part of the fake driver (tests/fake/libcuda.c includes it; not compiled on its own): streams, events, modelled device work, graph capture.

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
//
// Graph capture, with CUDA's rules as measured on an H200 (driver 580.159.04,
// tests/gpu/programs/capture_rules.cu; docs/design.md, "Capture-safe"):
// - a capture has a mode (global, thread-local, relaxed) and the thread that began it; each
//   thread has an interaction mode (cuThreadExchangeStreamCaptureMode, global by default);
// - "potentially unsafe" calls (stream and event queries and synchronizations, cuMemAlloc,
//   cuMemFree, cuMemPoolTrimTo, synchronous copies) are refused with
//   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the capture that forbade them is invalidated,
//   when the calling thread's mode is not relaxed and it has a capture of its own not begun
//   relaxed, or when its mode is global and another thread has a global capture;
// - cuCtxSynchronize is refused during any capture, and invalidates them all;
// - a query or synchronization of the capturing stream itself is refused and invalidates it;
// - any work, event, wait or query on the legacy stream while a blocking stream captures is
//   refused with CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and invalidates that capture (a query of
//   whether the legacy stream captures gets the error and invalidates nothing);
// - an invalidated capture ends with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and no graph.
// fakecu_capture_invalidations() counts the captures invalidated, fakecu_capture_breaker()
// names the call that invalidated the last one.
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CUDA_ERROR_STREAM_CAPTURE_INVALIDATED 901
#define CUDA_ERROR_STREAM_CAPTURE_IMPLICIT 906
enum { CAPTURE_GLOBAL = 0, CAPTURE_THREAD_LOCAL = 1, CAPTURE_RELAXED = 2 };
#define MAX_HOLDS 1024
#define EVENT_HOLDS 64
#define FAKECU_HOLD ((void *)0x401)
#define FAKECU_TOUCH ((void *)0x402)
// A kernel that never ends (an endless loop on a GPU): cuCtxSynchronize waits for it, for ever,
// until the test ends it (fakecu_end_hangs); nothing else waits for it.
#define FAKECU_HANG ((void *)0x403)
static int hangs;
static pthread_cond_t hang_ended = PTHREAD_COND_INITIALIZER;
void fakecu_end_hangs(void) {
  pthread_mutex_lock(&mu);
  hangs = 0;
  pthread_cond_broadcast(&hang_ended);
  pthread_mutex_unlock(&mu);
}

struct fake_stream {
  int live;
  unsigned flags;
  struct fake_ctx *ctx;
  int capturing;
  int capture_mode;        // as begun (CAPTURE_*)
  pthread_t capture_thread; // the thread that began it
  int invalidated;          // a forbidden call ended it: its end fails
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
static long capture_invalidations;
static const char *capture_breaker = "";
static __thread int thread_capture_mode; // CAPTURE_GLOBAL until exchanged

static int is_legacy_stream(void *s, int ptsz) { return (uintptr_t)s == 1 || (!s && !ptsz); }

// Ends the capture of st as a forbidden call does (mu held).
static void invalidate_capture(struct fake_stream *st, const char *api) {
  if (st->invalidated) return;
  st->invalidated = 1;
  capture_invalidations++;
  capture_violations++;
  capture_breaker = api;
}

// A "potentially unsafe" call (see above): 0, or the error it gets (the captures that forbid
// it invalidated).
static CUresult capture_unsafe(const char *api) {
  if (!capturing_now || thread_capture_mode == CAPTURE_RELAXED) return CUDA_SUCCESS;
  pthread_mutex_lock(&mu);
  int refused = 0;
  for (struct fake_stream *st = all_streams; st; st = st->next) {
    if (!st->live || !st->capturing) continue;
    int mine = pthread_equal(st->capture_thread, pthread_self());
    if ((mine && st->capture_mode != CAPTURE_RELAXED) ||
        (!mine && thread_capture_mode == CAPTURE_GLOBAL && st->capture_mode == CAPTURE_GLOBAL)) {
      invalidate_capture(st, api);
      refused = 1;
    }
  }
  pthread_mutex_unlock(&mu);
  return refused ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

// Legacy-stream work while a blocking stream captures (mu held): 0, or the error (those
// captures invalidated unless only_ask).
static CUresult capture_legacy_conflict(const char *api, int only_ask) {
  if (!capturing_now) return CUDA_SUCCESS;
  int refused = 0;
  for (struct fake_stream *st = all_streams; st; st = st->next) {
    if (!st->live || !st->capturing || (st->flags & 1)) continue;
    if (!only_ask) invalidate_capture(st, api);
    refused = 1;
  }
  return refused ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
}

// A query or synchronization of stream s (ptsz: through a per-thread entry point): 0, or the
// error of a capture's rules (mu not held).
static CUresult capture_sync_rules(void *s, int ptsz, const char *api) {
  if (!capturing_now) return CUDA_SUCCESS;
  if ((uintptr_t)s > 2 && ((struct fake_stream *)s)->capturing) {
    pthread_mutex_lock(&mu);
    invalidate_capture(s, api);
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (is_legacy_stream(s, ptsz)) {
    pthread_mutex_lock(&mu);
    CUresult r = capture_legacy_conflict(api, 0);
    pthread_mutex_unlock(&mu);
    if (r) return r;
  }
  return capture_unsafe(api);
}

CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
  count("cuThreadExchangeStreamCaptureMode");
  if (!mode || *mode < 0 || *mode > 2) return CUDA_ERROR_INVALID_VALUE;
  int old = thread_capture_mode;
  thread_capture_mode = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}
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
  if (sync) {
    CUresult c = capture_unsafe("a synchronous copy or memset");
    if (c) return c;
  }
  pthread_mutex_lock(&mu);
  CUresult c = is_legacy_stream(s, ptsz) ? capture_legacy_conflict("work on the legacy stream", 0) : 0;
  if (c) {
    pthread_mutex_unlock(&mu);
    return c;
  }
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
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s) {
  count("cuMemcpyHtoDAsync_v2");
  memcpy((void *)(uintptr_t)dst, src, n);
  return work(s, 0, copy_ns(n), dst, n, 0);
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s) {
  count("cuMemcpyDtoHAsync_v2");
  memcpy(dst, (void *)(uintptr_t)src, n);
  return work(s, 0, copy_ns(n), src, n, 0);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s) {
  count("cuMemcpyDtoDAsync_v2");
  memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
  return work(s, 0, copy_ns(n), dst, n, 0); // the race detector watches the destination
}

static CUresult hold_on(void *stream);
static CUresult launch(void *f, unsigned gx, void *s, void **params, int ptsz) {
  if (f == FAKECU_HOLD) return hold_on(ptsz && !s ? (void *)2 : s);
  if (f == FAKECU_HANG) {
    pthread_mutex_lock(&mu);
    hangs++;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
  }
  unsigned long long lo = 0;
  size_t bytes = 0;
  if (f == FAKECU_TOUCH && params && params[0] && params[1]) {
    lo = *(CUdeviceptr *)params[0];
    bytes = *(size_t *)params[1];
    // The kernel reads its memory: memory unmapped under it (a sleep no launch woke from)
    // faults, as on a GPU.
    if (bytes) {
      volatile unsigned char *p = (volatile unsigned char *)(uintptr_t)lo;
      (void)p[0], (void)p[bytes - 1];
    }
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
static CUresult begin_capture(void *s, int mode) {
  stream_alive(s, "cuStreamBeginCapture");
  if ((uintptr_t)s <= 2) return CUDA_ERROR_INVALID_VALUE; // legacy cannot capture
  if (mode < 0 || mode > 2) return CUDA_ERROR_INVALID_VALUE;
  struct fake_stream *st = s;
  pthread_mutex_lock(&mu);
  if (st->capturing) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_INVALID_VALUE;
  }
  st->capturing = 1;
  st->capture_mode = mode;
  st->capture_thread = pthread_self();
  st->invalidated = 0;
  capturing_now++;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuStreamBeginCapture_v2(void *s, int mode) { count("cuStreamBeginCapture_v2"); return begin_capture(s, mode); }
CUresult cuStreamBeginCapture_v2_ptsz(void *s, int mode) { count("cuStreamBeginCapture_v2_ptsz"); return begin_capture(s, mode); }
static CUresult end_capture(void *s, void **graph) {
  stream_alive(s, "cuStreamEndCapture");
  if ((uintptr_t)s <= 2 || !((struct fake_stream *)s)->capturing) return CUDA_ERROR_INVALID_VALUE;
  struct fake_stream *st = s;
  pthread_mutex_lock(&mu);
  st->capturing = 0;
  capturing_now--;
  int invalidated = st->invalidated;
  st->invalidated = 0;
  pthread_mutex_unlock(&mu);
  if (invalidated) {
    if (graph) *graph = NULL;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  if (graph) *graph = (void *)0x6a;
  return CUDA_SUCCESS;
}
CUresult cuStreamEndCapture(void *s, void **graph) { count("cuStreamEndCapture"); return end_capture(s, graph); }
CUresult cuStreamEndCapture_ptsz(void *s, void **graph) { count("cuStreamEndCapture_ptsz"); return end_capture(s, graph); }
CUresult cuStreamIsCapturing(void *s, int *status) {
  count("cuStreamIsCapturing");
  stream_alive(s, "cuStreamIsCapturing");
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  if (is_legacy_stream(s, 0)) {
    pthread_mutex_lock(&mu);
    CUresult c = capture_legacy_conflict("cuStreamIsCapturing", 1);
    pthread_mutex_unlock(&mu);
    if (c) return c; // the status is left unspecified, as the driver documents
  }
  struct fake_stream *st = s;
  *status = (uintptr_t)s > 2 && st->capturing ? (st->invalidated ? 2 : 1) : 0;
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
  if (is_legacy(s, ptsz)) {
    // The real driver refuses, and the capture elsewhere is ruined.
    CUresult c = capture_legacy_conflict("cuEventRecord on the legacy stream", 0);
    if (c) {
      pthread_mutex_unlock(&mu);
      return c;
    }
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
    CUresult c = capture_legacy_conflict("cuStreamWaitEvent on the legacy stream", 0);
    if (c) {
      pthread_mutex_unlock(&mu);
      return c;
    }
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
  CUresult c = capture_unsafe("cuEventQuery");
  if (c) return c;
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
  CUresult c = capture_unsafe("cuEventSynchronize");
  if (c) return c;
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
  if (capturing_now) {
    // Refused during any capture, whatever its mode or the caller's: every one ends.
    for (struct fake_stream *st = all_streams; st; st = st->next)
      if (st->live && st->capturing) invalidate_capture(st, "cuCtxSynchronize");
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  while (hangs) pthread_cond_wait(&hang_ended, &mu);
  dev_now = max2(dev_now, all_end());
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
static CUresult stream_query(void *s, int ptsz) {
  stream_alive(s, "cuStreamQuery");
  CUresult c = capture_sync_rules(s, ptsz, "cuStreamQuery");
  if (c) return c;
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
long fakecu_capture_invalidations(void) { return capture_invalidations; }
const char *fakecu_capture_breaker(void) { return capture_breaker; }
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
