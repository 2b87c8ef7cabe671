// The NVTX memory API as cudapool uses it (src/nvtx.rs): compiled with NVIDIA's header-only
// NVTX v3 (third_party/nvtx3), whose loader finds the tool a process was started under
// (NVTX_INJECTION64_PATH, set by compute-sanitizer) and does nothing without one.
//
// A pool segment is a sub-allocator heap; each block the program holds is a region in it,
// named; a freed block is no region, so the tool reports accesses to it.
#include <stdint.h>
#include "nvtx3/nvToolsExtMem.h"

static nvtxDomainHandle_t domain;

void cudapool_nvtx_init(void) { domain = nvtxDomainCreateA("cudapool"); }

static nvtxMemVirtualRangeDesc_t range(uint64_t ptr, uint64_t size) {
  nvtxMemVirtualRangeDesc_t r;
  r.size = (size_t)size;
  r.ptr = (const void *)(uintptr_t)ptr;
  return r;
}

// A segment of `size` bytes at `ptr` becomes a heap; NULL when no tool took it.
void *cudapool_nvtx_heap_register(uint64_t ptr, uint64_t size) {
  nvtxMemVirtualRangeDesc_t r = range(ptr, size);
  nvtxMemHeapDesc_t d = {0};
  d.extCompatID = NVTX_EXT_COMPATID_MEM;
  d.structSize = sizeof d;
  d.usage = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
  d.type = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  d.typeSpecificDescSize = sizeof r;
  d.typeSpecificDesc = &r;
  d.messageType = NVTX_MESSAGE_TYPE_ASCII;
  d.message.ascii = "cudapool segment";
  nvtxMemHeapHandle_t h = nvtxMemHeapRegister(domain, &d);
  return h == NVTX_MEM_HEAP_HANDLE_NO_TOOL ? 0 : (void *)h;
}

// The segment goes back to the driver: its heap and every region in it go.
void cudapool_nvtx_heap_unregister(void *heap) {
  nvtxMemHeapUnregister(domain, (nvtxMemHeapHandle_t)heap);
}

// A block the program now holds, named `name` (ASCII, may be NULL).
void cudapool_nvtx_region_register(void *heap, uint64_t ptr, uint64_t size, const char *name) {
  nvtxMemVirtualRangeDesc_t r = range(ptr, size);
  nvtxMemRegionsRegisterBatch_t b = {0};
  b.extCompatID = NVTX_EXT_COMPATID_MEM;
  b.structSize = sizeof b;
  b.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  b.heap = (nvtxMemHeapHandle_t)heap;
  b.regionCount = 1;
  b.regionDescElementSize = sizeof r;
  b.regionDescElements = &r;
  b.regionHandleElementsOut = 0;
  nvtxMemRegionsRegister(domain, &b);
  if (!name) return;
  nvtxMemRegionNameDesc_t n = {0};
  n.regionRefType = NVTX_MEM_REGION_REF_TYPE_POINTER;
  n.nameType = NVTX_MESSAGE_TYPE_ASCII;
  n.region.pointer = r.ptr;
  n.name.ascii = name;
  nvtxMemRegionsNameBatch_t nb = {0};
  nb.extCompatID = NVTX_EXT_COMPATID_MEM;
  nb.structSize = sizeof nb;
  nb.regionCount = 1;
  nb.regionElementSize = sizeof n;
  nb.regionElements = &n;
  nvtxMemRegionsName(domain, &nb);
}

// The program freed the block at `ptr`: it is no region any more.
void cudapool_nvtx_region_unregister(uint64_t ptr) {
  nvtxMemRegionRef_t ref;
  ref.pointer = (const void *)(uintptr_t)ptr;
  nvtxMemRegionsUnregisterBatch_t u = {0};
  u.extCompatID = NVTX_EXT_COMPATID_MEM;
  u.structSize = sizeof u;
  u.refType = NVTX_MEM_REGION_REF_TYPE_POINTER;
  u.refCount = 1;
  u.refElementSize = sizeof ref;
  u.refElements = &ref;
  nvtxMemRegionsUnregister(domain, &u);
}
