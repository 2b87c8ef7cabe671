// Where a sleep's host side goes: 16 threads copy GIB GiB from a 4 MiB source each (as the
// sleep's workers copy out of their pinned slots) into host memory that is (a) fresh, with huge
// pages asked, (b) the same memory again (its pages already there), (c) fresh, 4 KiB pages.
// No GPU: what it measures is the host's, the ceiling of a sleep's copy on this machine.
//   cc -O2 -pthread -o host_copy benches/gpu/host_copy.c && ./host_copy 8
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define THREADS 16
#define PIECE (4ul << 20)

static char *dst;
static size_t total;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *worker(void *arg) {
  long w = (long)arg;
  char *src = malloc(PIECE);
  memset(src, (int)w, PIECE);
  for (size_t off = w * PIECE; off < total; off += THREADS * PIECE)
    memcpy(dst + off, src, total - off < PIECE ? total - off : PIECE);
  free(src);
  return NULL;
}

static double run(void) {
  pthread_t t[THREADS];
  double t0 = now();
  for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)i);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  return total / (now() - t0) / 1e9;
}

static char *fresh(int huge) {
  char *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) exit(1);
  if (huge) madvise(p, total, MADV_HUGEPAGE);
  return p;
}

int main(int argc, char **argv) {
  total = (size_t)(atof(argc > 1 ? argv[1] : "8") * (1ul << 30));
  dst = fresh(1);
  double a = run();
  double b = run();
  munmap(dst, total);
  dst = fresh(0);
  double c = run();
  munmap(dst, total);
  printf("host copy of %.1f GiB on %d threads: fresh huge pages %.1f GB/s, the same pages again %.1f GB/s, fresh 4 KiB pages %.1f GB/s\n",
         total / (double)(1ul << 30), THREADS, a, b, c);
  return 0;
}
