/* alltoall_mpi.c — the peer of bench/alltoall.lua: a plain MPI_Alltoallv loop (f32, the same
 * counts and displacements for sending and receiving) timed the same way, so that the two give
 * comparable bandwidths. Built as liballtoall_peer.so (bench/CMakeLists.txt), which
 * bench/alltoall.lua loads and runs alternately with its own calls, in the same processes and
 * MPI world (a shared machine's load then weighs on both alike). */
#include <mpi.h>

/* Runs k MPI_Alltoallv calls from send into recv (counts[i] floats at displs[i] for rank i,
 * both ways) after a barrier; returns the seconds per call of the slowest rank (the same on
 * every rank). */
double alltoall_mpi_block(const float *send, float *recv, const int *counts, const int *displs, int k) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int i = 0; i < k; i++)
    MPI_Alltoallv(send, counts, displs, MPI_FLOAT, recv, counts, displs, MPI_FLOAT, MPI_COMM_WORLD);
  double t = (MPI_Wtime() - t0) / k, slowest = t;
  MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}
