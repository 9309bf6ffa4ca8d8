/* thread_env.c — thread pool settings that must be in the environment before libgomp and
 * OpenBLAS initialise (their constructors read it, before main runs).
 *
 * An idle OpenMP worker spins for GOMP_SPINCOUNT (300000 by default: milliseconds) before it
 * sleeps, so between two ops, while Lua runs the glue, the workers keep the cores busy. On a
 * machine with no spare core (a laptop, or a shared box) the spinning takes the time the main
 * thread needs: the training step of bench/gpt_step.lua ran 1.5-3x slower on 2 busy cores.
 * A short spin keeps back-to-back ops cheap and lets the workers sleep in the gaps. BLAS runs
 * on one thread (lt_matmul cuts big gemms over the OpenMP threads), so OpenBLAS need not start
 * a pool of its own. A value the user set wins.
 *
 * libgomp and OpenBLAS read these in their constructors, which run before any code of ours
 * (and libc sets up its environment after .preinit_array, so setting them there is lost). So a
 * constructor of the executable, when the settings are missing, adds them and re-executes
 * the same program with the same arguments (once: the second run finds them set). */
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor)) static void lutra_thread_env(int argc, char **argv, char **envp) {
  (void)argc, (void)envp;
  int missing = 0;
  if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) missing = 1;
  if (!getenv("OPENBLAS_NUM_THREADS") || !getenv("OPENBLAS_THREAD_TIMEOUT")) missing = 1;
  if (!missing || !argv || !argv[0]) return;
  if (!getenv("OMP_WAIT_POLICY")) setenv("GOMP_SPINCOUNT", "2000", 0);
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
  /* 2^4 cycles of spinning (the minimum) instead of 2^28: OpenBLAS's workers, used for very
   * large gemms only, go to sleep at once rather than take a core from the OpenMP threads */
  setenv("OPENBLAS_THREAD_TIMEOUT", "4", 0);
  execv("/proc/self/exe", argv); /* returns only on failure: go on with the defaults */
}
