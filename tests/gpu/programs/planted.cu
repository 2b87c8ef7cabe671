// Planted memory errors for compute-sanitizer (issue 12): each mode makes one mistake on a
// cudaMalloc'd block that has pooled neighbours, so that under a caching pool the bad access
// lands inside memory the driver sees as allocated. Prints "done MODE" and exits 0 whatever the
// sanitizer finds; `compute-sanitizer --tool memcheck` must report the mistake.
//   oob     a kernel writes 100 ints (400 bytes) past a 4000-byte block
//   uaf     a kernel writes through a pointer after cudaFree
//   double  cudaFree twice
//   clean   the same traffic without mistakes (0 errors expected)
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

__global__ void fill(int *p, int n, int v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "clean";
  int *before = nullptr, *a = nullptr, *after = nullptr;
  cudaMalloc(&before, 4000);
  cudaMalloc(&a, 4000);
  cudaMalloc(&after, 4000);
  fill<<<4, 256>>>(before, 1000, 1);
  fill<<<4, 256>>>(after, 1000, 3);
  if (!strcmp(mode, "oob")) {
    fill<<<5, 256>>>(a, 1100, 2);  // 1000 ints are the block's
  } else {
    fill<<<4, 256>>>(a, 1000, 2);
  }
  cudaDeviceSynchronize();
  if (!strcmp(mode, "uaf")) {
    cudaFree(a);
    fill<<<4, 256>>>(a, 1000, 4);  // after its free
    cudaDeviceSynchronize();
  } else if (!strcmp(mode, "double")) {
    cudaFree(a);
    cudaError_t e = cudaFree(a);
    printf("second cudaFree: %s\n", cudaGetErrorName(e));
  } else {
    cudaFree(a);
  }
  cudaFree(before);
  cudaFree(after);
  printf("done %s\n", mode);
  return 0;
}
