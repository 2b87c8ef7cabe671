// A fake libnvidia-ml.so.1 for the tests (tests/preload.rs, issue 35): the few NVML entry
// points a program asks for its GPUs' memory. Its devices are the fake driver's
// (tests/fake/libcuda.c): FAKECU_DEVICES of them (default 2), NVML index = the physical index,
// the same UUIDs (fa ce 00 <index> ...), FAKECU_TOTAL_MEM bytes each (default 1 GiB), of which
// FAKENVML_USED bytes (default 100 MiB) are used by "other processes" and 8 MiB reserved by the
// driver. With FAKENVML_CONTEXT=N, the calling process is listed among the compute processes of
// each GPU, holding N bytes (its "context") plus what the fake driver holds for it there. With
// FAKECU_BOARD=DIR (the fake driver's record of every process, tests/fake/libcuda.c), every
// live process recorded there is listed with what the driver holds for it (no context); with
// FAKECU_SHARED=1 too, nvmlDeviceGetMemoryInfo counts those processes' memory as the used.
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int nvmlReturn_t;
typedef struct fake_nvml_dev *nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

struct fake_nvml_dev {
  int index;
};
static struct fake_nvml_dev devs[16];
static int inited;

static int ndev(void) {
  const char *d = getenv("FAKECU_DEVICES");
  int n = d ? atoi(d) : 2;
  return n < 1 ? 1 : n > 16 ? 16 : n;
}
static unsigned long long total_mem(void) {
  const char *m = getenv("FAKECU_TOTAL_MEM");
  return m ? strtoull(m, NULL, 10) : 1ull << 30;
}
static unsigned long long used_mem(void) {
  const char *u = getenv("FAKENVML_USED");
  return u ? strtoull(u, NULL, 10) : 100ull << 20;
}
#define RESERVED (8ull << 20)

nvmlReturn_t nvmlInit_v2(void) {
  inited = 1;
  for (int i = 0; i < 16; i++) devs[i].index = i;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
nvmlReturn_t nvmlShutdown(void) {
  inited = 0;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
  if (!inited) return NVML_ERROR_UNINITIALIZED;
  if (!n) return NVML_ERROR_INVALID_ARGUMENT;
  *n = (unsigned)ndev();
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
  if (!inited) return NVML_ERROR_UNINITIALIZED;
  if (!d || i >= (unsigned)ndev()) return NVML_ERROR_INVALID_ARGUMENT;
  *d = &devs[i];
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) {
  return nvmlDeviceGetHandleByIndex_v2(i, d);
}
static int valid(nvmlDevice_t d) { return inited && d >= devs && d < devs + ndev(); }

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
  if (!valid(d) || !uuid) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned char u[16] = {0xfa, 0xce, 0, (unsigned char)d->index};
  for (int i = 4; i < 16; i++) u[i] = (unsigned char)(0x11 * (i - 3) + d->index);
  char s[64];
  snprintf(s, sizeof s,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
           u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
           u[14], u[15]);
  if (strlen(s) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  strcpy(uuid, s);
  return NVML_SUCCESS;
}
// Each live process of the fake driver's record (FAKECU_BOARD, tests/fake/libcuda.c) that holds
// memory on device `index`: `each(pid, bytes, arg)`. 0 without a board.
static int board_each(int index, void (*each)(long, unsigned long long, void *), void *arg) {
  const char *board = getenv("FAKECU_BOARD");
  if (!board) return 0;
  if (index >= 8) return 1;
  DIR *dir = opendir(board);
  struct dirent *e;
  while (dir && (e = readdir(dir))) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end || pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno != EPERM)) continue;
    unsigned long long words[8] = {0};
    int fd = openat(dirfd(dir), e->d_name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t got = pread(fd, words, sizeof words, 0);
    close(fd);
    if (got == (ssize_t)sizeof words && words[index]) each(pid, words[index], arg);
  }
  if (dir) closedir(dir);
  return 1;
}

static void add_up(long pid, unsigned long long bytes, void *sum) {
  (void)pid;
  *(unsigned long long *)sum += bytes;
}

// With a shared board (FAKECU_SHARED=1), what every live process of the board holds on device
// `index`, as the driver's record says: then that is what the device's "other processes" use.
static int board_used(int index, unsigned long long *sum) {
  const char *sh = getenv("FAKECU_SHARED");
  *sum = 0;
  return sh && !strcmp(sh, "1") && board_each(index, add_up, sum);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
  if (!valid(d) || !m) return NVML_ERROR_INVALID_ARGUMENT;
  m->total = total_mem();
  unsigned long long shared;
  m->used = (board_used(d->index, &shared) ? shared : used_mem()) + RESERVED;
  m->free = m->total - m->used;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
  if (!valid(d) || !m) return NVML_ERROR_INVALID_ARGUMENT;
  if (m->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  m->total = total_mem();
  m->reserved = RESERVED;
  m->used = used_mem();
  m->free = m->total - m->reserved - m->used;
  return NVML_SUCCESS;
}
const char *nvmlErrorString(nvmlReturn_t r) { return r == NVML_SUCCESS ? "Success" : "Error"; }

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
  if (!inited || !uuid || !d) return NVML_ERROR_INVALID_ARGUMENT;
  for (int i = 0; i < ndev(); i++) {
    char s[64];
    if (nvmlDeviceGetUUID(&devs[i], s, sizeof s) == NVML_SUCCESS && !strcmp(s, uuid)) {
      *d = &devs[i];
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_INVALID_ARGUMENT;
}

typedef struct {
  unsigned int pid;
  unsigned long long used;
  unsigned int gpu_instance, compute_instance;
} nvmlProcessInfo_t;

struct listing {
  unsigned int n, room;
  nvmlProcessInfo_t *infos;
};

static void list_one(long pid, unsigned long long bytes, void *arg) {
  struct listing *l = arg;
  // FAKENVML_USED_NA=1: NVML lists the process but not its memory (NVML_VALUE_NOT_AVAILABLE, as
  // under some virtual GPUs).
  const char *na = getenv("FAKENVML_USED_NA");
  unsigned long long u = na && !strcmp(na, "1") ? ~0ULL : bytes;
  if (l->n < l->room) l->infos[l->n] = (nvmlProcessInfo_t){(unsigned int)pid, u, 0, 0};
  l->n++;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
  if (!valid(d) || !count) return NVML_ERROR_INVALID_ARGUMENT;
  struct listing list = {0, infos ? *count : 0, infos};
  if (board_each(d->index, list_one, &list)) {
    *count = list.n;
    return list.n <= list.room ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
  }
  const char *c = getenv("FAKENVML_CONTEXT");
  if (!c) {
    *count = 0;
    return NVML_SUCCESS;
  }
  if (*count < 1 || !infos) {
    *count = 1;
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  size_t (*held)(int) = (size_t(*)(int))dlsym(RTLD_DEFAULT, "fakecu_used");
  infos[0] = (nvmlProcessInfo_t){(unsigned int)getpid(), strtoull(c, NULL, 10) + (held ? held(d->index) : 0), 0, 0};
  *count = 1;
  return NVML_SUCCESS;
}
