// A CUDA runtime program: cudaMalloc/cudaFree in a pattern of sizes with kernels writing the
// buffers, one checked result, cudaMemGetInfo, and a 2 GiB request (refused under a 1 GiB limit).
#include <cstdio>
#include <cuda_runtime.h>

__global__ void fill(float *p, size_t n, float v) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}

__global__ void sum(const float *p, size_t n, double *out) {
  double s = 0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) s += p[i];
  atomicAdd(out, s);
}

#define CK(x)                                                                      \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      printf("rt: %s -> %s (line %d)\n", #x, cudaGetErrorName(e_), __LINE__);     \
      return 1;                                                                    \
    }                                                                              \
  } while (0)

int main() {
  size_t f = 0, t = 0;
  CK(cudaMemGetInfo(&f, &t));
  printf("rt: cudaMemGetInfo free=%.1f MiB total=%.1f MiB\n", f / 1048576.0, t / 1048576.0);
  size_t sizes[] = {512, 4096, 1 << 20, 16 << 20, 256 << 20};
  int pairs = 0;
  for (int round = 0; round < 4; round++)
    for (size_t s : sizes) {
      float *p;
      CK(cudaMalloc(&p, s));
      size_t n = s / sizeof(float);
      fill<<<(unsigned)((n + 255) / 256), 256>>>(p, n, 1.0f);
      CK(cudaFree(p));
      pairs++;
    }
  float *a;
  double *d, h = 0;
  size_t n = (64 << 20) / sizeof(float);
  CK(cudaMalloc(&a, n * sizeof(float)));
  CK(cudaMalloc(&d, sizeof(double)));
  CK(cudaMemset(d, 0, sizeof(double)));
  fill<<<(unsigned)((n + 255) / 256), 256>>>(a, n, 2.0f);
  sum<<<1, 1024>>>(a, n, d);
  CK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
  printf("rt: %d alloc/free pairs with kernels; checksum %s (%.0f)\n", pairs,
         h == 2.0 * n ? "ok" : "WRONG", h);
  CK(cudaFree(a));
  CK(cudaFree(d));
  void *big = nullptr;
  cudaError_t e = cudaMalloc(&big, size_t(2) << 30);
  printf("rt: cudaMalloc(2 GiB) -> %s\n", cudaGetErrorName(e));
  if (e == cudaSuccess) cudaFree(big);
  (void)cudaGetLastError();
  return 0;
}
