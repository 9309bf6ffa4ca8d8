/* parallel.c — running a job's parts on an OpenMP team, or on this thread alone.
 *
 * A `#pragma omp parallel if (cond)` still sets up a team when cond is false (libgomp
 * allocates one), which costs more than a tiny op itself; kernels with per-thread state
 * (scratch rows, partial sums) therefore write their body as a part function and call it
 * through here, once per thread or once as part 0 of 1. */
#include "core/internal.h"
#ifdef _OPENMP
#include <omp.h>
#endif

int lt_run_parts(int (*part)(void *job, int tid, int nthreads), void *job, bool parallel) {
  if (!parallel) return part(job, 0, 1);
  int failed = 0;
#pragma omp parallel
  {
    int tid = 0, nthreads = 1;
#ifdef _OPENMP
    tid = omp_get_thread_num(), nthreads = omp_get_num_threads();
#endif
    if (part(job, tid, nthreads)) {
#pragma omp atomic write
      failed = 1;
    }
  }
  return failed;
}
