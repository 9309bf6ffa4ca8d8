/* sgemm_direct.c — the separate-process peer of bench/matmul.lua: cblas_sgemm n^3 f32 called
 * directly, with OpenBLAS's defaults (its own thread pool, OPENBLAS_NUM_THREADS or all cores).
 *   cc -O2 bench/sgemm_direct.c -o sgemm_direct -lopenblas && ./sgemm_direct [n] [reps]
 * Prints: gflops=<median over reps> threads=<OpenBLAS's>. bench/matmul_procs.sh builds and
 * runs it alternately with lutra. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int openblas_get_num_threads(void);

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 1024, reps = argc > 2 ? atoi(argv[2]) : 15;
  if (n < 1 || reps < 1 || reps > 1000) return fprintf(stderr, "usage: sgemm_direct [n] [reps]\n"), 2;
  float *a = malloc(sizeof(float) * (size_t)n * (size_t)n), *b = malloc(sizeof(float) * (size_t)n * (size_t)n),
        *c = malloc(sizeof(float) * (size_t)n * (size_t)n);
  double t[1000];
  if (!a || !b || !c) return 1;
  srand(1);
  for (size_t i = 0; i < (size_t)n * (size_t)n; i++) a[i] = (float)rand() / RAND_MAX - 0.5f, b[i] = (float)rand() / RAND_MAX - 0.5f;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    t[r] = now() - t0;
  }
  qsort(t, (size_t)reps, sizeof t[0], cmp);
  printf("gflops=%.1f threads=%d\n", 2.0 * n * n * n / t[reps / 2] / 1e9, openblas_get_num_threads());
  free(a), free(b), free(c);
  return 0;
}
