// Ways a sleep could move GIB GiB between the device and host memory, each timed in one run
// beside a plain pinned copy (the ceiling), on 16 threads:
//   slots     each thread's two pinned slots (SLOT_MIB, 4 by default), the CPU copying between
//             slot and host copy with memcpy;
//   slots-nt  the same with stores that bypass the caches (AVX2 streaming stores);
//   register  each thread pins 64 MiB pieces of the host copy itself (cuMemHostRegister) and
//             the bus moves straight into them; the pieces are unpinned at the end;
// each into fresh anonymous memory (huge pages asked) and into the same memory again (pages
// already there), and back to the device from it. No cudapool: the driver API alone.
//   nvcc -O2 -o sleep_paths benches/gpu/sleep_paths.cu -mavx2 -lcuda -lpthread && ./sleep_paths GIB ROUNDS SLOT_MIB
#include <cuda.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define THREADS 16
static size_t SLOT = 4ul << 20;
#define PIECE (64ul << 20)

#define CK(x)                                                                 \
  do {                                                                        \
    CUresult r_ = (x);                                                        \
    if (r_ != CUDA_SUCCESS) {                                                 \
      fprintf(stderr, "%s: error %d (line %d)\n", #x, (int)r_, __LINE__);     \
      exit(3);                                                                \
    }                                                                         \
  } while (0)

static CUcontext ctx;
static CUdeviceptr dev;
static char *host;
static size_t total;
static int to_host, streaming;

// A copy whose stores bypass the caches (no read of the destination first): 32-byte aligned
// ends, the tail by memcpy.
static void copy_nt(char *dst, const char *src, size_t n) {
  size_t i = 0;
  if (((uintptr_t)dst | (uintptr_t)src) % 32 == 0) {
    for (; i + 128 <= n; i += 128) {
      __m256i a = _mm256_load_si256((const __m256i *)(src + i));
      __m256i b = _mm256_load_si256((const __m256i *)(src + i + 32));
      __m256i c = _mm256_load_si256((const __m256i *)(src + i + 64));
      __m256i d = _mm256_load_si256((const __m256i *)(src + i + 96));
      _mm256_stream_si256((__m256i *)(dst + i), a);
      _mm256_stream_si256((__m256i *)(dst + i + 32), b);
      _mm256_stream_si256((__m256i *)(dst + i + 64), c);
      _mm256_stream_si256((__m256i *)(dst + i + 96), d);
    }
    _mm_sfence();
  }
  memcpy(dst + i, src + i, n - i);
}

static void copy(char *dst, const char *src, size_t n) {
  if (streaming)
    copy_nt(dst, src, n);
  else
    memcpy(dst, src, n);
}

static double now(void) {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *slots_worker(void *arg) {
  long w = (long)arg;
  CK(cuCtxSetCurrent(ctx));
  void *slot[2];
  CUstream s[2];
  for (int k = 0; k < 2; k++) {
    CK(cuMemHostAlloc(&slot[k], SLOT, 0));
    CK(cuStreamCreate(&s[k], CU_STREAM_NON_BLOCKING));
  }
  size_t queued[2] = {(size_t)-1, (size_t)-1}, qlen[2] = {0, 0};
  int k = 0;
  for (size_t off = w * SLOT; off < total; off += THREADS * SLOT, k ^= 1) {
    size_t len = total - off < SLOT ? total - off : SLOT;
    if (queued[k] != (size_t)-1) {
      CK(cuStreamSynchronize(s[k]));
      if (to_host) copy(host + queued[k], (char *)slot[k], qlen[k]);
      queued[k] = (size_t)-1;
    }
    if (to_host) {
      CK(cuMemcpyDtoHAsync(slot[k], dev + off, len, s[k]));
    } else {
      copy((char *)slot[k], host + off, len);
      CK(cuMemcpyHtoDAsync(dev + off, slot[k], len, s[k]));
    }
    queued[k] = off;
    qlen[k] = len;
  }
  for (int j = 0; j < 2; j++) {
    CK(cuStreamSynchronize(s[j]));
    if (to_host && queued[j] != (size_t)-1) copy(host + queued[j], (char *)slot[j], qlen[j]);
    CK(cuMemFreeHost(slot[j]));
    CK(cuStreamDestroy(s[j]));
  }
  return NULL;
}

static void *register_worker(void *arg) {
  long w = (long)arg;
  CK(cuCtxSetCurrent(ctx));
  CUstream s;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  for (size_t off = w * PIECE; off < total; off += THREADS * PIECE) {
    size_t len = total - off < PIECE ? total - off : PIECE;
    CK(cuMemHostRegister(host + off, len, 0));
    if (to_host)
      CK(cuMemcpyDtoHAsync(host + off, dev + off, len, s));
    else
      CK(cuMemcpyHtoDAsync(dev + off, host + off, len, s));
  }
  CK(cuStreamSynchronize(s));
  for (size_t off = w * PIECE; off < total; off += THREADS * PIECE)
    CK(cuMemHostUnregister(host + off));
  CK(cuStreamDestroy(s));
  return NULL;
}

static double run(int way_to_host, int reg) {
  to_host = way_to_host;
  pthread_t t[THREADS];
  double t0 = now();
  for (long i = 0; i < THREADS; i++)
    pthread_create(&t[i], NULL, reg ? register_worker : slots_worker, (void *)i);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  return total / (now() - t0) / 1e9;
}

static char *fresh(void) {
  char *p = (char *)mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) exit(1);
  madvise(p, total, MADV_HUGEPAGE);
  return p;
}

int main(int argc, char **argv) {
  total = (size_t)(atof(argc > 1 ? argv[1] : "16") * (1ul << 30));
  int rounds = argc > 2 ? atoi(argv[2]) : 2;
  if (argc > 3) SLOT = (size_t)atol(argv[3]) << 20;
  CUdevice d;
  CK(cuInit(0));
  CK(cuDeviceGet(&d, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, d));
  CK(cuCtxSetCurrent(ctx));
  CK(cuMemAlloc(&dev, total));
  CK(cuMemsetD8(dev, 7, total));
  CK(cuCtxSynchronize());
  for (int r = 0; r < rounds; r++) {
    // The ceiling: a pinned buffer (pinning timed apart) and one copy each way.
    double p0 = now();
    void *pinned;
    CK(cuMemHostAlloc(&pinned, total, 0));
    double p1 = now();
    CK(cuMemcpyDtoH(pinned, dev, total));
    double p2 = now();
    CK(cuMemcpyHtoD(dev, pinned, total));
    double p3 = now();
    CK(cuMemFreeHost(pinned));
    printf("round %d pinned: pin %.2f s, d2h %.1f GB/s, h2d %.1f GB/s\n", r, p1 - p0,
           total / (p2 - p1) / 1e9, total / (p3 - p2) / 1e9);
    for (int mode = 0; mode < 3; mode++) {
      int reg = mode == 2;
      streaming = mode == 1;
      host = fresh();
      double a = run(1, reg), b = run(1, reg), c = run(0, reg);
      munmap(host, total);
      printf("round %d %-9s: to host fresh %.1f GB/s, again %.1f GB/s, to device %.1f GB/s\n", r,
             mode == 0 ? "slots" : mode == 1 ? "slots-nt" : "register", a, b, c);
      fflush(stdout);
    }
  }
  return 0;
}
