// Part of the client (tests/c/client.c includes it; not compiled on its own): the scenarios of
// processes that hold, park, take or cache memory for other processes and tests to read
// (leaks, groups, the live page), and the timed and sample programs.

static int leak(int argc, char **argv) {
  CUdeviceptr a = leaky_helper(1 << 20), b = leaky_helper(4096), c = leaky_helper(3 << 20);
  (void)a;
  (void)c;
  CHECK(cu.MemFree(b));
  int (*snap)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "cudapool_snapshot");
  if (snap && argc > 0) printf("snapshot=%d\n", snap(argv[0]));
  if (snap) printf("snapshot_null=%d\n", snap(NULL));
  return 0;
}

// Holds some memory for a while (for `cudapool stat` to find), with a few OOMs under a limit.
static int hold_memory(int argc, char **argv) {
  double secs = argc > 0 ? atof(argv[0]) : 2.0;
  CUdeviceptr p[64];
  int n = 0;
  for (int i = 0; i < 64; i++)
    if (cu.MemAlloc(&p[n], (size_t)(i % 4 + 1) << 20) == CUDA_SUCCESS) n++;
  for (int i = 0; i < n; i += 2) CHECK(cu.MemFree(p[i]));
  print_stats("holding");
  fflush(stdout);
  struct timespec t = {(time_t)secs, (long)((secs - (time_t)secs) * 1e9)};
  nanosleep(&t, NULL);
  for (int i = 1; i < n; i += 2) CHECK(cu.MemFree(p[i]));
  return 0;
}

// park N SIZE [oom]: holds N blocks of SIZE bytes (and, with "oom", first asks for one block
// more than the limit allows: one out-of-memory answer), prints "parked", then waits until its
// standard input closes, and frees them.
static int park(int argc, char **argv) {
  int n = argc > 0 ? atoi(argv[0]) : 1;
  size_t size = argc > 1 ? strtoull(argv[1], NULL, 10) : (1 << 20);
  CUdeviceptr p[256];
  if (n > 256) n = 256;
  if (argc > 2 && !strcmp(argv[2], "oom")) {
    CUdeviceptr big;
    printf("oom_rc=%d\n", cu.MemAlloc(&big, (size_t)1 << 40));
  }
  for (int i = 0; i < n; i++) CHECK(cu.MemAlloc(&p[i], size));
  printf("parked n=%d size=%zu\n", n, size);
  fflush(stdout);
  char buf[64];
  while (fread(buf, 1, sizeof buf, stdin) > 0) {
  }
  for (int i = 0; i < n; i++) CHECK(cu.MemFree(p[i]));
  return 0;
}

// Waits until standard input closes (the test's way to end a scenario).
static void wait_for_stdin(void) {
  char buf[64];
  while (fread(buf, 1, sizeof buf, stdin) > 0) {
  }
}

// The group (CUDAPOOL_GROUP) on this device, through the C API: "TAG members=... reserved=...".
static void print_group(const char *tag) {
  struct group_stats {
    size_t struct_size;
    int32_t device;
    uint32_t pad;
    uint64_t members, reserved, limit, mine;
    char name[72];
  } g = {.struct_size = sizeof g};
  int (*get)(int, struct group_stats *) = dlsym(RTLD_DEFAULT, "cudapool_get_group_stats");
  int r = get ? get(dev, &g) : -1;
  printf("%s r=%d name=%s members=%llu reserved=%llu limit=%llu mine=%llu\n", tag, r,
         r == 0 ? g.name : "-", (unsigned long long)g.members, (unsigned long long)g.reserved,
         (unsigned long long)g.limit, (unsigned long long)g.mine);
}

// take SIZE [go]: allocates blocks of SIZE until refused, prints "took n=K err=E", holds them
// until stdin closes. With "go", first prints "ready" and waits for a line on stdin, so that
// several processes start taking at one moment.
static int take(int argc, char **argv) {
  size_t size = argc > 0 ? strtoull(argv[0], NULL, 10) : (8 << 20);
  if (argc > 1 && !strcmp(argv[1], "go")) {
    size_t f, t;
    CHECK(cu.MemGetInfo(&f, &t)); // the shim is set up before the race
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 5;
  }
  static CUdeviceptr p[4096];
  int n = 0;
  CUresult r = CUDA_SUCCESS;
  while (n < 4096 && (r = cu.MemAlloc(&p[n], size)) == CUDA_SUCCESS) n++;
  printf("took n=%d err=%d\n", n, r);
  print_group("group");
  fflush(stdout);
  wait_for_stdin();
  for (int i = 0; i < n; i++) CHECK(cu.MemFree(p[i]));
  return 0;
}

// cache N SIZE: allocates N blocks and frees them all (they stay cached), prints "cached",
// then sleeps in read() until stdin closes.
static int cache(int argc, char **argv) {
  int n = argc > 0 ? atoi(argv[0]) : 1;
  size_t size = argc > 1 ? strtoull(argv[1], NULL, 10) : (8 << 20);
  CUdeviceptr p[256];
  if (n > 256) n = 256;
  for (int i = 0; i < n; i++) CHECK(cu.MemAlloc(&p[i], size));
  for (int i = 0; i < n; i++) CHECK(cu.MemFree(p[i]));
  print_stats("cached");
  fflush(stdout);
  wait_for_stdin();
  print_stats("after");
  return 0;
}

// churn N SIZE [WAIT_MS]: N rounds of an allocation of SIZE freed at once (a program that frees
// and allocates again), prints "churned" with the stats; then, holding nothing, waits until
// nothing is reserved (at most WAIT_MS, default 10000) and prints "rested" with the stats and
// the milliseconds it waited ("waited_ms=").
static int churn(int argc, char **argv) {
  int n = argc > 0 ? atoi(argv[0]) : 20;
  size_t size = argc > 1 ? strtoull(argv[1], NULL, 10) : (64 << 20);
  long wait_ms = argc > 2 ? atol(argv[2]) : 10000;
  for (int i = 0; i < n; i++) {
    CUdeviceptr p;
    CHECK(cu.MemAlloc(&p, size));
    CHECK(cu.MemFree(p));
  }
  print_stats("churned");
  double start = now_ns();
  struct stats s;
  while ((now_ns() - start) / 1e6 < wait_ms && shim_stats(dev, &s) == 0 && s.reserved > 0)
    nanosleep(&(struct timespec){0, 20000000}, NULL);
  printf("waited_ms=%.0f\n", (now_ns() - start) / 1e6);
  print_stats("rested");
  return 0;
}

// timed SIZE: one allocation, timed: "timed rc=R ms=T", then holds it until stdin closes.
static int timed(int argc, char **argv) {
  size_t size = argc > 0 ? strtoull(argv[0], NULL, 10) : (8 << 20);
  CUdeviceptr p = 0;
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  CUresult r = cu.MemAlloc(&p, size);
  clock_gettime(CLOCK_MONOTONIC, &b);
  printf("timed rc=%d ms=%.1f\n", r, (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6);
  print_group("group");
  fflush(stdout);
  wait_for_stdin();
  if (r == CUDA_SUCCESS) CHECK(cu.MemFree(p));
  return 0;
}

// The bundled sample workload (README): a few buffers, a round trip through the device,
// then as many 64 MiB buffers as the limit allows.
static int sample(void) {
  size_t f, t;
  CHECK(cu.MemGetInfo(&f, &t));
  printf("sample: device %d reports %.1f MiB free of %.1f MiB\n", dev, f / 1048576.0,
         t / 1048576.0);
  size_t sizes[] = {512, 1 << 20, 16 << 20, 100 << 20};
  CUdeviceptr p[4];
  for (int i = 0; i < 4; i++) CHECK(cu.MemAlloc(&p[i], sizes[i]));
  char out[512], back[512];
  for (int i = 0; i < 512; i++) out[i] = (char)i;
  if (cu.MemcpyHtoD && cu.MemcpyDtoH) {
    CHECK(cu.MemcpyHtoD(p[0], out, sizeof out));
    CHECK(cu.MemcpyDtoH(back, p[0], sizeof back));
    printf("sample: round trip through the device %s\n",
           memcmp(out, back, sizeof out) ? "FAILED" : "ok");
  }
  for (int i = 0; i < 4; i++) CHECK(cu.MemFree(p[i]));
  CUdeviceptr held[256];
  int n = 0;
  CUresult r = CUDA_SUCCESS;
  while (n < 256 && (r = cu.MemAlloc(&held[n], 64 << 20)) == CUDA_SUCCESS) n++;
  printf("sample: %d buffers of 64 MiB fit, then error %d%s\n", n, r,
         r == CUDA_ERROR_OUT_OF_MEMORY ? " (CUDA_ERROR_OUT_OF_MEMORY)" : "");
  for (int i = 0; i < n; i++) CHECK(cu.MemFree(held[i]));
  return 0;
}
