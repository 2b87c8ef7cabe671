// Where a stitch's time goes: the driver calls the expandable arena makes to map a handle that
// is mapped already a second time (cuMemRetainAllocationHandle, cuMemMap, cuMemRelease,
// cuMemSetAccess), and to unmap the first address later (cuMemUnmap), each timed alone, with
// the GPU idle and with a kernel running on it. Beside them, what a growth's new handle costs
// (cuMemCreate, cuMemMap, cuMemSetAccess). Prints p50 and p99 in microseconds.
//
//   nvcc -O2 -o stitch_cost benches/gpu/stitch_cost.cu -lcuda && ./stitch_cost [N]
#include <cuda.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                  \
  do {                                                                         \
    CUresult r_ = (x);                                                         \
    if (r_ != CUDA_SUCCESS) {                                                  \
      std::fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #x, r_);   \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

__global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

static double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Series {
  const char *name;
  std::vector<double> us;
};

static void print(const char *mode, std::vector<Series> &all) {
  for (auto &s : all) {
    std::sort(s.us.begin(), s.us.end());
    size_t n = s.us.size();
    double total = 0;
    for (double v : s.us) total += v;
    std::printf("%-5s %-34s n=%zu p50 %8.1f us  p99 %8.1f us  mean %8.1f us\n", mode, s.name, n,
                s.us[n / 2], s.us[std::min(n - 1, n * 99 / 100)], total / n);
  }
}

int main(int argc, char **argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 200;
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  size_t g = 0;
  CK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  g = std::max(g, (size_t)2 << 20);
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  int sms = 0, clock_khz = 0;
  CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  CK(cuDeviceGetAttribute(&clock_khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev));
  long long spin_cycles = (long long)clock_khz * 20;  // about 20 ms a kernel
  CUstream s;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

  for (int busy = 0; busy < 2; busy++) {
    CUdeviceptr a, b;
    CK(cuMemAddressReserve(&a, n * g, g, 0, 0));
    CK(cuMemAddressReserve(&b, n * g, g, 0, 0));
    std::vector<Series> all = {{"new: cuMemCreate", {}},
                               {"new: cuMemMap", {}},
                               {"new: cuMemSetAccess", {}},
                               {"stitch: cuMemRetainAllocationHandle", {}},
                               {"stitch: cuMemMap", {}},
                               {"stitch: cuMemRelease", {}},
                               {"stitch: cuMemSetAccess", {}},
                               {"stitch: all four", {}},
                               {"shadow: cuMemUnmap", {}},
                               {"handle: cuMemUnmap + cuMemRelease", {}}};
    std::vector<CUmemGenericAllocationHandle> hs(n);
    for (int i = 0; i < n; i++) {
      if (busy) spin<<<sms, 32, 0, (cudaStream_t)s>>>(spin_cycles);
      double t0 = now_us();
      CK(cuMemCreate(&hs[i], g, &prop, 0));
      double t1 = now_us();
      CK(cuMemMap(a + i * g, g, 0, hs[i], 0));
      double t2 = now_us();
      CK(cuMemSetAccess(a + i * g, g, &access, 1));
      double t3 = now_us();
      all[0].us.push_back(t1 - t0);
      all[1].us.push_back(t2 - t1);
      all[2].us.push_back(t3 - t2);
      if (busy) CK(cuStreamSynchronize(s));
    }
    for (int i = 0; i < n; i++) {
      if (busy) spin<<<sms, 32, 0, (cudaStream_t)s>>>(spin_cycles);
      CUmemGenericAllocationHandle h;
      double t0 = now_us();
      CK(cuMemRetainAllocationHandle(&h, (void *)(a + i * g)));
      double t1 = now_us();
      CK(cuMemMap(b + i * g, g, 0, h, 0));
      double t2 = now_us();
      CK(cuMemRelease(h));
      double t3 = now_us();
      CK(cuMemSetAccess(b + i * g, g, &access, 1));
      double t4 = now_us();
      all[3].us.push_back(t1 - t0);
      all[4].us.push_back(t2 - t1);
      all[5].us.push_back(t3 - t2);
      all[6].us.push_back(t4 - t3);
      all[7].us.push_back(t4 - t0);
      if (busy) CK(cuStreamSynchronize(s));
    }
    for (int i = 0; i < n; i++) {
      if (busy) spin<<<sms, 32, 0, (cudaStream_t)s>>>(spin_cycles);
      double t0 = now_us();
      CK(cuMemUnmap(a + i * g, g));
      double t1 = now_us();
      CK(cuMemUnmap(b + i * g, g));
      CK(cuMemRelease(hs[i]));
      double t2 = now_us();
      all[8].us.push_back(t1 - t0);
      all[9].us.push_back(t2 - t1);
      if (busy) CK(cuStreamSynchronize(s));
    }
    CK(cuMemAddressFree(a, n * g));
    CK(cuMemAddressFree(b, n * g));
    print(busy ? "busy" : "idle", all);
  }
  std::printf("handle %zu bytes, %d SMs; busy: a kernel of about 20 ms on every SM during each call\n", g, sms);
  return 0;
}
