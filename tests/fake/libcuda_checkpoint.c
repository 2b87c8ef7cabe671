// Part of the fake driver (tests/fake/libcuda.c includes it; not compiled on its own): the
// checkpoint API (cuCheckpointProcess*, CUDA 12.8 drivers), by which one process (root's
// arbiter) has the driver move another's device memory to that process's host memory.
//
// As the real driver does it, the work happens inside the target: with a shared board
// (FAKECU_BOARD and FAKECU_SHARED=1) each process keeps a page BOARD/<pid>.ckpt (mode 0600: only
// its user and root reach it) and a thread of the driver's that serves it. A controller writes
// an operation into the page and waits for the answer. The rules modelled:
// - states running → locked → checkpointed → (restore) locked → (unlock) running; any other
//   order is CUDA_ERROR_ILLEGAL_STATE;
// - lock waits (at most the args' timeoutMs, 0: no limit) for the call holding the driver's
//   mutex, and from then on every call that takes the mutex waits until the process runs again
//   (`ck_lock_mu`): nothing changes the driver's state while it is locked;
// - checkpoint gives the process's device memory back (others can take it; NVML lists it no
//   more) and keeps the contents (device memory is host memory here, the process's own);
// - restore needs the room again: CUDA_ERROR_OUT_OF_MEMORY leaves it checkpointed;
// - a process the controller may not signal is CUDA_ERROR_NOT_PERMITTED; one without a page
//   (no CUDA, no shared board) CUDA_ERROR_INVALID_VALUE.
#include <linux/futex.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <time.h>

enum { CK_RUNNING = 0, CK_LOCKED = 1, CK_CHECKPOINTED = 2 };
enum { CK_OP_LOCK = 1, CK_OP_CHECKPOINT, CK_OP_RESTORE, CK_OP_UNLOCK };
enum { CUDA_ERROR_ILLEGAL_STATE = 401, CUDA_ERROR_NOT_PERMITTED = 800, CUDA_ERROR_TIMEOUT = 909 };

struct ck_page {
  _Atomic int state;
  _Atomic int op, arg, result;
  _Atomic unsigned seq, done; // a request is posted when seq moves, answered when done = seq
  size_t saved[MAX_DEV];
};

static struct ck_page *ck;
static _Atomic long ck_tid;

static void futex_wait(_Atomic unsigned *w, unsigned v, int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000};
  syscall(SYS_futex, w, FUTEX_WAIT, v, ms > 0 ? &t : NULL, NULL, 0);
}
static void futex_wake(_Atomic unsigned *w) { syscall(SYS_futex, w, FUTEX_WAKE, 1 << 30, NULL, NULL, 0); }

static int ck_lock_mu(pthread_mutex_t *m) {
  for (;;) {
    int r = (pthread_mutex_lock)(m);
    if (m != &mu || !ck || ck->state == CK_RUNNING || syscall(SYS_gettid) == ck_tid) return r;
    pthread_mutex_unlock(m);
    while (ck->state != CK_RUNNING) futex_wait((_Atomic unsigned *)&ck->state, (unsigned)ck->state, 100);
  }
}

static int ck_do(int op, int arg) {
  switch (op) {
  case CK_OP_LOCK: {
    if (ck->state != CK_RUNNING) return CUDA_ERROR_ILLEGAL_STATE;
    ck->state = CK_LOCKED;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += arg > 0 ? arg / 1000 : 3600;
    until.tv_nsec += arg > 0 ? (long)(arg % 1000) * 1000000 : 0;
    if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
    if (pthread_mutex_timedlock(&mu, &until) != 0) {
      ck->state = CK_RUNNING;
      futex_wake((_Atomic unsigned *)&ck->state);
      return CUDA_ERROR_TIMEOUT;
    }
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
  }
  case CK_OP_CHECKPOINT:
    if (ck->state != CK_LOCKED) return CUDA_ERROR_ILLEGAL_STATE;
    (pthread_mutex_lock)(&mu);
    for (int d = 0; d < MAX_DEV; d++) ck->saved[d] = used[d], used[d] = 0;
    ck->state = CK_CHECKPOINTED;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
  case CK_OP_RESTORE: {
    if (ck->state != CK_CHECKPOINTED) return CUDA_ERROR_ILLEGAL_STATE;
    (pthread_mutex_lock)(&mu);
    int fits = 1;
    for (int d = 0; d < ndev; d++) fits &= taken(d) + ck->saved[d] <= total_mem;
    if (fits) {
      for (int d = 0; d < MAX_DEV; d++) used[d] = ck->saved[d], ck->saved[d] = 0;
      ck->state = CK_LOCKED;
    }
    pthread_mutex_unlock(&mu);
    return fits ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  }
  case CK_OP_UNLOCK:
    if (ck->state != CK_LOCKED) return CUDA_ERROR_ILLEGAL_STATE;
    ck->state = CK_RUNNING;
    futex_wake((_Atomic unsigned *)&ck->state);
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

static void *ck_serve(void *unused) {
  (void)unused;
  ck_tid = syscall(SYS_gettid);
  for (;;) {
    unsigned s = ck->seq;
    if (s == ck->done) {
      futex_wait(&ck->seq, s, 0);
      continue;
    }
    ck->result = ck_do(ck->op, ck->arg);
    ck->done = s;
    futex_wake(&ck->done);
  }
  return NULL;
}

// This process's page and thread (cuInit, with a shared board; under `mu`).
static void ck_start(const char *board) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%d.ckpt", board, (int)getpid());
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return;
  if (ftruncate(fd, sizeof(struct ck_page)) == 0) {
    void *p = mmap(NULL, sizeof(struct ck_page), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      ck = p;
      pthread_t t;
      if (pthread_create(&t, NULL, ck_serve, NULL) == 0) pthread_detach(t);
      else ck = NULL;
    }
  }
  close(fd);
}

// The controller's side: process `pid`'s page, mapped, or an error.
static CUresult ck_open(int pid, struct ck_page **out, int *fd) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (pid <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (kill(pid, 0) != 0) return errno == EPERM ? CUDA_ERROR_NOT_PERMITTED : CUDA_ERROR_INVALID_VALUE;
  const char *board = getenv("FAKECU_BOARD");
  if (!board) return CUDA_ERROR_INVALID_VALUE;
  char path[4096];
  snprintf(path, sizeof path, "%s/%d.ckpt", board, pid);
  *fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (*fd < 0) return errno == EACCES ? CUDA_ERROR_NOT_PERMITTED : CUDA_ERROR_INVALID_VALUE;
  void *p = mmap(NULL, sizeof(struct ck_page), PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  if (p == MAP_FAILED) {
    close(*fd);
    return CUDA_ERROR_INVALID_VALUE;
  }
  *out = p;
  return CUDA_SUCCESS;
}

static CUresult ck_request(int pid, int op, int arg) {
  struct ck_page *p;
  int fd;
  CUresult r = ck_open(pid, &p, &fd);
  if (r) return r;
  flock(fd, LOCK_EX); // one controller at a time
  p->op = op;
  p->arg = arg;
  unsigned s = p->seq + 1;
  p->seq = s;
  futex_wake(&p->seq);
  for (int waited = 0; p->done != s; waited += 100) {
    if (waited > 60000 || kill(pid, 0) != 0) {
      r = CUDA_ERROR_TIMEOUT;
      break;
    }
    futex_wait(&p->done, p->done, 100);
  }
  if (p->done == s) r = p->result;
  flock(fd, LOCK_UN);
  munmap(p, sizeof *p);
  close(fd);
  return r;
}

typedef struct {
  unsigned timeoutMs, reserved0;
  unsigned long long reserved1[7];
} CUcheckpointLockArgs;

CUresult cuCheckpointProcessGetState(int pid, int *state) {
  count("cuCheckpointProcessGetState");
  if (!state) return CUDA_ERROR_INVALID_VALUE;
  struct ck_page *p;
  int fd;
  CUresult r = ck_open(pid, &p, &fd);
  if (r) return r;
  *state = p->state;
  munmap(p, sizeof *p);
  close(fd);
  return CUDA_SUCCESS;
}
CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args) {
  count("cuCheckpointProcessLock");
  if (args && (args->reserved0 || args->reserved1[0])) return CUDA_ERROR_INVALID_VALUE;
  return ck_request(pid, CK_OP_LOCK, args ? (int)args->timeoutMs : 0);
}
CUresult cuCheckpointProcessCheckpoint(int pid, void *args) {
  count("cuCheckpointProcessCheckpoint");
  (void)args;
  return ck_request(pid, CK_OP_CHECKPOINT, 0);
}
CUresult cuCheckpointProcessRestore(int pid, void *args) {
  count("cuCheckpointProcessRestore");
  (void)args;
  return ck_request(pid, CK_OP_RESTORE, 0);
}
CUresult cuCheckpointProcessUnlock(int pid, void *args) {
  count("cuCheckpointProcessUnlock");
  (void)args;
  return ck_request(pid, CK_OP_UNLOCK, 0);
}
