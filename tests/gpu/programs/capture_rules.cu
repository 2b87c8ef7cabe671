// What the driver does with each call cudapool may make on its own behalf while a program's
// stream capture is under way: the call's result and whether the capture survives it, in each
// capture mode (global, thread-local, relaxed), from the capturing thread and from another
// thread, with that thread's own mode left at its default or exchanged to relaxed.
// One line per case:
//   call=NAME mode=global|thread_local|relaxed who=same|other thread_mode=default|relaxed rc=N end=N
// end is cuStreamEndCapture's result: 0 the capture survived, 901 it was invalidated.
// Build: nvcc -O2 -o capture_rules capture_rules.cu -lcuda -ldl
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                   \
  do {                                                                          \
    CUresult r_ = (x);                                                          \
    if (r_ != CUDA_SUCCESS) {                                                   \
      fprintf(stderr, "%s failed: %d (line %d)\n", #x, (int)r_, __LINE__);      \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

static CUcontext ctx;
static CUdevice dev;
static CUstream cap_blocking, cap_nonblocking, other_nb, other_blocking;
static CUstream cap; // the stream being captured in this case
static CUevent ev_done, ev_scratch;
static CUdeviceptr buf, spare;
static size_t gran;
static CUmemGenericAllocationHandle h_spare, h_mapped;
static CUdeviceptr va, va_mapped;
static int (*nvml_mem)(void *, void *);
static void *nvml_dev;

// Each probe makes one call and returns its result; set-up it needs is done before the capture
// (prepare), undone after (cleanup).
struct probe {
  const char *name;
  CUresult (*call)(void);
  void (*prepare)(void);
  void (*cleanup)(void);
};

static CUresult q_nb(void) { return cuStreamQuery(other_nb); }
static CUresult q_blocking(void) { return cuStreamQuery(other_blocking); }
static CUresult q_legacy(void) { return cuStreamQuery(CU_STREAM_LEGACY); }
static CUresult q_capturing(void) { return cuStreamQuery(cap); }
static CUresult rec_nb(void) { return cuEventRecord(ev_scratch, other_nb); }
static CUresult rec_blocking(void) { return cuEventRecord(ev_scratch, other_blocking); }
static CUresult rec_legacy(void) { return cuEventRecord(ev_scratch, CU_STREAM_LEGACY); }
static CUresult ev_query(void) { return cuEventQuery(ev_done); }
static CUresult ev_sync(void) { return cuEventSynchronize(ev_done); }
static CUresult wait_nb(void) { return cuStreamWaitEvent(other_nb, ev_done, 0); }
static CUresult wait_legacy(void) { return cuStreamWaitEvent(CU_STREAM_LEGACY, ev_done, 0); }
static CUevent made;
static CUresult ev_create(void) { return cuEventCreate(&made, CU_EVENT_DISABLE_TIMING); }
static void ev_create_cleanup(void) { if (made) cuEventDestroy(made); made = 0; }
static void ev_destroy_prepare(void) { CK(cuEventCreate(&made, CU_EVENT_DISABLE_TIMING)); }
static CUresult ev_destroy(void) { CUresult r = cuEventDestroy(made); if (!r) made = 0; return r; }
static CUresult ctx_sync(void) { return cuCtxSynchronize(); }
static CUresult stream_sync_nb(void) { return cuStreamSynchronize(other_nb); }
static CUdeviceptr got;
static CUresult mem_alloc(void) { return cuMemAlloc(&got, 2 << 20); }
static void mem_alloc_cleanup(void) { if (got) cuMemFree(got); got = 0; }
static void mem_free_prepare(void) { CK(cuMemAlloc(&got, 2 << 20)); }
static CUresult mem_free(void) { CUresult r = cuMemFree(got); if (!r) got = 0; return r; }
static CUresult mem_get_info(void) { size_t f, t; return cuMemGetInfo(&f, &t); }
static CUresult ctx_get_limit(void) { size_t v; return cuCtxGetLimit(&v, CU_LIMIT_STACK_SIZE); }
static CUresult push_pop(void) {
  CUresult r = cuCtxPushCurrent(ctx);
  if (r) return r;
  CUcontext c;
  return cuCtxPopCurrent(&c);
}
static CUresult is_capturing_legacy(void) { CUstreamCaptureStatus s; return cuStreamIsCapturing(CU_STREAM_LEGACY, &s); }
static CUresult is_capturing_cap(void) { CUstreamCaptureStatus s; return cuStreamIsCapturing(cap, &s); }
static CUresult capture_info(void) {
  CUstreamCaptureStatus s;
  cuuint64_t id;
#if CUDA_VERSION >= 13000
  return cuStreamGetCaptureInfo(cap, &s, &id, NULL, NULL, NULL, NULL);
#else
  return cuStreamGetCaptureInfo(cap, &s, &id, NULL, NULL, NULL);
#endif
}
static CUmemAllocationProp prop(void) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  return p;
}
static CUmemGenericAllocationHandle h_new;
static CUresult mem_create(void) { CUmemAllocationProp p = prop(); return cuMemCreate(&h_new, gran, &p, 0); }
static void mem_create_cleanup(void) { if (h_new) cuMemRelease(h_new); h_new = 0; }
static CUdeviceptr va_new;
static CUresult addr_reserve(void) { return cuMemAddressReserve(&va_new, gran, gran, 0, 0); }
static void addr_reserve_cleanup(void) { if (va_new) cuMemAddressFree(va_new, gran); va_new = 0; }
static void addr_free_prepare(void) { CK(cuMemAddressReserve(&va_new, gran, gran, 0, 0)); }
static CUresult addr_free(void) { CUresult r = cuMemAddressFree(va_new, gran); if (!r) va_new = 0; return r; }
static int mapped_now;
static CUresult mem_map(void) { CUresult r = cuMemMap(va, gran, 0, h_spare, 0); mapped_now = !r; return r; }
static void mem_map_cleanup(void) { if (mapped_now) cuMemUnmap(va, gran); mapped_now = 0; }
static CUresult set_access(void) {
  CUmemAccessDesc a;
  memset(&a, 0, sizeof a);
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = dev;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return cuMemSetAccess(va_mapped, gran, &a, 1);
}
static void unmap_prepare(void) { CK(cuMemMap(va, gran, 0, h_spare, 0)); mapped_now = 1; }
static CUresult mem_unmap(void) { CUresult r = cuMemUnmap(va, gran); if (!r) mapped_now = 0; return r; }
static void release_prepare(void) { CUmemAllocationProp p = prop(); CK(cuMemCreate(&h_new, gran, &p, 0)); }
static CUresult mem_release(void) { CUresult r = cuMemRelease(h_new); if (!r) h_new = 0; return r; }
static CUresult retain_handle(void) {
  CUmemGenericAllocationHandle h;
  CUresult r = cuMemRetainAllocationHandle(&h, (void *)va_mapped);
  if (!r) cuMemRelease(h);
  return r;
}
static CUresult pool_trim(void) {
  CUmemoryPool p;
  CUresult r = cuDeviceGetDefaultMemPool(&p, dev);
  return r ? r : cuMemPoolTrimTo(p, 0);
}
static CUresult graph_trim(void) { return cuDeviceGraphMemTrim(dev); }
static CUresult address_range(void) { CUdeviceptr b; size_t s; return cuMemGetAddressRange(&b, &s, buf); }
static CUresult nvml(void) {
  if (!nvml_mem) return (CUresult)999;
  unsigned long long m[3];
  return (CUresult)nvml_mem(nvml_dev, m);
}
static CUresult stream_get_ctx(void) { CUcontext c; return cuStreamGetCtx(other_nb, &c); }
static CUresult thread_exchange(void) {
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  CUresult r = cuThreadExchangeStreamCaptureMode(&m);
  if (!r) r = cuThreadExchangeStreamCaptureMode(&m);
  return r;
}
static CUresult memset_legacy(void) { return cuMemsetD8Async(spare, 1, 4096, CU_STREAM_LEGACY); }

static const struct probe probes[] = {
    {"cuStreamQuery(nonblocking)", q_nb, 0, 0},
    {"cuStreamQuery(blocking)", q_blocking, 0, 0},
    {"cuStreamQuery(legacy)", q_legacy, 0, 0},
    {"cuStreamQuery(capturing)", q_capturing, 0, 0},
    {"cuEventRecord(nonblocking)", rec_nb, 0, 0},
    {"cuEventRecord(blocking)", rec_blocking, 0, 0},
    {"cuEventRecord(legacy)", rec_legacy, 0, 0},
    {"cuEventQuery", ev_query, 0, 0},
    {"cuEventSynchronize", ev_sync, 0, 0},
    {"cuStreamWaitEvent(nonblocking)", wait_nb, 0, 0},
    {"cuStreamWaitEvent(legacy)", wait_legacy, 0, 0},
    {"cuEventCreate", ev_create, 0, ev_create_cleanup},
    {"cuEventDestroy", ev_destroy, ev_destroy_prepare, ev_create_cleanup},
    {"cuCtxSynchronize", ctx_sync, 0, 0},
    {"cuStreamSynchronize(nonblocking)", stream_sync_nb, 0, 0},
    {"cuMemAlloc", mem_alloc, 0, mem_alloc_cleanup},
    {"cuMemFree", mem_free, mem_free_prepare, mem_alloc_cleanup},
    {"cuMemGetInfo", mem_get_info, 0, 0},
    {"cuCtxGetLimit", ctx_get_limit, 0, 0},
    {"cuCtxPushCurrent+Pop", push_pop, 0, 0},
    {"cuStreamIsCapturing(legacy)", is_capturing_legacy, 0, 0},
    {"cuStreamIsCapturing(capturing)", is_capturing_cap, 0, 0},
    {"cuStreamGetCaptureInfo", capture_info, 0, 0},
    {"cuMemCreate", mem_create, 0, mem_create_cleanup},
    {"cuMemAddressReserve", addr_reserve, 0, addr_reserve_cleanup},
    {"cuMemAddressFree", addr_free, addr_free_prepare, addr_reserve_cleanup},
    {"cuMemMap", mem_map, 0, mem_map_cleanup},
    {"cuMemSetAccess", set_access, 0, 0},
    {"cuMemUnmap", mem_unmap, unmap_prepare, mem_map_cleanup},
    {"cuMemRelease", mem_release, release_prepare, mem_create_cleanup},
    {"cuMemRetainAllocationHandle", retain_handle, 0, 0},
    {"cuMemPoolTrimTo", pool_trim, 0, 0},
    {"cuDeviceGraphMemTrim", graph_trim, 0, 0},
    {"cuMemGetAddressRange", address_range, 0, 0},
    {"nvmlDeviceGetMemoryInfo", nvml, 0, 0},
    {"cuMemsetD8Async(legacy)", memset_legacy, 0, 0},
    {"cuStreamGetCtx", stream_get_ctx, 0, 0},
    {"cuThreadExchangeStreamCaptureMode", thread_exchange, 0, 0},
};

static const char *mode_names[] = {"global", "thread_local", "relaxed"};
static CUstreamCaptureMode modes[] = {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                                      CU_STREAM_CAPTURE_MODE_RELAXED};

struct job {
  const struct probe *p;
  int relaxed;
  CUresult rc;
};
static void *other(void *arg) {
  struct job *j = (struct job *)arg;
  CK(cuCtxSetCurrent(ctx));
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (j->relaxed) CK(cuThreadExchangeStreamCaptureMode(&m));
  j->rc = j->p->call();
  if (j->relaxed) CK(cuThreadExchangeStreamCaptureMode(&m));
  return NULL;
}

static void one(const struct probe *p, int mode, int same, int relaxed, int nonblocking_cap) {
  cap = nonblocking_cap ? cap_nonblocking : cap_blocking;
  if (p->prepare) p->prepare();
  CK(cuStreamBeginCapture(cap, modes[mode]));
  CK(cuMemsetD8Async(buf, 7, 4096, cap));
  CUresult rc;
  if (same) {
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (relaxed) CK(cuThreadExchangeStreamCaptureMode(&m));
    rc = p->call();
    if (relaxed) CK(cuThreadExchangeStreamCaptureMode(&m));
  } else {
    struct job j = {p, relaxed, CUDA_SUCCESS};
    pthread_t t;
    pthread_create(&t, NULL, other, &j);
    pthread_join(t, NULL);
    rc = j.rc;
  }
  (void)cuMemsetD8Async(buf, 8, 4096, cap); // refused once the capture is invalidated
  CUgraph g = NULL;
  CUresult end = cuStreamEndCapture(cap, &g);
  if (g) cuGraphDestroy(g);
  if (p->cleanup) p->cleanup();
  CK(cuCtxSynchronize());
  printf("call=%s mode=%s who=%s thread_mode=%s captured=%s rc=%d end=%d\n", p->name, mode_names[mode],
         same ? "same" : "other", relaxed ? "relaxed" : "default", nonblocking_cap ? "nonblocking" : "blocking",
         (int)rc, (int)end);
}

int main(void) {
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CK(cuStreamCreate(&cap_blocking, CU_STREAM_DEFAULT));
  CK(cuStreamCreate(&cap_nonblocking, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&other_nb, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&other_blocking, CU_STREAM_DEFAULT));
  CK(cuEventCreate(&ev_done, CU_EVENT_DISABLE_TIMING));
  CK(cuEventCreate(&ev_scratch, CU_EVENT_DISABLE_TIMING));
  CK(cuMemAlloc(&buf, 1 << 20));
  CK(cuMemAlloc(&spare, 1 << 20));
  CK(cuEventRecord(ev_done, other_nb));
  CUmemAllocationProp p = prop();
  CK(cuMemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CK(cuMemCreate(&h_spare, gran, &p, 0));
  CK(cuMemCreate(&h_mapped, gran, &p, 0));
  CK(cuMemAddressReserve(&va, gran, gran, 0, 0));
  CK(cuMemAddressReserve(&va_mapped, gran, gran, 0, 0));
  CK(cuMemMap(va_mapped, gran, 0, h_mapped, 0));
  (void)set_access();
  void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (nv) {
    int (*init)(void) = (int (*)(void))dlsym(nv, "nvmlInit_v2");
    int (*get)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(nv, "nvmlDeviceGetHandleByIndex_v2");
    nvml_mem = (int (*)(void *, void *))dlsym(nv, "nvmlDeviceGetMemoryInfo");
    if (!init || init() || !get || get(0, &nvml_dev)) nvml_mem = NULL;
  }
  CK(cuCtxSynchronize());
  const char *only = getenv("CAPTURE_RULES_ONLY");
  for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
    if (only && !strstr(probes[i].name, only)) continue;
    for (int nb = 0; nb < 2; nb++)
      for (int mode = 0; mode < 3; mode++)
        for (int same = 0; same < 2; same++)
          for (int relaxed = 0; relaxed < 2; relaxed++) one(&probes[i], mode, same, relaxed, nb);
  }
  printf("capture rules done\n");
  return 0;
}
