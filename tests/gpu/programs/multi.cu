// Two devices under cudapool (issue 5): per-device limits, one thread switching devices, and
// peer-to-peer copies between pool blocks. Run with CUDAPOOL_MEMORY_LIMIT=0=1GiB,1=2GiB.
// Prints: limits dev0_mib=N dev1_mib=N / switching ok|WRONG / peer ok|WRONG; exits 1 on a
// wrong result.
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      printf("multi: %s -> %s (line %d)\n", #x, cudaGetErrorName(e_), __LINE__); \
      return 1;                                                                \
    }                                                                          \
  } while (0)

__global__ void fill(int *p, size_t n, int v) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) p[i] = v + (int)(i % 97);
}

int main() {
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    printf("multi: needs two devices, found %d\n", n);
    return 2;
  }
  // Per-device limits: take 128 MiB at a time on each device until refused.
  size_t got[2] = {0, 0};
  for (int d = 0; d < 2; d++) {
    CK(cudaSetDevice(d));
    std::vector<void *> held;
    void *p;
    while (held.size() < 64 && cudaMalloc(&p, 128 << 20) == cudaSuccess) held.push_back(p);
    cudaGetLastError();
    got[d] = held.size() * 128;
    for (void *q : held) CK(cudaFree(q));
  }
  printf("limits dev0_mib=%zu dev1_mib=%zu\n", got[0], got[1]);
  // One thread switching devices: allocate, write, check, free, alternating.
  bool ok = true;
  for (int i = 0; i < 400 && ok; i++) {
    int d = i % 2;
    CK(cudaSetDevice(d));
    size_t elems = (size_t)(1 + i % 7) << 16;
    int *p;
    CK(cudaMalloc(&p, elems * sizeof(int)));
    cudaPointerAttributes at;
    CK(cudaPointerGetAttributes(&at, p));
    if (at.device != d) {
      printf("multi: block of switch %d is on device %d, not %d\n", i, at.device, d);
      ok = false;
    }
    fill<<<(unsigned)((elems + 255) / 256), 256>>>(p, elems, i);
    int last;
    CK(cudaMemcpy(&last, p + elems - 1, sizeof last, cudaMemcpyDeviceToHost));
    ok = last == i + (int)((elems - 1) % 97);
    CK(cudaFree(p));
  }
  printf("switching %s\n", ok ? "ok" : "WRONG");
  // Peer copies between pool blocks (small ones, carved out of cached segments).
  int can = 0;
  CK(cudaDeviceCanAccessPeer(&can, 0, 1));
  if (can) {
    CK(cudaSetDevice(0));
    cudaDeviceEnablePeerAccess(1, 0);
    CK(cudaSetDevice(1));
    cudaDeviceEnablePeerAccess(0, 0);
    cudaGetLastError();
  }
  bool peer = true;
  for (int i = 0; i < 50 && peer; i++) {
    size_t elems = (size_t)(1 + i % 5) * 1000;
    int *a, *b;
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&a, elems * sizeof(int)));
    fill<<<(unsigned)((elems + 255) / 256), 256>>>(a, elems, 7 * i);
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&b, elems * sizeof(int)));
    CK(cudaMemcpyPeer(b, 1, a, 0, elems * sizeof(int)));
    std::vector<int> h(elems);
    CK(cudaMemcpy(h.data(), b, elems * sizeof(int), cudaMemcpyDeviceToHost));
    for (size_t k = 0; k < elems; k++) peer = peer && h[k] == 7 * i + (int)(k % 97);
    CK(cudaFree(b));
    CK(cudaSetDevice(0));
    CK(cudaFree(a));
  }
  printf("peer %s (peer access %s)\n", peer ? "ok" : "WRONG", can ? "direct" : "staged");
  return ok && peer ? 0 : 1;
}
