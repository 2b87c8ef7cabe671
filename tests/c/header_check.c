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
#define OFF(f) printf(" " #f "=%zu", offsetof(cudapool_stats, f))
  printf("offsets");
  OFF(struct_size);
  OFF(device);
  OFF(allocated_bytes);
  OFF(peak_allocated_bytes);
  OFF(reserved_bytes);
  OFF(peak_reserved_bytes);
  OFF(cached_bytes);
  OFF(live_allocations);
  OFF(segments);
  OFF(alloc_calls);
  OFF(free_calls);
  OFF(cache_hits);
  OFF(driver_allocs);
  OFF(driver_frees);
  OFF(reclaim_retries);
  OFF(ooms);
  OFF(hard_limit);
  OFF(soft_limit);
  OFF(requested_bytes);
  OFF(peak_requested_bytes);
  OFF(overhead_bytes);
  OFF(asleep_bytes);
  OFF(sleep_state);
  OFF(panics);
  printf("\n");
  printf("values device=%d allocated=%llu hard=%llu\n", s.device,
         (unsigned long long)s.allocated_bytes, (unsigned long long)s.hard_limit);
  printf("calls reclaim=%zu reset=%d limit=%d bad_device=%d null=%d\n", cudapool_reclaim(0),
         cudapool_reset_peak_stats(0), cudapool_set_memory_limit(0, 1 << 20),
         cudapool_get_stats(99, &s), cudapool_get_stats(0, NULL));
  printf("snapshot null=%d unwritable=%d\n", cudapool_snapshot(NULL),
         cudapool_snapshot("/nonexistent-dir/s.json"));
  cudapool_stats small = {.struct_size = 4};
  printf("too_small=%d\n", cudapool_get_stats(0, &small));
  cudapool_group_stats g;
  memset(&g, 0xff, sizeof g);
  g.struct_size = sizeof g;
#define GOFF(f) printf(" " #f "=%zu", offsetof(cudapool_group_stats, f))
  printf("group_offsets");
  GOFF(struct_size);
  GOFF(device);
  GOFF(members);
  GOFF(reserved_bytes);
  GOFF(limit);
  GOFF(process_reserved_bytes);
  GOFF(name);
  printf("\n");
  printf("group sizeof=%zu no_group=%d null=%d\n", sizeof g, cudapool_get_group_stats(0, &g),
         cudapool_get_group_stats(0, NULL));
  cudapool_oom_handler h = NULL;
  printf("oom_handler set=%d unset=%d\n", cudapool_set_oom_handler(h, &g), cudapool_set_oom_handler(NULL, NULL));
  return 0;
}
