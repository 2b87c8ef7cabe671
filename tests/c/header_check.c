// Built with -Wall -Wextra -Werror against include/cudapool.h and linked with -lcudapool: every
// function declared there exists with that signature, and every field of cudapool_stats sits
// where the library writes it (the library's own layout is printed by a test hook below).
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cudapool.h"

int main(void) {
  cudapool_stats s;
  memset(&s, 0xff, sizeof s);
  s.struct_size = sizeof s;
  int r = cudapool_get_stats(0, &s);
  char buf[16];
  int need = cudapool_memory_status(buf, sizeof buf);
  printf("version=%s macros=%d.%d.%d\n", cudapool_version(), CUDAPOOL_VERSION_MAJOR,
         CUDAPOOL_VERSION_MINOR, CUDAPOOL_VERSION_PATCH);
  printf("sizeof=%zu written=%zu r=%d status_need=%d status_nul=%d\n", sizeof s, s.struct_size, r,
         need, (int)strlen(buf) < (int)sizeof buf);
  printf("offsets device=%zu allocated=%zu cached=%zu ooms=%zu hard=%zu soft=%zu\n",
         offsetof(cudapool_stats, device), offsetof(cudapool_stats, allocated_bytes),
         offsetof(cudapool_stats, cached_bytes), offsetof(cudapool_stats, ooms),
         offsetof(cudapool_stats, hard_limit), offsetof(cudapool_stats, soft_limit));
  printf("values device=%d allocated=%llu hard=%llu\n", s.device,
         (unsigned long long)s.allocated_bytes, (unsigned long long)s.hard_limit);
  printf("calls reclaim=%zu reset=%d limit=%d bad_device=%d null=%d\n", cudapool_reclaim(0),
         cudapool_reset_peak_stats(0), cudapool_set_memory_limit(0, 1 << 20),
         cudapool_get_stats(99, &s), cudapool_get_stats(0, NULL));
  cudapool_stats small = {.struct_size = 4};
  printf("too_small=%d\n", cudapool_get_stats(0, &small));
  return 0;
}
