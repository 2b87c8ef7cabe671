// How fast 16 threads can copy into fresh anonymous memory (what a first sleep's host copy is),
// by the way the pages are asked for; no GPU: the host's side of a sleep alone. Each thread
// copies 4 MiB pieces from a buffer of its own (standing for its pinned slot) into its share of
// GIB GiB. Ways: thp (MADV_HUGEPAGE, what cudapool does), 4k (no advice), populate (the pages
// made first by MADV_POPULATE_WRITE on the same threads, then the copy: both timed), again
// (into the same memory a second time: pages already there). Prints GB/s and the huge pages
// the kernel gave (AnonHugePages).
//   cc -O2 -pthread -o fresh_pages benches/host/fresh_pages.c && ./fresh_pages 16 3
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define THREADS 16
#define PIECE (4ul << 20)

static char *dst;
static size_t total;
static int populate;
static char *src[THREADS];

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static void *work(void *arg) {
  long w = (long)arg;
  size_t share = total / THREADS;
  char *mine = dst + w * share;
  if (populate == 1) {
    madvise(mine, share, MADV_POPULATE_WRITE);
    return NULL;
  }
  for (size_t off = 0; off < share; off += PIECE) memcpy(mine + off, src[w], PIECE);
  return NULL;
}

static double run(void) {
  pthread_t t[THREADS];
  double t0 = now();
  for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, work, (void *)i);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  return now() - t0;
}

static long huge_kib(void) {
  FILE *f = fopen("/proc/self/smaps_rollup", "r");
  char line[256];
  long v = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "AnonHugePages: %ld kB", &v) == 1) break;
  if (f) fclose(f);
  return v;
}

int main(int argc, char **argv) {
  size_t gib = argc > 1 ? strtoul(argv[1], 0, 10) : 16;
  int rounds = argc > 2 ? atoi(argv[2]) : 3;
  total = gib << 30;
  for (int i = 0; i < THREADS; i++) {
    src[i] = aligned_alloc(4096, PIECE);
    memset(src[i], i + 1, PIECE);
  }
  const char *ways[] = {"thp", "4k", "populate", "populate-4k"};
  for (int r = 0; r < rounds; r++) {
    for (int k = 0; k < 4; k++) {
      dst = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (dst == MAP_FAILED) { perror("mmap"); return 1; }
      if (k == 0 || k == 2) madvise(dst, total, MADV_HUGEPAGE);
      if (k == 1 || k == 3) madvise(dst, total, MADV_NOHUGEPAGE);
      double made = 0;
      if (k >= 2) { populate = 1; made = run(); populate = 0; }
      double first = run();
      long huge = huge_kib();
      double again = run();
      printf("round=%d way=%s gib=%zu populate_s=%.3f copy_s=%.3f fresh_gbs=%.2f (with populate %.2f) again_gbs=%.2f huge_mib=%ld\n",
             r, ways[k], gib, made, first, total / first / 1e9, total / (first + made) / 1e9,
             total / again / 1e9, huge / 1024);
      fflush(stdout);
      munmap(dst, total);
    }
  }
  return 0;
}
