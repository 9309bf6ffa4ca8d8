/* test_caching_alloc.c — the stream-ordered caching allocator (host/core/caching_alloc.c) over
 * a malloc backend with simulated events: size classes, splitting and coalescing, reuse
 * across streams, statistics, the out-of-memory path, and random sequences checked
 * against a reference model. */
#include "core/caching_alloc.h"
#include "check.h"
#include "core/device.h"
#include <string.h>

#define MiB ((size_t)1 << 20)
#define S1 ((void *)1)
#define S2 ((void *)2)
#define S3 ((void *)3)
#define S4 ((void *)4)

/* ---- the backend: malloc with a byte limit, a record of live segments, fake events ---- */
enum { MAX_RAW = 4096, MAX_EVENTS = 1 << 16 };
typedef struct fake_event {
  bool done, released;
} fake_event;
typedef struct test_backend {
  size_t limit, held;
  void *raw_ptr[MAX_RAW];
  size_t raw_size[MAX_RAW];
  int nraw;
  int64_t raw_allocs, raw_frees, raw_failures;
  fake_event events[MAX_EVENTS];
  int nevents;
  int64_t live_events;
} test_backend;

static void *tb_alloc(void *ctx, size_t n) {
  test_backend *tb = ctx;
  if (tb->held + n > tb->limit || tb->nraw == MAX_RAW) {
    tb->raw_failures++;
    return NULL;
  }
  void *p = malloc(n);
  if (!p) return NULL;
  tb->raw_ptr[tb->nraw] = p;
  tb->raw_size[tb->nraw++] = n;
  tb->held += n;
  tb->raw_allocs++;
  return p;
}

static void tb_free(void *ctx, void *p) {
  test_backend *tb = ctx;
  for (int i = 0; i < tb->nraw; i++)
    if (tb->raw_ptr[i] == p) {
      tb->held -= tb->raw_size[i];
      tb->raw_ptr[i] = tb->raw_ptr[--tb->nraw];
      tb->raw_size[i] = tb->raw_size[tb->nraw];
      tb->raw_frees++;
      free(p);
      return;
    }
  fprintf(stderr, "backend: free of unknown pointer %p\n", p);
  check_failed++;
}

static void *tb_record(void *ctx, void *stream) {
  (void)stream;
  test_backend *tb = ctx;
  if (tb->nevents == MAX_EVENTS) return NULL;
  tb->live_events++;
  return &tb->events[tb->nevents++];
}
static int tb_query(void *ctx, void *event) {
  (void)ctx;
  return ((fake_event *)event)->done;
}
static void tb_release(void *ctx, void *event) {
  test_backend *tb = ctx;
  fake_event *e = event;
  if (e->released) {
    fprintf(stderr, "backend: event released twice\n");
    check_failed++;
  }
  e->released = true;
  tb->live_events--;
}
static void complete_events(test_backend *tb) {
  for (int i = 0; i < tb->nevents; i++) tb->events[i].done = true;
}

static test_backend *new_backend(size_t limit) {
  test_backend *tb = calloc(1, sizeof *tb);
  tb->limit = limit;
  return tb;
}

static void init_ca(lt_caching_alloc *ca, test_backend *tb, bool events) {
  lt_ca_backend b = {
      tb, tb_alloc, tb_free, events ? tb_record : NULL, events ? tb_query : NULL, events ? tb_release : NULL};
  CHECK_OK(lt_ca_init(ca, &b, "test:0"));
}

/* Destroys the allocator and checks that it gave everything back. */
static void finish(lt_caching_alloc *ca, test_backend *tb) {
  lt_ca_destroy(ca);
  CHECK(tb->held == 0 && tb->nraw == 0, "backend still holds %zu bytes in %d segments", tb->held, tb->nraw);
  CHECK(tb->live_events == 0, "%lld events not released", (long long)tb->live_events);
  free(tb);
}

static lt_ca_stats stats_of(lt_caching_alloc *ca) {
  lt_ca_stats st;
  lt_ca_get_stats(ca, &st);
  return st;
}

static size_t block_size(lt_caching_alloc *ca, void *p) {
  size_t n = 0;
  CHECK_OK(lt_ca_block_size(ca, p, &n));
  return n;
}

static uint64_t rand_u64(void) {
  check_uniform();
  return check_rng_state * 2685821657736338717ull;
}

/* ---- cases ---------------------------------------------------------------------- */

static void test_rounding(void) {
  size_t cases[][2] = {{1, 512},           {511, 512},         {512, 512},         {513, 1024},           {MiB, MiB},
                       {MiB + 1, 2 * MiB}, {2 * MiB, 2 * MiB}, {5 * MiB, 6 * MiB}, {6 * MiB + 1, 8 * MiB}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    CHECK(lt_ca_round_size(cases[i][0]) == cases[i][1], "round(%zu) = %zu, want %zu", cases[i][0],
          lt_ca_round_size(cases[i][0]), cases[i][1]);
  CHECK(lt_ca_round_size(SIZE_MAX - 5) == 0, "an unroundable size gives 0");

  test_backend *tb = new_backend(1u << 30);
  lt_caching_alloc ca;
  init_ca(&ca, tb, true);
  void *a, *b, *big;
  CHECK_OK(lt_ca_alloc(&ca, 1000, S1, &a));
  CHECK(block_size(&ca, a) == 1024, "small block %zu", block_size(&ca, a));
  CHECK(tb->raw_size[0] == 2 * MiB, "small segment is 2 MiB, got %zu", tb->raw_size[0]);
  CHECK_OK(lt_ca_alloc(&ca, 100, S1, &b));
  CHECK((char *)b == (char *)a + 1024, "second small block follows the first in its segment");
  CHECK(tb->raw_allocs == 1, "one segment for both");
  CHECK_OK(lt_ca_alloc(&ca, 5 * MiB, S1, &big));
  CHECK(block_size(&ca, big) == 6 * MiB && tb->raw_allocs == 2 && tb->held == 8 * MiB, "large: own 6 MiB segment");
  int64_t small, large;
  lt_ca_free_counts(&ca, &small, &large);
  CHECK(small == 1 && large == 0, "bins: %lld small, %lld large free blocks", (long long)small, (long long)large);
  /* the large pool: an 8 MiB block splits into 4 + 4 for a 3 MiB request, then serves 4 MiB */
  void *l8, *l3, *l4;
  CHECK_OK(lt_ca_alloc(&ca, 8 * MiB, S1, &l8));
  CHECK_OK(lt_ca_free(&ca, l8));
  CHECK_OK(lt_ca_alloc(&ca, 3 * MiB, S1, &l3));
  CHECK(l3 == l8 && block_size(&ca, l3) == 4 * MiB, "large split: best fit at the segment start");
  CHECK_OK(lt_ca_alloc(&ca, 4 * MiB, S1, &l4));
  CHECK((char *)l4 == (char *)l8 + 4 * MiB && tb->raw_allocs == 3, "the remainder serves the next request");
  /* a large request never comes from the small pool, nor a small one from a large block */
  CHECK_OK(lt_ca_free(&ca, big));
  void *s2;
  CHECK_OK(lt_ca_alloc(&ca, 4096, S1, &s2));
  CHECK((char *)s2 >= (char *)a && (char *)s2 < (char *)a + 2 * MiB, "small request from the small segment");
  finish(&ca, tb);
}

static void test_split_coalesce(void) {
  test_backend *tb = new_backend(1u << 30);
  lt_caching_alloc ca;
  init_ca(&ca, tb, true);
  void *a, *b, *c;
  CHECK_OK(lt_ca_alloc(&ca, 4096, S1, &a));
  CHECK_OK(lt_ca_alloc(&ca, 8192, S1, &b));
  CHECK_OK(lt_ca_alloc(&ca, 4096, S1, &c));
  CHECK((char *)b == (char *)a + 4096 && (char *)c == (char *)b + 8192, "A B C adjacent in one segment");
  int64_t small, large;
  lt_ca_free_counts(&ca, &small, &large);
  CHECK(small == 1, "the tail is one free block (%lld)", (long long)small);
  CHECK_OK(lt_ca_free(&ca, b));
  lt_ca_free_counts(&ca, &small, &large);
  CHECK(small == 2, "B free beside the tail: 2 free blocks (%lld)", (long long)small);
  CHECK_OK(lt_ca_free(&ca, a));
  lt_ca_free_counts(&ca, &small, &large);
  CHECK(small == 2, "A merged with B: still 2 free blocks (%lld)", (long long)small);
  /* the merged A+B (12 KiB) is the best fit for 12 KiB */
  void *ab;
  CHECK_OK(lt_ca_alloc(&ca, 12288, S1, &ab));
  CHECK(ab == a && block_size(&ca, ab) == 12288, "A+B served as one block");
  CHECK_OK(lt_ca_free(&ca, ab));
  CHECK_OK(lt_ca_free(&ca, c));
  lt_ca_free_counts(&ca, &small, &large);
  CHECK(small == 1, "all freed: one free block (%lld)", (long long)small);
  lt_ca_stats st = stats_of(&ca);
  CHECK(st.allocated == 0 && st.reserved == (int64_t)(2 * MiB) && st.num_segments == 1, "segment cached");
  CHECK_OK(lt_ca_empty_cache(&ca));
  st = stats_of(&ca);
  CHECK(tb->held == 0 && tb->raw_frees == 1 && st.reserved == 0 && st.num_segments == 0 && st.segment_frees == 1,
        "empty_cache returned the segment");
  finish(&ca, tb);
}

static void test_streams(void) {
  test_backend *tb = new_backend(1u << 30);
  lt_caching_alloc ca;
  init_ca(&ca, tb, true);
  void *x, *y, *w, *z;
  CHECK_OK(lt_ca_alloc(&ca, 4096, S1, &x));
  CHECK_OK(lt_ca_free(&ca, x));
  CHECK_OK(lt_ca_alloc(&ca, 4096, S1, &y));
  CHECK(y == x && tb->raw_allocs == 1, "same stream reuses at once");
  CHECK_OK(lt_ca_free(&ca, y));
  CHECK_OK(lt_ca_alloc(&ca, 4096, S2, &w));
  CHECK(tb->raw_allocs == 2 && ((char *)w < (char *)x || (char *)w >= (char *)x + 2 * MiB),
        "another stream does not reuse a block with a pending event");
  CHECK_OK(lt_ca_free(&ca, w));
  CHECK_OK(lt_ca_alloc(&ca, 4096, S3, &z));
  CHECK(tb->raw_allocs == 3, "a third stream waits on both");
  CHECK_OK(lt_ca_free(&ca, z));
  tb->events[0].done = true; /* only x's first free completed: y's free is still pending */
  CHECK_OK(lt_ca_alloc(&ca, 4096, S4, &z));
  CHECK(tb->raw_allocs == 4, "a later pending event still blocks");
  CHECK_OK(lt_ca_free(&ca, z));
  complete_events(tb);
  void *q;
  CHECK_OK(lt_ca_alloc(&ca, 4096, (void *)5, &q));
  CHECK(tb->raw_allocs == 4, "after the events complete, any stream reuses");
  CHECK(stats_of(&ca).cache_hits == 2, "hits %lld", (long long)stats_of(&ca).cache_hits);
  CHECK_OK(lt_ca_free(&ca, q));
  finish(&ca, tb);

  /* without event callbacks a block never moves to another stream */
  tb = new_backend(1u << 30);
  init_ca(&ca, tb, false);
  CHECK_OK(lt_ca_alloc(&ca, 4096, S1, &x));
  CHECK_OK(lt_ca_free(&ca, x));
  CHECK_OK(lt_ca_alloc(&ca, 4096, S2, &y));
  CHECK(tb->raw_allocs == 2, "no events: no reuse across streams");
  CHECK_OK(lt_ca_free(&ca, y));
  CHECK_OK(lt_ca_alloc(&ca, 4096, S2, &z));
  CHECK(z == y, "no events: same-stream reuse");
  CHECK_OK(lt_ca_free(&ca, z));
  finish(&ca, tb);
}

static void test_stats(void) {
  test_backend *tb = new_backend(1u << 30);
  lt_caching_alloc ca;
  init_ca(&ca, tb, true);
  void *a, *b, *c;
  CHECK_OK(lt_ca_alloc(&ca, 700, S1, &a));     /* 1024 in a 2 MiB segment */
  CHECK_OK(lt_ca_alloc(&ca, 3 * MiB, S1, &b)); /* 4 MiB segment */
  CHECK_OK(lt_ca_free(&ca, a));
  CHECK_OK(lt_ca_alloc(&ca, 512, S1, &c)); /* hit */
  lt_ca_stats st = stats_of(&ca);
  CHECK(st.allocated == (int64_t)(4 * MiB + 512), "allocated %lld", (long long)st.allocated);
  CHECK(st.reserved == (int64_t)(6 * MiB), "reserved %lld", (long long)st.reserved);
  CHECK(st.peak_allocated == (int64_t)(4 * MiB + 1024), "peak allocated %lld", (long long)st.peak_allocated);
  CHECK(st.peak_reserved == (int64_t)(6 * MiB), "peak reserved %lld", (long long)st.peak_reserved);
  CHECK(st.num_allocs == 3 && st.num_frees == 1 && st.cache_hits == 1 && st.segment_allocs == 2 &&
            st.num_segments == 2 && st.num_ooms == 0,
        "counts %lld %lld %lld %lld", (long long)st.num_allocs, (long long)st.num_frees, (long long)st.cache_hits,
        (long long)st.segment_allocs);
  CHECK_OK(lt_ca_free(&ca, b));
  CHECK_OK(lt_ca_empty_cache(&ca));
  st = stats_of(&ca);
  CHECK(st.allocated == 512 && st.reserved == (int64_t)(2 * MiB) && st.peak_reserved == (int64_t)(6 * MiB),
        "after empty_cache: %lld %lld", (long long)st.allocated, (long long)st.reserved);
  lt_ca_reset_peak(&ca);
  st = stats_of(&ca);
  CHECK(st.peak_allocated == 512 && st.peak_reserved == (int64_t)(2 * MiB), "reset peak: %lld %lld",
        (long long)st.peak_allocated, (long long)st.peak_reserved);
  CHECK_OK(lt_ca_free(&ca, c));
  finish(&ca, tb);
}

static void test_oom(void) {
  test_backend *tb = new_backend(6 * MiB);
  lt_caching_alloc ca;
  init_ca(&ca, tb, true);
  void *a, *b, *c;
  CHECK_OK(lt_ca_alloc(&ca, 4 * MiB, S1, &a));
  CHECK_OK(lt_ca_free(&ca, a)); /* cached, with a pending event */
  CHECK_OK(lt_ca_alloc(&ca, 4 * MiB, S2, &b));
  lt_ca_stats st = stats_of(&ca);
  CHECK(tb->raw_failures == 1 && st.segment_frees == 1 && st.num_ooms == 0 && st.reserved == (int64_t)(4 * MiB),
        "the cache was emptied and the retry succeeded");
  c = (void *)&ca;
  CHECK_ERR(lt_ca_alloc(&ca, 3 * MiB + 5, S2, &c), "test: out of memory allocating 3.00 MiB on test:0");
  CHECK(c == NULL, "ptr is NULL after a failure");
  CHECK(strstr(lt_last_error(), "4.00 MiB allocated") && strstr(lt_last_error(), "4.00 MiB reserved"),
        "the message gives the stats: %s", lt_last_error());
  CHECK(stats_of(&ca).num_ooms == 1, "OOM counted");
  CHECK_ERR(lt_ca_alloc(&ca, SIZE_MAX - 3, S2, &c), "out of memory");
  CHECK(stats_of(&ca).num_ooms == 2 && stats_of(&ca).allocated == (int64_t)(4 * MiB), "state intact after OOM");
  /* small segments also fail cleanly, and work again once memory is freed */
  tb->limit = 4 * MiB;
  CHECK_ERR(lt_ca_alloc(&ca, 100, S2, &c), "out of memory allocating 100 B");
  CHECK_OK(lt_ca_free(&ca, b));
  CHECK_OK(lt_ca_alloc(&ca, 100, S1, &c)); /* b's segment is pending on S2: emptied, then a small one */
  CHECK(stats_of(&ca).reserved == (int64_t)(2 * MiB), "reserved %lld", (long long)stats_of(&ca).reserved);
  CHECK_OK(lt_ca_free(&ca, c));
  finish(&ca, tb);
}

static void test_bad_input(void) {
  test_backend *tb = new_backend(1u << 30);
  lt_caching_alloc ca;
  init_ca(&ca, tb, true);
  void *p = NULL;
  int local;
  CHECK_ERR(lt_ca_alloc(&ca, 0, S1, &p), "cannot allocate 0 bytes");
  CHECK_ERR(lt_ca_free(&ca, &local), "not a live block of test:0");
  CHECK_OK(lt_ca_alloc(&ca, 64, S1, &p));
  CHECK_ERR(lt_ca_free(&ca, (char *)p + 8), "not a live block");
  CHECK_OK(lt_ca_free(&ca, p));
  CHECK_ERR(lt_ca_free(&ca, p), "not a live block"); /* double free */
  CHECK_OK(lt_ca_free(&ca, NULL));
  CHECK_ERR(lt_ca_alloc(&ca, 64, S1, NULL), "NULL");
  size_t n;
  CHECK_ERR(lt_ca_block_size(&ca, &local, &n), "not a live block");
  lt_caching_alloc other;
  lt_ca_backend none = {0};
  CHECK_ERR(lt_ca_init(&other, &none, "x"), "raw_alloc");
  CHECK_ERR(lt_ca_init(&other, NULL, "x"), "backend");
  finish(&ca, tb);
}

/* ---- random sequences against a model ------------------------------------------- */
typedef struct live_block {
  char *ptr;
  size_t request, size;
  uint64_t tag;
} live_block;
typedef struct layout_check {
  test_backend *tb;
  int64_t allocated_blocks, bad;
  char *seg_base, *expect_next;
  size_t covered, seg_size;
} layout_check;

static void visit_block(void *arg, void *segment, void *ptr, size_t size, bool allocated) {
  layout_check *lc = arg;
  if (segment != lc->seg_base) { /* a new segment: the last one must have been fully covered */
    if (lc->seg_base && lc->covered != lc->seg_size) lc->bad++;
    lc->seg_base = segment;
    lc->expect_next = segment;
    lc->covered = 0;
  }
  if (ptr != lc->expect_next) lc->bad++; /* blocks tile the segment: no gap, no overlap */
  lc->expect_next = (char *)ptr + size;
  lc->covered += size;
  size_t seg_size = 0;
  for (int i = 0; i < lc->tb->nraw; i++)
    if (lc->tb->raw_ptr[i] == segment) seg_size = lc->tb->raw_size[i];
  if (!seg_size || lc->covered > seg_size) lc->bad++; /* inside a segment the backend handed out */
  lc->seg_size = seg_size;
  lc->allocated_blocks += allocated;
}

static void test_random(void) {
  test_backend *tb = new_backend(64 * MiB);
  lt_caching_alloc ca;
  init_ca(&ca, tb, true);
  enum { MAX_LIVE = 200, STEPS = 4000 };
  live_block live[MAX_LIVE];
  int nlive = 0, ooms = 0, tag_errors = 0, model_errors = 0, layout_errors = 0;
  int64_t model_allocated = 0, model_peak = 0;
  for (int step = 0; step < STEPS; step++) {
    uint64_t r = rand_u64();
    bool do_alloc = nlive == 0 || (nlive < MAX_LIVE && r % 100 < 55);
    if (do_alloc) {
      size_t n = r % 10 < 8 ? 1 + (size_t)(rand_u64() % (64 * 1024)) : 1 + (size_t)(rand_u64() % (9 * MiB));
      void *stream = (void *)(uintptr_t)(1 + rand_u64() % 3);
      void *p;
      if (lt_ca_alloc(&ca, n, stream, &p) != 0) {
        ooms++;
        if (!strstr(lt_last_error(), "out of memory")) model_errors++;
        continue;
      }
      size_t size = block_size(&ca, p);
      if (size < lt_ca_round_size(n) || size % 512) model_errors++;
      uint64_t tag = rand_u64();
      memcpy(p, &tag, 8); /* overlapping blocks would overwrite each other's tags */
      memcpy((char *)p + size - 8, &tag, 8);
      live[nlive++] = (live_block){p, n, size, tag};
      model_allocated += (int64_t)size;
      if (model_allocated > model_peak) model_peak = model_allocated;
    } else {
      int i = (int)((r >> 8) % (uint64_t)nlive);
      uint64_t head, tail;
      memcpy(&head, live[i].ptr, 8);
      memcpy(&tail, live[i].ptr + live[i].size - 8, 8);
      if (head != live[i].tag || tail != live[i].tag) tag_errors++;
      CHECK_OK(lt_ca_free(&ca, live[i].ptr));
      model_allocated -= (int64_t)live[i].size;
      live[i] = live[--nlive];
    }
    if (r % 7 == 0) complete_events(tb);
    if (r % 97 == 0) CHECK_OK(lt_ca_empty_cache(&ca));
    lt_ca_stats st = stats_of(&ca);
    if (st.allocated != model_allocated || st.peak_allocated != model_peak || st.reserved != (int64_t)tb->held ||
        st.num_segments != tb->nraw || st.allocated > st.reserved)
      model_errors++;
    if (step % 50 == 0) {
      layout_check lc = {.tb = tb};
      lt_ca_visit(&ca, visit_block, &lc);
      if (lc.seg_base && lc.covered != lc.seg_size) lc.bad++;
      if (lc.bad || lc.allocated_blocks != nlive) layout_errors++;
    }
  }
  CHECK(model_errors == 0, "%d steps disagree with the model (allocated, peak, reserved, segments)", model_errors);
  CHECK(tag_errors == 0, "%d live blocks were overwritten: overlap", tag_errors);
  CHECK(layout_errors == 0, "%d layout checks failed: blocks must tile their segments", layout_errors);
  CHECK(ooms < STEPS / 4, "%d OOMs under a 64 MiB limit", ooms);
  lt_ca_stats st = stats_of(&ca);
  CHECK(st.cache_hits > st.segment_allocs, "the cache serves most requests: %lld hits, %lld segments",
        (long long)st.cache_hits, (long long)st.segment_allocs);
  for (int i = 0; i < nlive; i++) CHECK_OK(lt_ca_free(&ca, live[i].ptr));
  complete_events(tb);
  CHECK_OK(lt_ca_empty_cache(&ca));
  CHECK(tb->held == 0 && stats_of(&ca).allocated == 0, "everything returned: %zu held", tb->held);
  finish(&ca, tb);
}

/* The public entry points without a usable CUDA device: ctest hides any GPU from unit tests
 * (CUDA_VISIBLE_DEVICES=), so this runs on every machine. With a GPU: test_caching_alloc_gpu.c. */
static void test_entry_points_without_gpu(void) {
  CHECK(lt_cuda_device_count() == 0, "a GPU is visible: run with CUDA_VISIBLE_DEVICES= (as ctest does)");
  lt_cuda_memory_stats st;
  CHECK_ERR(lt_cuda_get_memory_stats(0, &st), "memory_stats: device cuda:0 is not available");
  CHECK_ERR(lt_cuda_reset_peak_memory_stats(0), "reset_peak_memory_stats: device cuda:0 is not available");
  CHECK_ERR(lt_cuda_empty_cache(1), "empty_cache: device cuda:1 is not available");
  void *p = (void *)&st;
  CHECK_ERR(lt_cuda_host_alloc(4096, &p), "cuda_host_alloc:");
  CHECK(p == NULL, "no pinned pointer");
  CHECK_OK(lt_cuda_host_free(NULL));
}

int main(void) {
  test_rounding();
  test_split_coalesce();
  test_streams();
  test_stats();
  test_oom();
  test_bad_input();
  test_random();
  test_entry_points_without_gpu();
  return check_summary();
}
