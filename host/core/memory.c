/* memory.c — storages, their allocation, and per-device memory statistics.
 *
 * CPU blocks of 1 MiB and more are cached by rounded size and reused, so that a
 * training loop does not pay page faults for every large temporary (glibc hands
 * such blocks back to the kernel at each free). Small blocks go to malloc. */
#include "core/device.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

enum { CACHE_MIN = 1 << 20, CACHE_ROUND = 1 << 16, CACHE_SLOTS = 64 };
static const int64_t cache_max_bytes = (int64_t)2 << 30;

typedef struct cached_block {
  void *ptr;
  int64_t nbytes;
} cached_block;

typedef struct device_memory {
  lt_memory_stats stats;
  cached_block cache[CACHE_SLOTS];
  int ncached;
  int64_t cached_bytes;
} device_memory;

enum { MAX_DEVICES = 16 };
static device_memory cpu_memory, pinned_memory;
static device_memory cuda_memory[MAX_DEVICES];
static pthread_mutex_t memory_lock = PTHREAD_MUTEX_INITIALIZER;

static device_memory *memory_of(int device) {
  if (device == LT_DEVICE_CPU) return &cpu_memory;
  if (device == LT_STORAGE_PINNED) return &pinned_memory;
  if (device >= 0 && device < MAX_DEVICES) return &cuda_memory[device];
  return NULL;
}

static int64_t rounded_size(int64_t nbytes) {
  if (nbytes < CACHE_MIN) return nbytes;
  return (nbytes + CACHE_ROUND - 1) / CACHE_ROUND * CACHE_ROUND;
}

/* Takes a cached block of exactly `size` bytes, or NULL. Called under the lock. */
static void *take_cached(device_memory *m, int64_t size) {
  for (int i = m->ncached - 1; i >= 0; i--) {
    if (m->cache[i].nbytes != size) continue;
    void *p = m->cache[i].ptr;
    m->cache[i] = m->cache[--m->ncached];
    m->cached_bytes -= size;
    return p;
  }
  return NULL;
}

static void raw_free(int device, void *ptr) {
  if (device == LT_DEVICE_CPU) {
    free(ptr);
    return;
  }
  if (device == LT_STORAGE_PINNED) {
    lt_cuda_host_free(ptr); /* back to the pinned cache (host/core/cuda_runtime.cu) */
    return;
  }
  const lt_device_runtime *rt = lt_device_cuda();
  if (rt) rt->release(device, ptr);
}

static void *raw_alloc(int device, int64_t nbytes) {
  if (device == LT_DEVICE_CPU) {
    /* tiny blocks from plain malloc (16-byte aligned): glibc's aligned_alloc is slow to free
     * in the batches the Lua GC hands back, and vector loads here are unaligned-safe */
    if (nbytes <= 256) return malloc(nbytes ? (size_t)nbytes : 1);
    size_t size = (size_t)((nbytes + 63) / 64 * 64);
    return aligned_alloc(64, size);
  }
  void *p = NULL;
  if (device == LT_STORAGE_PINNED) return lt_cuda_host_alloc(nbytes, &p) == 0 ? p : NULL;
  const lt_device_runtime *rt = lt_device_cuda();
  return rt && rt->alloc(device, nbytes, &p) == 0 ? p : NULL;
}

/* Frees every cached block of m. Called under the lock. */
static void drain_cache(device_memory *m, int device) {
  for (int i = 0; i < m->ncached; i++) raw_free(device, m->cache[i].ptr);
  m->stats.reserved -= m->cached_bytes;
  m->ncached = 0;
  m->cached_bytes = 0;
}

lt_storage *lt_storage_alloc(const char *op, int64_t nbytes, int device) {
  char dev[16];
  device_memory *m = memory_of(device);
  if (!m) return lt_errorf("%s: invalid device %d", op, device), NULL;
  if (device >= 0 && device >= lt_cuda_device_count())
    return lt_errorf("%s: device %s is not available (%s)", op, lt_device_str(dev, device), lt_cuda_status()), NULL;
  if (nbytes < 0) return lt_errorf("%s: negative allocation size %lld", op, (long long)nbytes), NULL;
  lt_storage *s = malloc(sizeof *s);
  if (!s) return lt_errorf("%s: out of host memory allocating a storage header", op), NULL;
  int64_t size = rounded_size(nbytes);
  pthread_mutex_lock(&memory_lock);
  /* CUDA devices cache in their own allocator (host/core/caching_alloc.c) */
  void *p = size >= CACHE_MIN && device == LT_DEVICE_CPU ? take_cached(m, size) : NULL;
  bool from_cache = p != NULL;
  if (!p) {
    p = raw_alloc(device, size);
    if (!p && m->ncached) { /* retry once with the cache handed back */
      drain_cache(m, device);
      p = raw_alloc(device, size);
    }
  }
  if (!p) {
    lt_memory_stats st = m->stats;
    pthread_mutex_unlock(&memory_lock);
    free(s);
    if (device != LT_DEVICE_CPU) { /* the caching allocator's message says why */
      char why[512];
      snprintf(why, sizeof why, "%s", lt_last_error());
      return lt_errorf("%s: %s", op, why), NULL;
    }
    return lt_errorf("%s: out of memory on %s allocating %lld bytes (allocated %lld, reserved %lld, peak %lld)", op,
                     lt_device_str(dev, device), (long long)nbytes, (long long)st.allocated, (long long)st.reserved,
                     (long long)st.peak),
           NULL;
  }
  if (!from_cache) m->stats.reserved += size;
  m->stats.allocated += size;
  m->stats.num_allocs++;
  m->stats.since_collect += size;
  if (m->stats.allocated > m->stats.peak) m->stats.peak = m->stats.allocated;
  pthread_mutex_unlock(&memory_lock);
  s->data = p;
  s->nbytes = size;
  s->refcount = 1;
  s->device = device;
  return s;
}

void lt_storage_release(lt_storage *s) {
  if (!s || __atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
  device_memory *m = memory_of(s->device);
  pthread_mutex_lock(&memory_lock);
  m->stats.allocated -= s->nbytes;
  m->stats.num_frees++;
  if (s->device == LT_DEVICE_CPU && s->nbytes >= CACHE_MIN && m->ncached < CACHE_SLOTS &&
      m->cached_bytes + s->nbytes <= cache_max_bytes) {
    m->cache[m->ncached++] = (cached_block){s->data, s->nbytes};
    m->cached_bytes += s->nbytes;
  } else {
    raw_free(s->device, s->data);
    m->stats.reserved -= s->nbytes;
  }
  pthread_mutex_unlock(&memory_lock);
  free(s);
}

int lt_memory_get_stats(int device, lt_memory_stats *stats) {
  device_memory *m = memory_of(device);
  if (!m) return lt_errorf("memory_stats: invalid device %d", device);
  pthread_mutex_lock(&memory_lock);
  *stats = m->stats;
  pthread_mutex_unlock(&memory_lock);
  lt_cuda_memory_stats cs;
  if (device >= 0 && device < lt_cuda_device_count() && lt_cuda_get_memory_stats(device, &cs) == 0) {
    stats->allocated = cs.allocated; /* block sizes, as the caching allocator holds them */
    stats->reserved = cs.reserved;
    stats->peak = cs.peak_allocated;
    stats->peak_reserved = cs.peak_reserved;
    stats->cache_hits = cs.cache_hits;
    stats->num_segments = cs.num_segments;
    stats->segment_allocs = cs.segment_allocs;
    stats->segment_frees = cs.segment_frees;
    stats->num_ooms = cs.num_ooms;
  }
  return 0;
}

int lt_memory_reset_peak(int device) {
  device_memory *m = memory_of(device);
  if (!m) return lt_errorf("memory_reset_peak: invalid device %d", device);
  pthread_mutex_lock(&memory_lock);
  m->stats.peak = m->stats.allocated;
  pthread_mutex_unlock(&memory_lock);
  if (device >= 0 && device < lt_cuda_device_count()) return lt_cuda_reset_peak_memory_stats(device);
  return 0;
}

int lt_memory_collected(int device) {
  device_memory *m = memory_of(device);
  if (!m) return lt_errorf("memory_collected: invalid device %d", device);
  m->stats.since_collect = 0;
  return 0;
}

int lt_memory_empty_cache(int device) {
  device_memory *m = memory_of(device);
  if (!m) return lt_errorf("empty_cache: invalid device %d", device);
  pthread_mutex_lock(&memory_lock);
  drain_cache(m, device);
  pthread_mutex_unlock(&memory_lock);
  if (device >= 0 && device < lt_cuda_device_count()) return lt_cuda_empty_cache(device);
  return 0;
}

const lt_memory_stats *lt_memory_cpu_counters(void) { return &cpu_memory.stats; }
