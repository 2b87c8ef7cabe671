// Probes for the allocation hot path (issue 14), no cudapool logic of its own:
//   hotpath_probe ctx N      -> "ctx threads=N ns=..." per cuCtxGetCurrent, N threads at once
//   hotpath_probe rtpairs K  -> K cudaMalloc+cudaFree pairs of 4 KiB (count calls under
//                               callcount.so: subtract a run with K=0)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

static double now_ns() {
  return std::chrono::duration<double, std::nano>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  cudaFree(0);
  if (!strcmp(argv[1], "rtpairs")) {
    int k = atoi(argv[2]);
    for (int i = 0; i < k; i++) {
      void *p;
      if (cudaMalloc(&p, 4096) == cudaSuccess) cudaFree(p);
    }
    return 0;
  }
  int n = atoi(argv[2]);
  CUcontext ctx;
  cuCtxGetCurrent(&ctx);
  std::vector<double> per(n);
  std::vector<std::thread> ts;
  for (int i = 0; i < n; i++)
    ts.emplace_back([&, i] {
      cuCtxSetCurrent(ctx);
      CUcontext c;
      const int iters = 2000000;
      double t = now_ns();
      for (int k = 0; k < iters; k++) cuCtxGetCurrent(&c);
      per[i] = (now_ns() - t) / iters;
    });
  for (auto &t : ts) t.join();
  double sum = 0;
  for (double v : per) sum += v;
  printf("ctx threads=%d ns=%.1f\n", n, sum / n);
  return 0;
}
