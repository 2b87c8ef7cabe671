// A fake NVTX tool, loaded the way NVTX loads real ones (NVTX_INJECTION64_PATH): it takes the
// memory extension's calls, keeps the heaps and regions they describe, and checks the protocol
// a pool owes a tool like compute-sanitizer:
// - a region lies inside the heap it is registered in, and is registered once;
// - two live regions never overlap;
// - a region is unregistered only while live; a heap is unregistered once, taking its regions.
// Every breach prints "fakenvtx: violation ..." and is counted. Clients ask it questions through
// fakenvtx_region(ptr) and fakenvtx_counts() (dlopen of the same path with RTLD_NOLOAD).
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Types and slot numbers only: the tool takes calls, it makes none.
#define NVTX_NO_IMPL
#include "nvtx3/nvToolsExtMem.h"

#define MAX 4096
struct heap {
  int live;
  uint64_t ptr, size;
};
struct region {
  int live;
  uint64_t ptr, size;
  int heap;
  char name[64];
};
static struct heap heaps[MAX];
static struct region regions[MAX];
static long heap_regs, heap_unregs, region_regs, region_unregs, names, violations;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void violation(const char *what, uint64_t p) {
  violations++;
  fprintf(stderr, "fakenvtx: violation: %s at %#llx\n", what, (unsigned long long)p);
}

static nvtxMemHeapHandle_t heap_register(nvtxDomainHandle_t d, nvtxMemHeapDesc_t const *desc) {
  (void)d;
  const nvtxMemVirtualRangeDesc_t *r = desc->typeSpecificDesc;
  pthread_mutex_lock(&mu);
  int i = 0;
  while (i < MAX && heaps[i].live) i++;
  if (desc->usage != NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR || desc->type != NVTX_MEM_TYPE_VIRTUAL_ADDRESS)
    violation("heap of another usage or type", (uintptr_t)r->ptr);
  for (int j = 0; j < MAX; j++)
    if (heaps[j].live && (uintptr_t)r->ptr < heaps[j].ptr + heaps[j].size &&
        heaps[j].ptr < (uintptr_t)r->ptr + r->size)
      violation("heap overlaps a live heap", (uintptr_t)r->ptr);
  heaps[i] = (struct heap){1, (uintptr_t)r->ptr, r->size};
  heap_regs++;
  pthread_mutex_unlock(&mu);
  return (nvtxMemHeapHandle_t)(uintptr_t)(i + 1);
}

static void heap_unregister(nvtxDomainHandle_t d, nvtxMemHeapHandle_t h) {
  (void)d;
  int i = (int)(uintptr_t)h - 1;
  pthread_mutex_lock(&mu);
  if (i < 0 || i >= MAX || !heaps[i].live) {
    violation("unregister of a heap that is not live", (uintptr_t)h);
  } else {
    heaps[i].live = 0;
    for (int j = 0; j < MAX; j++)
      if (regions[j].live && regions[j].heap == i) regions[j].live = 0;
    heap_unregs++;
  }
  pthread_mutex_unlock(&mu);
}

static void regions_register(nvtxDomainHandle_t d, nvtxMemRegionsRegisterBatch_t const *b) {
  (void)d;
  int h = (int)(uintptr_t)b->heap - 1;
  pthread_mutex_lock(&mu);
  for (size_t k = 0; k < b->regionCount; k++) {
    const nvtxMemVirtualRangeDesc_t *r = (const nvtxMemVirtualRangeDesc_t *)((const char *)b->regionDescElements + k * b->regionDescElementSize);
    uint64_t p = (uintptr_t)r->ptr;
    if (h < 0 || h >= MAX || !heaps[h].live) violation("region in a heap that is not live", p);
    else if (p < heaps[h].ptr || p + r->size > heaps[h].ptr + heaps[h].size)
      violation("region outside its heap", p);
    for (int j = 0; j < MAX; j++)
      if (regions[j].live && p < regions[j].ptr + regions[j].size && regions[j].ptr < p + r->size)
        violation("region overlaps a live region", p);
    int i = 0;
    while (i < MAX && regions[i].live) i++;
    regions[i] = (struct region){1, p, r->size, h, ""};
    region_regs++;
  }
  pthread_mutex_unlock(&mu);
}

static void regions_unregister(nvtxDomainHandle_t d, nvtxMemRegionsUnregisterBatch_t const *b) {
  (void)d;
  pthread_mutex_lock(&mu);
  for (size_t k = 0; k < b->refCount; k++) {
    const nvtxMemRegionRef_t *ref = (const nvtxMemRegionRef_t *)((const char *)b->refElements + k * b->refElementSize);
    uint64_t p = (uintptr_t)ref->pointer;
    int found = 0;
    for (int j = 0; j < MAX && !found; j++)
      if (regions[j].live && regions[j].ptr == p) regions[j].live = 0, found = 1;
    if (!found) violation("unregister of a region that is not live", p);
    else region_unregs++;
  }
  pthread_mutex_unlock(&mu);
}

static void regions_name(nvtxDomainHandle_t d, nvtxMemRegionsNameBatch_t const *b) {
  (void)d;
  pthread_mutex_lock(&mu);
  for (size_t k = 0; k < b->regionCount; k++) {
    const nvtxMemRegionNameDesc_t *n = (const nvtxMemRegionNameDesc_t *)((const char *)b->regionElements + k * b->regionElementSize);
    uint64_t p = (uintptr_t)n->region.pointer;
    int found = 0;
    for (int j = 0; j < MAX && !found; j++)
      if (regions[j].live && regions[j].ptr == p) {
        snprintf(regions[j].name, sizeof regions[j].name, "%s", n->name.ascii);
        found = 1;
      }
    if (!found) violation("name for a region that is not live", p);
    names++;
  }
  pthread_mutex_unlock(&mu);
}

// The size of the live region starting at ptr (0 if none), and its name.
const char *fakenvtx_region(uint64_t ptr, uint64_t *size) {
  const char *name = NULL;
  *size = 0;
  pthread_mutex_lock(&mu);
  for (int j = 0; j < MAX; j++)
    if (regions[j].live && regions[j].ptr == ptr) *size = regions[j].size, name = regions[j].name;
  pthread_mutex_unlock(&mu);
  return name;
}

// live heaps, live regions, and the totals of each call and of violations.
void fakenvtx_counts(long out[8]) {
  pthread_mutex_lock(&mu);
  long lh = 0, lr = 0;
  for (int j = 0; j < MAX; j++) lh += heaps[j].live, lr += regions[j].live;
  long v[8] = {lh, lr, heap_regs, heap_unregs, region_regs, region_unregs, names, violations};
  memcpy(out, v, sizeof v);
  pthread_mutex_unlock(&mu);
}

// NVTX's core asks first; nothing of the core is taken.
int InitializeInjectionNvtx2(void *get_export_table) {
  (void)get_export_table;
  return 1;
}

// FAKENVTX_NOOP=1: take every call and do nothing (what the calls cost cudapool itself).
static nvtxMemHeapHandle_t noop_heap(nvtxDomainHandle_t d, nvtxMemHeapDesc_t const *desc) {
  (void)d, (void)desc;
  return (nvtxMemHeapHandle_t)1;
}
static void noop(nvtxDomainHandle_t d, const void *x) { (void)d, (void)x; }

int InitializeInjectionNvtxExtension(nvtxExtModuleInfo_t *info) {
  if (info->moduleId != NVTX_EXT_MODULEID_MEM) return 1;
  int quiet = getenv("FAKENVTX_NOOP") != NULL;
  // The memory extension's calls this tool takes, recording or doing nothing.
  const struct {
    size_t cbid;
    intptr_t take, noop;
  } calls[] = {
      {NVTX3EXT_CBID_nvtxMemHeapRegister, (intptr_t)heap_register, (intptr_t)noop_heap},
      {NVTX3EXT_CBID_nvtxMemHeapUnregister, (intptr_t)heap_unregister, (intptr_t)noop},
      {NVTX3EXT_CBID_nvtxMemRegionsRegister, (intptr_t)regions_register, (intptr_t)noop},
      {NVTX3EXT_CBID_nvtxMemRegionsUnregister, (intptr_t)regions_unregister, (intptr_t)noop},
      {NVTX3EXT_CBID_nvtxMemRegionsName, (intptr_t)regions_name, (intptr_t)noop},
  };
  for (size_t s = 0; s < info->segmentsCount; s++)
    for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++)
      info->segments[s].functionSlots[calls[c].cbid] = quiet ? calls[c].noop : calls[c].take;
  return 1;
}
