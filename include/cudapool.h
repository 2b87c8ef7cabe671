/* cudapool: the C API of libcudapool.so.
 *
 * Usable whether the library was preloaded (LD_PRELOAD=libcudapool.so) or linked
 * (-lcudapool). Every function is thread-safe. `device` is a CUDA ordinal as the program sees
 * it (after CUDA_VISIBLE_DEVICES); -1 means every device where that makes sense.
 * Functions returning int return a CUDA result code: 0 (CUDA_SUCCESS) on success,
 * 1 (CUDA_ERROR_INVALID_VALUE) for bad arguments, 3 (CUDA_ERROR_NOT_INITIALIZED) when the shim
 * is not active in this process (CUDAPOOL_DISABLE=1, a bad CUDAPOOL_* value, or no driver).
 */
#ifndef CUDAPOOL_H
#define CUDAPOOL_H

#include <stddef.h>
#include <stdint.h>

#define CUDAPOOL_VERSION_MAJOR 0
#define CUDAPOOL_VERSION_MINOR 1
#define CUDAPOOL_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

/* Figures of one device (or of all, summed). Set struct_size = sizeof(cudapool_stats) before
 * the call: the library writes at most that many bytes and sets struct_size to the number it
 * wrote, so programs built against an older or newer header keep working. Fields are only
 * ever appended. */
typedef struct cudapool_stats {
  size_t struct_size;
  int32_t device;
  uint32_t reserved_padding;
  uint64_t allocated_bytes;      /* held by the program now: the blocks handed out, rounding
                                    included (PyTorch's allocated_bytes) */
  uint64_t peak_allocated_bytes; /* since start or the last cudapool_reset_peak_stats */
  uint64_t reserved_bytes;       /* held from the driver: allocated + cached (+ pool slack) */
  uint64_t peak_reserved_bytes;
  uint64_t cached_bytes;         /* reserved but free, kept for reuse */
  uint64_t live_allocations;
  uint64_t segments;             /* driver allocations held */
  uint64_t alloc_calls;
  uint64_t free_calls;
  uint64_t cache_hits;           /* allocations served without a driver call */
  uint64_t driver_allocs;        /* memory taken from the driver: a segment, a 2 MiB chunk mapped into an
                                    expandable segment, or a pass-through allocation, each */
  uint64_t driver_frees;         /* memory given back to the driver, counted the same way */
  uint64_t reclaim_retries;      /* allocations retried after giving cached memory back */
  uint64_t ooms;                 /* CUDA_ERROR_OUT_OF_MEMORY returned by the shim */
  uint64_t hard_limit;           /* bytes; 0 = none */
  uint64_t soft_limit;           /* bytes; 0 = none */
  /* Appended after the fields above (check struct_size when reading a struct filled by an
   * older library: it stops before them). */
  uint64_t requested_bytes;      /* what the program asked for of allocated_bytes, before
                                    rounding (PyTorch's requested_bytes) */
  uint64_t peak_requested_bytes;
  uint64_t overhead_bytes;       /* of reserved_bytes: what the driver took for the process
                                    besides its allocations: the per-thread stack, the device
                                    heap, the printf FIFO, module globals, contexts beyond the
                                    primary one (appended after the requested bytes) */
  uint64_t asleep_bytes;         /* device memory put to sleep, its contents on the host;
                                    counted in no limit and not in reserved_bytes */
  uint64_t sleep_state;          /* CUDAPOOL_STATE_AWAKE, _FALLING_ASLEEP, _ASLEEP or _WAKING (the
                                    process's, the same for every device) */
  uint64_t panics;               /* panics caught inside cudapool (each a bug of cudapool's; the
                                    process's, the same for every device): from the first on,
                                    new allocations go to the driver directly, uncached
                                    (appended after the sleep state) */
} cudapool_stats;

#define CUDAPOOL_STATE_AWAKE 0
#define CUDAPOOL_STATE_FALLING_ASLEEP 1
#define CUDAPOOL_STATE_ASLEEP 2
#define CUDAPOOL_STATE_WAKING 3

/* Fills *out for `device` (-1: summed over the devices used; limits then read 0).
 * Returns 0, or 1 for a NULL out / struct_size too small / bad device, or 3 (not active). */
int cudapool_get_stats(int device, cudapool_stats *out);

/* Gives every cached block on `device` (-1: every device) back to the driver, after waiting
 * for device work that may still touch them, and the memory the driver holds for CUDA graphs
 * that no graph is using (cuDeviceGraphMemTrim). Returns the bytes released (0 when nothing was
 * cached, or the shim is not active). Like torch.cuda.empty_cache and CUDA.reclaim. */
size_t cudapool_reclaim(int device);

/* Puts the calling process to sleep on `device` (-1: every device) and returns once it is asleep:
 * when its device work has drained (new work waits meanwhile; a graph capture under way
 * postpones it, up to 30 s), live blocks of expandable segments are copied to host memory,
 * cached blocks dropped and the device memory given back; their addresses stay reserved. The
 * next launch, copy, memset, event record, stream wait, graph launch or allocation wakes it
 * first, transparently. What stays on the device: classic segments (small requests' segments,
 * CUDAPOOL_SEGMENTS=classic, the binned and simple pools), memory exported to another process,
 * contexts, modules and graph memory. Returns 0; 1 a bad device; 3 cudapool not active; 600
 * (CUDA_ERROR_NOT_READY) work did not drain within 30 s (a kernel that never ends included: the
 * sleep is given up and the program's calls go on); 2 no host memory for the copy: the kernel
 * would not give it, or it would not fit under the process's memory cgroup or the node's
 * available memory (the process stays awake, a line says why). */
int cudapool_sleep(int device);

/* Wakes the calling process (every device) and returns once its memory is back at the same
 * addresses: 0; 2 when no room came within CUDAPOOL_WAKE_TIMEOUT (the contents stay on the host
 * for the next try); 1 a device the machine does not have; 3 cudapool not active. Any device
 * (or -1) wakes every device's memory. Waking an awake process does nothing. */
int cudapool_wake(int device);

/* Sets both peaks of `device` (-1: every device used) to the current values. Returns 0, 1, 3. */
int cudapool_reset_peak_stats(int device);

/* Sets the hard limit of `device` (-1: every device used so far) to `bytes`; 0 removes it.
 * Memory already held above a lowered limit is not taken back; new allocations fail until the
 * program is under it. Returns 0, 1, 3. */
int cudapool_set_memory_limit(int device, size_t bytes);

/* The same from text, in any form CUDAPOOL_MEMORY_LIMIT takes, parsed by the library: a SIZE
 * ("8GiB", "1.5G") or a percentage of the device's memory ("50%") for `device` (-1: every device
 * used so far), or a per-device list ("0=8GiB,1=50%", with `device` -1) for the devices it
 * names. Returns 0; 1 for a bad value or a device the process does not have, with why in `why`
 * (at most why_len bytes, NUL included; `why` may be NULL); 3 (not active). Nothing is set
 * unless all of it is good. */
int cudapool_set_memory_limit_text(int device, const char *limit, char *why, size_t why_len);

/* Writes the human-readable memory status into buf (at most len bytes, NUL included),
 * snprintf-style. Returns the length of the whole text without the NUL (call with NULL, 0 to
 * size a buffer), or -1 when the shim is not active. */
int cudapool_memory_status(char *buf, size_t len);

/* Writes a JSON snapshot to `path`: per device the counters, every pool segment with its blocks
 * (in_use, pending, free) and every live allocation (with a backtrace under CUDAPOOL_TRACK=2).
 * Schema in docs/observability.md. Returns 0; 1 for a NULL or non-UTF-8 path; 304
 * (CUDA_ERROR_OPERATING_SYSTEM) when the file cannot be written; 3 (not active). */
int cudapool_snapshot(const char *path);

/* The same state, and the CUDAPOOL_HISTORY events, as PyTorch's snapshot pickle (what
 * torch.cuda.memory._snapshot() returns), for pytorch.org/memory_viz and
 * `python -m torch.cuda._memory_viz`. Mapping in the README. Same return values. */
int cudapool_snapshot_torch(const char *path);

/* The library's version, "MAJOR.MINOR.PATCH". Static storage: do not free. */
const char *cudapool_version(void);

/* The process's group (CUDAPOOL_GROUP) on one GPU. Set struct_size = sizeof(cudapool_group_stats)
 * first, as for cudapool_stats. */
typedef struct cudapool_group_stats {
  size_t struct_size;
  int32_t device;
  uint32_t reserved_padding;
  uint64_t members;                /* processes in the group now */
  uint64_t reserved_bytes;         /* every member's driver memory on this GPU */
  uint64_t limit;                  /* the group's hard limit on this GPU; 0 = none */
  uint64_t process_reserved_bytes; /* this process's part of reserved_bytes */
  char name[72];                   /* the group's name, NUL-terminated */
} cudapool_group_stats;

/* Fills *out for `device` (a CUDA ordinal). Returns 0; 1 for a NULL out, a bad device or a
 * struct_size too small; 3 (not active); 801 (CUDA_ERROR_NOT_SUPPORTED) when the process is in
 * no group. */
int cudapool_get_group_stats(int device, cudapool_group_stats *out);

/* The program's out-of-memory handler: called on the allocating thread, with no cudapool lock
 * held and outside cudapool (what it frees or allocates goes through cudapool as usual), after
 * cudapool gave its cache back and before CUDA_ERROR_OUT_OF_MEMORY reaches the program. A
 * non-zero return asks for one more try (counted as a reclaim retry). Not called again from
 * inside itself: an allocation it makes that fails gets its answer at once. */
typedef int (*cudapool_oom_handler)(int device, size_t bytes, void *user_data);

/* Installs `handler` with `user_data` (NULL removes it). Returns 0. */
int cudapool_set_oom_handler(cudapool_oom_handler handler, void *user_data);

#ifdef __cplusplus
}
#endif

#endif /* CUDAPOOL_H */
