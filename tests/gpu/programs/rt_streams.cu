// Which entry points carry a runtime program's work (issue 11): kernels with <<<>>> on the
// legacy stream and on a created stream, an async copy and a memset on it. Run it under
// a tracer of the driver entry points (the survey of issue 11: docs/gpu/work-survey-h100.txt),
// built with the static and with the shared runtime.
#include <cstdio>
__global__ void fill(int *p, int v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}
int main() {
  const int n = 1 << 20;
  int *a, *b;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaMalloc(&a, n * sizeof(int));
  cudaMalloc(&b, n * sizeof(int));
  fill<<<n / 256, 256>>>(a, 1, n);
  fill<<<n / 256, 256, 0, s>>>(b, 2, n);
  cudaMemcpyAsync(a, b, n * sizeof(int), cudaMemcpyDeviceToDevice, s);
  cudaMemsetAsync(b, 0, n * sizeof(int), s);
  int v = 3;
  void *args[] = {&a, &v, (void *)&n};
  cudaLaunchKernel((void *)fill, dim3(n / 256), dim3(256), args, 0, s);
  cudaStreamSynchronize(s);
  int h = 0;
  cudaMemcpy(&h, a, sizeof(int), cudaMemcpyDeviceToHost);
  printf("rt_streams: a[0]=%d (3 expected)\n", h);
  return h == 3 ? 0 : 1;
}
