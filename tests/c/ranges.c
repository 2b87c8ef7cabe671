// What the driver's address queries answer about pooled blocks and about memory cudapool never
// handed out (pinned host memory mapped for the device). Reaches the driver the way frameworks
// do (dlsym on its handle, or cuGetProcAddress_v2 like the CUDA runtime) and prints key=value
// lines the tests read. Run it with and without cudapool: for memory cudapool did not hand
// out, the two outputs must be the same.
//
// usage: ranges dlsym|gpa blocks|host|ipc|ipc-large|ipc-forged|ipc-cross
//        ranges dlsym|gpa ipc-import HEX SIZE   (ipc-cross's importer: a process of its own)
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
enum { RANGE_START = 11, RANGE_SIZE = 12, MEMORY_TYPE = 2 };

static void *driver;
static const char *mode;

typedef CUresult (*gpa_t)(const char *, void **, int, unsigned long long, int *);
static void *get(const char *base, int version, const char *exported) {
  if (!strcmp(mode, "dlsym")) {
    void *p = dlsym(driver, exported);
    if (!p) fprintf(stderr, "ranges: no %s\n", exported), exit(4);
    return p;
  }
  static gpa_t gpa;
  if (!gpa) gpa = (gpa_t)dlsym(driver, "cuGetProcAddress_v2");
  void *p = NULL;
  int status = -1;
  if (gpa(base, &p, version, 0, &status) || status || !p)
    fprintf(stderr, "ranges: no %s@%d\n", base, version), exit(4);
  return p;
}

#define CHECK(call)                                                              \
  do {                                                                           \
    CUresult r_ = (call);                                                        \
    if (r_) {                                                                    \
      fprintf(stderr, "ranges: %s failed: %d (line %d)\n", #call, r_, __LINE__); \
      exit(3);                                                                   \
    }                                                                            \
  } while (0)

static CUresult (*MemAlloc)(CUdeviceptr *, size_t);
static CUresult (*MemFree)(CUdeviceptr);
static CUresult (*Range)(CUdeviceptr *, size_t *, CUdeviceptr);
static CUresult (*Attr)(void *, int, CUdeviceptr);
static CUresult (*Attrs)(unsigned, int *, void **, CUdeviceptr);
static CUresult (*Ipc)(void *, CUdeviceptr);
struct handle {
  unsigned char bytes[64];
};
static CUresult (*IpcOpen)(CUdeviceptr *, struct handle, unsigned);
static CUresult (*IpcClose)(CUdeviceptr);
static CUresult (*Memset)(CUdeviceptr, unsigned char, size_t);
static CUresult (*DtoH)(void *, CUdeviceptr, size_t);

static void setup(void) {
  driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!driver) fprintf(stderr, "ranges: %s\n", dlerror()), exit(2);
  CUresult (*Init)(unsigned) = get("cuInit", 2000, "cuInit");
  CUresult (*Retain)(void **, int) = get("cuDevicePrimaryCtxRetain", 7000, "cuDevicePrimaryCtxRetain");
  CUresult (*SetCurrent)(void *) = get("cuCtxSetCurrent", 4000, "cuCtxSetCurrent");
  void *ctx;
  CHECK(Init(0));
  CHECK(Retain(&ctx, 0));
  CHECK(SetCurrent(ctx));
  MemAlloc = get("cuMemAlloc", 3020, "cuMemAlloc_v2");
  MemFree = get("cuMemFree", 3020, "cuMemFree_v2");
  Range = get("cuMemGetAddressRange", 3020, "cuMemGetAddressRange_v2");
  Attr = get("cuPointerGetAttribute", 4000, "cuPointerGetAttribute");
  Attrs = get("cuPointerGetAttributes", 7000, "cuPointerGetAttributes");
  Ipc = get("cuIpcGetMemHandle", 4010, "cuIpcGetMemHandle");
  IpcOpen = get("cuIpcOpenMemHandle", 11000, "cuIpcOpenMemHandle_v2");
  IpcClose = get("cuIpcCloseMemHandle", 4010, "cuIpcCloseMemHandle");
  Memset = get("cuMemsetD8", 3020, "cuMemsetD8_v2");
  DtoH = get("cuMemcpyDtoH", 3020, "cuMemcpyDtoH_v2");
}

// Every query about the allocation holding p, relative to `start`, on one line.
static void describe(const char *tag, CUdeviceptr p, CUdeviceptr start) {
  CUdeviceptr base = 0, astart = 0;
  size_t size = 0, asize = 0;
  CUresult r = Range(&base, &size, p);
  CUresult ra = Attr(&astart, RANGE_START, p);
  CUresult rs = Attr(&asize, RANGE_SIZE, p);
  int attrs[3] = {RANGE_START, RANGE_SIZE, MEMORY_TYPE};
  CUdeviceptr mstart = 1;
  size_t msize = 1;
  unsigned type = 0;
  void *data[3] = {&mstart, &msize, &type};
  CUresult rm = Attrs(3, attrs, data, p);
  printf("%s range_rc=%d base_off=%lld size=%zu attr_rc=%d,%d attr_off=%lld attr_size=%zu "
         "attrs_rc=%d attrs_off=%lld attrs_size=%zu type=%u\n",
         tag, r, r ? 0 : (long long)(base - start), size, ra, rs,
         ra ? 0 : (long long)(astart - start), asize, rm,
         mstart ? (long long)(mstart - start) : -1, msize, type);
}

// Two small blocks (under `split`, neighbours in one segment). The program sizes each from
// the address queries and sets all of it, as Numba's device_memset(a, 0, device_memory_size(a))
// does: that must work and must leave the other block's bytes alone.
static int blocks(void) {
  CUdeviceptr a, b;
  CHECK(MemAlloc(&a, 1000));
  CHECK(MemAlloc(&b, 1000));
  CHECK(Memset(a, 0xaa, 1000));
  CHECK(Memset(b, 0xbb, 1000));
  describe("a", a + 100, a);
  describe("b", b + 10, b);
  size_t sa = 0, sb = 0;
  CUdeviceptr base;
  CHECK(Range(&base, &sa, a));
  CHECK(Range(&base, &sb, b));
  CUresult ma = Memset(a, 0, sa);
  CUresult mb = Memset(b, 0x11, sb);
  unsigned char ha[1000], hb[1000];
  CHECK(DtoH(ha, a, sizeof ha));
  CHECK(DtoH(hb, b, sizeof hb));
  int a_ok = 1, b_ok = 1;
  for (int i = 0; i < 1000; i++) {
    a_ok &= ha[i] == 0;
    b_ok &= hb[i] == (mb ? 0xbb : 0x11);
  }
  printf("memset a_rc=%d b_rc=%d a_ok=%d b_ok=%d\n", ma, mb, a_ok, b_ok);
  unsigned char handle[64];
  printf("ipc a_rc=%d b_rc=%d a_interior_rc=%d\n", Ipc(handle, a), Ipc(handle, b),
         Ipc(handle, a + 100));
  CHECK(MemFree(b));
  describe("freed_b", b + 10, b);
  CHECK(MemFree(a));
  return 0;
}

// Pinned host memory mapped for the device: cudapool never handed it out, so every answer is
// the driver's own; a memset of its whole range and a free through cuMemFree (the program's
// mistake) get exactly what the driver gives.
static int host(void) {
  CUresult (*HostAlloc)(void **, size_t, unsigned) = get("cuMemHostAlloc", 2020, "cuMemHostAlloc");
  CUresult (*HostPtr)(CUdeviceptr *, void *, unsigned) =
      get("cuMemHostGetDevicePointer", 3020, "cuMemHostGetDevicePointer_v2");
  CUresult (*FreeHost)(void *) = get("cuMemFreeHost", 2000, "cuMemFreeHost");
  void *h;
  CUdeviceptr d;
  CHECK(HostAlloc(&h, 40, 0x2 /* CU_MEMHOSTALLOC_DEVICEMAP */));
  memset(h, 123, 40);
  CHECK(HostPtr(&d, h, 0));
  describe("host", d + 4, d);
  size_t size = 0;
  CUdeviceptr base;
  CHECK(Range(&base, &size, d));
  CUresult m = Memset(d, 0, size);
  int zero = 1;
  for (int i = 0; i < 40; i++) zero &= ((unsigned char *)h)[i] == 0;
  unsigned char handle[64];
  printf("host_memset rc=%d zeroed=%d ipc_rc=%d free_rc=%d\n", m, zero, Ipc(handle, d),
         MemFree(d));
  CHECK(FreeHost(h));
  return 0;
}

// Legacy IPC of two blocks (under `split`, the second lies inside the first one's segment), as
// Numba does it: export the start cuMemGetAddressRange gives, send the pointer's offset from
// it, and add that offset to what the importer's open returns. The fake driver lets a process
// open its own handles and maps them at the same address, so the importer's address must be
// the block's own.
static int ipc(void) {
  CUdeviceptr a, b;
  CHECK(MemAlloc(&a, 1000));
  CHECK(MemAlloc(&b, 1000));
  CHECK(Memset(b, 0x5c, 1000));
  struct handle ha, hb, hb2;
  CUdeviceptr base;
  size_t size;
  CHECK(Range(&base, &size, b + 40));
  CHECK(Ipc(&hb, base));
  CHECK(Ipc(&hb2, b + 40));
  CHECK(Ipc(&ha, a));
  CUdeviceptr pa, pb, pb2;
  CHECK(IpcOpen(&pb, hb, 1));
  CHECK(IpcOpen(&pa, ha, 1));
  CHECK(IpcOpen(&pb2, hb2, 1));
  unsigned char v = 0;
  CHECK(DtoH(&v, pb + (b + 40 - base), 1));
  int (*opens)(void) = (int (*)(void))dlsym(driver, "fakecu_ipc_opens");
  printf("ipc same_handle=%d b_at_block=%d a_at_block=%d b2_at_block=%d value=%#x opens=%d\n",
         !memcmp(&hb, &hb2, sizeof hb), pb == b, pa == a, pb2 == b, v, opens ? opens() : -1);
  CUresult c1 = IpcClose(pb), c2 = IpcClose(pb2), c3 = IpcClose(pa), c4 = IpcClose(pa);
  printf("closed rc=%d,%d,%d,%d opens=%d\n", c1, c2, c3, c4, opens ? opens() : -1);
  CHECK(MemFree(a));
  CHECK(MemFree(b));
  return 0;
}

// A handle forged from a real one: its offset (cudapool's tag in the last 8 bytes) moved far
// past the segment, then onto another buffer of this process. cudapool must check the offset
// against the segment the driver reports and refuse both, never hand out such an address.
static CUresult forged_open(struct handle h, unsigned long long offset, CUdeviceptr *p) {
  unsigned long long tail = (0xc0deull << 48) | offset;
  memcpy((char *)&h + 56, &tail, 8);
  *p = 0;
  return IpcOpen(p, h, 1);
}
static int ipc_forged(void) {
  CUdeviceptr a, b, c;
  // The fake maps later allocations below earlier ones: c first, so it lies above b's segment.
  CHECK(MemAlloc(&c, 8 << 20));
  CHECK(MemAlloc(&a, 1000));
  CHECK(MemAlloc(&b, 1000));
  CHECK(Memset(c, 0xaa, 4096));
  struct handle hb;
  CHECK(Ipc(&hb, b));
  // The segment's start: b less the offset its handle carries.
  unsigned long long tail;
  memcpy(&tail, (char *)&hb + 56, 8);
  CUdeviceptr base = b - (tail & ((1ull << 48) - 1)), pf = 0, pc = 0;
  CUresult far = forged_open(hb, 1ull << 47, &pf);
  CUresult alias = c > base ? forged_open(hb, c - base, &pc) : -1;
  if (pc) Memset(pc, 0x11, 4096);
  unsigned char v = 0;
  CHECK(DtoH(&v, c, 1));
  printf("forged far_rc=%d alias_rc=%d alias_is_c=%d c_byte=%#x\n", far, alias, pc == c && pc, v);
  CHECK(MemFree(c));
  CHECK(MemFree(b));
  CHECK(MemFree(a));
  return 0;
}

// Legacy IPC of large blocks: under CUDAPOOL_SEGMENTS=expandable the first lies in mapped
// memory, which has no legacy handle; the export is refused and later blocks come from classic
// segments, whose export works.
static int ipc_large(void) {
  CUdeviceptr a, b;
  CHECK(MemAlloc(&a, 8 << 20));
  struct handle ha, hb;
  CUresult ra = Ipc(&ha, a);
  CHECK(MemAlloc(&b, 8 << 20));
  CHECK(Memset(b, 0x5c, 8 << 20));
  CUresult rb = Ipc(&hb, b);
  CUdeviceptr pb = 0;
  unsigned char v = 0;
  if (!rb) {
    CHECK(IpcOpen(&pb, hb, 1));
    CHECK(DtoH(&v, pb + 100, 1));
    CHECK(IpcClose(pb));
  }
  printf("ipc_large a_rc=%d b_rc=%d b_at_block=%d value=%#x\n", ra, rb, pb == b, v);
  CHECK(MemFree(a));
  CHECK(MemFree(b));
  return 0;
}

// ---- legacy IPC of a block of an expandable segment, across processes --------------------
// Descriptors of this process whose target names `what`.
static int open_fds(const char *what) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  char link[300], target[300];
  for (struct dirent *e; d && (e = readdir(d));) {
    snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
    ssize_t len = readlink(link, target, sizeof target - 1);
    if (len > 0) target[len] = 0, n += strstr(target, what) != NULL;
  }
  if (d) closedir(d);
  return n;
}

// cudapool's descriptors: its export tables, and the chunks' descriptors it exported (the
// fake's chunks are memfds of their own too: those it holds are not counted).
static int exported_fds(void) {
  int (*own)(void) = (int (*)(void))dlsym(driver, "fakecu_chunk_memfds");
  return open_fds("memfd:cudapool-ipc") + open_fds("memfd:fakecu-chunk") - (own ? own() : 0);
}

// Runs this program as `ipc-import HEX SIZE` (with or without the shim, as `preload` says)
// and returns its exit status; its output goes to ours.
static int importer(const char *self_mode, const struct handle *h, size_t size, int preload) {
  char hex[129], sz[32];
  for (int i = 0; i < 64; i++) sprintf(hex + 2 * i, "%02x", h->bytes[i]);
  snprintf(sz, sizeof sz, "%zu", size);
  fflush(stdout);
  pid_t c = fork();
  if (c == 0) {
    if (!preload) unsetenv("LD_PRELOAD");
    execl("/proc/self/exe", "ranges", self_mode, "ipc-import", hex, sz, (char *)0);
    _exit(127);
  }
  int st = 0;
  waitpid(c, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int ipc_import(const char *hex, size_t size) {
  struct handle h;
  for (int i = 0; i < 64; i++) sscanf(hex + 2 * i, "%2hhx", &h.bytes[i]);
  CUdeviceptr p = 0, q = 0;
  CUresult r = IpcOpen(&p, h, 1);
  if (r) {
    printf("import open_rc=%d\n", r);
    return 0;
  }
  unsigned char first = 0, last = 0;
  CHECK(DtoH(&first, p + 100, 1));
  CHECK(DtoH(&last, p + size - 1, 1));
  CHECK(Memset(p, 0x3d, size));
  CUresult r2 = IpcOpen(&q, h, 1);
  CUresult c1 = IpcClose(p), c2 = IpcClose(q), c3 = IpcClose(p);
  printf("import open_rc=0 first=%#x last=%#x again_rc=%d same=%d closes=%d,%d,%d\n", first, last,
         r2, q == p, c1, c2, c3 != 0);
  return 0;
}

static int ipc_cross(void) {
  int fds0 = exported_fds();
  CUdeviceptr a, b;
  size_t size = (5 << 20) + 4096;
  CHECK(MemAlloc(&a, 3 << 20));
  CHECK(MemAlloc(&b, size));
  CHECK(Memset(b, 0x5c, size));
  struct handle h, h2;
  CUresult rc = Ipc(&h, b);
  CUresult rc2 = Ipc(&h2, b);
  int fds1 = exported_fds();
  printf("export rc=%d again_rc=%d same_handle=%d fds_held=%d\n", rc, rc2,
         !memcmp(&h, &h2, sizeof h), fds1 - fds0);
  if (rc) return 0;
  int with = importer(mode, &h, size, 1);
  unsigned char v = 0;
  CHECK(DtoH(&v, b + 100, 1));
  int without = importer(mode, &h, size, 0);
  printf("parent importer_exit=%d bare_exit=%d value=%#x\n", with, without, v);
  CHECK(MemFree(a));
  CHECK(MemFree(b));
  size_t (*reclaim)(int) = (size_t (*)(int))dlsym(RTLD_DEFAULT, "cudapool_reclaim");
  if (reclaim) reclaim(0);
  int fds2 = exported_fds();
  int stale = importer(mode, &h, size, 1);
  printf("after fds_left=%d stale_exit=%d\n", fds2 - fds0, stale);
  // A block exported, then its context reset: the exports go with the context's memory.
  CUresult (*Reset)(int) = get("cuDevicePrimaryCtxReset", 11000, "cuDevicePrimaryCtxReset_v2");
  CHECK(MemAlloc(&b, size));
  CHECK(Ipc(&h, b));
  int fds3 = exported_fds();
  CHECK(Reset(0));
  printf("reset fds_held=%d fds_left=%d\n", fds3 - fds0, exported_fds() - fds0);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) return fprintf(stderr, "usage: ranges dlsym|gpa blocks|host|ipc|ipc-large\n"), 2;
  mode = argv[1];
  setup();
  if (!strcmp(argv[2], "blocks")) return blocks();
  if (!strcmp(argv[2], "host")) return host();
  if (!strcmp(argv[2], "ipc")) return ipc();
  if (!strcmp(argv[2], "ipc-large")) return ipc_large();
  if (!strcmp(argv[2], "ipc-forged")) return ipc_forged();
  if (!strcmp(argv[2], "ipc-cross")) return ipc_cross();
  if (!strcmp(argv[2], "ipc-import") && argc == 5) return ipc_import(argv[3], strtoull(argv[4], 0, 10));
  fprintf(stderr, "ranges: unknown scenario %s\n", argv[2]);
  return 2;
}
