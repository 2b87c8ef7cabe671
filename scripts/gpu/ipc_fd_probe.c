// Facts for exporting mapped (cuMemCreate) memory between processes through POSIX file
// descriptors: can a process take another's descriptor (pidfd_getfd) in each direction, does a
// chunk created for POSIX descriptors cost more, does an exported descriptor keep the memory.
// usage: ipc_fd_probe            (parent: runs everything, spawns itself as the importer)
//        ipc_fd_probe import PID FD   (child)
#define _GNU_SOURCE
#include <cuda.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#define CK(x) do { CUresult r_ = (x); if (r_) { printf("FAIL %s = %d (line %d)\n", #x, r_, __LINE__); exit(1); } } while (0)
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int getfd(int pid, int fd) {
  int pidfd = syscall(SYS_pidfd_open, pid, 0);
  if (pidfd < 0) return -errno * 1000;
  int got = syscall(SYS_pidfd_getfd, pidfd, fd, 0);
  int e = errno;
  close(pidfd);
  return got < 0 ? -e : got;
}
static CUmemAllocationProp prop(int fdtype) {
  CUmemAllocationProp p; memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE; p.location.id = 0;
  p.requestedHandleTypes = fdtype ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return p;
}
static void map_rw(CUdeviceptr va, size_t n, CUmemGenericAllocationHandle h) {
  CK(cuMemMap(va, n, 0, h, 0));
  CUmemAccessDesc a; memset(&a, 0, sizeof a);
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE; a.location.id = 0; a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemSetAccess(va, n, &a, 1));
}
int main(int argc, char **argv) {
  const size_t C = 2 << 20;
  CUcontext ctx; CUdevice dev;
  if (argc == 4) { // importer
    int pid = atoi(argv[2]), fd = atoi(argv[3]);
    int mine = getfd(pid, fd);
    printf("child: pidfd_getfd(parent=%d, fd %d) -> %d%s\n", pid, fd, mine, mine < 0 ? " (negative errno)" : "");
    if (mine < 0) return 3;
    CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
    CUmemGenericAllocationHandle h;
    CK(cuMemImportFromShareableHandle(&h, (void *)(long)mine, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(mine);
    CUmemAllocationProp got; CK(cuMemGetAllocationPropertiesFromHandle(&got, h));
    CUdeviceptr va; CK(cuMemAddressReserve(&va, C, C, 0, 0));
    map_rw(va, C, h); CK(cuMemRelease(h));
    unsigned v = 0; CK(cuMemcpyDtoH(&v, va + 4096, 4));
    printf("child: imported chunk on device %d, word at +4096 = %#x (%s)\n", got.location.id, v, v == 0xc0ffee ? "the exporter's" : "WRONG");
    CK(cuMemsetD32(va, 0xbeef, C / 4)); CK(cuCtxSynchronize());
    CK(cuMemUnmap(va, C)); CK(cuMemAddressFree(va, C));
    return v == 0xc0ffee ? 0 : 4;
  }
  FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  int scope = -1; if (f) { if (fscanf(f, "%d", &scope) != 1) scope = -2; fclose(f); }
  printf("yama ptrace_scope: %d (-1: no Yama)\n", scope);
  // Descriptor taking, both directions, before CUDA.
  int p[2]; if (pipe(p)) return 1;
  pid_t c = fork();
  if (c == 0) { int r = getfd(getppid(), p[0]); printf("child takes parent's fd: %d\n", r); _exit(0); }
  waitpid(c, 0, 0);
  int q[2]; if (pipe(q)) return 1;
  c = fork();
  if (c == 0) { close(q[0]); int dummy[2]; if (pipe(dummy)) _exit(1); char b = dummy[0]; if (write(q[1], &b, 1) != 1) _exit(1); sleep(2); _exit(0); }
  close(q[1]); char b; if (read(q[0], &b, 1) != 1) return 1;
  printf("parent takes child's fd: %d\n", getfd(c, b));
  waitpid(c, 0, 0);

  CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  // Cost of a chunk created for POSIX descriptors against a plain one, interleaved.
  for (int round = 0; round < 3; round++)
    for (int fdtype = 0; fdtype < 2; fdtype++) {
      CUmemAllocationProp pr = prop(fdtype);
      CUmemGenericAllocationHandle hs[200];
      double t0 = now();
      for (int i = 0; i < 200; i++) CK(cuMemCreate(&hs[i], C, &pr, 0));
      double t1 = now();
      for (int i = 0; i < 200; i++) CK(cuMemRelease(hs[i]));
      double t2 = now();
      printf("round %d %s: cuMemCreate %.1f us, cuMemRelease %.1f us per 2 MiB chunk\n", round, fdtype ? "posix-fd" : "plain   ", (t1 - t0) / 200 * 1e6, (t2 - t1) / 200 * 1e6);
    }
  // Export of a plain chunk.
  CUmemAllocationProp plain = prop(0), fdp = prop(1);
  CUmemGenericAllocationHandle h; int fd = -1;
  CK(cuMemCreate(&h, C, &plain, 0));
  printf("export of a plain chunk: %d\n", cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CK(cuMemRelease(h));
  // Map, release the handle (as cudapool does), retain it back from the address, export.
  CUdeviceptr va; CK(cuMemAddressReserve(&va, C, C, 0, 0));
  CK(cuMemCreate(&h, C, &fdp, 0)); map_rw(va, C, h); CK(cuMemRelease(h));
  CK(cuMemsetD32(va, 0xc0ffee, C / 4)); CK(cuCtxSynchronize());
  CUmemGenericAllocationHandle back; CK(cuMemRetainAllocationHandle(&back, (void *)va));
  CK(cuMemExportToShareableHandle(&fd, back, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CK(cuMemRelease(back));
  char link[64], target[256] = {0}; snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof target - 1); (void)n;
  printf("exported fd %d -> %s\n", fd, target);
  char sfd[16], spid[16]; snprintf(sfd, sizeof sfd, "%d", fd); snprintf(spid, sizeof spid, "%d", getpid());
  fflush(stdout);
  c = fork();
  if (c == 0) { execl("/proc/self/exe", argv[0], "import", spid, sfd, (char *)0); _exit(127); }
  int st; waitpid(c, &st, 0);
  unsigned v = 0; CK(cuMemcpyDtoH(&v, va + 4096, 4));
  printf("importer exit %d; exporter reads %#x after the importer's memset (%s)\n", WEXITSTATUS(st), v, v == 0xbeef ? "shared" : "not shared");
  // Does the open descriptor keep the memory once unmapped?
  size_t free0, free1, free2, tot;
  CK(cuMemGetInfo(&free0, &tot));
  CK(cuMemUnmap(va, C));
  CK(cuMemGetInfo(&free1, &tot));
  close(fd);
  CK(cuMemGetInfo(&free2, &tot));
  printf("free after unmap with fd open: %+ld KiB; after close(fd): %+ld KiB\n", (long)(free1 - free0) / 1024, (long)(free2 - free0) / 1024);
  CK(cuMemAddressFree(va, C));
  return 0;
}
