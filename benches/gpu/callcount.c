// callcount: which driver functions a program calls, and how often, and (STUB_POOL=1) the
// cost floor of an allocation API: a trivial one-slot cache in front of cuMemAlloc_v2 and
// cuMemFree_v2. Used to split cudaMalloc's cost into the runtime's own and cudapool's (issue 14
// part 3): under the stub, runtime pair - driver pair is what the runtime adds by itself.
// Build: gcc -shared -fPIC -O2 -o callcount.so callcount.c -ldl
// Use:   CALLCOUNT_OUT=/tmp/c.txt LD_PRELOAD=./callcount.so program   (never with libcudapool);
//        without CALLCOUNT_OUT nothing is counted (no trampolines: for timing the stub).
//
// Every function the program obtains through cuGetProcAddress(_v2) is handed back behind a
// trampoline that bumps that name's counter and jumps to the real one (x86-64: it touches only
// r11, which calls may clobber, so any signature passes through). Counts are written at exit.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <pthread.h>

typedef int (*gpa_v2_fn)(const char *, void **, int, uint64_t, int *);
typedef int (*gpa_v1_fn)(const char *, void **, int, uint64_t);
typedef int (*alloc_fn)(uint64_t *, size_t);
typedef int (*free_fn)(uint64_t);

#define MAXN 1024
static struct {
  char name[64];
  void *real;
  uint64_t count;
  void *tramp;
} tab[MAXN];
static int ntab;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned char *code;
static size_t code_used;
static gpa_v2_fn real_gpa_v2;
static gpa_v1_fn real_gpa_v1;
static alloc_fn real_alloc;
static free_fn real_free;
static int stub, counting;

static void *load(const char *name) {
  static void *h;
  if (!h) h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  return h ? dlsym(h, name) : NULL;
}

// A counting trampoline for (name, real).
static void *wrap(const char *name, void *real) {
  if (!counting) return real;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < ntab; i++)
    if (tab[i].real == real && !strcmp(tab[i].name, name)) {
      pthread_mutex_unlock(&mu);
      return tab[i].tramp;
    }
  if (ntab == MAXN) {
    pthread_mutex_unlock(&mu);
    return real;
  }
  if (!code) code = mmap(NULL, MAXN * 32, PROT_READ | PROT_WRITE | PROT_EXEC,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  unsigned char *t = code + code_used;
  uint64_t ctr = (uint64_t)&tab[ntab].count, fn = (uint64_t)real;
  int k = 0;
  t[k++] = 0x49; t[k++] = 0xBB; memcpy(t + k, &ctr, 8); k += 8;   // movabs r11, &count
  t[k++] = 0xF0; t[k++] = 0x49; t[k++] = 0xFF; t[k++] = 0x03;     // lock inc qword [r11]
  t[k++] = 0x49; t[k++] = 0xBB; memcpy(t + k, &fn, 8); k += 8;    // movabs r11, real
  t[k++] = 0x41; t[k++] = 0xFF; t[k++] = 0xE3;                    // jmp r11
  code_used += 32;
  snprintf(tab[ntab].name, sizeof tab[ntab].name, "%s", name);
  tab[ntab].real = real;
  tab[ntab].tramp = t;
  ntab++;
  pthread_mutex_unlock(&mu);
  return t;
}

// ---- the stub pool: one cached block per thread --------------------------------------------
static __thread uint64_t slot, slot_size;
static __thread uint64_t recent[8], recent_size[8];
static __thread int recent_next;

int cuMemAlloc_v2(uint64_t *p, size_t size) {
  if (!real_alloc) real_alloc = (alloc_fn)load("cuMemAlloc_v2");
  if (stub && slot && slot_size == size) {
    *p = slot;
    slot = 0;
    return 0;
  }
  int r = real_alloc(p, size);
  if (r == 0) {
    recent[recent_next] = *p;
    recent_size[recent_next] = size;
    recent_next = (recent_next + 1) & 7;
  }
  return r;
}

int cuMemFree_v2(uint64_t p) {
  if (!real_free) real_free = (free_fn)load("cuMemFree_v2");
  if (stub)
    for (int i = 0; i < 8; i++)
      if (recent[i] == p) {
        // The slot keeps the newest freed block; the one it held goes back to the driver.
        uint64_t old = slot;
        slot = p;
        slot_size = recent_size[i];
        return old ? real_free(old) : 0;
      }
  return real_free(p);
}

static void *replace(const char *s, void *p) {
  if (!strcmp(s, "cuMemAlloc") && p == load("cuMemAlloc_v2")) return (void *)cuMemAlloc_v2;
  if (!strcmp(s, "cuMemFree") && p == load("cuMemFree_v2")) return (void *)cuMemFree_v2;
  return NULL;
}

static int my_gpa_v2(const char *s, void **pfn, int ver, uint64_t flags, int *st) {
  int r = real_gpa_v2(s, pfn, ver, flags, st);
  if (r == 0 && pfn && *pfn) {
    void *mine = replace(s, *pfn);
    *pfn = wrap(s, mine ? mine : *pfn);
  }
  return r;
}

static int my_gpa_v1(const char *s, void **pfn, int ver, uint64_t flags) {
  int r = real_gpa_v1(s, pfn, ver, flags);
  if (r == 0 && pfn && *pfn) {
    void *mine = replace(s, *pfn);
    *pfn = wrap(s, mine ? mine : *pfn);
  }
  return r;
}

int cuGetProcAddress_v2(const char *s, void **pfn, int ver, uint64_t flags, int *st) {
  if (!real_gpa_v2) real_gpa_v2 = (gpa_v2_fn)load("cuGetProcAddress_v2");
  if (!strcmp(s, "cuGetProcAddress")) {
    int r = real_gpa_v2(s, pfn, ver, flags, st);
    if (r == 0 && pfn) *pfn = ver >= 12000 ? (void *)my_gpa_v2 : (void *)my_gpa_v1;
    if (!real_gpa_v1) real_gpa_v1 = (gpa_v1_fn)load("cuGetProcAddress");
    return r;
  }
  return my_gpa_v2(s, pfn, ver, flags, st);
}

typedef void *(*dlsym_fn)(void *, const char *);
void *dlsym(void *h, const char *name) {
  static dlsym_fn real_dlsym;
  if (!real_dlsym) {
    real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym) real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  }
  void *p = real_dlsym(h, name);
  if (p && name && !strcmp(name, "cuGetProcAddress_v2")) {
    real_gpa_v2 = (gpa_v2_fn)p;
    return (void *)cuGetProcAddress_v2;
  }
  if (p && name && !strcmp(name, "cuGetProcAddress")) {
    real_gpa_v1 = (gpa_v1_fn)p;
    return (void *)my_gpa_v1;
  }
  return p;
}

__attribute__((constructor)) static void init(void) {
  stub = getenv("STUB_POOL") != NULL;
  counting = getenv("CALLCOUNT_OUT") != NULL;
}

__attribute__((destructor)) static void report(void) {
  const char *path = getenv("CALLCOUNT_OUT");
  FILE *f = path ? fopen(path, "w") : stderr;
  if (!f) return;
  for (int i = 0; i < ntab; i++)
    if (tab[i].count) fprintf(f, "%lu %s\n", (unsigned long)tab[i].count, tab[i].name);
  if (f != stderr) fclose(f);
}
