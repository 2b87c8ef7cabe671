// Part of the fake driver (tests/fake/libcuda.c includes it; not compiled on its own): stream-ordered allocation, driver pools, graphs with memory nodes.

// ---- stream-ordered allocation and driver pools -----------------------------------------
// The fake runs no work, so a stream-ordered free takes effect at once. A pool reserves device
// memory in 2 MiB steps and keeps what is freed (release threshold: everything) until trimmed.
#define MAX_POOLS 16
#define POOL_STEP ((size_t)2 << 20)
struct fake_pool {
  int live;
  int dev; // -1: a host pool
  size_t reserved, in_use;
  size_t reserved_high, in_use_high; // since the last reset (cuMemPoolSetAttribute)
};
static struct fake_pool pools[MAX_POOLS]; // pools[d] for d < MAX_DEV: device d's default pool

static void pool_trim(struct fake_pool *pool, size_t keep);
// Called with mu held. A destroyed pool gives its memory back once its last allocation is freed.
static void pool_unuse(struct fake_pool *pool, size_t bytes) {
  pool->in_use -= bytes;
  if (!pool->live) pool_trim(pool, 0);
}

static CUresult pool_alloc(CUdeviceptr *out, size_t size, struct fake_pool *pool) {
  if (!out || size == 0 || !pool) return CUDA_ERROR_INVALID_VALUE;
  struct fake_ctx *ctx = current;
  if (!ctx || !ctx->live) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  size_t idle = pool->reserved - pool->in_use;
  size_t grow = size > idle ? (size - idle + POOL_STEP - 1) / POOL_STEP * POOL_STEP : 0;
  if (pool->dev >= 0 && taken(pool->dev) + grow > total_mem) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  size_t mapped = (size + 4095) & ~(size_t)4095;
  void *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pool->reserved += grow;
  pool->in_use += size;
  if (pool->reserved > pool->reserved_high) pool->reserved_high = pool->reserved;
  if (pool->in_use > pool->in_use_high) pool->in_use_high = pool->in_use;
  if (pool->dev >= 0) {
    used[pool->dev] += grow;
    if (used[pool->dev] > peak[pool->dev]) peak[pool->dev] = used[pool->dev];
  }
  struct alloc *a = malloc(sizeof *a);
  *a = (struct alloc){(CUdeviceptr)(uintptr_t)p, 0, mapped, ctx, 0, allocs, pool, size};
  allocs = a;
  pthread_mutex_unlock(&mu);
  *out = a->ptr;
  return CUDA_SUCCESS;
}

static CUresult alloc_async(CUdeviceptr *p, size_t size, void *s) {
  stream_alive(s, "cuMemAllocAsync");
  struct fake_ctx *ctx = current;
  if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
  (void)s;
  return pool_alloc(p, size, &pools[ctx->dev]);
}
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, void *s) { count("cuMemAllocAsync"); return alloc_async(p, size, s); }
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, void *s) { count("cuMemAllocAsync_ptsz"); return alloc_async(p, size, s); }
CUresult cuMemFreeAsync(CUdeviceptr p, void *s) { count("cuMemFreeAsync"); stream_alive(s, "cuMemFreeAsync"); return do_free(p); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, void *s) { count("cuMemFreeAsync_ptsz"); stream_alive(s, "cuMemFreeAsync_ptsz"); return do_free(p); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, void *pool, void *s) {
  (void)s;
  count("cuMemAllocFromPoolAsync");
  return pool_alloc(p, size, pool);
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, void *pool, void *s) {
  (void)s;
  count("cuMemAllocFromPoolAsync_ptsz");
  return pool_alloc(p, size, pool);
}
struct loc_head { int kind, handle_types, location_type, location_id; };
CUresult cuMemPoolCreate(void **pool, const struct loc_head *props) {
  count("cuMemPoolCreate");
  if (!pool || !props) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  for (int i = MAX_DEV; i < MAX_POOLS; i++)
    if (!pools[i].live) {
      pools[i] = (struct fake_pool){1, props->location_type == 1 ? props->location_id : -1, 0, 0, 0, 0};
      *pool = &pools[i];
      pthread_mutex_unlock(&mu);
      return CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&mu);
  return CUDA_ERROR_OUT_OF_MEMORY;
}
static void pool_trim(struct fake_pool *pool, size_t keep) {
  size_t floor_ = (pool->in_use + POOL_STEP - 1) / POOL_STEP * POOL_STEP;
  if (keep > floor_) floor_ = (keep + POOL_STEP - 1) / POOL_STEP * POOL_STEP;
  if (pool->reserved > floor_) {
    if (pool->dev >= 0) used[pool->dev] -= pool->reserved - floor_;
    pool->reserved = floor_;
  }
}
CUresult cuMemPoolTrimTo(void *pool, size_t keep) {
  count("cuMemPoolTrimTo");
  CUresult c = capture_unsafe("cuMemPoolTrimTo");
  if (c) return c;
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  pool_trim(pool, keep);
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuMemPoolDestroy(void *pool) {
  count("cuMemPoolDestroy");
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  pool_trim(pool, 0);
  ((struct fake_pool *)pool)->live = 0;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuMemPoolGetAttribute(void *pool, int attr, void *value) {
  count("cuMemPoolGetAttribute");
  struct fake_pool *p = pool;
  if (!p || !value) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  // 5, 6: reserved current and high; 7, 8: used current and high (CUmemPool_attribute).
  unsigned long long v = attr == 5   ? p->reserved
                         : attr == 6 ? p->reserved_high
                         : attr == 7 ? p->in_use
                         : attr == 8 ? p->in_use_high
                                     : 0;
  pthread_mutex_unlock(&mu);
  *(unsigned long long *)value = v;
  return CUDA_SUCCESS;
}
// As the driver: a high is reset (to the current figure) by setting it to 0, and only to 0.
CUresult cuMemPoolSetAttribute(void *pool, int attr, void *value) {
  count("cuMemPoolSetAttribute");
  struct fake_pool *p = pool;
  if (!p || !value) return CUDA_ERROR_INVALID_VALUE;
  unsigned long long v = *(unsigned long long *)value;
  if ((attr == 6 || attr == 8) && v != 0) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  if (attr == 6) p->reserved_high = p->reserved;
  if (attr == 8) p->in_use_high = p->in_use;
  pthread_mutex_unlock(&mu);
  return attr == 6 || attr == 8 || attr == 4 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuDeviceGetDefaultMemPool(void **pool, CUdevice d) {
  count("cuDeviceGetDefaultMemPool");
  if (!pool || d < 0 || d >= ndev) return CUDA_ERROR_INVALID_VALUE;
  pools[d].live = 1;
  pools[d].dev = d;
  *pool = &pools[d];
  return CUDA_SUCCESS;
}
size_t fakecu_pool_reserved(void *pool) { return ((struct fake_pool *)pool)->reserved; }

// ---- graphs with memory nodes -------------------------------------------------------------
// As the real driver (H100, driver 580, tests/gpu/programs/graph_mem.cu): an upload or launch maps the
// graph's memory nodes into one reserve per device, shared by every graph (it grows to the
// largest graph mapped since the last trim); instantiation takes nothing; only
// cuDeviceGraphMemTrim gives it back. The reserve is device memory (fakecu_used counts it).
#define MAX_GRAPH_NODES 16
struct fake_node {
  int type;      // 10: memory allocation; 0: anything else
  int dev;
  size_t bytes;
};
struct fake_graph {
  int nnodes;
  struct fake_node nodes[MAX_GRAPH_NODES];
};
struct fake_exec {
  size_t need[MAX_DEV];
  unsigned long long mapped_in[MAX_DEV];
};
static size_t graph_reserve[MAX_DEV];
static unsigned long long graph_epoch[MAX_DEV] = {1, 1, 1, 1, 1, 1, 1, 1};
static long graph_maps;

CUresult cuGraphCreate(void **g, unsigned flags) {
  (void)flags;
  count("cuGraphCreate");
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  *g = calloc(1, sizeof(struct fake_graph));
  return CUDA_SUCCESS;
}
CUresult cuGraphDestroy(void *g) { count("cuGraphDestroy"); free(g); return CUDA_SUCCESS; }
static struct fake_node *add_node(void *graph, int type) {
  struct fake_graph *g = graph;
  if (!g || g->nnodes == MAX_GRAPH_NODES) return NULL;
  struct fake_node *n = &g->nodes[g->nnodes++];
  n->type = type;
  return n;
}
// CUDA_MEM_ALLOC_NODE_PARAMS: pool properties (where at their head), access descriptors, size,
// address.
struct mem_alloc_node_params {
  int kind, handle_types, location_type, location_id;
  unsigned char props_rest[72];
  const void *access;
  size_t access_count;
  size_t bytesize;
  CUdeviceptr dptr;
};
CUresult cuGraphAddMemAllocNode(void **node, void *graph, const void *deps, size_t ndeps,
                                struct mem_alloc_node_params *p) {
  (void)deps; (void)ndeps;
  count("cuGraphAddMemAllocNode");
  if (!node || !p || !p->bytesize) return CUDA_ERROR_INVALID_VALUE;
  struct fake_node *n = add_node(graph, 10);
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  n->dev = p->location_id;
  n->bytes = p->bytesize;
  p->dptr = 0x7f0000000000ull; // a fixed virtual address; never touched
  *node = n;
  return CUDA_SUCCESS;
}
CUresult cuGraphAddEmptyNode(void **node, void *graph, const void *deps, size_t ndeps) {
  (void)deps; (void)ndeps;
  count("cuGraphAddEmptyNode");
  struct fake_node *n = add_node(graph, 0);
  if (!node || !n) return CUDA_ERROR_INVALID_VALUE;
  *node = n;
  return CUDA_SUCCESS;
}
CUresult cuGraphGetNodes(void *graph, void **nodes, size_t *n) {
  count("cuGraphGetNodes");
  struct fake_graph *g = graph;
  if (!g || !n) return CUDA_ERROR_INVALID_VALUE;
  if (nodes) {
    size_t k = *n < (size_t)g->nnodes ? *n : (size_t)g->nnodes;
    for (size_t i = 0; i < k; i++) nodes[i] = &g->nodes[i];
  }
  *n = g->nnodes;
  return CUDA_SUCCESS;
}
CUresult cuGraphNodeGetType(void *node, int *type) {
  count("cuGraphNodeGetType");
  if (!node || !type) return CUDA_ERROR_INVALID_VALUE;
  *type = ((struct fake_node *)node)->type;
  return CUDA_SUCCESS;
}
CUresult cuGraphMemAllocNodeGetParams(void *node, struct mem_alloc_node_params *p) {
  count("cuGraphMemAllocNodeGetParams");
  struct fake_node *n = node;
  if (!n || !p || n->type != 10) return CUDA_ERROR_INVALID_VALUE;
  memset(p, 0, sizeof *p);
  p->kind = 1;
  p->location_type = 1;
  p->location_id = n->dev;
  p->bytesize = n->bytes;
  p->dptr = 0x7f0000000000ull;
  return CUDA_SUCCESS;
}
static CUresult instantiate(void **exec, void *graph) {
  struct fake_graph *g = graph;
  if (!exec || !g) return CUDA_ERROR_INVALID_VALUE;
  struct fake_exec *x = calloc(1, sizeof *x);
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i].type == 10 && g->nodes[i].dev >= 0 && g->nodes[i].dev < MAX_DEV)
      x->need[g->nodes[i].dev] += g->nodes[i].bytes;
  *exec = x;
  return CUDA_SUCCESS;
}
CUresult cuGraphInstantiate(void **exec, void *graph, void **err, char *log, size_t n) {
  (void)err; (void)log; (void)n;
  count("cuGraphInstantiate");
  return instantiate(exec, graph);
}
CUresult cuGraphInstantiate_v2(void **exec, void *graph, void **err, char *log, size_t n) {
  (void)err; (void)log; (void)n;
  count("cuGraphInstantiate_v2");
  return instantiate(exec, graph);
}
CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
  (void)flags;
  count("cuGraphInstantiateWithFlags");
  return instantiate(exec, graph);
}
CUresult cuGraphInstantiateWithParams(void **exec, void *graph, void *params) {
  (void)params;
  count("cuGraphInstantiateWithParams");
  return instantiate(exec, graph);
}
CUresult cuGraphInstantiateWithParams_ptsz(void **exec, void *graph, void *params) {
  (void)params;
  count("cuGraphInstantiateWithParams_ptsz");
  return instantiate(exec, graph);
}
CUresult cuGraphExecDestroy(void *exec) { count("cuGraphExecDestroy"); free(exec); return CUDA_SUCCESS; }
// Maps what the graph needs; out-of-memory (and nothing mapped) if the device has no room.
static CUresult graph_map(void *exec) {
  struct fake_exec *x = exec;
  if (!x) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  for (int d = 0; d < MAX_DEV; d++) {
    if (!x->need[d] || x->mapped_in[d] == graph_epoch[d] || x->need[d] <= graph_reserve[d]) continue;
    if (taken(d) + (x->need[d] - graph_reserve[d]) > total_mem) {
      pthread_mutex_unlock(&mu);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  for (int d = 0; d < MAX_DEV; d++) {
    if (!x->need[d]) continue;
    if (x->need[d] > graph_reserve[d]) {
      used[d] += x->need[d] - graph_reserve[d];
      if (used[d] > peak[d]) peak[d] = used[d];
      graph_reserve[d] = x->need[d];
    }
    x->mapped_in[d] = graph_epoch[d];
  }
  graph_maps++;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuGraphLaunch(void *exec, void *s) { count("cuGraphLaunch"); stream_alive(s, "cuGraphLaunch"); return graph_map(exec); }
CUresult cuGraphLaunch_ptsz(void *exec, void *s) { count("cuGraphLaunch_ptsz"); stream_alive(s, "cuGraphLaunch_ptsz"); return graph_map(exec); }
CUresult cuGraphUpload(void *exec, void *s) { count("cuGraphUpload"); stream_alive(s, "cuGraphUpload"); return graph_map(exec); }
CUresult cuGraphUpload_ptsz(void *exec, void *s) { count("cuGraphUpload_ptsz"); stream_alive(s, "cuGraphUpload_ptsz"); return graph_map(exec); }
CUresult cuDeviceGraphMemTrim(CUdevice d) {
  count("cuDeviceGraphMemTrim");
  if (d < 0 || d >= ndev) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  used[d] -= graph_reserve[d];
  graph_reserve[d] = 0;
  graph_epoch[d]++;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
// 0/2: used/reserved now (the same here: every mapped byte serves some graph); 1/3: their highs
// (not kept: answered as now).
CUresult cuDeviceGetGraphMemAttribute(CUdevice d, int attr, void *value) {
  count("cuDeviceGetGraphMemAttribute");
  if (d < 0 || d >= ndev || !value || attr < 0 || attr > 3) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  *(unsigned long long *)value = graph_reserve[d];
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
size_t fakecu_graph_reserve(int d) { return d >= 0 && d < MAX_DEV ? graph_reserve[d] : 0; }
long fakecu_graph_maps(void) { return graph_maps; }

CUresult cuStreamSynchronize(void *s) {
  count("cuStreamSynchronize");
  stream_alive(s, "cuStreamSynchronize");
  CUresult c = capture_sync_rules(s, 0, "cuStreamSynchronize");
  if (c) return c;
  pthread_mutex_lock(&mu);
  int nb = is_nonblocking(s);
  for (int i = 0; i < MAX_HOLDS; i++)
    if (holds[i].live && (nb ? holds[i].stream == s : !holds[i].nonblocking)) holds[i].live = 0;
  dev_now = max2(dev_now, stream_end(s, 0));
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
