/* allreduce_mpi.c — the peer of bench/allreduce.lua: a plain MPI_Allreduce loop (in place,
 * f32, sum) timed the same way, so that the two give comparable bus bandwidths.
 *
 * Built twice (bench/CMakeLists.txt):
 *   liballreduce_peer.so  allreduce_mpi_block() alone: bench/allreduce.lua loads it and runs
 *                         its blocks alternately with its own, in the same processes and
 *                         MPI world (a shared machine's load then weighs on both alike);
 *   allreduce_mpi         a standalone program: mpirun -np 2 build/bench/allreduce_mpi [reps]
 *                         prints "bytes seconds busbw_GB/s" per size on rank 0.
 * busbw = 2 (n - 1) / n * bytes / time (nccl-tests' definition for all-reduce). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

/* Runs k in-place MPI_Allreduce calls of count floats after a barrier; returns the seconds
 * per call of the slowest rank (the same on every rank). */
double allreduce_mpi_block(float *buf, int count, int k) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int i = 0; i < k; i++) MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double t = (MPI_Wtime() - t0) / k, slowest = t;
  MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

#ifndef ALLREDUCE_PEER_LIBRARY
static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// Calls per timed block: about 16 MiB of traffic, between 2 and 1000 calls.
static int calls_per_block(long bytes) {
  long k = (16L << 20) / bytes;
  return (int)(k < 2 ? 2 : k > 1000 ? 1000 : k);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int reps = argc > 1 ? atoi(argv[1]) : 7;
  if (reps < 1) reps = 1;
  long max_bytes = 64L << 20;
  float *buf = calloc((size_t)max_bytes / 4, 4); /* zeros: repeated sums stay finite */
  double *times = malloc(sizeof(double) * (size_t)reps);
  if (!buf || !times) {
    fprintf(stderr, "allreduce_mpi: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (long bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    int count = (int)(bytes / 4), k = calls_per_block(bytes);
    allreduce_mpi_block(buf, count, k); /* warm-up */
    for (int r = 0; r < reps; r++) times[r] = allreduce_mpi_block(buf, count, k);
    qsort(times, (size_t)reps, sizeof(double), compare_doubles);
    double t = reps % 2 ? times[reps / 2] : 0.5 * (times[reps / 2 - 1] + times[reps / 2]);
    double busbw = 2.0 * (size - 1) / size * (double)bytes / t / 1e9;
    if (rank == 0) printf("%ld %.9f %.4f\n", bytes, t, busbw);
  }
  free(buf);
  free(times);
  MPI_Finalize();
  return 0;
}
#endif
