// Two threads, one capturing CUDA graphs while the other allocates and frees (a legal program
// in each capture mode): every capture must end with a graph that replays right, and the other
// thread's data must stay right.
//   capture_threads MODE      MODE: global | thread_local | relaxed
// In the global mode the other thread allocates in the relaxed mode, as a legal program must
// (PyTorch does so around its cudaMalloc during a capture). The capturing thread allocates
// inside each capture too (relaxed, a new size each time: a pool miss), as PyTorch's graph pool
// does. Prints "captures ok N of 20 ..." and exits 0 only if all are right.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#define CK(x)                                                                             \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "%s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);        \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

__global__ void fill(float *p, size_t n, float v) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}
__global__ void add(float *dst, const float *src, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

static std::atomic<int> want{0}, done{0};
static std::atomic<bool> stop{false};
static std::atomic<long> steps{0}, bad{0}, errors{0};
static cudaStreamCaptureMode mode;

static void burst(cudaStream_t w, int round) {
  for (int i = 0; i < 6; i++) {
    size_t n = ((size_t)(1 + (round * 6 + i) % 37) << 18) + 1024 * i;
    float *p;
    cudaError_t e = cudaMalloc(&p, n * sizeof(float));
    if (e != cudaSuccess) {
      errors++;
      fprintf(stderr, "other thread: cudaMalloc: %s\n", cudaGetErrorString(e));
      continue;
    }
    fill<<<(n + 255) / 256, 256, 0, w>>>(p, n, (float)round);
    float last;
    CK(cudaMemcpyAsync(&last, p + n - 1, sizeof last, cudaMemcpyDeviceToHost, w));
    CK(cudaStreamSynchronize(w));
    if (last != (float)round) bad++;
    CK(cudaFree(p));
  }
  steps++;
}

static void other() {
  CK(cudaSetDevice(0));
  cudaStream_t w;
  CK(cudaStreamCreateWithFlags(&w, cudaStreamNonBlocking));
  size_t (*reclaim)(int) = (size_t(*)(int))dlsym(RTLD_DEFAULT, "cudapool_reclaim");
  for (int round = 0;; round++) {
    while (want.load() == done.load() && !stop.load()) std::this_thread::yield();
    if (want.load() == done.load()) break;
    cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    if (mode == cudaStreamCaptureModeGlobal) CK(cudaThreadExchangeStreamCaptureMode(&m));
    burst(w, round);
    if (round % 3 == 0 && reclaim) reclaim(0);
    if (mode == cudaStreamCaptureModeGlobal) CK(cudaThreadExchangeStreamCaptureMode(&m));
    done++;
  }
  CK(cudaStreamDestroy(w));
}

static void ask() {
  int target = ++want;
  while (done.load() < target) std::this_thread::yield();
}

int main(int argc, char **argv) {
  const char *name = argc > 1 ? argv[1] : "global";
  mode = !strcmp(name, "global") ? cudaStreamCaptureModeGlobal
         : !strcmp(name, "thread_local") ? cudaStreamCaptureModeThreadLocal
                                          : cudaStreamCaptureModeRelaxed;
  CK(cudaSetDevice(0));
  cudaStream_t s;
  CK(cudaStreamCreate(&s)); // blocking: legacy-stream work would conflict with its capture
  const size_t n = 1 << 20;
  float *x, *y;
  CK(cudaMalloc(&x, n * sizeof(float)));
  CK(cudaMalloc(&y, n * sizeof(float)));
  fill<<<(n + 255) / 256, 256, 0, s>>>(x, n, 1.0f);
  fill<<<(n + 255) / 256, 256>>>(y, n, 0.0f); // the legacy stream: a queue cudapool knows
  CK(cudaDeviceSynchronize());
  std::thread t(other);
  ask();
  int ok = 0;
  for (int i = 0; i < 20; i++) {
    CK(cudaStreamBeginCapture(s, mode));
    ask();
    cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    CK(cudaThreadExchangeStreamCaptureMode(&m));
    float *tmp;
    cudaError_t e = cudaMalloc(&tmp, ((size_t)(40 + i) << 20));
    CK(cudaThreadExchangeStreamCaptureMode(&m));
    fill<<<(n + 255) / 256, 256, 0, s>>>(tmp, n, 2.0f);
    add<<<(n + 255) / 256, 256, 0, s>>>(y, tmp, n);
    add<<<(n + 255) / 256, 256, 0, s>>>(y, x, n);
    ask();
    cudaGraph_t g = nullptr;
    cudaError_t end = cudaStreamEndCapture(s, &g);
    if (e != cudaSuccess || end != cudaSuccess || !g) {
      fprintf(stderr, "capture %d: alloc %s, end %s\n", i, cudaGetErrorString(e), cudaGetErrorString(end));
      (void)cudaGetLastError();
      if (e == cudaSuccess) CK(cudaFree(tmp));
      continue;
    }
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaMemsetAsync(y, 0, n * sizeof(float), s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaGraphLaunch(ge, s));
    float last;
    CK(cudaMemcpyAsync(&last, y + n - 1, sizeof last, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    if (last == 6.0f) ok++;
    else fprintf(stderr, "capture %d: replayed to %f, want 6\n", i, last);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaFree(tmp));
    ask();
  }
  stop = true;
  t.join();
  printf("captures ok %d of 20 (mode %s); other thread %ld steps, %ld wrong, %ld errors\n", ok, name,
         steps.load(), bad.load(), errors.load());
  return ok == 20 && bad == 0 && errors == 0 && steps > 40 ? 0 : 1;
}
