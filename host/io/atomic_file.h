/* atomic_file.h — what host/io's own writers need of host/io/atomic_file.c beyond lutra.h:
 * the temporary's descriptor (for large sequential and positioned writes), and error
 * messages prefixed with the writer's name. */
#ifndef LUTRA_IO_ATOMIC_FILE_H
#define LUTRA_IO_ATOMIC_FILE_H
#include "lutra.h"

/* The temporary's open descriptor (write-only; -1 for NULL). Writes through it count as
 * lt_atomic_file_write's: lt_atomic_file_commit fsyncs and renames whatever it holds. */
int lt_atomic_file_fd(const lt_atomic_file *f);
const char *lt_atomic_file_path(const lt_atomic_file *f);
/* fsync of a directory (a rename in it made durable); EINVAL (no sync there) is no error. */
int lt_fsync_dir(const char *dir);
/* Puts prefix ("ckpt: ") before the thread's last error message; returns -1. */
int lt_io_error_prefix(const char *prefix);
#endif
