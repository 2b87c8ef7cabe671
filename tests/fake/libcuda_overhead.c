// Part of the fake driver (tests/fake/libcuda.c includes it; not compiled on its own): the
// device memory the driver takes for a process besides its allocations, as the real one does
// (measured on an H100, driver 580): a per-thread stack for every thread slot of the device
// (cuCtxSetLimit(CU_LIMIT_STACK_SIZE): (new - old) x SMs x threads per SM, taken at once), the
// device heap and the printf FIFO (their sizes, taken here at once), a module's device globals
// (an image "FAKEMOD globals=N": N bytes while it is loaded; " neighbour=M" after it: another
// process takes M bytes during the load), and a context beyond the primary one (FAKECU_CTX_MEM
// bytes, default 0, while it lives).

enum { FAKE_SMS = 4, FAKE_THREADS_PER_SM = 1024 };
enum { LIMIT_STACK = 0, LIMIT_PRINTF = 1, LIMIT_HEAP = 2 };
static const size_t limit_default[3] = {1024, 1 << 20, 8 << 20};

CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice dev) {
  count("cuDeviceGetAttribute");
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
  switch (attr) {
  case 16: *v = FAKE_SMS; return CUDA_SUCCESS;            // MULTIPROCESSOR_COUNT
  case 39: *v = FAKE_THREADS_PER_SM; return CUDA_SUCCESS; // MAX_THREADS_PER_MULTIPROCESSOR
  default: *v = 0; return CUDA_SUCCESS;
  }
}

// What a limit takes on the device for a value.
static size_t limit_bytes(int which, size_t value) {
  return which == LIMIT_STACK ? value * FAKE_SMS * FAKE_THREADS_PER_SM : value;
}

CUresult cuCtxGetLimit(size_t *value, int which) {
  count("cuCtxGetLimit");
  if (!value || which < 0 || which > 2) return CUDA_ERROR_INVALID_VALUE;
  struct fake_ctx *c = current;
  if (!c || !c->live) return CUDA_ERROR_INVALID_CONTEXT;
  *value = c->limit[which] ? c->limit[which] : limit_default[which];
  return CUDA_SUCCESS;
}

CUresult cuCtxSetLimit(int which, size_t value) {
  count("cuCtxSetLimit");
  if (which < 0 || which > 2) return CUDA_ERROR_INVALID_VALUE;
  struct fake_ctx *c = current;
  if (!c || !c->live) return CUDA_ERROR_INVALID_CONTEXT;
  // FAKECU_SETLIMIT_US: the call takes that long (the real one waits for the device), so
  // that two threads' calls overlap.
  const char *slow = getenv("FAKECU_SETLIMIT_US");
  if (slow) usleep((useconds_t)atoi(slow));
  size_t old = c->limit[which] ? c->limit[which] : limit_default[which];
  // The defaults are part of the context; only what is above them is taken.
  size_t had = limit_bytes(which, old) - limit_bytes(which, limit_default[which]);
  size_t want = value > limit_default[which] ? limit_bytes(which, value) - limit_bytes(which, limit_default[which]) : 0;
  pthread_mutex_lock(&mu);
  if (want > had && taken(c->dev) + (want - had) > total_mem) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  used[c->dev] = used[c->dev] - had + want;
  c->taken += want - had;
  if (used[c->dev] > peak[c->dev]) peak[c->dev] = used[c->dev];
  pthread_mutex_unlock(&mu);
  c->limit[which] = value;
  return CUDA_SUCCESS;
}

struct fake_module {
  struct fake_ctx *ctx;
  size_t globals;
  int live;
};

static size_t globals_of(const void *image) {
  const char *s = image;
  return s && !strncmp(s, "FAKEMOD globals=", 16) ? strtoull(s + 16, NULL, 10) : 0;
}

// An image "FAKEMOD globals=N neighbour=M" on a shared board: while it loads, another tenant of
// the GPU (the parent process's page of the board) takes M bytes more, as a neighbour's
// allocation lands between a load's two readings of the device's free memory on a real GPU.
static void neighbour_takes(const void *image, int dev) {
  const char *n = image ? strstr(image, " neighbour=") : NULL;
  if (!n || !shared_board) return;
  char path[4096];
  snprintf(path, sizeof path, "%s/%d", shared_board, (int)getppid());
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  size_t words[MAX_DEV] = {0};
  (void)pread(fd, words, sizeof words, 0);
  words[dev] += strtoull(n + 11, NULL, 10);
  (void)pwrite(fd, words, sizeof words, 0);
  close(fd);
}

static CUresult load(struct fake_module **out, const void *image, const char *api) {
  count(api);
  if (!out || !image) return CUDA_ERROR_INVALID_VALUE;
  struct fake_ctx *c = current;
  if (!c || !c->live) return CUDA_ERROR_INVALID_CONTEXT;
  size_t g = globals_of(image);
  pthread_mutex_lock(&mu);
  if (taken(c->dev) + g > total_mem) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  used[c->dev] += g;
  c->taken += g;
  if (used[c->dev] > peak[c->dev]) peak[c->dev] = used[c->dev];
  neighbour_takes(image, c->dev);
  pthread_mutex_unlock(&mu);
  struct fake_module *m = calloc(1, sizeof *m);
  *m = (struct fake_module){c, g, 1};
  *out = m;
  return CUDA_SUCCESS;
}

static CUresult unload(struct fake_module *m, const char *api) {
  count(api);
  if (!m || !m->live) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&mu);
  if (m->ctx->live) {
    used[m->ctx->dev] -= m->globals;
    m->ctx->taken -= m->globals;
  }
  pthread_mutex_unlock(&mu);
  m->live = 0;
  return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(struct fake_module **m, const void *image) {
  return load(m, image, "cuModuleLoadData");
}
CUresult cuModuleLoadDataEx(struct fake_module **m, const void *image, unsigned n, void *o, void **v) {
  (void)n, (void)o, (void)v;
  return load(m, image, "cuModuleLoadDataEx");
}
CUresult cuModuleUnload(struct fake_module *m) { return unload(m, "cuModuleUnload"); }
// A library loads into the current context here (the real one loads into each lazily).
CUresult cuLibraryLoadData(struct fake_module **l, const void *image, void *a, void *b, unsigned c,
                           void *d, void *e, unsigned f) {
  (void)a, (void)b, (void)c, (void)d, (void)e, (void)f;
  return load(l, image, "cuLibraryLoadData");
}
CUresult cuLibraryUnload(struct fake_module *l) { return unload(l, "cuLibraryUnload"); }
