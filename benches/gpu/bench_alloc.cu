// Cost of one alloc+free pair on the GPU, by API and size, and throughput by thread count.
//   bench_alloc driver|runtime|async sizes      -> "size=BYTES ns=MEDIAN" per size
//   bench_alloc driver|runtime|async threads N  -> "threads=N mpairs=M" (4 KiB pairs, 200000 a
//     thread after a warm-up, all starting together)
//   bench_alloc launch one|two                  -> "launch=... ns=MEDIAN": host time of one
//     empty kernel launch (<<<1, 1>>>), on the legacy stream, or alternating two streams
//     (what cudapool's work hooks add to every launch)
// driver: cuMemAlloc/cuMemFree; runtime: cudaMalloc/cudaFree; async: cuMemAllocAsync/
// cuMemFreeAsync on the device's default pool with its release threshold at max (CUDA's own
// stream-ordered pool, kept warm). Run under LD_PRELOAD=libcudapool.so to measure cudapool.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

static const char *api;
static CUcontext ctx;
static thread_local CUstream stream;

static void pair(size_t size) {
  if (!strcmp(api, "driver")) {
    CUdeviceptr p;
    if (cuMemAlloc(&p, size) == CUDA_SUCCESS) cuMemFree(p);
  } else if (!strcmp(api, "runtime")) {
    void *p;
    if (cudaMalloc(&p, size) == cudaSuccess) cudaFree(p);
  } else {
    CUdeviceptr p;
    if (cuMemAllocAsync(&p, size, stream) == CUDA_SUCCESS) cuMemFreeAsync(p, stream);
  }
}

__global__ void empty() {}

static double now_ns() {
  return std::chrono::duration<double, std::nano>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

static double pair_ns(size_t size) {
  for (int i = 0; i < 20; i++) pair(size);
  double t = now_ns();
  for (int i = 0; i < 20; i++) pair(size);
  double per = (now_ns() - t) / 20;
  int iters = std::max(20, std::min(200000, (int)(20e6 / std::max(per, 1.0)))); // ~20 ms a run
  std::vector<double> runs;
  for (int r = 0; r < 5; r++) {
    t = now_ns();
    for (int i = 0; i < iters; i++) pair(size);
    runs.push_back((now_ns() - t) / iters);
  }
  std::sort(runs.begin(), runs.end());
  return runs[2];
}

// Host ns per launch: 1000 launches timed, then a synchronize (untimed); median of 7.
static double launch_ns(bool two) {
  cudaStream_t s[2] = {0, 0};
  if (two) {
    cudaStreamCreateWithFlags(&s[0], cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s[1], cudaStreamNonBlocking);
  }
  std::vector<double> runs;
  for (int r = 0; r < 8; r++) {
    double t = now_ns();
    for (int i = 0; i < 1000; i++) empty<<<1, 1, 0, s[i & 1]>>>();
    double dt = now_ns() - t;
    cudaDeviceSynchronize();
    if (r > 0) runs.push_back(dt / 1000);
  }
  std::sort(runs.begin(), runs.end());
  return runs[3];
}

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  api = argv[1];
  cudaFree(0);
  if (!strcmp(api, "launch")) {
    bool two = !strcmp(argv[2], "two");
    printf("launch=%s ns=%.1f\n", argv[2], launch_ns(two));
    return 0;
  }
  cuCtxGetCurrent(&ctx);
  CUmemoryPool pool;
  CUdevice dev = 0;
  cuDeviceGetDefaultMemPool(&pool, dev);
  cuuint64_t max = ~0ull;
  cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max);
  stream = 0;
  if (!strcmp(argv[2], "sizes")) {
    size_t sizes[] = {512, 4096, 65536, 1 << 20, 16 << 20, 256 << 20};
    for (size_t s : sizes) printf("size=%zu ns=%.1f\n", s, pair_ns(s));
    return 0;
  }
  int n = argc > 3 ? atoi(argv[3]) : 1;
  // Each thread warms up (its first pairs make its per-thread state), then all start at once;
  // the time runs from the start to the last thread's end (thread creation is not timed).
  std::vector<std::thread> ts;
  std::vector<double> end(n);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  const int iters = 200000;
  for (int i = 0; i < n; i++)
    ts.emplace_back([&, i] {
      cuCtxSetCurrent(ctx);
      if (!strcmp(api, "async")) cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
      for (int k = 0; k < 2000; k++) pair(4096);
      ready++;
      while (!go.load()) {
      }
      for (int k = 0; k < iters; k++) pair(4096);
      end[i] = now_ns();
    });
  while (ready.load() < n) {
  }
  double t = now_ns();
  go = true;
  for (auto &th : ts) th.join();
  double last = *std::max_element(end.begin(), end.end());
  double secs = (last - t) / 1e9;
  printf("threads=%d mpairs=%.3f\n", n, n * iters / secs / 1e6);
  return 0;
}
