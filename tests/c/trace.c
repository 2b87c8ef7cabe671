// A recorded allocation trace (`a ID SIZE`, `f ID`, `#` comments: benches/traces/) played
// through the driver API against the fake driver's modelled device: each allocation is used by
// a kernel on one of `streams` streams in turn (the legacy stream first, its kernels `us`
// microseconds of device time, then non-blocking ones, a quarter of that: a job's busy compute
// stream and NCCL's, which runs ahead of it), and freed with
// cuMemFree, which names no stream. So the whole library runs as in a program: hooks, fences
// on busy streams, a device that lags the host. With `touch` set the kernels touch their
// blocks and the fake's race detector watches them (a block handed out again while a kernel
// that may still run uses it is a race); without, the kernels touch nothing and the run times
// the host path alone (ns an allocation or free over the trace's second half, its steady
// state).
//
//   client link trace FILE [STREAMS] [US] [TOUCH]
// prints "trace ops=N frees=N streams=S ns_per_op=X races=R", the driver calls of the second
// half ("trace_steady maps=N unmaps=N access=N creates=N event_syncs=N misses=N": the
// virtual-memory work and the waits a steady step costs, and its allocations the cache did not
// serve; misses=-1 without the shim), then the shim's counters.
//
// Part of client.c (included at its end, as client_holding.c is: every build of the client
// has it without naming it).

#define TRACE_LEGACY ((void *)1)
#define TRACE_NONBLOCKING 1

struct op {
  char kind; // 'a' or 'f'
  long id;
  size_t size;
};

// The trace's operations; exits with 2 on a line it cannot read.
static struct op *read_trace(const char *path, long *n_out, long *max_id) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "client: trace %s: cannot open\n", path);
    exit(2);
  }
  long cap = 1 << 16, n = 0;
  struct op *ops = malloc(cap * sizeof *ops);
  char line[256];
  *max_id = 0;
  for (long no = 1; fgets(line, sizeof line, f); no++) {
    if (line[0] == '#' || line[0] == '\n') continue;
    struct op o = {0};
    unsigned long long size = 0;
    if (sscanf(line, "a %ld %llu", &o.id, &size) == 2) {
      o.kind = 'a';
      o.size = size;
    } else if (sscanf(line, "f %ld", &o.id) == 1) {
      o.kind = 'f';
    } else {
      fprintf(stderr, "client: trace %s line %ld: not `a ID SIZE` or `f ID`\n", path, no);
      exit(2);
    }
    if (o.id < 0) {
      fprintf(stderr, "client: trace %s line %ld: a negative ID\n", path, no);
      exit(2);
    }
    if (n == cap) ops = realloc(ops, (cap *= 2) * sizeof *ops);
    ops[n++] = o;
    if (o.id > *max_id) *max_id = o.id;
  }
  fclose(f);
  *n_out = n;
  return ops;
}

// The shim's allocations so far that its cache did not serve; -1 without the shim.
static long cache_misses(void) {
  struct stats s;
  return shim_stats(dev, &s) == 0 ? (long)(s.alloc_calls - s.cache_hits) : -1;
}

static int trace_scenario(const char *name, int argc, char **argv) {
  if (strcmp(name, "trace") != 0) return -1;
  if (argc < 1) {
    fprintf(stderr, "usage: client MODE trace FILE [STREAMS] [US] [TOUCH]\n");
    return 2;
  }
  int nstreams = argc > 1 ? atoi(argv[1]) : 1;
  unsigned us = argc > 2 ? (unsigned)atoi(argv[2]) : 5;
  int touches = argc > 3 ? atoi(argv[3]) : 1;
  if (nstreams < 1 || nstreams > 8) {
    fprintf(stderr, "client: trace: STREAMS is 1 to 8, not %s\n", argv[1]);
    return 2;
  }
  long n, max_id;
  struct op *ops = read_trace(argv[0], &n, &max_id);
  CUdeviceptr *ptr = calloc(max_id + 1, sizeof *ptr);
  void *streams[8] = {TRACE_LEGACY};
  for (int i = 1; i < nstreams; i++) CHECK(cu.StreamCreate(&streams[i], TRACE_NONBLOCKING));
  static const char *const steady[] = {"cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuMemCreate",
                                       "cuEventSynchronize"};
  enum { STEADY = sizeof steady / sizeof *steady };
  long at_half[STEADY] = {0}, misses_at_half = -1;
  long allocs = 0, frees = 0, timed = 0;
  double t0 = 0;
  for (long i = 0; i < n; i++) {
    if (i == n / 2) {
      for (int c = 0; c < STEADY; c++) at_half[c] = fake_calls(steady[c]);
      misses_at_half = cache_misses();
      t0 = now_ns(), timed = n - i;
    }
    struct op o = ops[i];
    if (o.kind == 'a') {
      if (ptr[o.id]) {
        fprintf(stderr, "client: trace: ID %ld allocated twice\n", o.id);
        return 2;
      }
      CHECK(cu.MemAlloc(&ptr[o.id], o.size));
      int k = (int)(allocs % nstreams);
      touch(streams[k], ptr[o.id], touches ? o.size : 0, k == 0 ? us : (us / 4 ? us / 4 : 1));
      allocs++;
    } else if (ptr[o.id]) {
      CHECK(cu.MemFree(ptr[o.id]));
      ptr[o.id] = 0;
      frees++;
    }
  }
  double ns = timed ? (now_ns() - t0) / timed : 0;
  long in_half[STEADY];
  for (int c = 0; c < STEADY; c++) in_half[c] = fake_calls(steady[c]) - at_half[c];
  long misses = misses_at_half < 0 ? -1 : cache_misses() - misses_at_half;
  // What the trace leaves allocated goes back, so the counters end at nothing held.
  for (long id = 0; id <= max_id; id++)
    if (ptr[id]) CHECK(cu.MemFree(ptr[id]));
  printf("trace ops=%ld frees=%ld streams=%d ns_per_op=%.1f races=%ld\n", allocs, frees, nstreams,
         ns, races());
  printf("trace_steady maps=%ld unmaps=%ld access=%ld creates=%ld event_syncs=%ld misses=%ld\n",
         in_half[0], in_half[1], in_half[2], in_half[3], in_half[4], misses);
  print_stats("trace_end");
  for (int i = 1; i < nstreams; i++) CHECK(cu.StreamDestroy(streams[i]));
  free(ops), free(ptr);
  return 0;
}
