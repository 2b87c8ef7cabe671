// Tries to take more device memory than the limit through one allocation API (issue 6).
//
// usage: limit_apis API [CHUNK_MIB] [MAX_CHUNKS]
//   API: idle (context only) | malloc | async | frompool | managed | pitch | vmm | array | mipmap
// Takes CHUNK_MIB (default 128) at a time until the API refuses, makes every chunk resident
// (writes it), holds the memory 1.5 s so that nvidia-smi sees it from outside, then gives it
// all back. Prints: api=NAME granted_mib=N error=NAME (the first refusal).
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      printf("limit_apis: %s -> %s (line %d)\n", #x, cudaGetErrorName(e_), __LINE__); \
      return 1;                                                                \
    }                                                                          \
  } while (0)

static const char *drv_name(CUresult r) {
  const char *s = "?";
  cuGetErrorName(r, &s);
  return s;
}

int main(int argc, char **argv) {
  const char *api = argc > 1 ? argv[1] : "idle";
  size_t chunk = (size_t)(argc > 2 ? atoi(argv[2]) : 128) << 20;
  int max_chunks = argc > 3 ? atoi(argv[3]) : 64;
  CK(cudaFree(0));
  cudaStream_t s = 0;
  cudaMemPool_t pool = nullptr;
  if (!strcmp(api, "frompool")) {
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    CK(cudaMemPoolCreate(&pool, &props));
    unsigned long long keep = ~0ull; // keep what is freed: the pool's reserve must count
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;

  struct Held {
    void *p;
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    cudaArray_t arr;
    cudaMipmappedArray_t mip;
  };
  std::vector<Held> held;
  const char *error = "none";
  for (int i = 0; strcmp(api, "idle") && i < max_chunks; i++) {
    Held h = {};
    cudaError_t e = cudaSuccess;
    if (!strcmp(api, "malloc")) {
      e = cudaMalloc(&h.p, chunk);
    } else if (!strcmp(api, "async")) {
      e = cudaMallocAsync(&h.p, chunk, s);
    } else if (!strcmp(api, "frompool")) {
      e = cudaMallocFromPoolAsync(&h.p, chunk, pool, s);
    } else if (!strcmp(api, "managed")) {
      e = cudaMallocManaged(&h.p, chunk);
    } else if (!strcmp(api, "pitch")) {
      size_t pitch;
      e = cudaMallocPitch(&h.p, &pitch, 8192, chunk / 8192);
    } else if (!strcmp(api, "vmm")) {
      CUresult r = cuMemCreate(&h.h, chunk, &prop, 0);
      if (r == CUDA_SUCCESS) {
        cuMemAddressReserve(&h.va, chunk, 0, 0, 0);
        cuMemMap(h.va, chunk, 0, h.h, 0);
        CUmemAccessDesc acc = {};
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        cuMemSetAccess(h.va, chunk, &acc, 1);
        h.p = (void *)h.va;
      } else {
        error = drv_name(r);
        break;
      }
    } else if (!strcmp(api, "array")) {
      cudaChannelFormatDesc d = cudaCreateChannelDesc<float>();
      e = cudaMalloc3DArray(&h.arr, &d, make_cudaExtent(4096, chunk / (4096 * 4), 0));
    } else if (!strcmp(api, "mipmap")) {
      cudaChannelFormatDesc d = cudaCreateChannelDesc<float>();
      e = cudaMallocMipmappedArray(&h.mip, &d, make_cudaExtent(4096, chunk / (4096 * 4), 0), 1);
    } else {
      printf("limit_apis: unknown api %s\n", api);
      return 2;
    }
    if (e != cudaSuccess) {
      error = cudaGetErrorName(e);
      cudaGetLastError();
      break;
    }
    if (h.p) CK(cudaMemsetAsync(h.p, 1, chunk, s)); // resident, as nvidia-smi counts it
    held.push_back(h);
  }
  CK(cudaDeviceSynchronize());
  printf("api=%s granted_mib=%zu error=%s\n", api, held.size() * (chunk >> 20), error);
  fflush(stdout);
  usleep(1500 * 1000);
  for (auto &h : held) {
    if (!strcmp(api, "async") || !strcmp(api, "frompool")) cudaFreeAsync(h.p, s);
    else if (!strcmp(api, "vmm")) {
      cuMemUnmap(h.va, chunk);
      cuMemAddressFree(h.va, chunk);
      cuMemRelease(h.h);
    } else if (h.arr) cudaFreeArray(h.arr);
    else if (h.mip) cudaFreeMipmappedArray(h.mip);
    else cudaFree(h.p);
  }
  CK(cudaDeviceSynchronize());
  if (pool) CK(cudaMemPoolDestroy(pool));
  return 0;
}
