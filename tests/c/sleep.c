// Sleep and wake scenarios of the client, against the fake driver (its device memory is host
// memory: unmapped memory faults when a kernel or copy touches it, so data that survives a
// sleep and a wake was really moved and put back).
//
//   sleep WAKER      blocks of expandable segments (and a small one in a classic segment) are
//                    filled, a cached block freed, the process put to sleep, then woken by
//                    WAKER: launch | memset | copy | alloc | event | wait | api; prints what
//                    the stats said asleep and awake, and whether every block's data came back
//   sleep_busy       kernels still run on three streams when the sleep is asked: it waits for
//                    them (no race), and the data comes back
//   sleep_threads    two threads wake the process at once, each by a copy
//   sleep_free       blocks freed and the cache reclaimed while asleep drop their host copy;
//                    the rest still wakes
//   sleep_capture    a thread captures for 300 ms while the sleep is asked: the sleep waits
//                    for the capture's end, and the capture stays valid
//   sleep_hold SECS  fills its blocks, sleeps, prints "asleep", then waits SECS seconds and
//                    checks its data (woken by the copy); for tests that act from outside
//   sleep_wait [vmm] fills its blocks (with "vmm", 8 MiB of its own virtual memory too),
//                    sleeps, prints "asleep"; at each line on stdin: first a copy that wakes it
//                    (its answer printed: no room is an answer too), then the check of every
//                    block
//   sleep_no_host    fills its blocks, then limits its address space (RLIMIT_AS) to what it
//                    uses and 32 MiB more, and asks for a sleep: no host memory for the copy
//   capture_hold     fills its blocks, begins a capture, prints "ready", and ends the capture
//                    at a line on stdin (the sleep asked meanwhile from outside cannot drain)
//   hang_hold        a kernel that never ends, then as sleep_idle (the memset it makes at the
//                    line is timed); see hang_hold below
//   sleep_idle       fills its blocks, prints "ready", waits for a line on stdin (meanwhile
//                    `cudapool sleep|wake PID` acts from outside), then checks its data
//   sleep_reset      a primary context reset while asleep wakes the process first
//   suspend_hold MIB FILE [idle]  MIB MiB in 8 MiB blocks; "ready"; a 1-byte copy (work)
//                    every 20 ms (with "idle": no device work at all) until FILE exists; then
//                    "suspend_hold intact=0|1" (tests/suspend.rs, tests/overcommit.rs)
//   sleep_vmm WAKER  the program's own virtual memory beside the pool's blocks, asleep and
//                    woken by WAKER, twice; its handle values still work after (sleep_vmm)
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "client.h"

#define MIB ((size_t)1 << 20)

struct sleep_stats {
  size_t struct_size;
  int32_t device, pad;
  uint64_t f[19];
  uint64_t asleep, state, pad2;
};

static int (*sleep_fn)(int);
static int (*wake_fn)(int);

static void get_sleep_api(void) {
  sleep_fn = dlsym(RTLD_DEFAULT, "cudapool_sleep");
  wake_fn = dlsym(RTLD_DEFAULT, "cudapool_wake");
  if (!sleep_fn || !wake_fn) {
    fprintf(stderr, "client: cudapool_sleep is not loaded\n");
    exit(4);
  }
}

// "TAG state=S asleep=B reserved=R used=U" (used: the fake device's memory in use).
static void print_sleep(const char *tag) {
  int (*get)(int, struct sleep_stats *) = dlsym(RTLD_DEFAULT, "cudapool_get_stats");
  struct sleep_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  get(dev, &s);
  size_t (*used)(int) = (size_t(*)(int))fake_fn("fakecu_used");
  printf("%s state=%llu asleep=%llu reserved=%llu used=%zu\n", tag, (unsigned long long)s.state,
         (unsigned long long)s.asleep, (unsigned long long)s.f[2], used(dev));
}

// "TAG status=<the status report's sleep line, spaces as _>" ("none" without one).
static void status_line(const char *tag) {
  int (*status)(char *, size_t) = dlsym(RTLD_DEFAULT, "cudapool_memory_status");
  char text[8192], *line = NULL;
  if (status && status(text, sizeof text) > 0) {
    for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n"))
      if (strstr(l, " on the host")) line = l;
  }
  printf("%s status=", tag);
  for (const char *c = line ? line : "none"; *c; c++) putchar(*c == ' ' ? '_' : *c);
  putchar('\n');
}

struct block {
  CUdeviceptr p;
  size_t size;
  unsigned char seed;
};

static void fill(struct block *b) {
  unsigned char *h = malloc(b->size);
  for (size_t i = 0; i < b->size; i++) h[i] = (unsigned char)(b->seed + i * 7 + (i >> 12));
  CHECK(cu.MemcpyHtoD(b->p, h, b->size));
  free(h);
}

// Whether the block's data is what `fill` wrote (read back by a copy, which wakes if asleep).
static int intact(struct block *b) {
  unsigned char *h = malloc(b->size);
  CHECK(cu.MemcpyDtoH(h, b->p, b->size));
  int ok = 1;
  for (size_t i = 0; i < b->size && ok; i++)
    ok = h[i] == (unsigned char)(b->seed + i * 7 + (i >> 12));
  free(h);
  return ok;
}

// The blocks every scenario holds: two of the arena's (64 MiB, 3 MiB + 5 bytes), one small.
static struct block blocks[3] = {{0, 64 * MIB, 1}, {0, 3 * MIB + 5, 2}, {0, 4096, 3}};

// A block of the arena whose contents nobody checks (what a memset may write).
static CUdeviceptr scratch;
// A graph instantiated before the sleep (the `graph` waker).
static void *graph_exec;

static void fill_all(void) {
  for (int i = 0; i < 3; i++) {
    CHECK(cu.MemAlloc(&blocks[i].p, blocks[i].size));
    fill(&blocks[i]);
  }
  CHECK(cu.MemAlloc(&scratch, 2 * MIB));
  // A cached block: dropped by the sleep, never copied.
  CUdeviceptr c;
  CHECK(cu.MemAlloc(&c, 32 * MIB));
  CHECK(cu.MemFree(c));
}

static int all_intact(void) {
  int ok = 1;
  for (int i = 0; i < 3; i++) ok &= intact(&blocks[i]);
  return ok;
}

static void free_all(void) {
  for (int i = 0; i < 3; i++)
    if (blocks[i].p) CHECK(cu.MemFree(blocks[i].p));
  CHECK(cu.MemFree(scratch));
}

static void *sym(const char *name) {
  void *f = dlsym(driver ? driver : RTLD_DEFAULT, name);
  if (!f) {
    fprintf(stderr, "client: no %s\n", name);
    exit(4);
  }
  return f;
}

static int wake_by(const char *waker) {
  if (!strcmp(waker, "launch")) {
    touch(NULL, blocks[0].p, blocks[0].size, 1);
  } else if (!strcmp(waker, "memset")) {
    CHECK(cu.MemsetD8(scratch, 0, 2 * MIB));
  } else if (!strcmp(waker, "graph")) {
    CUresult (*launch)(void *, void *) = sym("cuGraphLaunch");
    CHECK(launch(graph_exec, NULL));
  } else if (!strcmp(waker, "copy")) {
    unsigned char one;
    CHECK(cu.MemcpyDtoH(&one, blocks[1].p, 1));
  } else if (!strcmp(waker, "alloc")) {
    CUdeviceptr m;
    CHECK(cu.MemAlloc(&m, 2 * MIB));
    CHECK(cu.MemFree(m));
  } else if (!strcmp(waker, "event") || !strcmp(waker, "wait")) {
    CUresult (*create)(void **, unsigned) = sym("cuEventCreate");
    CUresult (*record)(void *, void *) = sym("cuEventRecord");
    CUresult (*wait)(void *, void *, unsigned) = sym("cuStreamWaitEvent");
    CUresult (*destroy)(void *) = sym("cuEventDestroy_v2");
    void *e;
    CHECK(create(&e, 0));
    if (!strcmp(waker, "event")) {
      CHECK(record(e, NULL));
    } else {
      CHECK(wait(NULL, e, 0));
    }
    CHECK(destroy(e));
  } else if (!strcmp(waker, "api")) {
    CHECK(wake_fn(-1));
  } else {
    fprintf(stderr, "client: unknown waker %s\n", waker);
    exit(2);
  }
  return 0;
}

// A graph made before the sleep (the fake's captures make no graph that runs: an empty node).
static void make_graph(void) {
  CUresult (*create)(void **, unsigned) = sym("cuGraphCreate");
  CUresult (*add_empty)(void **, void *, const void *, size_t) = sym("cuGraphAddEmptyNode");
  CUresult (*instantiate)(void **, void *, unsigned long long) = sym("cuGraphInstantiateWithFlags");
  void *g, *n;
  CHECK(create(&g, 0));
  CHECK(add_empty(&n, g, NULL, 0));
  CHECK(instantiate(&graph_exec, g, 0));
}

static int sleep_then(const char *waker) {
  get_sleep_api();
  fill_all();
  if (!strcmp(waker, "graph")) make_graph();
  print_sleep("before");
  int r = sleep_fn(-1);
  printf("slept rc=%d again=%d\n", r, sleep_fn(-1)); // asleep already: nothing more to do
  print_sleep("asleep");
  status_line("report_asleep");
  wake_by(waker);
  print_sleep("woken");
  status_line("report_woken");
  printf("intact=%d races=%ld\n", all_intact(), races());
  // Again with other contents: the second sleep writes into the host copies the first one
  // left (kept as spares), and what comes back must be the new bytes.
  for (int i = 0; i < 3; i++) {
    blocks[i].seed += 101;
    fill(&blocks[i]);
  }
  r = sleep_fn(-1);
  wake_by(waker);
  printf("again slept=%d intact=%d\n", r, all_intact());
  free_all();
  print_sleep("end");
  return 0;
}

// "sleep_cost N MIB": N blocks of MIB MiB, each written, put to sleep and woken through the C
// API three times; prints each round's milliseconds and the driver calls a sleep and a wake
// made (copies, handles unmapped, made and mapped; a handle is released right after its map),
// so that builds compare without a GPU: "sleep_cost round=R sleep_ms=S wake_ms=W copies_out=..
// unmaps=.. creates=.. maps=.. copies_in=.. intact=0|1".
static double cost_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static long cost_calls(const char *const *names) {
  long n = 0;
  for (; *names; names++) n += fake_calls(*names);
  return n;
}

static int sleep_cost(int argc, char **argv) {
  get_sleep_api();
  int n = argc > 0 ? atoi(argv[0]) : 0;
  size_t mib = argc > 1 ? (size_t)atoll(argv[1]) : 0;
  if (n < 1 || n > 1024 || mib < 1 || mib > 4096) {
    fprintf(stderr, "client: sleep_cost N MIB: N in 1-1024, MIB in 1-4096\n");
    return 2;
  }
  struct block *b = calloc((size_t)n, sizeof *b);
  if (!b) return 3;
  for (int i = 0; i < n; i++) {
    b[i].size = mib * MIB;
    b[i].seed = (unsigned char)(i + 7);
    CHECK(cu.MemAlloc(&b[i].p, b[i].size));
    fill(&b[i]);
  }
  static const char *const out[] = {"cuMemcpyDtoHAsync_v2", "cuMemcpyDtoH_v2", NULL};
  static const char *const in[] = {"cuMemcpyHtoDAsync_v2", "cuMemcpyHtoD_v2", NULL};
  static const char *const unmap[] = {"cuMemUnmap", NULL};
  static const char *const create[] = {"cuMemCreate", NULL}, *const map[] = {"cuMemMap", NULL};
  for (int round = 0; round < 3; round++) {
    long o0 = cost_calls(out), u0 = cost_calls(unmap);
    double t0 = cost_ms();
    int rc = sleep_fn(-1);
    double t1 = cost_ms();
    long o1 = cost_calls(out), u1 = cost_calls(unmap);
    long c0 = cost_calls(create), m0 = cost_calls(map), i0 = cost_calls(in);
    int wrc = wake_fn(-1);
    double t2 = cost_ms();
    int ok = rc == 0 && wrc == 0;
    for (int i = 0; i < n; i++) ok &= intact(&b[i]);
    printf("sleep_cost round=%d sleep_ms=%.2f wake_ms=%.2f copies_out=%ld unmaps=%ld creates=%ld "
           "maps=%ld copies_in=%ld intact=%d\n",
           round, t1 - t0, t2 - t1, o1 - o0, u1 - u0, cost_calls(create) - c0,
           cost_calls(map) - m0, cost_calls(in) - i0, ok);
  }
  for (int i = 0; i < n; i++) CHECK(cu.MemFree(b[i].p));
  free(b);
  return 0;
}

static int sleep_busy(void) {
  get_sleep_api();
  fill_all();
  void *s[3];
  for (int i = 0; i < 3; i++) {
    CHECK(cu.StreamCreate(&s[i], 1));
    touch(s[i], blocks[i % 2].p, blocks[i % 2].size, 20000); // 20 ms of device time each
  }
  int r = sleep_fn(-1);
  printf("slept rc=%d races=%ld\n", r, races());
  print_sleep("asleep");
  printf("intact=%d races=%ld\n", all_intact(), races());
  for (int i = 0; i < 3; i++) CHECK(cu.StreamDestroy(s[i]));
  free_all();
  return 0;
}

static int thread_ok[2];
static void *copy_back(void *arg) {
  int i = (int)(intptr_t)arg;
  CHECK(cu.CtxSetCurrent(primary));
  thread_ok[i] = intact(&blocks[i]);
  return NULL;
}

static int sleep_threads(void) {
  get_sleep_api();
  fill_all();
  printf("slept rc=%d\n", sleep_fn(-1));
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, copy_back, (void *)(intptr_t)i);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  print_sleep("woken");
  printf("threads_intact=%d,%d all_intact=%d\n", thread_ok[0], thread_ok[1], all_intact());
  free_all();
  return 0;
}

static int sleep_free(void) {
  get_sleep_api();
  fill_all();
  printf("slept rc=%d\n", sleep_fn(-1));
  print_sleep("asleep");
  CHECK(cu.MemFree(blocks[0].p)); // a free does not wake
  blocks[0].p = 0;
  size_t (*reclaim)(int) = dlsym(RTLD_DEFAULT, "cudapool_reclaim");
  size_t back = reclaim(-1);
  printf("reclaimed=%zu\n", back);
  print_sleep("freed");
  int ok = intact(&blocks[1]) && intact(&blocks[2]);
  print_sleep("woken");
  printf("intact=%d\n", ok);
  free_all();
  print_sleep("end");
  return 0;
}

static volatile int capturing, captured_rc = -1;
static void *capture_a_while(void *arg) {
  (void)arg;
  CHECK(cu.CtxSetCurrent(primary));
  void *s, *g = NULL;
  CHECK(cu.StreamCreate(&s, 1));
  CHECK(cu.BeginCapture(s, 0)); // global mode
  touch(s, blocks[2].p, blocks[2].size, 1);
  capturing = 1;
  usleep(300 * 1000);
  captured_rc = cu.EndCapture(s, &g);
  CHECK(cu.StreamDestroy(s));
  return NULL;
}

static int sleep_capture(void) {
  get_sleep_api();
  fill_all();
  pthread_t t;
  pthread_create(&t, NULL, capture_a_while, NULL);
  while (!capturing) usleep(1000);
  int r = sleep_fn(-1);
  int during = !captured_rc ? 0 : 1; // 1: the sleep returned before the capture ended
  pthread_join(t, NULL);
  printf("slept rc=%d returned_during_capture=%d capture_rc=%d\n", r, during && captured_rc != 0,
         captured_rc);
  print_sleep("asleep");
  printf("intact=%d\n", all_intact());
  free_all();
  return 0;
}

static int sleep_hold(int argc, char **argv) {
  get_sleep_api();
  fill_all();
  printf("slept rc=%d\n", sleep_fn(-1));
  print_sleep("asleep");
  fflush(stdout);
  int secs = argc > 0 ? atoi(argv[0]) : 1;
  for (int i = 0; i < secs * 10; i++) usleep(100 * 1000);
  print_sleep("before_check");
  printf("intact=%d\n", all_intact());
  free_all();
  return 0;
}

struct vm_prop {
  int type, handle_types, location_type, location_id;
  void *win32;
  unsigned char flags[8];
};
struct vm_access {
  int location_type, location_id, flags;
};

static unsigned char vm_byte(size_t i) { return (unsigned char)(i * 13 + (i >> 16) + 5); }

static int vm_intact(CUdeviceptr va, size_t n) {
  unsigned char *h = malloc(n);
  CHECK(cu.MemcpyDtoH(h, va, n));
  int ok = 1;
  for (size_t i = 0; i < n && ok; i++) ok = h[i] == vm_byte(i);
  free(h);
  return ok;
}

// The virtual-memory entry points both scenarios make and map memory with.
static struct {
  CUresult (*create)(unsigned long long *, size_t, const struct vm_prop *, unsigned long long);
  CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*map)(CUdeviceptr, size_t, size_t, unsigned long long, unsigned long long);
  CUresult (*access)(CUdeviceptr, size_t, const struct vm_access *, size_t);
} vm;

static void get_vm_api(void) {
  vm.create = sym("cuMemCreate");
  vm.reserve = sym("cuMemAddressReserve");
  vm.map = sym("cuMemMap");
  vm.access = sym("cuMemSetAccess");
}

// N handles of 2 MiB of the program's own, plain, mapped side by side and filled (`vm_byte`).
static CUdeviceptr vm_own(int n) {
  get_vm_api();
  struct vm_prop plain = {1, 0, 1, dev, NULL, {0}};
  struct vm_access rw = {1, dev, 3};
  CUdeviceptr va;
  size_t n_bytes = (size_t)n * 2 * MIB;
  CHECK(vm.reserve(&va, n_bytes, 0, 0, 0));
  for (int i = 0; i < n; i++) {
    unsigned long long h;
    CHECK(vm.create(&h, 2 * MIB, &plain, 0));
    CHECK(vm.map(va + (size_t)i * 2 * MIB, 2 * MIB, 0, h, 0));
  }
  CHECK(vm.access(va, n_bytes, &rw, 1));
  unsigned char *bytes = malloc(n_bytes);
  for (size_t i = 0; i < n_bytes; i++) bytes[i] = vm_byte(i);
  CHECK(cu.MemcpyHtoD(va, bytes, n_bytes));
  free(bytes);
  return va;
}

static int sleep_wait(int argc, char **argv) {
  get_sleep_api();
  fill_all();
  // With "vmm": 8 MiB of the program's own virtual memory too.
  int vmm = argc > 0 && !strcmp(argv[0], "vmm");
  CUdeviceptr va = vmm ? vm_own(4) : 0;
  printf("slept rc=%d\n", sleep_fn(-1));
  print_sleep("asleep");
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) return 5;
  unsigned char one;
  printf("wake rc=%d\n", cu.MemcpyDtoH(&one, blocks[0].p, 1));
  print_sleep("after_try");
  fflush(stdout);
  if (!fgets(line, sizeof line, stdin)) return 5;
  printf("intact=%d\n", all_intact());
  if (vmm) printf("vm_intact=%d\n", vm_intact(va, 8 * MIB));
  print_sleep("woken");
  free_all();
  return 0;
}

static int sleep_no_host(void) {
  get_sleep_api();
  fill_all();
  printf("bad_device sleep=%d wake=%d\n", sleep_fn(7), wake_fn(7));
  long pages = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f || fscanf(f, "%ld", &pages) != 1) return 6;
  fclose(f);
  struct rlimit r = {(rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (32ul << 20), RLIM_INFINITY};
  if (setrlimit(RLIMIT_AS, &r)) return 7;
  int rc = sleep_fn(-1);
  r.rlim_cur = RLIM_INFINITY;
  setrlimit(RLIMIT_AS, &r);
  printf("slept rc=%d\n", rc);
  print_sleep("after");
  printf("intact=%d\n", all_intact());
  free_all();
  return 0;
}

static int capture_hold(void) {
  fill_all();
  void *s, *g = NULL;
  CHECK(cu.StreamCreate(&s, 1));
  CHECK(cu.BeginCapture(s, 0));
  touch(s, blocks[0].p, 4096, 1);
  printf("ready\n");
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) return 5;
  printf("capture_rc=%d\n", cu.EndCapture(s, &g));
  print_sleep("after");
  printf("intact=%d\n", all_intact());
  free_all();
  return 0;
}

// "hang_hold": fills its blocks, launches a kernel that never ends (the fake driver's
// FAKECU_HANG: cuCtxSynchronize waits for it until fakecu_end_hangs), prints "ready"; at a line
// on stdin, times a memset of its own (a call a stuck sleep would hold at the hooks), ends the
// kernel, and checks its data.
static int hang_hold(void) {
  fill_all();
  void *s;
  CHECK(cu.StreamCreate(&s, 1));
  CHECK(cu.LaunchKernel((void *)0x403, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
  printf("ready\n");
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) return 5;
  double t = cost_ms();
  CUresult rc = cu.MemsetD8(blocks[0].p, 7, 1);
  printf("memset rc=%d ms=%.0f\n", rc, cost_ms() - t);
  ((void (*)(void))fake_fn("fakecu_end_hangs"))();
  fill(&blocks[0]);
  print_sleep("before_check");
  printf("intact=%d\n", all_intact());
  free_all();
  return 0;
}

static int sleep_idle(void) {
  fill_all();
  printf("ready\n");
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) return 5;
  print_sleep("before_check");
  printf("intact=%d\n", all_intact());
  free_all();
  return 0;
}

// The program's own virtual memory: three handles of 2 MiB mapped side by side, the first plain
// (retained once more), the other two asked shareable, the third exported (it stays), beside
// the pool's blocks. Asleep, the first two go back; woken by `waker`, every byte is back, the
// program's handle values still name its memory (map, retain, properties, release), and a
// handle made after the wake gets a value the program does not already hold.
static int sleep_vmm(const char *waker) {
  get_sleep_api();
  get_vm_api();
  CUresult (*unmap)(CUdeviceptr, size_t) = sym("cuMemUnmap");
  CUresult (*release)(unsigned long long) = sym("cuMemRelease");
  CUresult (*retain)(unsigned long long *, void *) = sym("cuMemRetainAllocationHandle");
  CUresult (*props)(struct vm_prop *, unsigned long long) =
      sym("cuMemGetAllocationPropertiesFromHandle");
  CUresult (*unreserve)(CUdeviceptr, size_t) = sym("cuMemAddressFree");
  size_t (*used)(int) = (size_t(*)(int))fake_fn("fakecu_used");

  fill_all();
  CUdeviceptr va;
  CHECK(vm.reserve(&va, 8 * MIB, 0, 0, 0));
  struct vm_prop plain = {1, 0, 1, dev, NULL, {0}}, shared = {1, 1, 1, dev, NULL, {0}};
  struct vm_access rw = {1, dev, 3};
  unsigned long long h[4];
  CUresult (*export_)(void *, unsigned long long, int, unsigned long long) =
      sym("cuMemExportToShareableHandle");
  for (int i = 0; i < 3; i++) {
    CHECK(vm.create(&h[i], 2 * MIB, i == 0 ? &plain : &shared, 0));
    CHECK(vm.map(va + i * 2 * MIB, 2 * MIB, 0, h[i], 0));
  }
  int fd = -1;
  CHECK(export_(&fd, h[2], 1, 0)); // shared with whoever gets the descriptor: it stays
  CHECK(vm.access(va, 6 * MIB, &rw, 1));
  unsigned long long again;
  CHECK(retain(&again, (void *)(uintptr_t)va));
  unsigned char *bytes = malloc(6 * MIB);
  for (size_t i = 0; i < 6 * MIB; i++) bytes[i] = vm_byte(i);
  CHECK(cu.MemcpyHtoD(va, bytes, 6 * MIB));
  // A 4 MiB handle mapped in its first half only: a sleep would copy half of it, so it stays.
  CUdeviceptr half_va;
  unsigned long long half;
  CHECK(vm.reserve(&half_va, 2 * MIB, 0, 0, 0));
  CHECK(vm.create(&half, 4 * MIB, &plain, 0));
  CHECK(vm.map(half_va, 2 * MIB, 0, half, 0));
  CHECK(vm.access(half_va, 2 * MIB, &rw, 1));
  CHECK(cu.MemcpyHtoD(half_va, bytes, 2 * MIB));
  free(bytes);
  size_t before = used(dev);

  int r = sleep_fn(-1);
  print_sleep("vmm_asleep");
  printf("vmm slept=%d dropped=%zu retained_same=%d\n", r, before - used(dev), again == h[0]);
  wake_by(waker);
  unsigned long long mine;
  struct vm_prop got;
  memset(&got, 0, sizeof got);
  int retain_same =
      retain(&mine, (void *)(uintptr_t)(va + 2 * MIB)) == CUDA_SUCCESS && mine == h[1];
  int props_ok = props(&got, h[0]) == CUDA_SUCCESS && got.location_id == dev;
  // A handle made now: a value the program does not hold yet, and it works.
  CHECK(vm.create(&h[3], 2 * MIB, &plain, 0));
  int distinct = h[3] != h[0] && h[3] != h[1] && h[3] != h[2];
  CHECK(vm.map(va + 6 * MIB, 2 * MIB, 0, h[3], 0));
  CHECK(vm.access(va + 6 * MIB, 2 * MIB, &rw, 1));
  CHECK(cu.MemsetD8(va + 6 * MIB, 7, 2 * MIB));
  unsigned char last;
  CHECK(cu.MemcpyDtoH(&last, va + 8 * MIB - 1, 1));
  printf("vmm intact=%d retain_same=%d props=%d distinct=%d new_ok=%d pool=%d partial=%d\n",
         vm_intact(va, 6 * MIB), retain_same, props_ok, distinct, last == 7, all_intact(),
         vm_intact(half_va, 2 * MIB));

  // Again, now that the driver's values differ from the program's.
  r = sleep_fn(-1);
  CHECK(wake_fn(-1));
  printf("vmm again slept=%d intact=%d\n", r, vm_intact(va, 6 * MIB));

  CHECK(unmap(va, 8 * MIB));
  CHECK(unmap(half_va, 2 * MIB));
  CHECK(unreserve(half_va, 2 * MIB));
  int released = release(half) == CUDA_SUCCESS;
  released &= release(h[0]) == CUDA_SUCCESS && release(h[0]) == CUDA_SUCCESS;
  released &= release(h[1]) == CUDA_SUCCESS && release(h[1]) == CUDA_SUCCESS;
  released &= release(h[2]) == CUDA_SUCCESS && release(h[3]) == CUDA_SUCCESS;
  // A release too many is the driver's error, as without cudapool.
  int extra = release(h[0]) != CUDA_SUCCESS;
  CHECK(unreserve(va, 8 * MIB));
  close(fd);
  free_all();
  printf("vmm released=%d extra_refused=%d vm_left=%zu\n", released, extra,
         used(dev) > before ? used(dev) - before : 0);
  return 0;
}

// A context's end while asleep: the reset is work, so the process wakes first (its memory
// back where the context can drop it) and nothing of the dead context stays asleep.
static int sleep_reset(void) {
  get_sleep_api();
  fill_all();
  int r = sleep_fn(-1);
  print_sleep("reset_asleep");
  CHECK(cu.PrimaryCtxReset(dev));
  print_sleep("reset_done");
  CHECK(cu.PrimaryCtxRetain(&primary, dev));
  CHECK(cu.CtxSetCurrent(primary));
  CUdeviceptr p;
  CHECK(cu.MemAlloc(&p, 64 * MIB));
  CHECK(cu.MemsetD8(p, 5, 64 * MIB));
  unsigned char last;
  CHECK(cu.MemcpyDtoH(&last, p + 64 * MIB - 1, 1));
  CHECK(cu.MemFree(p));
  printf("reset slept=%d after_ok=%d\n", r, last == 5);
  return 0;
}

static int suspend_hold(int argc, char **argv) {
  size_t mib = argc > 0 ? (size_t)atoll(argv[0]) : 0;
  if (mib < 8 || mib > 65536 || argc < 2) {
    fprintf(stderr, "client: suspend_hold MIB FILE: MIB in 8-65536\n");
    return 2;
  }
  size_t n = mib / 8;
  struct block *b = calloc(n, sizeof *b);
  for (size_t i = 0; i < n; i++) {
    b[i] = (struct block){0, 8 * MIB, (unsigned char)(i * 13 + 5)};
    CHECK(cu.MemAlloc(&b[i].p, b[i].size));
    fill(&b[i]);
  }
  printf("ready\n");
  int idle = argc > 2 && !strcmp(argv[2], "idle");
  for (unsigned char byte; access(argv[1], F_OK) != 0; usleep(20000))
    if (!idle) CHECK(cu.MemcpyDtoH(&byte, b[0].p, 1));
  int ok = 1;
  for (size_t i = 0; i < n; i++) ok &= intact(&b[i]) && cu.MemFree(b[i].p) == CUDA_SUCCESS;
  printf("suspend_hold intact=%d\n", ok);
  free(b);
  return 0;
}

int sleep_scenario(const char *name, int argc, char **argv) {
  if (!strcmp(name, "suspend_hold")) return suspend_hold(argc, argv);
  if (!strcmp(name, "sleep_reset")) return sleep_reset();
  if (!strcmp(name, "sleep_vmm")) return sleep_vmm(argc > 0 ? argv[0] : "copy");
  if (!strcmp(name, "sleep_idle")) return sleep_idle();
  if (!strcmp(name, "hang_hold")) return hang_hold();
  if (!strcmp(name, "capture_hold")) return capture_hold();
  if (!strcmp(name, "sleep_no_host")) return sleep_no_host();
  if (!strcmp(name, "sleep_wait")) return sleep_wait(argc, argv);
  if (!strcmp(name, "sleep")) return sleep_then(argc > 0 ? argv[0] : "copy");
  if (!strcmp(name, "sleep_busy")) return sleep_busy();
  if (!strcmp(name, "sleep_cost")) return sleep_cost(argc, argv);
  if (!strcmp(name, "sleep_threads")) return sleep_threads();
  if (!strcmp(name, "sleep_free")) return sleep_free();
  if (!strcmp(name, "sleep_capture")) return sleep_capture();
  if (!strcmp(name, "sleep_hold")) return sleep_hold(argc, argv);
  return -1;
}
