// A program linked against the driver that finds it only through its own RUNPATH (tests/preload.rs:
// the_driver_the_program_found_through_its_rpath_is_the_one_cudapool_uses): cudapool, preloaded,
// cannot open libcuda.so.1 by name and must use the one the program loaded.
#include <stdio.h>

#include "cuda_min.h"

int main(void) {
  CUdevice d;
  CUcontext c;
  CUdeviceptr p;
  CUresult r = cuInit(0);
  if (!r) r = cuDeviceGet(&d, 0);
  if (!r) r = cuDevicePrimaryCtxRetain(&c, d);
  if (!r) r = cuCtxSetCurrent(c);
  if (!r) r = cuMemAlloc(&p, 1 << 20);
  printf("rpath rc=%d\n", r);
  return r;
}
