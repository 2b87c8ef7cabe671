// Prints cudapool's view of device 0 around a phase of work, then gives the cache back. Build against the header and run
// under the shim:
//   cc -I include -o print_status cbindings/c/print_status.c -ldl
//   LD_PRELOAD=target/release/libcudapool.so ./print_status
// The functions are found with dlsym so the program also runs (and says so) without the shim.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "cudapool.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

int main(void) {
  const char *(*version)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "cudapool_version");
  if (!version) {
    printf("cudapool is not loaded in this process\n");
    return 1;
  }
  int (*get_stats)(int, cudapool_stats *) =
      (int (*)(int, cudapool_stats *))dlsym(RTLD_DEFAULT, "cudapool_get_stats");
  int (*status)(char *, size_t) = (int (*)(char *, size_t))dlsym(RTLD_DEFAULT, "cudapool_memory_status");
  int (*reset_peaks)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "cudapool_reset_peak_stats");
  size_t (*reclaim)(int) = (size_t(*)(int))dlsym(RTLD_DEFAULT, "cudapool_reclaim");

  // A phase of work, through the driver API.
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
  if (!cuda) {
    printf("no libcuda.so.1\n");
    return 1;
  }
  CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(cuda, "cuInit");
  CUresult (*retain)(void **, int) = (CUresult(*)(void **, int))dlsym(cuda, "cuDevicePrimaryCtxRetain");
  CUresult (*set_current)(void *) = (CUresult(*)(void *))dlsym(cuda, "cuCtxSetCurrent");
  CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(cuda, "cuMemAlloc_v2");
  CUresult (*release)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))dlsym(cuda, "cuMemFree_v2");
  void *ctx;
  if (init(0) || retain(&ctx, 0) || set_current(ctx)) {
    printf("no CUDA device\n");
    return 1;
  }
  reset_peaks(0);
  CUdeviceptr p[4];
  for (int i = 0; i < 4; i++) alloc(&p[i], (size_t)(i + 1) << 20);
  for (int i = 0; i < 4; i++) release(p[i]);

  cudapool_stats s = {.struct_size = sizeof s};
  if (get_stats(0, &s) == 0)
    printf("cudapool %s: the phase peaked at %llu bytes in %llu allocations\n", version(),
           (unsigned long long)s.peak_allocated_bytes, (unsigned long long)s.alloc_calls);
  int n = status(NULL, 0);
  char *buf = malloc((size_t)n + 1);
  status(buf, (size_t)n + 1);
  fputs(buf, stdout);
  free(buf);
  // The phase is over: give what cudapool cached for it back to the driver.
  printf("reclaimed %zu bytes\n", reclaim(-1));
  if (get_stats(0, &s) == 0) printf("reserved now %llu bytes\n", (unsigned long long)s.reserved_bytes);
  return 0;
}
