// What the client's parts share: the driver entry points as the client reached them (linked,
// by dlsym or by cuGetProcAddress), the context, and helpers that read the shim and the fake.
#pragma once
#include <stdio.h>
#include <stdlib.h>

#include "cuda_min.h"

struct api {
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*PrimaryCtxRelease)(CUdevice);
  CUresult (*PrimaryCtxReset)(CUdevice);
  CUresult (*CtxCreate)(CUcontext *, unsigned, CUdevice);
  CUresult (*CtxDestroy)(CUcontext);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*CtxPushCurrent)(CUcontext);
  CUresult (*CtxPopCurrent)(CUcontext *);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
  CUresult (*MemGetInfo)(size_t *, size_t *);
  CUresult (*MemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
  CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
  CUresult (*MemAlloc1)(unsigned *, unsigned);
  CUresult (*MemFree1)(unsigned);
  CUresult (*StreamCreate)(void **, unsigned);
  CUresult (*StreamDestroy)(void *);
  CUresult (*BeginCapture)(void *, int);
  CUresult (*EndCapture)(void *, void **);
  // cuLaunchKernel (its _ptsz variant in gpa-ptsz mode).
  CUresult (*LaunchKernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, void *, void **, void **);
  CUresult (*LaunchHostFunc)(void *, void (*)(void *), void *);
  CUresult (*StreamAddCallback)(void *, void (*)(void *, CUresult, void *), void *, unsigned);
};

extern struct api cu;
extern void *driver;
extern CUdevice dev;
extern CUcontext primary;

#define CHECK(call)                                                              \
  do {                                                                           \
    CUresult r_ = (call);                                                        \
    if (r_ != CUDA_SUCCESS) {                                                    \
      fprintf(stderr, "client: %s failed: %d (line %d)\n", #call, r_, __LINE__); \
      exit(3);                                                                   \
    }                                                                            \
  } while (0)

// The shim's counters for the device (a line "TAG shim=... k=v ..."), or "TAG shim=absent".
void print_stats(const char *tag);
// A function the fake driver exports for tests (exits if absent).
void *fake_fn(const char *name);
// How often the fake driver's entry point `name` was called.
long fake_calls(const char *name);
// The reuse-safety scenarios (reuse.c): the scenario's exit status, or -1 if it is not one.
int reuse_scenario(const char *name, int argc, char **argv);
// The lifetime and fault-injection scenarios (lifetimes.c), the same way.
int lifetime_scenario(const char *name, int argc, char **argv);
// The graph capture scenarios (capture.c), the same way.
int capture_scenario(const char *name, int argc, char **argv);
// The sleep and wake scenarios (sleep.c), the same way.
int sleep_scenario(const char *name, int argc, char **argv);
// A kernel of the fake driver on `s` that runs `us` microseconds of device time and touches
// [p, p + n) (reuse.c).
void touch(void *s, CUdeviceptr p, size_t n, unsigned us);
// The fake's race count, the kernel that holds its stream until finished (reuse.c).
long races(void);
long launch_hold(void *s);
