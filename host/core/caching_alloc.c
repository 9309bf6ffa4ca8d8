/* caching_alloc.c — the stream-ordered caching allocator (design in core/caching_alloc.h).
 *
 * Memory comes from the backend in segments; a segment is a list of blocks in address
 * order that tile it. Free blocks sit in one of two bins (small, large) sorted by size,
 * and allocation takes the smallest free block that fits and may be used on the stream
 * (best fit), splitting off the remainder. Freeing merges a block with free neighbours. */
#include "core/caching_alloc.h"
#include "core/internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct lt_ca_segment {
  char *base;
  size_t size;
  bool small;
  lt_ca_block *first; /* lowest address */
  lt_ca_segment *next;
};

struct lt_ca_block {
  char *ptr;
  size_t size;
  lt_ca_segment *segment;
  lt_ca_block *prev, *next;         /* neighbours in the segment, by address */
  lt_ca_block *bin_prev, *bin_next; /* in a free bin */
  lt_ca_block *hash_next;           /* in the live table */
  void *stream;                     /* the stream of the last use */
  void *event;                      /* recorded at free on `stream`; NULL once completed */
  bool pending;                     /* free, but other streams must wait: its event has not been seen complete */
  bool allocated;
};

size_t lt_ca_round_size(size_t nbytes) {
  if (nbytes <= LT_CA_SMALL_LIMIT)
    return nbytes < LT_CA_SMALL_ROUND ? LT_CA_SMALL_ROUND
                                      : (nbytes + LT_CA_SMALL_ROUND - 1) / LT_CA_SMALL_ROUND * LT_CA_SMALL_ROUND;
  if (nbytes > SIZE_MAX - LT_CA_LARGE_ROUND) return 0; /* too large to round */
  return (nbytes + LT_CA_LARGE_ROUND - 1) / LT_CA_LARGE_ROUND * LT_CA_LARGE_ROUND;
}

/* "2.00 GiB"; buf >= 32 bytes */
static const char *format_bytes(char *buf, int64_t n) {
  double v = (double)n;
  if (n >= (int64_t)1 << 30)
    snprintf(buf, 32, "%.2f GiB", v / (1 << 30));
  else if (n >= 1 << 20)
    snprintf(buf, 32, "%.2f MiB", v / (1 << 20));
  else if (n >= 1 << 10)
    snprintf(buf, 32, "%.2f KiB", v / (1 << 10));
  else
    snprintf(buf, 32, "%lld B", (long long)n);
  return buf;
}

/* ---- free bins ---------------------------------------------------------------- */

static lt_ca_block **bin_of(lt_caching_alloc *ca, const lt_ca_block *b) {
  return b->segment->small ? &ca->free_small : &ca->free_large;
}

static void bin_insert(lt_caching_alloc *ca, lt_ca_block *b) {
  lt_ca_block **head = bin_of(ca, b), *prev = NULL, *at = *head;
  while (at && (at->size < b->size || (at->size == b->size && at->ptr < b->ptr))) prev = at, at = at->bin_next;
  b->bin_prev = prev;
  b->bin_next = at;
  if (at) at->bin_prev = b;
  if (prev)
    prev->bin_next = b;
  else
    *head = b;
}

static void bin_remove(lt_caching_alloc *ca, lt_ca_block *b) {
  if (b->bin_prev)
    b->bin_prev->bin_next = b->bin_next;
  else
    *bin_of(ca, b) = b->bin_next;
  if (b->bin_next) b->bin_next->bin_prev = b->bin_prev;
  b->bin_prev = b->bin_next = NULL;
}

/* ---- events ------------------------------------------------------------------- */

static void drop_event(lt_caching_alloc *ca, lt_ca_block *b) {
  if (b->event && ca->backend.release_event) ca->backend.release_event(ca->backend.ctx, b->event);
  b->event = NULL;
}

/* Clears `pending` when the block's event has completed. */
static void settle(lt_caching_alloc *ca, lt_ca_block *b) {
  if (!b->pending || !b->event || !ca->backend.query_event) return;
  if (ca->backend.query_event(ca->backend.ctx, b->event) != 1) return;
  drop_event(ca, b);
  b->pending = false;
}

static bool usable_on(lt_caching_alloc *ca, lt_ca_block *b, void *stream) {
  if (b->stream == stream) return true;
  settle(ca, b);
  return !b->pending;
}

/* ---- live table: allocated blocks by pointer ----------------------------------- */

static int64_t hash_of(const lt_caching_alloc *ca, const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p >> 9;
  x *= 0x9E3779B97F4A7C15ull;
  return (int64_t)(x >> 20) & (ca->live_buckets - 1);
}

static int live_insert(lt_caching_alloc *ca, lt_ca_block *b) {
  if (ca->live_count >= ca->live_buckets) { /* grow: load factor <= 1 */
    int64_t n = ca->live_buckets ? ca->live_buckets * 2 : 256;
    lt_ca_block **table = calloc((size_t)n, sizeof *table);
    if (!table) return -1;
    lt_ca_block **old = ca->live;
    int64_t old_n = ca->live_buckets;
    ca->live = table;
    ca->live_buckets = n;
    for (int64_t i = 0; i < old_n; i++)
      for (lt_ca_block *x = old[i], *next; x; x = next) {
        next = x->hash_next;
        int64_t h = hash_of(ca, x->ptr);
        x->hash_next = table[h];
        table[h] = x;
      }
    free(old);
  }
  int64_t h = hash_of(ca, b->ptr);
  b->hash_next = ca->live[h];
  ca->live[h] = b;
  ca->live_count++;
  return 0;
}

static lt_ca_block *live_find(lt_caching_alloc *ca, const void *p, bool remove) {
  if (!ca->live_buckets) return NULL;
  for (lt_ca_block **at = &ca->live[hash_of(ca, p)]; *at; at = &(*at)->hash_next) {
    lt_ca_block *b = *at;
    if (b->ptr != p) continue;
    if (remove) {
      *at = b->hash_next;
      b->hash_next = NULL;
      ca->live_count--;
    }
    return b;
  }
  return NULL;
}

/* ---- segments ----------------------------------------------------------------- */

static lt_ca_block *new_segment(lt_caching_alloc *ca, bool small, size_t size, void *stream) {
  lt_ca_segment *seg = calloc(1, sizeof *seg);
  lt_ca_block *b = calloc(1, sizeof *b);
  void *base = seg && b ? ca->backend.raw_alloc(ca->backend.ctx, size) : NULL;
  if (!base) {
    free(seg);
    free(b);
    return NULL;
  }
  *seg = (lt_ca_segment){.base = base, .size = size, .small = small, .first = b, .next = ca->segments};
  *b = (lt_ca_block){.ptr = base, .size = size, .segment = seg, .stream = stream};
  ca->segments = seg;
  ca->stats.reserved += (int64_t)size;
  ca->stats.num_segments++;
  ca->stats.segment_allocs++;
  if (ca->stats.reserved > ca->stats.peak_reserved) ca->stats.peak_reserved = ca->stats.reserved;
  return b;
}

/* Returns every segment whose blocks are all free to the backend. Freeing device memory
 * waits for the device, so pending events do not matter here. */
static bool segment_free(const lt_ca_segment *seg) {
  for (const lt_ca_block *b = seg->first; b; b = b->next)
    if (b->allocated) return false;
  return true;
}

static void release_free_segments(lt_caching_alloc *ca) {
  for (lt_ca_segment **at = &ca->segments; *at;) {
    lt_ca_segment *seg = *at;
    if (!segment_free(seg)) { /* usually one free block; several when neighbours were pending on two streams */
      at = &seg->next;
      continue;
    }
    *at = seg->next;
    for (lt_ca_block *b = seg->first, *next; b; b = next) {
      next = b->next;
      bin_remove(ca, b);
      drop_event(ca, b);
      free(b);
    }
    ca->backend.raw_free(ca->backend.ctx, seg->base);
    ca->stats.reserved -= (int64_t)seg->size;
    ca->stats.num_segments--;
    ca->stats.segment_frees++;
    free(seg);
  }
}

/* Splits off what b does not need beyond `size` as a free block, when worth it. The
 * remainder keeps b's stream and pending event: it is still ordered after that work. */
static void split(lt_caching_alloc *ca, lt_ca_block *b, size_t size) {
  size_t rest = b->size - size;
  bool worth = b->segment->small ? rest >= LT_CA_SMALL_ROUND : rest > LT_CA_SMALL_LIMIT;
  if (!worth) return;
  lt_ca_block *r = calloc(1, sizeof *r);
  if (!r) return; /* hand out the whole block */
  *r = (lt_ca_block){.ptr = b->ptr + size,
                     .size = rest,
                     .segment = b->segment,
                     .prev = b,
                     .next = b->next,
                     .stream = b->stream,
                     .event = b->event,
                     .pending = b->pending};
  if (b->next) b->next->prev = r;
  b->next = r;
  b->size = size;
  b->event = NULL;
  bin_insert(ca, r);
}

static bool can_merge(lt_caching_alloc *ca, lt_ca_block *keep, lt_ca_block *other) {
  if (!other || other->allocated) return false;
  if (keep->stream == other->stream) return true;
  settle(ca, keep);
  settle(ca, other);
  return !keep->pending || !other->pending;
}

/* Merges the free neighbour `other` into the just-freed `keep` (not in a bin). The merged
 * block carries the constraint that is still pending: on one stream, keep's event is the
 * newer and covers other's. */
static void merge(lt_caching_alloc *ca, lt_ca_block *keep, lt_ca_block *other) {
  if (!other->pending) {
    drop_event(ca, other); /* nothing to carry over */
  } else if (!keep->pending) {
    keep->stream = other->stream;
    keep->event = other->event;
    keep->pending = true;
    other->event = NULL;
  } else {
    drop_event(ca, other); /* both pending on one stream: keep's event is newer */
  }
  bin_remove(ca, other);
  if (other == keep->prev) {
    keep->ptr = other->ptr;
    keep->prev = other->prev;
    if (other->prev)
      other->prev->next = keep;
    else
      keep->segment->first = keep;
  } else {
    keep->next = other->next;
    if (other->next) other->next->prev = keep;
  }
  keep->size += other->size;
  free(other);
}

/* ---- the allocator -------------------------------------------------------------- */

int lt_ca_init(lt_caching_alloc *ca, const lt_ca_backend *backend, const char *name) {
  if (!ca || !backend || !backend->raw_alloc || !backend->raw_free)
    return lt_errorf("caching_alloc: init needs an allocator and a backend with raw_alloc and raw_free");
  memset(ca, 0, sizeof *ca);
  ca->backend = *backend;
  snprintf(ca->name, sizeof ca->name, "%s", name ? name : "device");
  pthread_mutex_init(&ca->lock, NULL);
  return 0;
}

void lt_ca_destroy(lt_caching_alloc *ca) {
  if (!ca) return;
  for (lt_ca_segment *seg = ca->segments, *next; seg; seg = next) {
    next = seg->next;
    for (lt_ca_block *b = seg->first, *bn; b; b = bn) {
      bn = b->next;
      drop_event(ca, b);
      free(b);
    }
    ca->backend.raw_free(ca->backend.ctx, seg->base);
    free(seg);
  }
  free(ca->live);
  pthread_mutex_destroy(&ca->lock);
  memset(ca, 0, sizeof *ca);
}

static int out_of_memory(lt_caching_alloc *ca, size_t nbytes) {
  lt_ca_stats st = ca->stats;
  int64_t cached = st.reserved - st.allocated;
  pthread_mutex_unlock(&ca->lock);
  char op[24], req[32], alloc[32], res[32], free_[32], peak[32];
  snprintf(op, sizeof op, "%s", ca->name);
  char *colon = strchr(op, ':');
  if (colon) *colon = 0;
  return lt_errorf("%s: out of memory allocating %s on %s: %s allocated, %s reserved (%s of it cached free), peak %s "
                   "allocated, %lld segments",
                   op, format_bytes(req, (int64_t)nbytes), ca->name, format_bytes(alloc, st.allocated),
                   format_bytes(res, st.reserved), format_bytes(free_, cached), format_bytes(peak, st.peak_allocated),
                   (long long)st.num_segments);
}

int lt_ca_alloc(lt_caching_alloc *ca, size_t nbytes, void *stream, void **ptr) {
  if (!ca || !ptr) return lt_errorf("caching_alloc: NULL allocator or result pointer");
  *ptr = NULL;
  if (nbytes == 0) return lt_errorf("caching_alloc: cannot allocate 0 bytes on %s", ca->name);
  size_t size = lt_ca_round_size(nbytes);
  pthread_mutex_lock(&ca->lock);
  if (size == 0) {
    ca->stats.num_ooms++;
    return out_of_memory(ca, nbytes);
  }
  bool small = size <= LT_CA_SMALL_LIMIT, hit = true;
  lt_ca_block *b = small ? ca->free_small : ca->free_large;
  while (b && (b->size < size || !usable_on(ca, b, stream))) b = b->bin_next;
  if (b)
    bin_remove(ca, b);
  else {
    hit = false;
    size_t segment_size = small ? LT_CA_SMALL_SEGMENT : size;
    b = new_segment(ca, small, segment_size, stream);
    if (!b) { /* hand the cache back and retry once */
      release_free_segments(ca);
      b = new_segment(ca, small, segment_size, stream);
    }
    if (!b) {
      ca->stats.num_ooms++;
      return out_of_memory(ca, nbytes);
    }
  }
  split(ca, b, size);
  drop_event(ca, b);
  b->stream = stream;
  b->pending = false;
  b->allocated = true;
  if (live_insert(ca, b)) { /* no host memory for the table: give the block back */
    b->allocated = false;
    bin_insert(ca, b);
    ca->stats.num_ooms++;
    return out_of_memory(ca, nbytes);
  }
  ca->stats.allocated += (int64_t)b->size;
  if (ca->stats.allocated > ca->stats.peak_allocated) ca->stats.peak_allocated = ca->stats.allocated;
  ca->stats.num_allocs++;
  ca->stats.cache_hits += hit;
  *ptr = b->ptr;
  pthread_mutex_unlock(&ca->lock);
  return 0;
}

int lt_ca_free(lt_caching_alloc *ca, void *ptr) {
  if (!ca) return lt_errorf("caching_alloc: NULL allocator");
  if (!ptr) return 0;
  pthread_mutex_lock(&ca->lock);
  lt_ca_block *b = live_find(ca, ptr, true);
  if (!b) {
    pthread_mutex_unlock(&ca->lock);
    return lt_errorf("caching_alloc: free of %p, which is not a live block of %s", ptr, ca->name);
  }
  b->allocated = false;
  ca->stats.allocated -= (int64_t)b->size;
  ca->stats.num_frees++;
  /* other streams wait for the work queued on b's stream so far */
  b->event = ca->backend.record_event ? ca->backend.record_event(ca->backend.ctx, b->stream) : NULL;
  b->pending = true;
  if (can_merge(ca, b, b->prev)) merge(ca, b, b->prev);
  if (can_merge(ca, b, b->next)) merge(ca, b, b->next);
  bin_insert(ca, b);
  pthread_mutex_unlock(&ca->lock);
  return 0;
}

int lt_ca_block_size(lt_caching_alloc *ca, void *ptr, size_t *nbytes) {
  if (!ca || !nbytes) return lt_errorf("caching_alloc: NULL argument");
  pthread_mutex_lock(&ca->lock);
  lt_ca_block *b = live_find(ca, ptr, false);
  *nbytes = b ? b->size : 0;
  pthread_mutex_unlock(&ca->lock);
  return b ? 0 : lt_errorf("caching_alloc: %p is not a live block of %s", ptr, ca->name);
}

int lt_ca_empty_cache(lt_caching_alloc *ca) {
  if (!ca) return lt_errorf("empty_cache: NULL allocator");
  pthread_mutex_lock(&ca->lock);
  release_free_segments(ca);
  pthread_mutex_unlock(&ca->lock);
  return 0;
}

void lt_ca_get_stats(lt_caching_alloc *ca, lt_ca_stats *stats) {
  pthread_mutex_lock(&ca->lock);
  *stats = ca->stats;
  pthread_mutex_unlock(&ca->lock);
}

void lt_ca_reset_peak(lt_caching_alloc *ca) {
  pthread_mutex_lock(&ca->lock);
  ca->stats.peak_allocated = ca->stats.allocated;
  ca->stats.peak_reserved = ca->stats.reserved;
  pthread_mutex_unlock(&ca->lock);
}

void lt_ca_visit(lt_caching_alloc *ca, lt_ca_visit_fn fn, void *arg) {
  pthread_mutex_lock(&ca->lock);
  for (lt_ca_segment *seg = ca->segments; seg; seg = seg->next)
    for (lt_ca_block *b = seg->first; b; b = b->next) fn(arg, seg->base, b->ptr, b->size, b->allocated);
  pthread_mutex_unlock(&ca->lock);
}

void lt_ca_free_counts(lt_caching_alloc *ca, int64_t *small, int64_t *large) {
  pthread_mutex_lock(&ca->lock);
  *small = *large = 0;
  for (lt_ca_block *b = ca->free_small; b; b = b->bin_next) ++*small;
  for (lt_ca_block *b = ca->free_large; b; b = b->bin_next) ++*large;
  pthread_mutex_unlock(&ca->lock);
}
