// The few driver declarations the test clients need, spelled as cuda.h spells them (the
// public names map to the _v2 symbols), so the clients build without a CUDA toolkit.
#pragma once
#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_INVALID_CONTEXT 201

#define cuCtxCreate cuCtxCreate_v2
#define cuCtxDestroy cuCtxDestroy_v2
#define cuCtxPushCurrent cuCtxPushCurrent_v2
#define cuCtxPopCurrent cuCtxPopCurrent_v2
#define cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2
#define cuDevicePrimaryCtxReset cuDevicePrimaryCtxReset_v2
#define cuMemAlloc cuMemAlloc_v2
#define cuMemFree cuMemFree_v2
#define cuMemAllocPitch cuMemAllocPitch_v2
#define cuMemGetInfo cuMemGetInfo_v2
#define cuMemGetAddressRange cuMemGetAddressRange_v2
#define cuMemsetD8 cuMemsetD8_v2
#define cuMemcpyHtoD cuMemcpyHtoD_v2
#define cuMemcpyDtoH cuMemcpyDtoH_v2
#define cuStreamDestroy cuStreamDestroy_v2
#define cuStreamBeginCapture cuStreamBeginCapture_v2

CUresult cuInit(unsigned flags);
CUresult cuDeviceGet(CUdevice *dev, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);
CUresult cuCtxCreate(CUcontext *ctx, unsigned flags, CUdevice dev);
CUresult cuCtxDestroy(CUcontext ctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxPushCurrent(CUcontext ctx);
CUresult cuCtxPopCurrent(CUcontext *ctx);
CUresult cuMemAlloc(CUdeviceptr *p, size_t size);
CUresult cuMemFree(CUdeviceptr p);
CUresult cuMemAllocPitch(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned elem);
CUresult cuMemGetInfo(size_t *free_bytes, size_t *total_bytes);
CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr p);
CUresult cuMemsetD8(CUdeviceptr p, unsigned char v, size_t n);
CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n);
CUresult cuStreamCreate(void **stream, unsigned flags);
CUresult cuStreamDestroy(void *stream);
CUresult cuStreamBeginCapture(void *stream, int mode);
CUresult cuStreamEndCapture(void *stream, void **graph);
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shmem, void *stream, void **params, void **extra);
CUresult cuLaunchHostFunc(void *stream, void (*fn)(void *), void *data);
CUresult cuStreamAddCallback(void *stream, void (*cb)(void *, CUresult, void *), void *data,
                             unsigned flags);
// The legacy 32-bit entry points, bound to their real symbol names.
CUresult cuMemAlloc_v1(unsigned *p, unsigned size) __asm__("cuMemAlloc");
CUresult cuMemFree_v1(unsigned p) __asm__("cuMemFree");
