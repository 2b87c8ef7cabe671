// A module load is charged what it took, whatever the GPU's other tenants do meanwhile.
//
// usage: load_beside load CUBIN N      loads CUBIN (its device globals) N times, each kept
//                                      while cudapool's overhead figure is read, then unloaded;
//                                      prints "load I took_mib=T overhead_mib=O us=U" and last
//                                      "loads N exact=K median_us=M"
//        load_beside neighbour SECONDS allocates and frees 256 MiB blocks for SECONDS (another
//                                      process on the same GPU, as a busy neighbour)
// A load is exact when cudapool's overhead figure rose by the module's 64 MiB of globals, up to
// 4 MiB more (its code and the driver's pages). Read under LD_PRELOAD=libcudapool.so.
#include <cuda.h>
#include <dlfcn.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "cudapool.h"

#define CK(x)                                                                   \
  do {                                                                          \
    CUresult e_ = (x);                                                          \
    if (e_ != CUDA_SUCCESS) {                                                   \
      printf("load_beside: %s -> %d (line %d)\n", #x, (int)e_, __LINE__);       \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

static uint64_t overhead() {
  auto get = (int (*)(int, cudapool_stats *))dlsym(RTLD_DEFAULT, "cudapool_get_stats");
  cudapool_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  return get && get(0, &s) == 0 ? s.overhead_bytes : 0;
}

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  if (!strcmp(argv[1], "neighbour")) {
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(atoi(argv[2]));
    while (std::chrono::steady_clock::now() < end) {
      CUdeviceptr p;
      if (cuMemAlloc(&p, 256u << 20) == CUDA_SUCCESS) {
        CK(cuMemsetD8(p, 1, 256u << 20));
        CK(cuCtxSynchronize());
        CK(cuMemFree(p));
      }
    }
    return 0;
  }
  int n = argc > 3 ? atoi(argv[3]) : 20;
  const uint64_t MIB = 1 << 20;
  int exact = 0;
  std::vector<double> us;
  for (int i = 0; i < n; i++) {
    uint64_t before = overhead();
    CUmodule m;
    auto t0 = std::chrono::steady_clock::now();
    CK(cuModuleLoad(&m, argv[2]));
    auto t1 = std::chrono::steady_clock::now();
    uint64_t took = overhead() - before;
    exact += took >= 64 * MIB && took <= 68 * MIB;
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    printf("load %d took_mib=%llu overhead_mib=%llu us=%.0f\n", i, (unsigned long long)(took / MIB),
           (unsigned long long)(overhead() / MIB), us.back());
    CK(cuModuleUnload(m));
  }
  std::sort(us.begin(), us.end());
  printf("loads %d exact=%d median_us=%.0f\n", n, exact, us[us.size() / 2]);
  return 0;
}
