/* caching_alloc.h — a stream-ordered caching allocator for device memory, in plain C.
 *
 * The logic (size classes, best-fit bins, splitting, coalescing, stream-ordered reuse,
 * statistics, out-of-memory retry) knows nothing about CUDA: it runs over a backend of
 * callbacks, cudaMalloc/cudaFree/cudaEventRecord/cudaEventQuery in host/core/cuda_runtime.cu and
 * malloc plus simulated events in tests/c/test_caching_alloc.c.
 *
 * Size classes (the scheme of PyTorch's CUDACachingAllocator):
 * - small requests (<= 1 MiB) are rounded up to 512 B and carved from 2 MiB segments;
 * - large requests are rounded up to 2 MiB and get a segment of exactly that size,
 *   or a best-fit free block of an existing large segment.
 * A block handed out may be bigger than the rounded request when the remainder is too
 * small to be worth a free block (< 512 B small, <= 1 MiB large); stats count block sizes.
 *
 * Streams: a block remembers the stream it was allocated on. When freed it is reusable at
 * once on that stream (later work on it is ordered after the last use); another stream may
 * use it only once the event recorded at free time has completed. */
#ifndef LUTRA_CACHING_ALLOC_H
#define LUTRA_CACHING_ALLOC_H
#include "lutra.h"
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The figures of one device's allocator (lt_memory_get_stats passes them on). Byte counts
 * are of blocks (requests rounded to 512 B, or 2 MiB above 1 MiB); reserved is what is held
 * from cudaMalloc. */
typedef struct lt_cuda_memory_stats {
  int64_t allocated;      /* bytes in blocks handed out */
  int64_t reserved;       /* bytes in segments held from the device */
  int64_t peak_allocated; /* high-water marks since the last reset */
  int64_t peak_reserved;
  int64_t num_allocs;     /* successful allocations */
  int64_t num_frees;      /* successful frees */
  int64_t cache_hits;     /* allocations served from the cache, without cudaMalloc */
  int64_t num_segments;   /* segments held now */
  int64_t segment_allocs; /* cudaMalloc calls that succeeded */
  int64_t segment_frees;  /* cudaFree calls */
  int64_t num_ooms;       /* allocations that failed for lack of memory */
} lt_cuda_memory_stats;

enum {
  LT_CA_SMALL_LIMIT = 1 << 20,   /* requests up to this size use the small pool */
  LT_CA_SMALL_ROUND = 512,       /* small requests round up to this */
  LT_CA_SMALL_SEGMENT = 2 << 20, /* small pool segment size */
  LT_CA_LARGE_ROUND = 2 << 20,   /* large requests and segments round up to this */
};

typedef struct lt_ca_backend {
  void *ctx;
  void *(*raw_alloc)(void *ctx, size_t nbytes); /* NULL when out of memory */
  void (*raw_free)(void *ctx, void *ptr);
  /* Optional (NULL: blocks are reusable only on their own stream). record_event returns
   * an event marking the stream's work so far, or NULL on failure; query_event returns
   * 1 when the event completed, 0 while pending; release_event frees it. */
  void *(*record_event)(void *ctx, void *stream);
  int (*query_event)(void *ctx, void *event);
  void (*release_event)(void *ctx, void *event);
} lt_ca_backend;

/* lutra.h's lt_cuda_memory_stats: allocated, reserved, peaks, counts. */
typedef lt_cuda_memory_stats lt_ca_stats;

typedef struct lt_ca_block lt_ca_block;
typedef struct lt_ca_segment lt_ca_segment;

typedef struct lt_caching_alloc {
  lt_ca_backend backend;
  char name[24];           /* "cuda:0", used in messages */
  lt_ca_segment *segments; /* every segment held, newest first */
  lt_ca_block *free_small; /* free blocks of each pool, sorted by (size, address) */
  lt_ca_block *free_large;
  lt_ca_block **live; /* hash table of allocated blocks by pointer */
  int64_t live_buckets, live_count;
  lt_ca_stats stats;
  pthread_mutex_t lock;
} lt_caching_alloc;

/* Every function returns 0 or -1 with lt_errorf, and never aborts. */
int lt_ca_init(lt_caching_alloc *ca, const lt_ca_backend *backend, const char *name);
void lt_ca_destroy(lt_caching_alloc *ca); /* returns every segment; live blocks become invalid */
/* *ptr gets a block of at least nbytes (> 0) usable on `stream` (an opaque handle). */
int lt_ca_alloc(lt_caching_alloc *ca, size_t nbytes, void *stream, void **ptr);
int lt_ca_free(lt_caching_alloc *ca, void *ptr);
int lt_ca_block_size(lt_caching_alloc *ca, void *ptr, size_t *nbytes); /* size of a live block */
int lt_ca_empty_cache(lt_caching_alloc *ca);                           /* returns fully free segments to the backend */
void lt_ca_get_stats(lt_caching_alloc *ca, lt_ca_stats *stats);
void lt_ca_reset_peak(lt_caching_alloc *ca);
size_t lt_ca_round_size(size_t nbytes); /* the size class of a request */

/* For tests: visits every block of every segment in address order. */
typedef void (*lt_ca_visit_fn)(void *arg, void *segment, void *ptr, size_t size, bool allocated);
void lt_ca_visit(lt_caching_alloc *ca, lt_ca_visit_fn fn, void *arg);
/* Number of free blocks in the small and large bins. */
void lt_ca_free_counts(lt_caching_alloc *ca, int64_t *small, int64_t *large);

/* Runtime wiring (host/core/cuda_runtime.cu), internal to the library. */
int lt_cuda_alloc_stream(int device, int64_t nbytes, void *stream, void **ptr);

#endif
