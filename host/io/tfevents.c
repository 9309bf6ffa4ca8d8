/* tfevents.c — TensorBoard event files (lutra.h, "TensorBoard event files"): Event messages
 * (host/io/proto/tfevents.proto, packed by protobuf-c) framed as TFRecords, collected in a
 * buffer and appended to DIR/events.out.tfevents.<unix secs>.<hostname> through the project's
 * append writer (atomic_file.c: a link planted there is replaced, never written through).
 *
 * A TFRecord is: u64 length (little-endian), u32 masked CRC32C of those 8 bytes, the data,
 * u32 masked CRC32C of the data; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "core/internal.h"
#include "io/atomic_file.h"
#include "io/proto/tfevents.pb-c.h"
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { FLUSH_AT = 1 << 20 }; /* buffered bytes past which a record is written out at once */

struct lt_tb_writer {
  lt_append_file *file;
  char *path;
  uint8_t *buf; /* framed records not yet written */
  size_t len, cap;
};

/* ---- CRC32C (Castagnoli, reflected polynomial 0x82f63b78) --------------------------------
 * Debian 12 packages no CRC32C library for C (Google's crc32c is not there; ISA-L would be a
 * dependency for these twenty lines), so a byte-wise table: records are small (a histogram is
 * its buckets, not its values), and the table does several hundred MB/s. */
static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    crc_table[i] = c;
  }
}

static uint32_t crc32c(const uint8_t *p, size_t n) {
  pthread_once(&crc_once, crc_init);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

static uint32_t masked_crc(const uint8_t *p, size_t n) {
  uint32_t c = crc32c(p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* ---- records ------------------------------------------------------------------------------ */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int lt_tb_flush(lt_tb_writer *w) {
  if (!w) return lt_errorf("tensorboard: writer is NULL");
  if (!w->file) return lt_errorf("tensorboard: cannot write %s: the writer is closed", w->path);
  if (w->len == 0) return 0;
  size_t n = w->len;
  w->len = 0; /* a failed write drops what it held: the next records still frame correctly */
  if (lt_append_file_write(w->file, w->buf, (int64_t)n) != 0) return lt_io_error_prefix("tensorboard: ");
  return 0;
}

/* Packs ev as one framed record at the end of the buffer. */
static int add_event(lt_tb_writer *w, Tfevents__Event *ev) {
  if (!w) return lt_errorf("tensorboard: writer is NULL");
  if (!w->file) return lt_errorf("tensorboard: cannot write %s: the writer is closed", w->path);
  size_t n = protobuf_c_message_get_packed_size(&ev->base);
  size_t need = w->len + n + 16;
  if (need > w->cap) {
    size_t cap = w->cap ? w->cap : 4096;
    while (cap < need) cap *= 2;
    uint8_t *b = realloc(w->buf, cap);
    if (!b) return lt_errorf("tensorboard: cannot write %s: out of memory (a record of %zu bytes)", w->path, n);
    w->buf = b, w->cap = cap;
  }
  uint8_t *r = w->buf + w->len;
  put_le(r, n, 8);
  put_le(r + 8, masked_crc(r, 8), 4);
  protobuf_c_message_pack(&ev->base, r + 12);
  put_le(r + 12 + n, masked_crc(r + 12, n), 4);
  w->len += n + 16;
  return w->len >= FLUSH_AT ? lt_tb_flush(w) : 0;
}

/* Whether s is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF):
 * a tag is a protobuf string, and a reader refuses a whole file over one bad string. */
static bool utf8_ok(const unsigned char *s) {
  while (*s) {
    unsigned c = *s++, n = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : 9;
    if (n == 9) return false;
    uint32_t cp = n == 0 ? c : c & (0x3fu >> n);
    for (unsigned k = 0; k < n; k++, s++) {
      if ((*s & 0xc0) != 0x80) return false;
      cp = cp << 6 | (*s & 0x3fu);
    }
    static const uint32_t least[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
  }
  return true;
}

/* An event at step (wall_time < 0: now), its content still to set. */
static Tfevents__Event event_at(int64_t step, double wall_time) {
  Tfevents__Event ev = TFEVENTS__EVENT__INIT;
  ev.wall_time = wall_time >= 0 ? wall_time : now_s();
  ev.step = step;
  return ev;
}

/* An event holding one summary value. */
static int add_value(lt_tb_writer *w, Tfevents__Summary__Value *v, int64_t step, double wall_time) {
  if (!v->tag || !*v->tag) return lt_errorf("tensorboard: the tag is NULL or empty");
  if (!utf8_ok((const unsigned char *)v->tag)) return lt_errorf("tensorboard: the tag %s is not valid UTF-8", v->tag);
  Tfevents__Summary summary = TFEVENTS__SUMMARY__INIT;
  summary.n_value = 1;
  summary.value = &v;
  Tfevents__Event ev = event_at(step, wall_time);
  ev.what_case = TFEVENTS__EVENT__WHAT_SUMMARY;
  ev.summary = &summary;
  return add_event(w, &ev);
}

int lt_tb_session_start(lt_tb_writer *w, int64_t step, double wall_time) {
  Tfevents__SessionLog log = TFEVENTS__SESSION_LOG__INIT;
  log.status = TFEVENTS__SESSION_LOG__SESSION_STATUS__START;
  Tfevents__Event ev = event_at(step, wall_time);
  ev.what_case = TFEVENTS__EVENT__WHAT_SESSION_LOG;
  ev.session_log = &log;
  return add_event(w, &ev);
}

int lt_tb_scalar(lt_tb_writer *w, const char *tag, double value, int64_t step, double wall_time) {
  Tfevents__Summary__Value v = TFEVENTS__SUMMARY__VALUE__INIT;
  v.tag = (char *)tag;
  v.value_case = TFEVENTS__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
  v.simple_value = (float)value; /* TensorBoard's scalars are f32 */
  return add_value(w, &v, step, wall_time);
}

int lt_tb_text(lt_tb_writer *w, const char *tag, const char *text, int64_t len, int64_t step, double wall_time) {
  if (!text || len < 0) return lt_errorf("tensorboard: text for tag %s is NULL or of negative length", tag ? tag : "?");
  /* the text plugin's form: a scalar string tensor, plugin_name "text" */
  Tfevents__SummaryMetadata__PluginData plugin = TFEVENTS__SUMMARY_METADATA__PLUGIN_DATA__INIT;
  plugin.plugin_name = "text";
  Tfevents__SummaryMetadata meta = TFEVENTS__SUMMARY_METADATA__INIT;
  meta.plugin_data = &plugin;
  Tfevents__TensorShapeProto shape = TFEVENTS__TENSOR_SHAPE_PROTO__INIT;
  ProtobufCBinaryData s = {(size_t)len, (uint8_t *)text};
  Tfevents__TensorProto tensor = TFEVENTS__TENSOR_PROTO__INIT;
  tensor.dtype = TFEVENTS__DATA_TYPE__DT_STRING;
  tensor.tensor_shape = &shape;
  tensor.n_string_val = 1;
  tensor.string_val = &s;
  Tfevents__Summary__Value v = TFEVENTS__SUMMARY__VALUE__INIT;
  v.tag = (char *)tag;
  v.metadata = &meta;
  v.value_case = TFEVENTS__SUMMARY__VALUE__VALUE_TENSOR;
  v.tensor = &tensor;
  return add_value(w, &v, step, wall_time);
}

int lt_tb_histogram_buckets(lt_tb_writer *w, const char *tag, const lt_tb_histo *h, int64_t step, double wall_time) {
  if (!h || h->n_buckets < 0 || (h->n_buckets > 0 && (!h->bucket_limit || !h->bucket)))
    return lt_errorf("tensorboard: histogram %s: bad buckets (NULL arrays or a negative count)", tag ? tag : "?");
  for (int64_t i = 1; i < h->n_buckets; i++)
    if (!(h->bucket_limit[i] > h->bucket_limit[i - 1]))
      return lt_errorf("tensorboard: histogram %s: bucket_limit[%lld] = %g is not above bucket_limit[%lld] = %g",
                       tag ? tag : "?", (long long)i, h->bucket_limit[i], (long long)i - 1, h->bucket_limit[i - 1]);
  Tfevents__HistogramProto histo = TFEVENTS__HISTOGRAM_PROTO__INIT;
  histo.min = h->min, histo.max = h->max, histo.num = h->num, histo.sum = h->sum, histo.sum_squares = h->sum_squares;
  histo.n_bucket_limit = histo.n_bucket = (size_t)h->n_buckets;
  histo.bucket_limit = (double *)h->bucket_limit;
  histo.bucket = (double *)h->bucket;
  Tfevents__Summary__Value v = TFEVENTS__SUMMARY__VALUE__INIT;
  v.tag = (char *)tag;
  v.value_case = TFEVENTS__SUMMARY__VALUE__VALUE_HISTO;
  v.histo = &histo;
  return add_value(w, &v, step, wall_time);
}

/* Equal-width buckets over [min, max] of the finite values: bucket i holds (limit[i-1], limit[i]]
 * (bucket 0 from min itself), limit[i] = min + (max - min) * (i + 1) / bins, the last one max. */
int lt_tb_histogram(lt_tb_writer *w, const char *tag, const double *values, int64_t n, int bins, int64_t step,
                    double wall_time) {
  if (n < 0 || (n > 0 && !values)) return lt_errorf("tensorboard: histogram %s: values NULL or n < 0", tag ? tag : "?");
  if (bins < 1 || bins > 100000) return lt_errorf("tensorboard: histogram %s: bins = %d (1 to 100000)", tag ? tag : "?", bins);
  lt_tb_histo h = {0};
  double lo = DBL_MAX, hi = -DBL_MAX;
  for (int64_t i = 0; i < n; i++) {
    double x = values[i];
    if (!isfinite(x)) continue; /* NaN and infinities are left out: they have no bucket */
    lo = fmin(lo, x), hi = fmax(hi, x);
    h.num += 1, h.sum += x, h.sum_squares += x * x;
  }
  if (h.num == 0) return lt_tb_histogram_buckets(w, tag, &h, step, wall_time);
  if (hi == lo) bins = 1;
  h.min = lo, h.max = hi, h.n_buckets = bins;
  double *limit = malloc(2 * (size_t)bins * sizeof *limit);
  if (!limit) return lt_errorf("tensorboard: histogram %s: out of memory (%d bins)", tag, bins);
  double *count = limit + bins, width = (hi - lo) / bins;
  for (int b = 0; b < bins; b++) limit[b] = lo + (hi - lo) * (b + 1) / bins, count[b] = 0;
  limit[bins - 1] = hi;
  for (int64_t i = 0; i < n; i++) {
    double x = values[i];
    if (!isfinite(x)) continue;
    double q = width > 0 ? ceil((x - lo) / width) - 1 : 0;
    int b = q < 0 ? 0 : q > bins - 1 ? bins - 1 : (int)q;
    /* the division may round across an edge: settle on the stored limits */
    while (b < bins - 1 && x > limit[b]) b++;
    while (b > 0 && x <= limit[b - 1]) b--;
    count[b] += 1;
  }
  h.bucket_limit = limit, h.bucket = count;
  int rc = lt_tb_histogram_buckets(w, tag, &h, step, wall_time);
  free(limit);
  return rc;
}

/* ---- the file ------------------------------------------------------------------------------ */

static void free_writer(lt_tb_writer *w) {
  if (!w) return;
  free(w->path), free(w->buf);
  free(w);
}

int lt_tb_open(lt_tb_writer **out, const char *dir) {
  if (!out || !dir || !*dir) return lt_errorf("tensorboard: out or dir is NULL or empty");
  *out = NULL;
  struct stat st;
  if (stat(dir, &st) != 0) {
    char r[128];
    snprintf(r, sizeof r, "%s", strerror(errno));
    r[0] = (char)tolower((unsigned char)r[0]);
    return lt_errorf("tensorboard: cannot write in %s: %s", dir, r);
  }
  if (!S_ISDIR(st.st_mode)) return lt_errorf("tensorboard: cannot write in %s: not a directory", dir);
  char host[256] = "localhost";
  if (gethostname(host, sizeof host - 1) != 0 || !host[0]) snprintf(host, sizeof host, "localhost");
  for (char *c = host; *c; c++)
    if (*c == '/') *c = '_';
  lt_tb_writer *w = calloc(1, sizeof *w);
  size_t cap = strlen(dir) + strlen(host) + 64;
  if (!w || !(w->path = malloc(cap))) {
    free_writer(w);
    return lt_errorf("tensorboard: cannot write in %s: out of memory", dir);
  }
  /* a second writer in the same second takes NAME.2, NAME.3, ...: one writer a file */
  long long secs = (long long)time(NULL);
  for (int k = 1;; k++) {
    int len = snprintf(w->path, cap, "%s/events.out.tfevents.%lld.%s", dir, secs, host);
    if (k > 1) snprintf(w->path + len, cap - (size_t)len, ".%d", k);
    if (lstat(w->path, &st) != 0 && errno == ENOENT) break;
    if (k == 1000) {
      lt_errorf("tensorboard: cannot write in %s: %s and 999 more names are taken", dir, w->path);
      free_writer(w);
      return -1;
    }
  }
  if (lt_append_file_open(&w->file, w->path, 0) != 0) {
    lt_io_error_prefix("tensorboard: ");
    free_writer(w);
    return -1;
  }
  Tfevents__Event ev = TFEVENTS__EVENT__INIT;
  ev.wall_time = now_s();
  ev.what_case = TFEVENTS__EVENT__WHAT_FILE_VERSION;
  ev.file_version = "brain.Event:2";
  if (add_event(w, &ev) != 0 || lt_tb_flush(w) != 0) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", lt_last_error());
    lt_append_file_close(w->file);
    free_writer(w);
    return lt_errorf("%s", msg);
  }
  *out = w;
  return 0;
}

int lt_tb_path(const lt_tb_writer *w, const char **path) {
  if (!w || !path) return lt_errorf("tensorboard: writer or path is NULL");
  *path = w->path;
  return 0;
}

int lt_tb_close(lt_tb_writer *w) {
  if (!w) return 0;
  char msg[1024] = "";
  int rc = lt_tb_flush(w);
  if (rc != 0) snprintf(msg, sizeof msg, "%s", lt_last_error());
  if (lt_append_file_close(w->file) != 0 && rc == 0) {
    rc = lt_io_error_prefix("tensorboard: ");
    snprintf(msg, sizeof msg, "%s", lt_last_error());
  }
  free_writer(w);
  return rc != 0 ? lt_errorf("%s", msg) : 0;
}
