// Part of the fake driver (tests/fake/libcuda.c includes it; not compiled on its own): host functions; managed, host and virtual memory; arrays.

// ---- host functions ----------------------------------------------------------------------
// cuLaunchHostFunc and cuStreamAddCallback: the function runs on the driver's own callback
// thread, one for the process, in the order they were enqueued, once the work its stream had
// before it has run (device time moves to it). Unlike the real driver, the fake lets a
// callback call the driver (free, destroy its stream), as the tests need.
struct host_call {
  void (*fn)(void *);                   // cuLaunchHostFunc
  void (*cb)(void *, CUresult, void *); // cuStreamAddCallback
  void *stream, *data;
  ns_t at;
  struct host_call *next;
};
static pthread_mutex_t host_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t host_cv = PTHREAD_COND_INITIALIZER;
static struct host_call *host_head, *host_tail;
static int host_thread_started;

static void *host_thread(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&host_mu);
    while (!host_head) pthread_cond_wait(&host_cv, &host_mu);
    struct host_call *c = host_head;
    host_head = c->next;
    if (!host_head) host_tail = NULL;
    pthread_mutex_unlock(&host_mu);
    pthread_mutex_lock(&mu);
    dev_now = max2(dev_now, c->at);
    pthread_mutex_unlock(&mu);
    if (c->fn) c->fn(c->data);
    else c->cb(c->stream, CUDA_SUCCESS, c->data);
    free(c);
  }
  return NULL;
}

static CUresult host_enqueue(void *s, void (*fn)(void *), void (*cb)(void *, CUresult, void *),
                             void *data, const char *api) {
  stream_alive(s, api);
  if (!fn && !cb) return CUDA_ERROR_INVALID_VALUE;
  struct host_call *c = calloc(1, sizeof *c);
  if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
  c->fn = fn, c->cb = cb, c->stream = s, c->data = data;
  pthread_mutex_lock(&mu);
  init_time();
  c->at = stream_end(s, 0);
  pthread_mutex_unlock(&mu);
  pthread_mutex_lock(&host_mu);
  if (!host_thread_started) {
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &a, host_thread, NULL)) {
      pthread_mutex_unlock(&host_mu);
      free(c);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    host_thread_started = 1;
  }
  if (host_tail) host_tail->next = c;
  else host_head = c;
  host_tail = c;
  pthread_cond_signal(&host_cv);
  pthread_mutex_unlock(&host_mu);
  return CUDA_SUCCESS;
}
CUresult cuLaunchHostFunc(void *s, void (*fn)(void *), void *data) {
  count("cuLaunchHostFunc");
  return host_enqueue(s, fn, NULL, data, "cuLaunchHostFunc");
}
CUresult cuStreamAddCallback(void *s, void (*cb)(void *, CUresult, void *), void *data,
                             unsigned flags) {
  count("cuStreamAddCallback");
  if (flags) return CUDA_ERROR_INVALID_VALUE;
  return host_enqueue(s, NULL, cb, data, "cuStreamAddCallback");
}

CUresult cuStreamBeginCaptureToGraph(void *s, void *g, const void *d, const void *e, size_t n,
                                     int mode) {
  (void)g, (void)d, (void)e, (void)n;
  count("cuStreamBeginCaptureToGraph");
  return begin_capture(s, mode);
}

// ---- managed, host, virtual memory --------------------------------------------------------
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned flags) {
  (void)flags;
  count("cuMemAllocManaged");
  return do_alloc(p, size, 0);
}
CUresult cuMemHostAlloc(void **p, size_t size, unsigned flags) {
  (void)flags;
  count("cuMemHostAlloc");
  if (!p || !size) return CUDA_ERROR_INVALID_VALUE;
  *p = malloc(size);
  if (!*p) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_HOST; i++)
    if (!host_allocs[i].p) {
      host_allocs[i].p = *p, host_allocs[i].size = size;
      break;
    }
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags) {
  count("cuMemHostGetDevicePointer_v2");
  CUdeviceptr b;
  size_t s;
  pthread_mutex_lock(&mu);
  int found = find_range((CUdeviceptr)(uintptr_t)p, &b, &s);
  pthread_mutex_unlock(&mu);
  if (!d || flags || found != 2) return CUDA_ERROR_INVALID_VALUE;
  *d = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}
CUresult cuMemFreeHost(void *p) {
  count("cuMemFreeHost");
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_HOST; i++)
    if (p && host_allocs[i].p == p) host_allocs[i].p = NULL;
  pthread_mutex_unlock(&mu);
  free(p);
  return CUDA_SUCCESS;
}

#define MAX_PHYS 4096
#define MAX_MAPS 4096
// A chunk created exportable (requestedHandleTypes POSIX_FILE_DESCRIPTOR) lives in a memfd,
// mapped shared wherever it is mapped: its descriptor, exported, carries the very bytes to
// another process, which imports and maps it as the real driver lets it. A chunk imported so
// is not counted against this process's device (the exporter holds the memory).
struct fake_phys {
  int live, dev, refs, maps;
  size_t size;
  int memfd; // -1: not exportable
  int imported;
};
static struct fake_phys phys[MAX_PHYS];
static struct {
  CUdeviceptr va;
  size_t size;
  int h; // index + 1 into phys
  unsigned char access[8]; // cuMemSetAccess's flags, by device
} vmaps[MAX_MAPS];
static void phys_check(int h) {
  struct fake_phys *p = &phys[h - 1];
  if (p->live && p->refs == 0 && p->maps == 0) {
    p->live = 0;
    if (p->dev >= 0 && !p->imported) used[p->dev] -= p->size;
    if (p->memfd >= 0) close(p->memfd);
    p->memfd = -1;
  }
}
CUresult cuMemCreate(unsigned long long *handle, size_t size, const struct loc_head *prop,
                     unsigned long long flags) {
  (void)flags;
  count("cuMemCreate");
  if (!handle || !prop || !size || size % POOL_STEP) return CUDA_ERROR_INVALID_VALUE;
  int dev = prop->location_type == 1 ? prop->location_id : -1;
  pthread_mutex_lock(&mu);
  if (dev >= 0 && taken(dev) + size > total_mem) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  int memfd = -1;
  if (prop->handle_types == 1) {
    memfd = memfd_create("fakecu-chunk", MFD_CLOEXEC);
    if (memfd < 0 || ftruncate(memfd, (off_t)size)) {
      pthread_mutex_unlock(&mu);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  } else if (prop->handle_types) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  for (int i = 0; i < MAX_PHYS; i++)
    if (!phys[i].live) {
      phys[i] = (struct fake_phys){1, dev, 1, 0, size, memfd, 0};
      if (dev >= 0) {
        used[dev] += size;
        if (used[dev] > peak[dev]) peak[dev] = used[dev];
      }
      *handle = (unsigned long long)(i + 1) << 20; // opaque, not an index
      pthread_mutex_unlock(&mu);
      return CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&mu);
  return CUDA_ERROR_OUT_OF_MEMORY;
}
static int phys_index(unsigned long long handle) {
  int h = (int)(handle >> 20);
  return h >= 1 && h <= MAX_PHYS && phys[h - 1].live ? h : 0;
}
CUresult cuMemRelease(unsigned long long handle) {
  count("cuMemRelease");
  pthread_mutex_lock(&mu);
  int h = phys_index(handle);
  if (!h || phys[h - 1].refs == 0) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_INVALID_VALUE;
  }
  phys[h - 1].refs--;
  phys_check(h);
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
// Reserved address ranges (the process's, not a context's: they outlive every context).
static long reserved_ranges;
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                             unsigned long long flags) {
  (void)addr, (void)flags;
  count("cuMemAddressReserve");
  if (!ptr || !size) return CUDA_ERROR_INVALID_VALUE;
  if (!align) align = POOL_STEP;
  // Over-reserve, then trim to an `align`-aligned range, as the real driver aligns.
  size_t span = size + align;
  char *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t start = ((uintptr_t)p + align - 1) / align * align;
  if (start > (uintptr_t)p) munmap(p, start - (uintptr_t)p);
  if ((uintptr_t)p + span > start + size)
    munmap((void *)(start + size), (uintptr_t)p + span - (start + size));
  *ptr = (CUdeviceptr)start;
  __atomic_add_fetch(&reserved_ranges, 1, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  count("cuMemAddressFree");
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_MAPS; i++)
    if (vmaps[i].h && vmaps[i].va >= ptr && vmaps[i].va < ptr + size) {
      pthread_mutex_unlock(&mu);
      fprintf(stderr, "fakecu: cuMemAddressFree of a range with memory still mapped\n");
      return CUDA_ERROR_INVALID_VALUE;
    }
  pthread_mutex_unlock(&mu);
  munmap((void *)(uintptr_t)ptr, size);
  __atomic_sub_fetch(&reserved_ranges, 1, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}
long fakecu_reserved_ranges(void) { return reserved_ranges; }
CUresult cuMemMap(CUdeviceptr va, size_t size, size_t offset, unsigned long long handle,
                  unsigned long long flags) {
  (void)flags;
  count("cuMemMap");
  pthread_mutex_lock(&mu);
  int h = phys_index(handle);
  for (int i = 0; h && i < MAX_MAPS; i++)
    if (!vmaps[i].h) {
      vmaps[i].va = va, vmaps[i].size = size, vmaps[i].h = h;
      memset(vmaps[i].access, 0, sizeof vmaps[i].access);
      phys[h - 1].maps++;
      // The host pages behind the reserved range become usable (memsets and copies run on them);
      // an exportable chunk's are its memfd's, shared with every mapping of it.
      if (phys[h - 1].memfd >= 0)
        mmap((void *)(uintptr_t)va, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
             phys[h - 1].memfd, (off_t)offset);
      else
        mprotect((void *)(uintptr_t)va, size, PROT_READ | PROT_WRITE);
      pthread_mutex_unlock(&mu);
      return CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&mu);
  return CUDA_ERROR_INVALID_VALUE;
}
// Unlike cuMemFree, the real cuMemUnmap does not wait for the device: unmapping memory that
// work still in flight touches is a fault on a GPU. Here it counts as a race, and is reported.
static void unmapped_in_use(CUdeviceptr lo, size_t size) {
  long n = works < WORKS ? works : WORKS;
  for (long i = 0; i < n; i++)
    if (recent[i].lo < lo + size && lo < recent[i].hi && recent[i].end > dev_now) {
      races++;
      fprintf(stderr, "fakecu: cuMemUnmap of %#llx+%zu while device work still uses it\n",
              (unsigned long long)lo, size);
      return;
    }
}
CUresult cuMemUnmap(CUdeviceptr va, size_t size) {
  count("cuMemUnmap");
  pthread_mutex_lock(&mu);
  unmapped_in_use(va, size);
  int n = 0;
  for (int i = 0; i < MAX_MAPS; i++)
    if (vmaps[i].h && vmaps[i].va >= va && vmaps[i].va < va + size) {
      int h = vmaps[i].h;
      vmaps[i].h = 0;
      void *p = (void *)(uintptr_t)vmaps[i].va;
      if (phys[h - 1].memfd >= 0)
        mmap(p, vmaps[i].size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
             -1, 0);
      else
        madvise(p, vmaps[i].size, MADV_DONTNEED), mprotect(p, vmaps[i].size, PROT_NONE);
      phys[h - 1].maps--;
      phys_check(h);
      n++;
    }
  pthread_mutex_unlock(&mu);
  return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
// Access may be set only on mapped memory: every chunk of the range must be mapped. The
// flags are kept per mapping and device (what cuMemGetAccess answers).
struct access_desc {
  int location_type, location_id, flags;
};
CUresult cuMemSetAccess(CUdeviceptr va, size_t size, const void *desc, size_t count_) {
  count("cuMemSetAccess");
  if (!desc || !count_ || !size) return CUDA_ERROR_INVALID_VALUE;
  const struct access_desc *d = desc;
  pthread_mutex_lock(&mu);
  size_t covered = 0;
  for (int i = 0; i < MAX_MAPS; i++)
    if (vmaps[i].h && vmaps[i].va >= va && vmaps[i].va < va + size) covered += vmaps[i].size;
  if (covered == size)
    for (int i = 0; i < MAX_MAPS; i++)
      if (vmaps[i].h && vmaps[i].va >= va && vmaps[i].va < va + size)
        for (size_t k = 0; k < count_; k++)
          if (d[k].location_id >= 0 && d[k].location_id < 8)
            vmaps[i].access[d[k].location_id] = (unsigned char)d[k].flags;
  pthread_mutex_unlock(&mu);
  return covered == size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemGetAccess(unsigned long long *flags, const int *location, CUdeviceptr ptr) {
  count("cuMemGetAccess");
  if (!flags || !location) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_MAPS; i++)
    if (vmaps[i].h && ptr >= vmaps[i].va && ptr < vmaps[i].va + vmaps[i].size) {
      int dev = location[1];
      *flags = dev >= 0 && dev < 8 ? vmaps[i].access[dev] : 0;
      pthread_mutex_unlock(&mu);
      return CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&mu);
  return CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemGetAllocationGranularity(size_t *g, const struct loc_head *prop, int option) {
  (void)option;
  count("cuMemGetAllocationGranularity");
  if (!g || !prop) return CUDA_ERROR_INVALID_VALUE;
  *g = POOL_STEP;
  return CUDA_SUCCESS;
}
// Every pair of fake devices are peers.
CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
  count("cuDeviceCanAccessPeer");
  if (!can || dev < 0 || dev >= ndev || peer < 0 || peer >= ndev) return CUDA_ERROR_INVALID_DEVICE;
  *can = dev != peer;
  return CUDA_SUCCESS;
}
CUresult cuMemRetainAllocationHandle(unsigned long long *handle, void *addr) {
  count("cuMemRetainAllocationHandle");
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  CUdeviceptr a = (CUdeviceptr)(uintptr_t)addr;
  for (int i = 0; i < MAX_MAPS; i++)
    if (vmaps[i].h && a >= vmaps[i].va && a < vmaps[i].va + vmaps[i].size) {
      phys[vmaps[i].h - 1].refs++;
      *handle = (unsigned long long)vmaps[i].h << 20;
      pthread_mutex_unlock(&mu);
      return CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&mu);
  return CUDA_ERROR_INVALID_VALUE;
}

// Export: a new descriptor of the chunk's memfd (the real driver's keeps the memory alive
// until closed; the fake does not count that). Only chunks created exportable.
CUresult cuMemExportToShareableHandle(void *out, unsigned long long handle, int type,
                                      unsigned long long flags) {
  (void)flags;
  count("cuMemExportToShareableHandle");
  if (!out || type != 1) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  int h = phys_index(handle);
  int fd = h && phys[h - 1].memfd >= 0 ? fcntl(phys[h - 1].memfd, F_DUPFD, 3) : -1;
  pthread_mutex_unlock(&mu);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
  *(int *)out = fd;
  return CUDA_SUCCESS;
}
CUresult cuMemImportFromShareableHandle(unsigned long long *handle, void *os_handle, int type) {
  count("cuMemImportFromShareableHandle");
  struct stat st;
  int fd = (int)(intptr_t)os_handle;
  if (!handle || type != 1 || fstat(fd, &st) || !S_ISREG(st.st_mode) || !st.st_size ||
      st.st_size % POOL_STEP)
    return CUDA_ERROR_INVALID_VALUE;
  int mine = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (mine < 0) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_PHYS; i++)
    if (!phys[i].live) {
      phys[i] = (struct fake_phys){1, 0, 1, 0, (size_t)st.st_size, mine, 1};
      *handle = (unsigned long long)(i + 1) << 20;
      pthread_mutex_unlock(&mu);
      return CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&mu);
  close(mine);
  return CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult cuMemGetAllocationPropertiesFromHandle(struct loc_head *prop, unsigned long long handle) {
  count("cuMemGetAllocationPropertiesFromHandle");
  if (!prop) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  int h = phys_index(handle);
  if (h) *prop = (struct loc_head){1, phys[h - 1].memfd >= 0, 1, phys[h - 1].dev < 0 ? 0 : phys[h - 1].dev};
  pthread_mutex_unlock(&mu);
  return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// The memfds the fake itself holds for live exportable chunks.
int fakecu_chunk_memfds(void) {
  int n = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_PHYS; i++) n += phys[i].live && phys[i].memfd >= 0;
  pthread_mutex_unlock(&mu);
  return n;
}

// ---- arrays ------------------------------------------------------------------------------
// Footprint: rows padded to 512 bytes, every mip level, the total rounded up to 2 MiB (so a
// naive texel count is never the right answer). Deferred-mapping arrays take nothing.
#define MAX_ARRAYS 64
struct desc3 { size_t w, h, d; unsigned format, channels, flags; };
struct desc2 { size_t w, h; unsigned format, channels; };
struct desc2v1 { unsigned w, h, format, channels; };
struct desc3v1 { unsigned w, h, d, format, channels, flags; };
struct mem_req { size_t size, alignment; unsigned reserved[4]; };
struct fake_array {
  int live, dev, deferred;
  size_t size;
};
static struct fake_array arrays[MAX_ARRAYS];
static size_t elem_bytes(unsigned f) {
  switch (f) {
    case 0x01: case 0x08: return 1;
    case 0x02: case 0x09: case 0x10: return 2;
    case 0x03: case 0x0a: case 0x20: return 4;
    default: return 0;
  }
}
static size_t footprint(struct desc3 d, unsigned levels) {
  size_t total = 0;
  for (unsigned l = 0; l < (levels ? levels : 1); l++) {
    size_t w = d.w >> l ? d.w >> l : 1, h = d.h ? (d.h >> l ? d.h >> l : 1) : 1,
           z = d.d ? (d.d >> l ? d.d >> l : 1) : 1;
    total += ((w * elem_bytes(d.format) * d.channels + 511) & ~(size_t)511) * h * z;
  }
  return (total + POOL_STEP - 1) / POOL_STEP * POOL_STEP;
}
size_t fakecu_array_footprint(size_t w, size_t h, size_t d, unsigned format, unsigned ch,
                              unsigned levels) {
  return footprint((struct desc3){w, h, d, format, ch, 0}, levels);
}
static CUresult array_make(void **out, struct desc3 d, unsigned levels) {
  if (!out || !d.w || !elem_bytes(d.format) || !d.channels) return CUDA_ERROR_INVALID_VALUE;
  struct fake_ctx *ctx = current;
  if (!ctx || !ctx->live) return CUDA_ERROR_INVALID_CONTEXT;
  int deferred = (d.flags & 0x80) != 0;
  size_t size = footprint(d, levels);
  pthread_mutex_lock(&mu);
  if (!deferred && taken(ctx->dev) + size > total_mem) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  for (int i = 0; i < MAX_ARRAYS; i++)
    if (!arrays[i].live) {
      arrays[i] = (struct fake_array){1, ctx->dev, deferred, size};
      if (!deferred) {
        used[ctx->dev] += size;
        if (used[ctx->dev] > peak[ctx->dev]) peak[ctx->dev] = used[ctx->dev];
      }
      *out = &arrays[i];
      pthread_mutex_unlock(&mu);
      return CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&mu);
  return CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult cuArrayCreate_v2(void **out, const struct desc2 *d) {
  count("cuArrayCreate_v2");
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  return array_make(out, (struct desc3){d->w, d->h, 0, d->format, d->channels, 0}, 0);
}
CUresult cuArrayCreate(void **out, const struct desc2v1 *d) {
  count("cuArrayCreate");
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  return array_make(out, (struct desc3){d->w, d->h, 0, d->format, d->channels, 0}, 0);
}
CUresult cuArray3DCreate_v2(void **out, const struct desc3 *d) {
  count("cuArray3DCreate_v2");
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  return array_make(out, *d, 0);
}
CUresult cuArray3DCreate(void **out, const struct desc3v1 *d) {
  count("cuArray3DCreate");
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  return array_make(out, (struct desc3){d->w, d->h, d->d, d->format, d->channels, d->flags}, 0);
}
CUresult cuMipmappedArrayCreate(void **out, const struct desc3 *d, unsigned levels) {
  count("cuMipmappedArrayCreate");
  if (!d || !levels) return CUDA_ERROR_INVALID_VALUE;
  return array_make(out, *d, levels);
}
static CUresult array_destroy(void *a) {
  struct fake_array *arr = a;
  if (!arr || !arr->live) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  arr->live = 0;
  if (!arr->deferred) used[arr->dev] -= arr->size;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuArrayDestroy(void *a) { count("cuArrayDestroy"); return array_destroy(a); }
CUresult cuMipmappedArrayDestroy(void *a) { count("cuMipmappedArrayDestroy"); return array_destroy(a); }
static CUresult requirements(struct mem_req *r, void *a) {
  struct fake_array *arr = a;
  if (!r || !arr || !arr->live || !arr->deferred || getenv("FAKECU_NO_ARRAY_REQUIREMENTS"))
    return CUDA_ERROR_INVALID_VALUE;
  r->size = arr->size;
  r->alignment = 65536;
  return CUDA_SUCCESS;
}
CUresult cuArrayGetMemoryRequirements(struct mem_req *r, void *a, CUdevice d) {
  (void)d;
  count("cuArrayGetMemoryRequirements");
  return requirements(r, a);
}
CUresult cuMipmappedArrayGetMemoryRequirements(struct mem_req *r, void *a, CUdevice d) {
  (void)d;
  count("cuMipmappedArrayGetMemoryRequirements");
  return requirements(r, a);
}

// Test controls.
long fakecu_hold(void *stream) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_HOLDS; i++)
    if (!holds[i].live) {
      holds[i] = (struct fake_hold){1, stream, is_nonblocking(stream)};
      last_hold = i;
      pthread_mutex_unlock(&mu);
      return i;
    }
  pthread_mutex_unlock(&mu);
  return -1;
}
// A FAKECU_HOLD kernel: a hold on its stream.
static CUresult hold_on(void *stream) {
  return fakecu_hold(stream ? stream : (void *)1) >= 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
void fakecu_finish(long h) {
  if (h >= 0 && h < MAX_HOLDS) holds[h].live = 0;
}
int fakecu_running(long h) { return h >= 0 && h < MAX_HOLDS && holds[h].live; }
long fakecu_capture_violations(void) { return capture_violations; }
