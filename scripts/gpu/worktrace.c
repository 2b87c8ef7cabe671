// worktrace: which driver entry points carry a program's device work, and on which streams.
// A diagnostic for cudapool's queue watching (issue 11): run a program under it *without*
// cudapool and read, per entry point, how many calls went to which stream, and which streams
// the program created. A kernel launched through a path not listed here is not seen; compare
// the launch count with the kernels a profiler sees.
//
// Build: gcc -shared -fPIC -O2 -o worktrace.so worktrace.c -ldl -lpthread
// Use:   WORKTRACE_LOG=/tmp/w.txt LD_PRELOAD=./worktrace.so program   (written at exit)
//        From Python in the traced process: ctypes.CDLL(None).worktrace_launches() gives the
//        number of kernel launches seen so far.
//
// Every wrapper takes eleven integer arguments and passes them on: on x86-64 that forwards
// any of these entry points (none takes a floating-point or by-value struct argument).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef uint64_t u;
typedef int (*fn11)(u, u, u, u, u, u, u, u, u, u, u);
typedef void *(*dlsym_fn)(void *, const char *);
typedef int (*gpa_v1_fn)(const char *, void **, int, uint64_t);
typedef int (*gpa_v2_fn)(const char *, void **, int, uint64_t, int *);

// Where the stream is: an argument index, LEGACY for synchronous calls (the legacy stream, or
// the per-thread one for _ptds), CONFIG for cuLaunchKernelEx (config->hStream), NONE to count.
enum { LEGACY = -1, CONFIG = -2, NONE = -3 };
struct entry {
  const char *name;
  int stream_arg;
  int launch;
};
static const struct entry entries[] = {
    {"cuLaunchKernel", 8, 1},          {"cuLaunchKernel_ptsz", 8, 1},
    {"cuLaunchKernelEx", CONFIG, 1},   {"cuLaunchKernelEx_ptsz", CONFIG, 1},
    {"cuLaunchCooperativeKernel", 8, 1}, {"cuLaunchCooperativeKernel_ptsz", 8, 1},
    {"cuLaunchHostFunc", 0, 0},        {"cuLaunchHostFunc_ptsz", 0, 0},
    {"cuGraphLaunch", 1, 0},           {"cuGraphLaunch_ptsz", 1, 0},
    {"cuMemcpyAsync", 3, 0},           {"cuMemcpyAsync_ptsz", 3, 0},
    {"cuMemcpyHtoDAsync_v2", 3, 0},    {"cuMemcpyHtoDAsync_v2_ptsz", 3, 0},
    {"cuMemcpyDtoHAsync_v2", 3, 0},    {"cuMemcpyDtoHAsync_v2_ptsz", 3, 0},
    {"cuMemcpyDtoDAsync_v2", 3, 0},    {"cuMemcpyDtoDAsync_v2_ptsz", 3, 0},
    {"cuMemcpy2DAsync_v2", 1, 0},      {"cuMemcpy2DAsync_v2_ptsz", 1, 0},
    {"cuMemcpy3DAsync_v2", 1, 0},      {"cuMemcpy3DAsync_v2_ptsz", 1, 0},
    {"cuMemcpyPeerAsync", 5, 0},       {"cuMemcpyPeerAsync_ptsz", 5, 0},
    {"cuMemcpyBatchAsync", NONE, 0},   {"cuMemcpyBatchAsync_v2", NONE, 0},
    {"cuMemsetD8Async", 3, 0},         {"cuMemsetD8Async_ptsz", 3, 0},
    {"cuMemsetD16Async", 3, 0},        {"cuMemsetD16Async_ptsz", 3, 0},
    {"cuMemsetD32Async", 3, 0},        {"cuMemsetD32Async_ptsz", 3, 0},
    {"cuMemsetD2D8Async", 5, 0},       {"cuMemsetD2D32Async", 5, 0},
    {"cuMemcpy", LEGACY, 0},           {"cuMemcpy_ptds", LEGACY, 0},
    {"cuMemcpyHtoD_v2", LEGACY, 0},    {"cuMemcpyHtoD_v2_ptds", LEGACY, 0},
    {"cuMemcpyDtoH_v2", LEGACY, 0},    {"cuMemcpyDtoH_v2_ptds", LEGACY, 0},
    {"cuMemcpyDtoD_v2", LEGACY, 0},    {"cuMemcpyDtoD_v2_ptds", LEGACY, 0},
    {"cuMemsetD8_v2", LEGACY, 0},      {"cuMemsetD8_v2_ptds", LEGACY, 0},
    {"cuMemsetD32_v2", LEGACY, 0},     {"cuMemsetD32_v2_ptds", LEGACY, 0},
    {"cuStreamWriteValue32_v2", 0, 0}, {"cuStreamWaitValue32_v2", 0, 0},
    {"cuStreamBatchMemOp_v2", 0, 0},
    {"cuEventRecord", 1, 0},           {"cuEventRecord_ptsz", 1, 0},
    {"cuEventRecordWithFlags", 1, 0},  {"cuEventRecordWithFlags_ptsz", 1, 0},
    {"cuStreamWaitEvent", 0, 0},       {"cuStreamWaitEvent_ptsz", 0, 0},
    {"cuStreamCreate", NONE, 0},       {"cuStreamCreateWithPriority", NONE, 0},
    {"cuStreamDestroy_v2", NONE, 0},   {"cuGetExportTable", NONE, 0},
    {"cuMemAlloc_v2", NONE, 0},        {"cuMemFree_v2", NONE, 0},
    {"cuMemAllocAsync", 2, 0},         {"cuMemFreeAsync", 1, 0},
    {"cuStreamSynchronize", 0, 0},     {"cuCtxSynchronize", NONE, 0},
    {"cuEventSynchronize", NONE, 0},   {"cuStreamQuery", 0, 0},
};
#define N (sizeof entries / sizeof entries[0])
#define STREAMS 64

static fn11 real[N];
static _Atomic long calls[N];
static struct {
  _Atomic u stream;
  _Atomic long n;
} per_stream[N][STREAMS];
static _Atomic long launches;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static dlsym_fn real_dlsym;
static gpa_v1_fn real_gpa_v1;
static gpa_v2_fn real_gpa_v2;

long worktrace_launches(void) { return launches; }

static void note(int i, u stream) {
  for (int k = 0; k < STREAMS; k++) {
    u seen = per_stream[i][k].stream;
    if (seen == 0) {
      u want = 0;
      if (!__atomic_compare_exchange_n((u *)&per_stream[i][k].stream, &want, stream + 1, 0,
                                       __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        seen = want;
      else
        seen = stream + 1;
    }
    if (seen == stream + 1) {
      per_stream[i][k].n++;
      return;
    }
  }
}

static int body(int i, u a0, u a1, u a2, u a3, u a4, u a5, u a6, u a7, u a8, u a9, u a10) {
  u args[11] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10};
  calls[i]++;
  if (entries[i].launch) launches++;
  int s = entries[i].stream_arg;
  if (s >= 0)
    note(i, args[s]);
  else if (s == CONFIG)
    note(i, a0 ? *(u *)(uintptr_t)(a0 + 32) : 0);
  else if (s == LEGACY)
    note(i, 1);
  return real[i](a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10);
}

#define W(i)                                                                                   \
  static int w##i(u a0, u a1, u a2, u a3, u a4, u a5, u a6, u a7, u a8, u a9, u a10) {          \
    return body(i, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10);                               \
  }
#define W10(b) W(b##0) W(b##1) W(b##2) W(b##3) W(b##4) W(b##5) W(b##6) W(b##7) W(b##8) W(b##9)
W10() W10(1) W10(2) W10(3) W10(4) W10(5) W10(6) W10(7)
#define R(i) (fn11) w##i
#define R10(b) R(b##0), R(b##1), R(b##2), R(b##3), R(b##4), R(b##5), R(b##6), R(b##7), R(b##8), R(b##9)
static const fn11 wrappers[80] = {R10(), R10(1), R10(2), R10(3), R10(4), R10(5), R10(6), R10(7)};

static void *wrap(const char *name, void *p) {
  if (!p || !name) return p;
  for (size_t i = 0; i < N; i++) {
    if (strcmp(entries[i].name, name)) continue;
    pthread_mutex_lock(&mu);
    if (!real[i]) real[i] = (fn11)p;
    pthread_mutex_unlock(&mu);
    return real[i] == (fn11)p ? (void *)wrappers[i] : p;
  }
  return p;
}

// The name the driver exports p under (for cuGetProcAddress answers, which use base names).
static const char *exported_name(void *p) {
  Dl_info info;
  if (dladdr(p, &info) && info.dli_saddr == p) return info.dli_sname;
  return NULL;
}

static int my_gpa_v2(const char *s, void **pfn, int ver, uint64_t flags, int *st);
static int my_gpa_v1(const char *s, void **pfn, int ver, uint64_t flags) {
  int r = real_gpa_v1(s, pfn, ver, flags);
  if (r == 0 && pfn && *pfn) {
    if (!strcmp(s, "cuGetProcAddress")) {
      if (ver >= 12000) { real_gpa_v2 = (gpa_v2_fn)*pfn; *pfn = (void *)my_gpa_v2; }
      else { real_gpa_v1 = (gpa_v1_fn)*pfn; *pfn = (void *)my_gpa_v1; }
    } else {
      *pfn = wrap(exported_name(*pfn), *pfn);
    }
  }
  return r;
}
static int my_gpa_v2(const char *s, void **pfn, int ver, uint64_t flags, int *st) {
  int r = real_gpa_v2(s, pfn, ver, flags, st);
  if (r == 0 && pfn && *pfn) {
    if (!strcmp(s, "cuGetProcAddress")) {
      if (ver >= 12000) { real_gpa_v2 = (gpa_v2_fn)*pfn; *pfn = (void *)my_gpa_v2; }
      else { real_gpa_v1 = (gpa_v1_fn)*pfn; *pfn = (void *)my_gpa_v1; }
    } else {
      *pfn = wrap(exported_name(*pfn), *pfn);
    }
  }
  return r;
}

void *dlsym(void *h, const char *name) {
  if (!real_dlsym) {
    real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym) real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  }
  void *p = real_dlsym(h, name);
  if (!p || !name || name[0] != 'c' || name[1] != 'u') return p;
  if (!strcmp(name, "cuGetProcAddress_v2")) { real_gpa_v2 = (gpa_v2_fn)p; return (void *)my_gpa_v2; }
  if (!strcmp(name, "cuGetProcAddress")) { real_gpa_v1 = (gpa_v1_fn)p; return (void *)my_gpa_v1; }
  return wrap(name, p);
}

__attribute__((destructor)) static void report(void) {
  const char *path = getenv("WORKTRACE_LOG");
  FILE *f = path ? fopen(path, "a") : stderr;
  if (!f) return;
  fprintf(f, "worktrace: pid %d, %ld kernel launches seen\n", getpid(), (long)launches);
  for (size_t i = 0; i < N; i++) {
    if (!calls[i]) continue;
    fprintf(f, "%-32s %8ld calls", entries[i].name, (long)calls[i]);
    for (int k = 0; k < STREAMS && per_stream[i][k].stream; k++)
      fprintf(f, "  [stream %#llx: %ld]", (unsigned long long)(per_stream[i][k].stream - 1),
              (long)per_stream[i][k].n);
    fprintf(f, "\n");
  }
  if (f != stderr) fclose(f);
}
