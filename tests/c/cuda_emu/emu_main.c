/* emu_main.c — the emulator's program (run.sh builds it): runs the suites named on the command
 * line ("all": every one), prints a line per suite and "N passed, N failed"; exit status 1 on
 * any failure or emulator error (a bad launch, a shuffle from an exited lane). */
#include "emu_check.h"
#include <time.h>
void emu_suite_reduce_softmax(const char *which);
void emu_suite_elementwise(void);
void emu_suite_layer_norm(void);
void emu_suite_loss(void);
void emu_suite_embedding(void);
void emu_suite_gather(void);
void emu_suite_rope(void);
void emu_suite_rng(void);
void emu_suite_optim(void);
void emu_suite_attention(void);
void emu_suite_errors(void);
void emu_suite_sort(void);
long emu_error_count(void);
static void reduce(void) { emu_suite_reduce_softmax("reduce"); }
static void softmax(void) { emu_suite_reduce_softmax("softmax"); }
static const struct {
  const char *name;
  void (*run)(void);
} suites[] = {{"elementwise", emu_suite_elementwise},
              {"layer_norm", emu_suite_layer_norm},
              {"loss", emu_suite_loss},
              {"embedding", emu_suite_embedding},
              {"gather", emu_suite_gather},
              {"rope", emu_suite_rope},
              {"rng", emu_suite_rng},
              {"optim", emu_suite_optim},
              {"attention", emu_suite_attention},
              {"reduce", reduce},
              {"softmax", softmax},
              {"sort", emu_suite_sort},
              {"errors", emu_suite_errors}}; /* last: it leaves the emulated device's sticky error behind */
int main(int argc, char **argv) {
  emu_quick = getenv("EMU_QUICK") && atoi(getenv("EMU_QUICK"));
  int ran = 0;
  for (size_t s = 0; s < sizeof suites / sizeof *suites; s++) {
    int want = 0;
    for (int a = 1; a < argc; a++) want |= !strcmp(argv[a], "all") || !strcmp(argv[a], suites[s].name);
    if (!want) continue;
    ran++;
    int p = emu_passes, f = emu_fails;
    long l = emu_launches;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    suites[s].run();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("suite %s: %d passed, %d failed (%ld launches, %.1f s)\n", suites[s].name, emu_passes - p, emu_fails - f,
           emu_launches - l, (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    fflush(stdout);
  }
  if (!ran) return printf("no such suite\n"), 2;
  long errs = emu_error_count();
  if (errs) printf("emulator errors: %ld\n", errs), emu_fails++;
  printf("%d passed, %d failed\n", emu_passes, emu_fails);
  return emu_fails != 0;
}
