// Does the size of the physical handles behind a range change how fast kernels read it? The
// same 4 GiB range is made several ways: cuMemAlloc, one cuMemCreate handle, and handles of
// 2 MiB to 512 MiB mapped side by side (with "mixed", every second handle of two ranges made in
// turn, so that neither range's memory is one physical run). On each, three kernels: random
// 4-byte reads over the whole range (what the GPU's address translation costs most), random
// reads inside a 96 MiB window (an embedding table's lookups), and a streaming copy. Rounds are
// interleaved; prints each layout's median and spread over the rounds, and its ratio to
// cuMemAlloc. Also the host time to map and set access of the whole range, per layout.
//
//   nvcc -O2 -o handle_size benches/gpu/handle_size.cu -lcuda && ./handle_size [rounds]
#include <cuda.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CK(x)                                                                  \
  do {                                                                         \
    CUresult r_ = (x);                                                         \
    if (r_ != CUDA_SUCCESS) {                                                  \
      std::fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #x, r_);   \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

static const size_t MiB = 1 << 20;
static const size_t RANGE = 4096 * MiB;

__device__ __forceinline__ unsigned long long mix(unsigned long long x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// Each thread makes `iters` dependent random reads inside `words` words of `p`.
__global__ void gather(const unsigned *p, size_t words, int iters, unsigned *sink) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  unsigned acc = 0;
  unsigned long long h = i;
  for (int k = 0; k < iters; k++) {
    h = mix(h + acc + k);
    acc += p[h % words];
  }
  if (acc == 0xdeadbeef) *sink = acc;
}

__global__ void copy(const uint4 *src, uint4 *dst, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

struct Layout {
  std::string name;
  CUdeviceptr base = 0;
  size_t handle = 0;  // 0: cuMemAlloc
  double map_ms = 0;
  std::vector<CUmemGenericAllocationHandle> handles;
};

static double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Maps `handle`-sized handles over [base, base + RANGE); with `other`, every second handle
// made goes to `other` instead (two ranges made in turn).
static void map_range(CUdevice dev, Layout &l, Layout *other) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  CUmemAccessDesc acc = {};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  // The range rounded up to whole handles (20 MiB does not divide 4 GiB).
  size_t span = (RANGE + l.handle - 1) / l.handle * l.handle;
  double t0 = now_ms();
  CK(cuMemAddressReserve(&l.base, span, 0, 0, 0));
  if (other) CK(cuMemAddressReserve(&other->base, span, 0, 0, 0));
  for (size_t off = 0; off < span; off += l.handle) {
    for (Layout *t : {&l, other}) {
      if (!t) continue;
      CUmemGenericAllocationHandle h;
      CK(cuMemCreate(&h, l.handle, &prop, 0));
      CK(cuMemMap(t->base + off, l.handle, 0, h, 0));
      t->handles.push_back(h);
    }
  }
  CK(cuMemSetAccess(l.base, span, &acc, 1));
  if (other) CK(cuMemSetAccess(other->base, span, &acc, 1));
  l.map_ms = now_ms() - t0;
  if (other) other->map_ms = l.map_ms;
}

static float time_it(CUstream s, CUevent a, CUevent b, void (*f)(const Layout &, CUstream),
                     const Layout &l) {
  f(l, s);  // warm
  CK(cuEventRecord(a, s));
  f(l, s);
  CK(cuEventRecord(b, s));
  CK(cuEventSynchronize(b));
  float ms;
  CK(cuEventElapsedTime(&ms, a, b));
  return ms;
}

static unsigned *sink;
static CUdeviceptr scratch;

static void far_reads(const Layout &l, CUstream s) {
  gather<<<264 * 8, 256, 0, s>>>((const unsigned *)l.base, RANGE / 4, 64, sink);
}
static void window_reads(const Layout &l, CUstream s) {
  gather<<<264 * 8, 256, 0, s>>>((const unsigned *)(l.base + RANGE / 2), 96 * MiB / 4, 64,
                                 sink);
}
static void stream_copy(const Layout &l, CUstream s) {
  copy<<<264 * 4, 512, 0, s>>>((const uint4 *)l.base, (uint4 *)scratch, 1024 * MiB / 16);
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  char name[256];
  CK(cuDeviceGetName(name, sizeof name, dev));
  CK(cuMemAlloc((CUdeviceptr *)&sink, 4));
  CK(cuMemAlloc(&scratch, 1024 * MiB));

  std::vector<Layout> ls;
  {
    Layout l;
    l.name = "cuMemAlloc";
    double t0 = now_ms();
    CK(cuMemAlloc(&l.base, RANGE));
    l.map_ms = now_ms() - t0;
    ls.push_back(l);
  }
  for (size_t h : {RANGE, 512 * MiB, 64 * MiB, 20 * MiB, 8 * MiB, 2 * MiB}) {
    Layout l;
    l.handle = h;
    l.name = h == RANGE ? "one handle" : "handles of " + std::to_string(h / MiB) + " MiB";
    map_range(dev, l, nullptr);
    ls.push_back(l);
  }
  for (size_t h : {20 * MiB, 2 * MiB}) {
    Layout l, other;
    l.handle = other.handle = h;
    l.name = "mixed, " + std::to_string(h / MiB) + " MiB";
    map_range(dev, l, &other);
    ls.push_back(l);
    // `other` stays mapped: its memory is what makes `l` physically scattered.
  }
  for (auto &l : ls) CK(cuMemsetD32(l.base, 1, RANGE / 4));
  CK(cuCtxSynchronize());

  CUstream s;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUevent a, b;
  CK(cuEventCreate(&a, 0));
  CK(cuEventCreate(&b, 0));
  struct K {
    const char *name;
    void (*f)(const Layout &, CUstream);
  } ks[] = {{"far reads", far_reads}, {"window reads", window_reads}, {"copy", stream_copy}};
  // times[layout][kernel][round]
  std::vector<std::vector<std::vector<float>>> t(ls.size(),
                                                 std::vector<std::vector<float>>(3));
  for (int r = 0; r < rounds; r++)
    for (size_t i = 0; i < ls.size(); i++) {
      size_t li = (i + r) % ls.size();  // a different order each round
      for (int k = 0; k < 3; k++) t[li][k].push_back(time_it(s, a, b, ks[k].f, ls[li]));
    }
  std::printf("%s, %d rounds; kernel time in ms, median [min-max], and the median's ratio to "
              "cuMemAlloc's\n",
              name, rounds);
  std::printf("%-20s %10s", "layout", "map ms");
  for (auto &k : ks) std::printf(" | %-26s", k.name);
  std::printf("\n");
  std::vector<float> base(3);
  for (size_t i = 0; i < ls.size(); i++) {
    std::printf("%-20s %10.1f", ls[i].name.c_str(), ls[i].map_ms);
    for (int k = 0; k < 3; k++) {
      auto v = t[i][k];
      std::sort(v.begin(), v.end());
      float med = v[v.size() / 2];
      if (i == 0) base[k] = med;
      std::printf(" | %7.3f [%6.3f-%6.3f] %5.3f", med, v.front(), v.back(), med / base[k]);
    }
    std::printf("\n");
  }
  return 0;
}
