/*
 * How often a process's allocations would miss glibc's per-thread cache (tcache), by size.
 *
 * Loaded with LD_PRELOAD into the bench (see benches/cache-misses.sh). It passes every call on
 * to the real allocator and keeps, per thread and per chunk size, the count glibc's tcache
 * would hold (7 blocks per size up to 1,032 bytes): a free adds one if there is room, else the
 * block "spills" to the shared lists; a malloc takes one if there is any, else it "misses" and
 * glibc takes the slow path (_int_malloc, often after a lock and a consolidation). It counts
 * from 2 s after start for 2 s, and writes one line per chunk size to $SHIM_OUT.
 * A model, not glibc itself: read the miss rate, and compare builds with it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BINS 64          /* chunk sizes 32 .. 1040 by 16: glibc's tcache bins */
#define PER_BIN 7        /* glibc's default tcache_count */

static void *(*real_malloc)(size_t);
static void (*real_free)(void *);
static void *(*real_realloc)(void *, size_t);
static void *(*real_calloc)(size_t, size_t);
static __thread int cached[BINS];
static unsigned long allocs[BINS], misses[BINS], spills[BINS];
static int counting;
/* dlsym allocates before the real functions are known: served from here, never freed. */
static char early[1 << 16];
static size_t early_used;

static int bin_of(void *p) {
    size_t chunk = malloc_usable_size(p) + 8;
    int b = chunk < 32 ? 0 : (int)((chunk - 17) / 16);
    return b < BINS ? b : -1;
}

static void on_alloc(void *p) {
    int b;
    if (!p || !counting || (b = bin_of(p)) < 0) return;
    __atomic_add_fetch(&allocs[b], 1, __ATOMIC_RELAXED);
    if (cached[b] > 0) cached[b]--;
    else __atomic_add_fetch(&misses[b], 1, __ATOMIC_RELAXED);
}

static void on_free(void *p) {
    int b;
    if (!p || !counting || (b = bin_of(p)) < 0) return;
    if (cached[b] < PER_BIN) cached[b]++;
    else __atomic_add_fetch(&spills[b], 1, __ATOMIC_RELAXED);
}

static int is_early(void *p) { return (char *)p >= early && (char *)p < early + sizeof early; }

void *malloc(size_t n) {
    if (!real_malloc) {
        void *p = early + early_used;
        early_used += (n + 15) & ~(size_t)15;
        if (early_used > sizeof early) abort();
        return p;
    }
    void *p = real_malloc(n);
    on_alloc(p);
    return p;
}

void *calloc(size_t k, size_t n) {
    if (!real_calloc) return malloc(k * n); /* early memory is zeroed */
    void *p = real_calloc(k, n);
    on_alloc(p);
    return p;
}

void free(void *p) {
    if (!p || is_early(p) || !real_free) return;
    on_free(p);
    real_free(p);
}

void *realloc(void *p, size_t n) {
    if (p && is_early(p)) {
        void *q = malloc(n);
        memcpy(q, p, n);
        return q;
    }
    on_free(p);
    void *q = real_realloc(p, n);
    on_alloc(q);
    return q;
}

static void *count_later(void *unused) {
    (void)unused;
    sleep(2);
    counting = 1;
    sleep(2);
    counting = 0;
    const char *out = getenv("SHIM_OUT");
    FILE *f = fopen(out ? out : "/dev/stderr", "w");
    if (!f) return NULL;
    for (int b = 0; b < BINS; b++)
        if (allocs[b])
            fprintf(f, "chunk %4d allocs %lu misses %lu spills %lu\n", b * 16 + 32, allocs[b],
                    misses[b], spills[b]);
    fclose(f);
    return NULL;
}

__attribute__((constructor)) static void start(void) {
    real_malloc = dlsym(RTLD_NEXT, "malloc");
    real_free = dlsym(RTLD_NEXT, "free");
    real_realloc = dlsym(RTLD_NEXT, "realloc");
    real_calloc = dlsym(RTLD_NEXT, "calloc");
    /* Only the process started with it: not the redis-server it starts. */
    unsetenv("LD_PRELOAD");
    pthread_t t;
    pthread_create(&t, NULL, count_later, NULL);
    pthread_detach(t);
}
