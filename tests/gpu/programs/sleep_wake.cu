// Sleep and wake on a GPU: a program fills GIB GiB in blocks of BLOCK MiB (plus small blocks
// and a graph captured before the sleep), puts itself to sleep through the C API, says
// "asleep" and waits HOLD seconds (the caller reads nvidia-smi meanwhile), is woken by a kernel
// launch, and checks every byte; then the same again woken by the API. Beside it, in the same
// run: pinning that many bytes of host memory and a pinned copy of them each way (the
// bandwidth the sleep is measured against). Then CYCLES sleep/wake cycles of a small set, with
// the process's resident host memory after the first, the middle and the last, and once more
// asleep after them (the caller reads nvidia-smi again).
//
//   sleep_wake GIB BLOCK_MIB HOLD_S CYCLES
// Prints key=value lines; exit 0 when every check held.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#define CK(x)                                                                             \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "%s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);       \
      exit(3);                                                                            \
    }                                                                                     \
  } while (0)

__global__ void fill(uint32_t *p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = seed ^ (uint32_t)(i * 2654435761u);
}

__global__ void check(const uint32_t *p, size_t n, uint32_t seed, unsigned long long *bad) {
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    mine += p[i] != (seed ^ (uint32_t)(i * 2654435761u));
  if (mine) atomicAdd(bad, mine);
}

__global__ void bump(uint32_t *p) { p[0] += 1; }

static double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static long rss_kib() {
  long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f && fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  if (f) fclose(f);
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

struct Block {
  uint32_t *p;
  size_t bytes;
  uint32_t seed;
};

static unsigned long long *bad;

static unsigned long long check_all(std::vector<Block> &blocks) {
  CK(cudaMemset(bad, 0, sizeof *bad));
  for (auto &b : blocks) check<<<1024, 256>>>(b.p, b.bytes / 4, b.seed, bad);
  unsigned long long h = 0;
  CK(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
  return h;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s GIB BLOCK_MIB HOLD_S CYCLES\n", argv[0]);
    return 2;
  }
  double gib = atof(argv[1]);
  size_t block = (size_t)atol(argv[2]) << 20;
  int hold = atoi(argv[3]), cycles = atoi(argv[4]);
  auto sleep_fn = (int (*)(int))dlsym(RTLD_DEFAULT, "cudapool_sleep");
  auto wake_fn = (int (*)(int))dlsym(RTLD_DEFAULT, "cudapool_wake");
  if (!sleep_fn || !wake_fn) {
    fprintf(stderr, "cudapool is not loaded\n");
    return 4;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  CK(cudaMalloc(&bad, sizeof *bad));
  std::vector<Block> blocks;
  size_t total = (size_t)(gib * (1 << 30));
  for (size_t got = 0; got < total; got += block) {
    Block b{nullptr, block, (uint32_t)blocks.size() * 7919u + 1};
    CK(cudaMalloc(&b.p, b.bytes));
    blocks.push_back(b);
  }
  for (int i = 0; i < 64; i++) { // small blocks too (classic segments: they stay)
    Block b{nullptr, 4096, 100000u + i};
    CK(cudaMalloc(&b.p, b.bytes));
    blocks.push_back(b);
  }
  for (auto &b : blocks) fill<<<1024, 256>>>(b.p, b.bytes / 4, b.seed);
  void *cached;
  CK(cudaMalloc(&cached, (size_t)1 << 30)); // a cached GiB: dropped by the sleep, not copied
  CK(cudaFree(cached));
  // A graph captured before the sleep, replayed after the wake.
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  bump<<<1, 1, 0, s>>>(blocks[0].p);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaDeviceSynchronize());
  printf("filled pid=%d blocks=%zu live_gib=%.2f\n", (int)getpid(), blocks.size(),
         total / 1073741824.0);
  sleep(hold); // nvidia-smi is read meanwhile: the footprint awake

  int ok = 1;
  for (int round = 0; round < 2; round++) {
    double t0 = now();
    int r = sleep_fn(-1);
    double t1 = now();
    printf("asleep round=%d rc=%d sleep_s=%.3f sleep_gbs=%.2f\n", round, r, t1 - t0,
           total / (t1 - t0) / 1e9);
    fflush(stdout);
    if (round == 0) sleep(hold); // nvidia-smi is read meanwhile
    double t2 = now();
    if (round == 0) {
      bump<<<1, 1>>>(blocks[1].p); // the launch wakes it
      CK(cudaDeviceSynchronize());
    } else {
      r = wake_fn(-1);
    }
    double t3 = now();
    if (round == 0) { // undo the bump on block 1 so that the check holds
      uint32_t v;
      CK(cudaMemcpy(&v, blocks[1].p, 4, cudaMemcpyDeviceToHost));
      v -= 1;
      CK(cudaMemcpy(blocks[1].p, &v, 4, cudaMemcpyHostToDevice));
    }
    unsigned long long wrong = check_all(blocks);
    printf("woken round=%d by=%s wake_s=%.3f wake_gbs=%.2f wrong=%llu\n", round,
           round == 0 ? "launch" : "api", t3 - t2, total / (t3 - t2) / 1e9, wrong);
    ok &= wrong == 0 && r == 0;
  }
  // The graph captured before the sleeps replays into the woken memory.
  uint32_t before, after;
  CK(cudaMemcpy(&before, blocks[0].p, 4, cudaMemcpyDeviceToHost));
  CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(&after, blocks[0].p, 4, cudaMemcpyDeviceToHost));
  printf("graph replay=%d\n", after == before + 1);
  ok &= after == before + 1;
  after -= 1; // as filled again, for the checks below
  CK(cudaMemcpy(blocks[0].p, &after, 4, cudaMemcpyHostToDevice));

  // The baseline: pin the same bytes and copy them each way.
  double p0 = now();
  char *pinned;
  CK(cudaMallocHost(&pinned, total));
  double p1 = now();
  for (size_t off = 0, i = 0; off < total; off += block, i++)
    CK(cudaMemcpy(pinned + off, blocks[i].p, block, cudaMemcpyDeviceToHost));
  double p2 = now();
  for (size_t off = 0, i = 0; off < total; off += block, i++)
    CK(cudaMemcpy(blocks[i].p, pinned + off, block, cudaMemcpyHostToDevice));
  double p3 = now();
  CK(cudaFreeHost(pinned));
  printf("pinned pin_s=%.3f d2h_gbs=%.2f h2d_gbs=%.2f\n", p1 - p0, total / (p2 - p1) / 1e9,
         total / (p3 - p2) / 1e9);

  // Many cycles of a small set: host memory stays flat, nothing is lost.
  for (size_t i = 1; i < blocks.size() - 64; i++) CK(cudaFree(blocks[i].p));
  blocks.erase(blocks.begin() + 1, blocks.end() - 64);
  // The first cycle leaves the host copies the next ones reuse: host memory is read after it.
  long rss0 = 0, rss_mid = 0;
  double c0 = now();
  for (int c = 0; c < cycles; c++) {
    if (sleep_fn(-1) != 0 || wake_fn(-1) != 0) {
      printf("cycle %d failed\n", c);
      ok = 0;
      break;
    }
    if (c == 0) rss0 = rss_kib();
    if (c == cycles / 2) rss_mid = rss_kib();
  }
  double c1 = now();
  unsigned long long wrong = check_all(blocks);
  long rss1 = rss_kib();
  printf("cycles n=%d each_ms=%.2f wrong=%llu rss_first_kib=%ld rss_mid_kib=%ld rss_last_kib=%ld\n",
         cycles, cycles ? (c1 - c0) * 1e3 / cycles : 0.0, wrong, rss0, rss_mid, rss1);
  ok &= wrong == 0 && rss1 < rss0 + 64 * 1024;
  // Asleep once more after the cycles: the caller reads nvidia-smi meanwhile.
  int r = sleep_fn(-1);
  printf("asleep_after_cycles rc=%d\n", r);
  fflush(stdout);
  sleep(hold);
  r |= wake_fn(-1);
  wrong = check_all(blocks);
  printf("woken_after_cycles rc=%d wrong=%llu\n", r, wrong);
  ok &= r == 0 && wrong == 0;
  printf("sleep_wake %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
