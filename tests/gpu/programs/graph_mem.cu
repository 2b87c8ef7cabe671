// Graph memory nodes under cudapool: what the driver reserves for a graph whose memory node
// takes SIZE bytes, and whether the limit holds.
//   graph_mem probe SIZE_MIB          prints the driver's graph memory attributes at each step
//   graph_mem run SIZE_MIB REPLAYS    captures, instantiates, launches REPLAYS times; prints
//                                     each step's result and the reserve; exit 0 if all ran,
//                                     2 if a launch was refused with out-of-memory
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

__global__ void touch(char *p, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = (char)i;
}

// cudapool's figures when it is loaded (cudapool.h's struct, read through dlsym).
struct pool_stats {
  size_t struct_size;
  int32_t device, pad;
  uint64_t allocated, peak_allocated, reserved, peak_reserved, cached, live, segments;
  uint64_t alloc_calls, free_calls, cache_hits, driver_allocs, driver_frees, retries, ooms;
  uint64_t hard_limit, soft_limit;
};
static long long pool_reserved(void) {
  int (*f)(int, struct pool_stats *) =
      (int (*)(int, struct pool_stats *))dlsym(RTLD_DEFAULT, "cudapool_get_stats");
  struct pool_stats st = {sizeof st};
  if (!f || f(0, &st)) return -1;
  return (long long)(st.reserved >> 20);
}

static void attrs(const char *when) {
  unsigned long long r = 0, u = 0, rh = 0;
  cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemCurrent, &r);
  cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &u);
  cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemHigh, &rh);
  size_t f = 0, t = 0;
  cudaMemGetInfo(&f, &t);
  printf("%-28s reserved %6llu MiB used %6llu MiB high %6llu MiB | memgetinfo free %6zu total %6zu MiB"
         " | cudapool reserved %lld MiB\n",
         when, r >> 20, u >> 20, rh >> 20, f >> 20, t >> 20, pool_reserved());
  fflush(stdout);
}

static cudaGraph_t capture(cudaStream_t s, size_t bytes, int free_inside) {
  cudaGraph_t g;
  char *p = NULL;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  cudaMallocAsync((void **)&p, bytes, s);
  touch<<<1024, 256, 0, s>>>(p, bytes);
  if (free_inside) cudaFreeAsync(p, s);
  cudaError_t e = cudaStreamEndCapture(s, &g);
  if (e != cudaSuccess) { printf("capture: %s\n", cudaGetErrorString(e)); exit(1); }
  return g;
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: graph_mem probe|run SIZE_MIB [REPLAYS]\n"); return 64; }
  size_t bytes = (size_t)atoll(argv[2]) << 20;
  cudaStream_t s;
  cudaFree(0);
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (!strcmp(argv[1], "probe")) {
    attrs("start");
    cudaGraph_t g = capture(s, bytes, 1);
    attrs("captured");
    cudaGraphExec_t x;
    cudaGraphInstantiate(&x, g, 0);
    attrs("instantiated");
    cudaGraphUpload(x, s);
    attrs("uploaded (not synced)");
    cudaStreamSynchronize(s);
    attrs("uploaded, synced");
    cudaGraphLaunch(x, s);
    attrs("launched (not synced)");
    cudaStreamSynchronize(s);
    attrs("launched, synced");
    cudaGraph_t g2 = capture(s, bytes, 1);
    cudaGraphExec_t x2;
    cudaGraphInstantiate(&x2, g2, 0);
    cudaGraphLaunch(x2, s);
    cudaStreamSynchronize(s);
    attrs("second graph launched");
    cudaGraphLaunch(x, s);
    cudaGraphLaunch(x2, s);
    attrs("both in flight");
    cudaStreamSynchronize(s);
    cudaDeviceGraphMemTrim(0);
    attrs("trimmed");
    cudaGraphLaunch(x, s);
    cudaStreamSynchronize(s);
    attrs("first relaunched");
    cudaGraphExecDestroy(x);
    cudaGraphExecDestroy(x2);
    attrs("execs destroyed");
    cudaDeviceGraphMemTrim(0);
    attrs("trimmed again");
    // an allocation that outlives the graph: freed outside it
    cudaGraph_t g3 = capture(s, bytes, 0);
    cudaGraphExec_t x3;
    cudaGraphInstantiate(&x3, g3, 0);
    cudaGraphLaunch(x3, s);
    cudaStreamSynchronize(s);
    attrs("unfreed alloc launched");
    cudaDeviceGraphMemTrim(0);
    attrs("trimmed with it live");
    return 0;
  }
  int replays = argc > 3 ? atoi(argv[3]) : 3;
  cudaGraph_t g = capture(s, bytes, 1);
  cudaGraphExec_t x;
  cudaError_t e = cudaGraphInstantiate(&x, g, 0);
  printf("instantiate: %s\n", cudaGetErrorName(e));
  if (e != cudaSuccess) return 1;
  for (int i = 0; i < replays; i++) {
    e = cudaGraphLaunch(x, s);
    cudaError_t e2 = cudaStreamSynchronize(s);
    printf("launch %d: %s, sync: %s\n", i, cudaGetErrorName(e), cudaGetErrorName(e2));
    attrs("after launch");
    if (e == cudaErrorMemoryAllocation) return 2;
    if (e != cudaSuccess || e2 != cudaSuccess) return 1;
  }
  // Held for GRAPH_MEM_HOLD_S seconds so that nvidia-smi can see the process.
  const char *hold = getenv("GRAPH_MEM_HOLD_S");
  if (hold) {
    printf("holding\n");
    fflush(stdout);
    sleep(atoi(hold));
  }
  // The program goes on after the graph: an ordinary allocation still works.
  void *p;
  e = cudaMalloc(&p, 16 << 20);
  printf("cudaMalloc after: %s\n", cudaGetErrorName(e));
  return e == cudaSuccess ? 0 : 1;
}
