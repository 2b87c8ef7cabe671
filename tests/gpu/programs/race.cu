// Reuse safety on the GPU (issue 3): a kernel still reading a buffer when the program frees it.
// The kernel spins ~50 ms, then sums the buffer. Right after the launch the program frees the
// buffer, allocates the same size and overwrites the new buffer. With the driver's own
// cudaFree (which waits) or a safe pool, the sum is the original one; a pool that hands the
// freed block out at once lets the overwrite land under the running kernel.
//
// usage: race legacy|blocking|nonblocking|threads|late|handoff|switch|return
//   handoff (build with --default-stream per-thread): thread A launches on its own default
//   stream, frees, allocates again (it may get the block back at once) and hands the new
//   buffer to thread B, which overwrites it on B's own default stream.
//   late: the kernel runs on the legacy stream; the program frees, allocates again (the same
//   thread may get the block back at once), and only then creates a non-blocking stream and
//   overwrites the new buffer on it.
//   threads: thread A launches and frees, thread B allocates and overwrites (build with
//   --default-stream per-thread so each thread has its own default stream).
//   switch: a non-blocking stream exists from the start but gets no work; the kernel runs on
//   the legacy stream (one queue: the block may come back at once), and the stream's first
//   work overwrites the new buffer.
//   return: the same, but the stream had work at the start, then none for half a second while
//   the program kept allocating on the legacy stream (so cudapool may retire it as idle);
//   its next work overwrites the new buffer.
#include <cstdio>
#include <cstring>
#include <chrono>
#include <thread>
#include <cuda_runtime.h>

__global__ void spin_then_sum(const unsigned *buf, size_t n, unsigned long long *out, long long spin) {
  long long t0 = clock64();
  while (clock64() - t0 < spin) {
  }
  unsigned long long s = 0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) s += buf[i];
  atomicAdd(out, s);
}

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      printf("race: %s -> %s\n", #x, cudaGetErrorName(e_));                   \
      return 2;                                                                \
    }                                                                          \
  } while (0)

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "legacy";
  const size_t n = 16 << 20; // 64 MiB of unsigned
  int rate_khz = 0;
  CK(cudaDeviceGetAttribute(&rate_khz, cudaDevAttrClockRate, 0));
  long long spin = (long long)rate_khz * 50; // ~50 ms
  unsigned long long *out;
  CK(cudaMalloc(&out, sizeof *out));
  cudaStream_t s = 0, s2 = 0;
  if (!strcmp(mode, "blocking")) {
    CK(cudaStreamCreate(&s));
    CK(cudaStreamCreate(&s2));
  } else if (!strcmp(mode, "nonblocking")) {
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  } else if (!strcmp(mode, "switch") || !strcmp(mode, "return")) {
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  }
  unsigned *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, n * sizeof *a));
  CK(cudaMemset(a, 0, n * sizeof *a));
  CK(cudaMemset(out, 0, sizeof *out));
  // Every word = 1: the right sum is n.
  CK(cudaMemset(a, 0, n * sizeof *a));
  unsigned *host = new unsigned[n];
  for (size_t i = 0; i < n; i++) host[i] = 1;
  CK(cudaMemcpy(a, host, n * sizeof *a, cudaMemcpyHostToDevice));
  CK(cudaDeviceSynchronize());
  if (!strcmp(mode, "return")) {
    unsigned *scratch;
    CK(cudaMalloc(&scratch, 1 << 20));
    CK(cudaMemsetAsync(scratch, 0, 1 << 20, s2));
    CK(cudaDeviceSynchronize());
    auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(500)) {
      unsigned *p; // another size than the test's buffer, so only that one can serve it
      CK(cudaMalloc(&p, 32 << 20));
      CK(cudaMemset(p, 0, 32 << 20));
      CK(cudaFree(p));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    CK(cudaFree(scratch));
  }

  if (!strcmp(mode, "threads")) {
    // Thread A launches on its own default stream and frees; thread B allocates and
    // overwrites on its own default stream.
    std::thread ta([&] {
      spin_then_sum<<<1, 256>>>(a, n, out, spin);
      cudaFree(a);
    });
    ta.join();
    std::thread tb([&] {
      cudaMalloc(&b, n * sizeof *b);
      cudaMemset(b, 0xff, n * sizeof *b);
    });
    tb.join();
  } else if (!strcmp(mode, "handoff")) {
    std::thread ta([&] {
      spin_then_sum<<<1, 256>>>(a, n, out, spin);
      cudaFree(a);
      cudaMalloc(&b, n * sizeof *b);
    });
    ta.join();
    std::thread tb([&] { cudaMemset(b, 0xff, n * sizeof *b); });
    tb.join();
  } else if (!strcmp(mode, "switch") || !strcmp(mode, "return")) {
    spin_then_sum<<<1, 256>>>(a, n, out, spin);
    CK(cudaFree(a));
    CK(cudaMalloc(&b, n * sizeof *b));
    CK(cudaMemsetAsync(b, 0xff, n * sizeof *b, s2));
  } else if (!strcmp(mode, "late")) {
    spin_then_sum<<<1, 256>>>(a, n, out, spin);
    CK(cudaFree(a));
    CK(cudaMalloc(&b, n * sizeof *b));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CK(cudaMemsetAsync(b, 0xff, n * sizeof *b, s2));
  } else {
    spin_then_sum<<<1, 256, 0, s>>>(a, n, out, spin);
    CK(cudaFree(a));
    CK(cudaMalloc(&b, n * sizeof *b));
    CK(cudaMemsetAsync(b, 0xff, n * sizeof *b, s2)); // s2 = 0 in legacy mode
  }
  CK(cudaDeviceSynchronize());
  unsigned long long got = 0;
  CK(cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost));
  printf("race %s: reused=%d checksum %s (%llu, want %zu)\n", mode, b == a,
         got == n ? "ok" : "CORRUPTED", got, n);
  return got == n ? 0 : 1;
}
