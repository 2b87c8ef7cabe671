// Part of the fake driver (tests/fake/libcuda.c includes it; not compiled on its own): cuGetProcAddress and its table.

// ---- cuGetProcAddress ------------------------------------------------------------------
// One row per variant: base name, the first cudaVersion that gets it, whether it is the
// per-thread-default-stream variant. The real driver's rules: the newest variant whose
// version is <= the caller's; with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (2), the
// _ptds/_ptsz variant where one exists.
CUresult cuGetProcAddress(const char *, void **, int, unsigned long long);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

struct proc {
  const char *base;
  int version;
  int ptds;
  void *fn;
};

static const struct proc procs[] = {
    {"cuInit", 2000, 0, (void *)cuInit},
    {"cuDriverGetVersion", 2020, 0, (void *)cuDriverGetVersion},
    {"cuDeviceGet", 2000, 0, (void *)cuDeviceGet},
    {"cuDeviceGetCount", 2000, 0, (void *)cuDeviceGetCount},
    {"cuDeviceTotalMem", 3020, 0, (void *)cuDeviceTotalMem_v2},
    {"cuDeviceGetUuid", 9020, 0, (void *)cuDeviceGetUuid},
    {"cuDeviceGetUuid", 11040, 0, (void *)cuDeviceGetUuid_v2},
    {"cuCtxCreate", 3020, 0, (void *)cuCtxCreate_v2},
    {"cuCtxDestroy", 2000, 0, (void *)cuCtxDestroy},
    {"cuCtxDestroy", 4000, 0, (void *)cuCtxDestroy_v2},
    {"cuCtxSetCurrent", 4000, 0, (void *)cuCtxSetCurrent},
    {"cuCtxGetCurrent", 4000, 0, (void *)cuCtxGetCurrent},
    {"cuCtxGetDevice", 2000, 0, (void *)cuCtxGetDevice},
    {"cuDevicePrimaryCtxRetain", 7000, 0, (void *)cuDevicePrimaryCtxRetain},
    {"cuDevicePrimaryCtxRelease", 7000, 0, (void *)cuDevicePrimaryCtxRelease},
    {"cuDevicePrimaryCtxRelease", 11000, 0, (void *)cuDevicePrimaryCtxRelease_v2},
    {"cuDevicePrimaryCtxReset", 7000, 0, (void *)cuDevicePrimaryCtxReset},
    {"cuDevicePrimaryCtxReset", 11000, 0, (void *)cuDevicePrimaryCtxReset_v2},
    {"cuDevicePrimaryCtxGetState", 7000, 0, (void *)cuDevicePrimaryCtxGetState},
    {"cuMemAlloc", 2000, 0, (void *)cuMemAlloc},
    {"cuMemAlloc", 3020, 0, (void *)cuMemAlloc_v2},
    {"cuMemFree", 2000, 0, (void *)cuMemFree},
    {"cuMemFree", 3020, 0, (void *)cuMemFree_v2},
    {"cuMemAllocPitch", 2000, 0, (void *)cuMemAllocPitch},
    {"cuMemAllocPitch", 3020, 0, (void *)cuMemAllocPitch_v2},
    {"cuDeviceGetAttribute", 2000, 0, (void *)cuDeviceGetAttribute},
    {"cuCtxGetLimit", 3010, 0, (void *)cuCtxGetLimit},
    {"cuCtxSetLimit", 3010, 0, (void *)cuCtxSetLimit},
    {"cuModuleLoadData", 2000, 0, (void *)cuModuleLoadData},
    {"cuModuleLoadDataEx", 2010, 0, (void *)cuModuleLoadDataEx},
    {"cuModuleUnload", 2000, 0, (void *)cuModuleUnload},
    {"cuLibraryLoadData", 12000, 0, (void *)cuLibraryLoadData},
    {"cuLibraryUnload", 12000, 0, (void *)cuLibraryUnload},
    {"cuMemGetInfo", 2000, 0, (void *)cuMemGetInfo},
    {"cuMemGetInfo", 3020, 0, (void *)cuMemGetInfo_v2},
    {"cuMemGetAddressRange", 2000, 0, (void *)cuMemGetAddressRange},
    {"cuMemGetAddressRange", 3020, 0, (void *)cuMemGetAddressRange_v2},
    {"cuMemsetD8", 3020, 0, (void *)cuMemsetD8_v2},
    {"cuMemsetD8", 7000, 1, (void *)cuMemsetD8_v2_ptds},
    {"cuMemsetD32", 3020, 0, (void *)cuMemsetD32_v2},
    {"cuMemsetD8Async", 3020, 0, (void *)cuMemsetD8Async},
    {"cuMemsetD8Async", 7000, 1, (void *)cuMemsetD8Async_ptsz},
    {"cuMemsetD32Async", 3020, 0, (void *)cuMemsetD32Async},
    {"cuMemcpyDtoDAsync", 3020, 0, (void *)cuMemcpyDtoDAsync_v2},
    {"cuLaunchKernel", 4000, 0, (void *)cuLaunchKernel},
    {"cuLaunchKernel", 7000, 1, (void *)cuLaunchKernel_ptsz},
    {"cuStreamQuery", 2000, 0, (void *)cuStreamQuery},
    {"cuCtxSynchronize", 2000, 0, (void *)cuCtxSynchronize},
    {"cuStreamCreate", 2000, 0, (void *)cuStreamCreate},
    {"cuStreamCreateWithPriority", 5050, 0, (void *)cuStreamCreateWithPriority},
    {"cuStreamDestroy", 2000, 0, (void *)cuStreamDestroy},
    {"cuStreamDestroy", 4000, 0, (void *)cuStreamDestroy_v2},
    {"cuStreamGetCtx", 9020, 0, (void *)cuStreamGetCtx},
    {"cuStreamBeginCapture", 10010, 0, (void *)cuStreamBeginCapture_v2},
    {"cuStreamBeginCapture", 10010, 1, (void *)cuStreamBeginCapture_v2_ptsz},
    {"cuStreamEndCapture", 10000, 0, (void *)cuStreamEndCapture},
    {"cuStreamEndCapture", 10000, 1, (void *)cuStreamEndCapture_ptsz},
    {"cuStreamIsCapturing", 10000, 0, (void *)cuStreamIsCapturing},
    {"cuThreadExchangeStreamCaptureMode", 10010, 0, (void *)cuThreadExchangeStreamCaptureMode},
    {"cuEventCreate", 2000, 0, (void *)cuEventCreate},
    {"cuEventRecord", 2000, 0, (void *)cuEventRecord},
    {"cuEventRecord", 7000, 1, (void *)cuEventRecord_ptsz},
    {"cuEventQuery", 2000, 0, (void *)cuEventQuery},
    {"cuStreamWaitEvent", 3020, 0, (void *)cuStreamWaitEvent},
    {"cuStreamWaitEvent", 7000, 1, (void *)cuStreamWaitEvent_ptsz},
    {"cuEventSynchronize", 2000, 0, (void *)cuEventSynchronize},
    {"cuEventDestroy", 4000, 0, (void *)cuEventDestroy_v2},
    {"cuCtxPushCurrent", 4000, 0, (void *)cuCtxPushCurrent_v2},
    {"cuCtxPopCurrent", 4000, 0, (void *)cuCtxPopCurrent_v2},
    {"cuMemcpyHtoD", 3020, 0, (void *)cuMemcpyHtoD_v2},
    {"cuMemcpyDtoH", 3020, 0, (void *)cuMemcpyDtoH_v2},
    {"cuMemAllocAsync", 11020, 0, (void *)cuMemAllocAsync},
    {"cuMemAllocAsync", 11020, 1, (void *)cuMemAllocAsync_ptsz},
    {"cuMemFreeAsync", 11020, 0, (void *)cuMemFreeAsync},
    {"cuMemFreeAsync", 11020, 1, (void *)cuMemFreeAsync_ptsz},
    {"cuMemAllocFromPoolAsync", 11020, 0, (void *)cuMemAllocFromPoolAsync},
    {"cuMemAllocFromPoolAsync", 11020, 1, (void *)cuMemAllocFromPoolAsync_ptsz},
    {"cuMemPoolCreate", 11020, 0, (void *)cuMemPoolCreate},
    {"cuMemPoolDestroy", 11020, 0, (void *)cuMemPoolDestroy},
    {"cuMemPoolTrimTo", 11020, 0, (void *)cuMemPoolTrimTo},
    {"cuMemPoolGetAttribute", 11020, 0, (void *)cuMemPoolGetAttribute},
    {"cuMemPoolSetAttribute", 11020, 0, (void *)cuMemPoolSetAttribute},
    {"cuDeviceGetDefaultMemPool", 11020, 0, (void *)cuDeviceGetDefaultMemPool},
    {"cuStreamSynchronize", 2000, 0, (void *)cuStreamSynchronize},
    {"cuLaunchHostFunc", 10000, 0, (void *)cuLaunchHostFunc},
    {"cuStreamAddCallback", 5000, 0, (void *)cuStreamAddCallback},
    {"cuStreamBeginCaptureToGraph", 12030, 0, (void *)cuStreamBeginCaptureToGraph},
    {"cuMemAllocManaged", 6000, 0, (void *)cuMemAllocManaged},
    {"cuMemHostAlloc", 2020, 0, (void *)cuMemHostAlloc},
    {"cuMemFreeHost", 2000, 0, (void *)cuMemFreeHost},
    {"cuMemHostGetDevicePointer", 3020, 0, (void *)cuMemHostGetDevicePointer_v2},
    {"cuPointerGetAttribute", 4000, 0, (void *)cuPointerGetAttribute},
    {"cuPointerGetAttributes", 7000, 0, (void *)cuPointerGetAttributes},
    {"cuIpcGetMemHandle", 4010, 0, (void *)cuIpcGetMemHandle},
    {"cuIpcOpenMemHandle", 11000, 0, (void *)cuIpcOpenMemHandle_v2},
    {"cuIpcCloseMemHandle", 4010, 0, (void *)cuIpcCloseMemHandle},
    {"cuMemCreate", 10020, 0, (void *)cuMemCreate},
    {"cuMemRelease", 10020, 0, (void *)cuMemRelease},
    {"cuMemAddressReserve", 10020, 0, (void *)cuMemAddressReserve},
    {"cuMemAddressFree", 10020, 0, (void *)cuMemAddressFree},
    {"cuMemMap", 10020, 0, (void *)cuMemMap},
    {"cuMemUnmap", 10020, 0, (void *)cuMemUnmap},
    {"cuMemSetAccess", 10020, 0, (void *)cuMemSetAccess},
    {"cuMemGetAccess", 10020, 0, (void *)cuMemGetAccess},
    {"cuMemRetainAllocationHandle", 11000, 0, (void *)cuMemRetainAllocationHandle},
    {"cuMemExportToShareableHandle", 10020, 0, (void *)cuMemExportToShareableHandle},
    {"cuMemImportFromShareableHandle", 10020, 0, (void *)cuMemImportFromShareableHandle},
    {"cuMemGetAllocationPropertiesFromHandle", 10020, 0, (void *)cuMemGetAllocationPropertiesFromHandle},
    {"cuArrayCreate", 2000, 0, (void *)cuArrayCreate},
    {"cuArrayCreate", 3020, 0, (void *)cuArrayCreate_v2},
    {"cuArray3DCreate", 2000, 0, (void *)cuArray3DCreate},
    {"cuArray3DCreate", 3020, 0, (void *)cuArray3DCreate_v2},
    {"cuMipmappedArrayCreate", 5000, 0, (void *)cuMipmappedArrayCreate},
    {"cuArrayDestroy", 2000, 0, (void *)cuArrayDestroy},
    {"cuMipmappedArrayDestroy", 5000, 0, (void *)cuMipmappedArrayDestroy},
    {"cuArrayGetMemoryRequirements", 11060, 0, (void *)cuArrayGetMemoryRequirements},
    {"cuMipmappedArrayGetMemoryRequirements", 11060, 0, (void *)cuMipmappedArrayGetMemoryRequirements},
    {"cuGraphCreate", 10000, 0, (void *)cuGraphCreate},
    {"cuGraphDestroy", 10000, 0, (void *)cuGraphDestroy},
    {"cuGraphAddMemAllocNode", 11040, 0, (void *)cuGraphAddMemAllocNode},
    {"cuGraphAddEmptyNode", 10000, 0, (void *)cuGraphAddEmptyNode},
    {"cuGraphGetNodes", 10000, 0, (void *)cuGraphGetNodes},
    {"cuGraphNodeGetType", 10000, 0, (void *)cuGraphNodeGetType},
    {"cuGraphMemAllocNodeGetParams", 11040, 0, (void *)cuGraphMemAllocNodeGetParams},
    {"cuGraphInstantiate", 10000, 0, (void *)cuGraphInstantiate},
    {"cuGraphInstantiate", 11000, 0, (void *)cuGraphInstantiate_v2},
    {"cuGraphInstantiateWithFlags", 11040, 0, (void *)cuGraphInstantiateWithFlags},
    {"cuGraphInstantiateWithParams", 12000, 0, (void *)cuGraphInstantiateWithParams},
    {"cuGraphInstantiateWithParams", 12000, 1, (void *)cuGraphInstantiateWithParams_ptsz},
    {"cuGraphExecDestroy", 10000, 0, (void *)cuGraphExecDestroy},
    {"cuGraphLaunch", 10000, 0, (void *)cuGraphLaunch},
    {"cuGraphLaunch", 10000, 1, (void *)cuGraphLaunch_ptsz},
    {"cuGraphUpload", 11010, 0, (void *)cuGraphUpload},
    {"cuGraphUpload", 11010, 1, (void *)cuGraphUpload_ptsz},
    {"cuDeviceGraphMemTrim", 11040, 0, (void *)cuDeviceGraphMemTrim},
    {"cuDeviceGetGraphMemAttribute", 11040, 0, (void *)cuDeviceGetGraphMemAttribute},
    {"cuGetProcAddress", 11030, 0, (void *)cuGetProcAddress},
    {"cuGetProcAddress", 12000, 0, (void *)cuGetProcAddress_v2},
};

// 0 found, 1 no such symbol, 2 version not sufficient (CUdriverProcAddressQueryResult).
static int lookup(const char *sym, void **pfn, int version, unsigned long long flags) {
  const struct proc *best = NULL;
  int known = 0;
  int want_ptds = (flags & 2) != 0;
  for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
    const struct proc *p = &procs[i];
    if (strcmp(p->base, sym)) continue;
    known = 1;
    if (p->version > version) continue;
    if (p->ptds && !want_ptds) continue;
    if (!best || p->ptds > best->ptds || (p->ptds == best->ptds && p->version > best->version))
      best = p;
  }
  *pfn = best ? best->fn : NULL;
  return best ? 0 : known ? 2 : 1;
}

CUresult cuGetProcAddress(const char *sym, void **pfn, int version, unsigned long long flags) {
  count("cuGetProcAddress");
  if (!sym || !pfn) return CUDA_ERROR_INVALID_VALUE;
  return lookup(sym, pfn, version, flags) == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version, unsigned long long flags,
                             int *status) {
  count("cuGetProcAddress_v2");
  if (!sym || !pfn) return CUDA_ERROR_INVALID_VALUE;
  // As the real driver (seen on an H100, driver 580): a missing symbol is CUDA_SUCCESS with a
  // NULL function and the reason in *status.
  int s = lookup(sym, pfn, version, flags);
  if (status) *status = s;
  return status || s == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
