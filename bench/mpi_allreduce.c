/* mpi_allreduce.c — the peer of bench/allreduce.lua: a plain MPI_Allreduce loop in C (f32
 * sum, in place, MPI_COMM_WORLD). Built twice: as a shared library whose function
 * bench/allreduce.lua calls between its own timed blocks (same process, same moment:
 * fair on a busy machine), and as a program:
 *   mpirun -np N mpi_allreduce [bytes...]   -> "bytes B seconds S" per size on rank 0 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

/* Seconds for `iters` in-place MPI_Allreduce calls of n floats. */
double bench_mpi_allreduce_loop(float *buf, int n, int iters) {
  double t0 = MPI_Wtime();
  for (int i = 0; i < iters; i++) MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  return MPI_Wtime() - t0;
}

#ifndef PEER_LIBRARY
static int compare(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// Median over 7 blocks of the seconds per call; iters doubled until a block takes 50 ms.
static double time_allreduce(float *buf, int n) {
  int iters = 1;
  for (;;) { /* every rank must agree on iters: rank 0 decides */
    int more = bench_mpi_allreduce_loop(buf, n, iters) < 0.05 && iters < (1 << 20);
    MPI_Bcast(&more, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!more) break;
    iters *= 2;
  }
  double times[7];
  for (int b = 0; b < 7; b++) {
    MPI_Barrier(MPI_COMM_WORLD);
    times[b] = bench_mpi_allreduce_loop(buf, n, iters) / iters;
  }
  MPI_Allreduce(MPI_IN_PLACE, times, 7, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  qsort(times, 7, sizeof *times, compare);
  return times[3];
}

int main(int argc, char **argv) {
  int provided, rank;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  long sizes[32] = {4096, 65536, 1 << 20, 16 << 20};
  int nsizes = 4;
  if (argc > 1) {
    nsizes = 0;
    for (int i = 1; i < argc && nsizes < 32; i++) sizes[nsizes++] = atol(argv[i]);
  }
  for (int s = 0; s < nsizes; s++) {
    int n = (int)(sizes[s] / 4);
    float *buf = calloc((size_t)n, sizeof *buf);
    double t = time_allreduce(buf, n);
    if (rank == 0) printf("bytes %ld seconds %.9g\n", sizes[s], t);
    fflush(stdout);
    free(buf);
  }
  MPI_Finalize();
  return 0;
}
#endif
