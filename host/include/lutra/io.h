/* io.h — the C API, part: files: written safely, safetensors, checkpoint shards and manifests, JSON.
 * Include lutra.h, which includes every part in order (and cmake/gen_cdef.awk follows the
 * same order into the one ffi.cdef text); the conventions are at the head of lutra.h. */
#ifndef LUTRA_IO_H
#define LUTRA_IO_H

/* ---- files written safely (host/io/atomic_file.c) ----------------------------------------
 * Every file lutra writes goes through these. A whole file goes to a temporary beside PATH
 * (PATH.tmp.<12 random hex digits>, created with O_CREAT | O_EXCL | O_NOFOLLOW, mode 0644 less
 * the umask), is fsync'ed and renamed over PATH: a reader, or a run killed at any moment, sees
 * the old file or the new one, never half of one, and a symbolic link planted at PATH is
 * replaced by the file (said once on stderr), never written through: its target is left as it
 * was. On any failure the temporary is removed, PATH keeps what it held, and the error names
 * PATH and the OS's reason: "cannot write runs/x/model/config.json: no space left on device".
 * sync_dir = 1 also fsyncs PATH's directory after the rename (a checkpoint's commit: the rename
 * itself then survives a power cut).
 * An appended file (metrics.jsonl, samples.txt) is opened with O_APPEND | O_NOFOLLOW; a symbolic
 * link (or a file with other hard links) planted at PATH is first replaced by a fresh empty
 * regular file (said on stderr), never written through. truncate = 1 starts PATH empty.
 * Test hook: env LUTRA_FAULT=write:N kills the process (SIGKILL, as kill -9 does) once N bytes
 * have gone through lt_atomic_file_write, cutting the write that crosses N. */
typedef struct lt_atomic_file lt_atomic_file;   /* opaque: a temporary on its way to PATH */
typedef struct lt_append_file lt_append_file;   /* opaque: a file open for appending */
int lt_atomic_file_open(lt_atomic_file **out, const char *path);
int lt_atomic_file_write(lt_atomic_file *f, const void *data, int64_t nbytes);
/* fsync, close, rename over PATH (then fsync of the directory with sync_dir); frees f, and on
 * failure removes the temporary. */
int lt_atomic_file_commit(lt_atomic_file *f, int sync_dir);
int lt_atomic_file_abort(lt_atomic_file *f);     /* removes the temporary, frees f; NULL is ok */
/* The whole file in one call: open, write, commit. */
int lt_write_file_atomic(const char *path, const void *data, int64_t nbytes, int sync_dir);
int lt_append_file_open(lt_append_file **out, const char *path, int truncate);
int lt_append_file_write(lt_append_file *f, const void *data, int64_t nbytes);
int lt_append_file_close(lt_append_file *f);     /* NULL is ok */

/* ---- safetensors: defensive header parsing, tensor reads and writes (host/safetensors*.c) ----
 * A .safetensors file is an 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {"key": "value"}} (padded with spaces), then the data section, which
 * the offsets index. Parsing checks everything before any byte of data is trusted: N is
 * at most 100 MB and within the file, the JSON is well formed, dtypes are ones lutra has
 * (F32 F64 BF16 F16 I32 I64 U8 BOOL), shapes are non-negative integers of at most 8 dims
 * whose byte size does not overflow, offsets lie in the data section, end - begin equals
 * the byte size, no two tensors overlap, names are unique, and metadata values are
 * strings. Errors name the file (or "buffer"), the tensor and the problem. */

typedef struct lt_st_header lt_st_header; /* opaque: a validated header (and the open file) */

typedef struct lt_st_info {
  const char *name;  /* owned by the header */
  int64_t shape[8];  /* LT_MAX_DIMS */
  int64_t begin;     /* byte offsets in the data section */
  int64_t end;
  int32_t ndim;
  int32_t dtype;     /* lt_dtype */
} lt_st_info;

/* Parses the header at the start of buf (len bytes: at least 8 + N) of a file of
 * file_size bytes. source names it in messages (NULL: "buffer"). */
int lt_st_parse(lt_st_header **out, const void *buf, int64_t len, int64_t file_size, const char *source);
/* Opens and parses the file at path; the file stays open for lt_st_load until lt_st_close. */
int lt_st_open(lt_st_header **out, const char *path);
int lt_st_close(lt_st_header *h); /* NULL is ok */
/* Tensors are in name order (byte order of the UTF-8 names), i in [0, count). */
int lt_st_count(const lt_st_header *h, int64_t *count);
int lt_st_tensor(const lt_st_header *h, int64_t i, lt_st_info *info);
int lt_st_find(const lt_st_header *h, const char *name, int64_t *index); /* index -1 when absent */
int lt_st_data_offset(const lt_st_header *h, int64_t *offset); /* 8 + N: where the data section starts */
int lt_st_metadata_count(const lt_st_header *h, int64_t *count);
int lt_st_metadata(const lt_st_header *h, int64_t i, const char **key, const char **value);
/* Reads tensor i of an opened file into out (undefined: allocated on the CPU with the
 * stored dtype and shape; defined: must match them, contiguous on the CPU). */
int lt_st_load(lt_tensor *out, const lt_st_header *h, int64_t i);
/* Writes n tensors (contiguous, on the CPU) under unique names, sorted by name, with
 * n_meta metadata string pairs, to a temporary file that is fsync'ed and renamed to path. */
int lt_st_save(const char *path, int64_t n, const char *const *names, const lt_tensor *const *tensors, int64_t n_meta,
               const char *const *meta_keys, const char *const *meta_values);

/* ---- checkpoint io: lz4-framed shard files, background saves (host/ckpt_*.c) ----
 * A shard file holds pieces (the bytes of one tensor box each), each one or more LZ4 frames
 * (liblz4's frame format, content checksum on, at most chunk_bytes raw bytes a frame), then
 * a footer: one 40-byte little-endian entry per piece {u64 offset, u64 csize, u64 raw_bytes,
 * u32 nframes, u32 checksum, u32 shuffle, u32 0}, then 24 bytes {u64 count, u32 hash of the entries, u32
 * version, the 8 bytes "LTCKPT1\n"}. A piece's checksum hashes its frames' content checksums
 * (each of which LZ4 checks against the decoded bytes), so a footer that points at the wrong
 * frames is caught too. Every read checks every size against the file before trusting it;
 * errors name the file, the piece, the frame and the problem (bad magic, checksum mismatch,
 * truncated, size mismatch), never crash.
 *
 * A job writes one shard file: pieces are added (pointers to bytes that must stay valid
 * until the job is waited for), then it runs on this thread (lt_ckpt_job_run) or on a
 * background thread (lt_ckpt_job_start, then lt_ckpt_job_wait). It writes a temporary beside
 * PATH with large sequential writes, fsyncs it and renames it to PATH (lt_atomic_file_*).
 * With a commit (rank 0) it then waits until the `world` files tmp_dir/rank_%05d.lz4 exist,
 * writes tmp_dir/manifest.json, fsyncs it and tmp_dir, renames tmp_dir to final_dir (an older
 * final_dir is moved aside and removed), fsyncs the parent, and replaces latest_path by
 * latest_text (temp file, fsync, rename). On a failure (a full disk) the error names the file
 * and the reason, the temporary is removed, and every committed checkpoint stays as it was.
 * Every started job is joined at exit (atexit), so a process never ends with a save
 * half-written. Test hook: env LUTRA_FAULT=save:start | save:mid_file | save:after_file |
 * save:after_manifest | save:after_rename ends the process (_exit(86)) at
 * that point; POINT@R only on rank R (OMPI_COMM_WORLD_RANK, PMIX_RANK or LUTRA_RANK). */

typedef struct lt_ckpt_piece {
  int64_t offset;    /* of the piece's first frame in the file */
  int64_t csize;     /* compressed bytes (all its frames) */
  int64_t raw_bytes; /* decoded bytes */
  int32_t nframes;
  uint32_t checksum;
  int32_t shuffle;   /* 0: plain bytes; k > 1: each frame holds its bytes transposed by k-byte
                      * elements (all first bytes, then all second bytes, ...): the exponent
                      * bytes of float weights then compress, where plain lz4 finds nothing */
  int32_t reserved;
} lt_ckpt_piece;

typedef struct lt_ckpt_job lt_ckpt_job; /* opaque */

/* chunk_bytes <= 0: 4 MiB; level: lz4 compression level (0 fast, up to 12: HC). */
int lt_ckpt_job_new(lt_ckpt_job **out, const char *path, int64_t chunk_bytes, int level);
/* Adds a piece: copy = 1 copies the bytes now (the job owns them: an async save's host
 * buffer); copy = 2 has the job's thread copy them first, the caller keeping them unchanged
 * until lt_ckpt_job_wait_copied; copy = 0: they must stay valid until the job is waited for.
 * shuffle: 0 or 1 plain,
 * 2, 4 or 8: byte-transposed by elements of that size (nbytes a multiple of it). */
int lt_ckpt_job_add(lt_ckpt_job *j, const void *data, int64_t nbytes, int shuffle, int copy);
/* Threads compressing frames (default 1; 0: all of OpenMP's). */
int lt_ckpt_job_threads(lt_ckpt_job *j, int threads);
/* A small file the job writes (a copy of data; temp, fsync, rename) before its shard file
 * appears: this rank's extra state, files copied into the checkpoint. */
int lt_ckpt_job_add_file(lt_ckpt_job *j, const char *path, const void *data, int64_t nbytes);
/* A directory the committing job removes (rm -r) after a successful commit: the
 * checkpoints that keeping the last K drops. */
int lt_ckpt_job_remove_after(lt_ckpt_job *j, const char *path);
/* Makes the job rank 0's: commit the checkpoint once every rank's file is there (waiting at
 * most timeout_s seconds for the others; latest_path NULL: no pointer). */
int lt_ckpt_job_commit(lt_ckpt_job *j, const char *tmp_dir, const char *final_dir, const char *manifest_text,
                       int world, const char *latest_path, const char *latest_text, double timeout_s);
/* The commit alone (what a committing job does after its file), for callers that write the
 * files first and agree that every rank succeeded before committing. */
int lt_ckpt_commit(const char *tmp_dir, const char *final_dir, const char *manifest_text, int world,
                   const char *latest_path, const char *latest_text, double timeout_s);
int lt_ckpt_job_run(lt_ckpt_job *j);
int lt_ckpt_job_start(lt_ckpt_job *j);
int lt_ckpt_job_poll(lt_ckpt_job *j, int *done); /* done = 1 once the thread finished (still wait) */
/* Returns once a started job has taken its deferred copies (lt_ckpt_job_add with copy = 2: the
 * job's thread copies the sources first): after it the caller may change them. */
int lt_ckpt_job_wait_copied(lt_ckpt_job *j);
/* Retains t until the job has taken its deferred copies (then releases it, from the job's
 * thread): a source freed by its owner (a Lua state closing at exit) stays readable. */
int lt_ckpt_job_hold(lt_ckpt_job *j, lt_tensor *t);
int lt_ckpt_job_wait(lt_ckpt_job *j);            /* joins; 0 or -1 with the job's error */
/* After the job: piece i's frames, and totals (raw, compressed bytes; seconds it took). */
int lt_ckpt_job_piece(const lt_ckpt_job *j, int64_t i, lt_ckpt_piece *piece);
int lt_ckpt_job_stats(const lt_ckpt_job *j, int64_t *raw, int64_t *compressed, double *seconds);
int lt_ckpt_job_free(lt_ckpt_job *j); /* waits for a running job first; NULL is ok */
int lt_ckpt_wait_all(void);          /* joins every started job; the first error */

/* Reads a shard file's footer: *count pieces, the first min(count, max) into pieces (may be
 * NULL with max 0); *file_size the file's bytes. */
int lt_ckpt_read_index(const char *path, lt_ckpt_piece *pieces, int64_t max, int64_t *count, int64_t *file_size);
/* Decodes piece `index` of path (as its footer entry p says) into dst (dst_bytes must equal
 * p->raw_bytes), verifying magic, frame checksums, sizes and the piece checksum. */
int lt_ckpt_read_piece(const char *path, int64_t index, const lt_ckpt_piece *p, void *dst, int64_t dst_bytes);
/* Decodes bytes [begin, begin + len) of piece `index` into dst (len bytes): only the frames
 * holding them are decoded (each checked), the others are walked by their block headers;
 * the piece's size, frame count and checksum are verified as for a whole read. */
int lt_ckpt_read_range(const char *path, int64_t index, const lt_ckpt_piece *p, int64_t begin, int64_t len, void *dst);
/* Decodes every piece of path into a scratch buffer: a full check. raw/compressed may be NULL. */
int lt_ckpt_verify_file(const char *path, int64_t *raw, int64_t *compressed);

/* Files: fsync of a file or a directory; rename then fsync of the target's directory; an
 * atomic small file (lt_write_file_atomic with the directory fsync'ed); rm -r; and a whole
 * checkpoint removed: renamed to DIR.old-<pid> first (which no reader takes for a checkpoint,
 * and the next prune removes), so that a crash midway never leaves half of one under its name. */
int lt_ckpt_fsync_path(const char *path);
int lt_ckpt_rename(const char *from, const char *to);
int lt_ckpt_write_file(const char *path, const void *data, int64_t nbytes);
int lt_ckpt_remove_tree(const char *path);
int lt_ckpt_remove_checkpoint(const char *dir);

/* Validates a manifest.json text (host/io/ckpt_manifest.c) before Lua trusts it: format and
 * version, files (plain names), tensors (unique names, known dtypes, shapes of at most 8
 * non-negative dims without overflow), pieces (file in range, index >= 0, box inside the
 * global shape, bytes = box elements * dtype size). Counts go to n_tensors / n_pieces. */
int lt_ckpt_manifest_check(const char *text, int64_t len, const char *source, int64_t *n_tensors, int64_t *n_pieces);

/* ---- JSON ---------------------------------------------------------------------------
 * The one JSON reader, for C and for Lua (lutra.json walks a parsed text through these):
 * RFC 8259 and strict (no leading zeros, trailing commas or bare dots, no raw control
 * characters in strings, numbers within the double range, at most max_depth nested arrays
 * and objects, which is capped at 1000). A UTF-8 byte order mark is skipped. A bad text is
 * an error that names the problem and where: "',' or ']' expected, got end of input at line
 * 1 column 6" (columns count bytes). Strings are decoded to UTF-8 (escaped surrogate pairs joined;
 * a lone surrogate is an error; other bytes pass through unchecked) and may hold NUL bytes,
 * so their lengths are given. A repeated key is kept: an object's members come in the
 * order of the text, both of them (lutra.json keeps the last). Values live as long as
 * their document. */
typedef struct lt_json_doc lt_json_doc;     /* opaque: a parsed text */
typedef struct lt_json_value lt_json_value; /* opaque: a value inside a document */
enum {
  LT_JSON_NULL = 0,
  LT_JSON_FALSE = 1,
  LT_JSON_TRUE = 2,
  LT_JSON_NUMBER = 3,
  LT_JSON_STRING = 4,
  LT_JSON_ARRAY = 5,
  LT_JSON_OBJECT = 6
};
int lt_json_parse(lt_json_doc **out, const char *text, int64_t len, int max_depth);
void lt_json_free(lt_json_doc *doc);
const lt_json_value *lt_json_root(const lt_json_doc *doc);
int lt_json_type(const lt_json_value *value); /* LT_JSON_* */
double lt_json_number(const lt_json_value *value);
/* A string value's bytes and length (NULL for another type). */
const char *lt_json_string(const lt_json_doc *doc, const lt_json_value *value, int64_t *len);
/* The first item of an array or member of an object (NULL when empty or not a container),
 * the one after item (NULL at the end), and a member's key. */
const lt_json_value *lt_json_first(const lt_json_value *value);
const lt_json_value *lt_json_next(const lt_json_value *item);
const char *lt_json_key(const lt_json_doc *doc, const lt_json_value *member, int64_t *len);

/* ---- TensorBoard event files (host/io/tfevents.c) -------------------------------------------
 * A writer appends TFRecords (u64 length, masked CRC32C of it, an Event message, masked CRC32C
 * of that; the messages of host/io/proto/tfevents.proto, TensorBoard's own field numbers) to
 * DIR/events.out.tfevents.<unix seconds>.<hostname> (".2", ".3", ... appended when that name
 * is taken), opened as lt_append_file_open does: a link planted there is replaced, never written
 * through. DIR must exist. The first record is file_version "brain.Event:2". Records gather in
 * a buffer that lt_tb_flush writes out (so does a record once 1 MiB is waiting, and close).
 * wall_time < 0: now. Tags are non-empty UTF-8. Scalars are stored as f32 (simple_value), as
 * TensorBoard keeps them. Text goes to the text plugin: a scalar string tensor (DT_STRING)
 * whose metadata names plugin "text". Every failure names the file and the reason:
 * "tensorboard: cannot write runs/x/events.out.tfevents.1733329805.node1: no space left on
 * device"; a failed flush drops the records it held (the file stays a sequence of whole
 * records as far as the OS wrote them). */
typedef struct lt_tb_writer lt_tb_writer; /* opaque */
/* A histogram with its buckets given: bucket i counts values in (bucket_limit[i-1],
 * bucket_limit[i]] (bucket 0 from min); limits strictly increasing. */
typedef struct lt_tb_histo {
  double min, max, num, sum, sum_squares;
  const double *bucket_limit; /* n_buckets each */
  const double *bucket;
  int64_t n_buckets;
} lt_tb_histo;
int lt_tb_open(lt_tb_writer **out, const char *dir);
int lt_tb_path(const lt_tb_writer *w, const char **path); /* the events file's path, owned by w */
int lt_tb_scalar(lt_tb_writer *w, const char *tag, double value, int64_t step, double wall_time);
/* A session START at step: TensorBoard's readers then drop what earlier records hold for step
 * and later (a resumed run redoes those steps). */
int lt_tb_session_start(lt_tb_writer *w, int64_t step, double wall_time);
int lt_tb_text(lt_tb_writer *w, const char *tag, const char *text, int64_t len, int64_t step, double wall_time);
/* The histogram of n values in `bins` equal-width buckets spanning [min, max] of the finite
 * values (NaN and infinities are left out of every field; all values equal: one bucket).
 * Equal-width, not TensorFlow's exponential edges (some 1500 from 1e-12 up, kept when filled):
 * a fixed, small number of buckets a record, each count exact. */
int lt_tb_histogram(lt_tb_writer *w, const char *tag, const double *values, int64_t n, int bins, int64_t step,
                    double wall_time);
int lt_tb_histogram_buckets(lt_tb_writer *w, const char *tag, const lt_tb_histo *h, int64_t step, double wall_time);
int lt_tb_flush(lt_tb_writer *w);
int lt_tb_close(lt_tb_writer *w); /* flushes, closes, frees w (also on failure); NULL is ok */

#endif
