/* interrupt.c — what a training loop needs from the system: a monotonic wall clock, and
 * Ctrl-C as a flag that the loop polls between steps (so that it stops cleanly after the
 * current step instead of being interrupted in the middle of one). */
#define _POSIX_C_SOURCE 200809L
#include "core/internal.h"
#include <signal.h>
#include <string.h>
#include <time.h>

double lt_wall_time(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static volatile sig_atomic_t interrupt_pending;
static volatile sig_atomic_t interrupt_armed;
static struct sigaction previous_action;

/* The first SIGINT sets the flag. A second one before the flag was cleared gives the
 * signal back to the handler in force before arming (the lutra host's: it interrupts the
 * running Lua code), re-raised once this handler returns. May run on any thread. */
static void on_sigint(int sig) {
  if (!interrupt_pending) {
    interrupt_pending = 1;
    return;
  }
  sigaction(SIGINT, &previous_action, NULL);
  interrupt_armed = 0;
  raise(sig);
}

int lt_interrupt_arm(void) {
  if (interrupt_armed) return 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  interrupt_pending = 0;
  if (sigaction(SIGINT, &sa, &previous_action) != 0) return lt_errorf("interrupt_arm: sigaction failed");
  interrupt_armed = 1;
  return 0;
}

int lt_interrupt_pending(int clear) {
  int p = interrupt_pending;
  if (clear) interrupt_pending = 0;
  return p;
}

int lt_interrupt_disarm(void) {
  if (!interrupt_armed) return 0;
  interrupt_armed = 0;
  interrupt_pending = 0;
  if (sigaction(SIGINT, &previous_action, NULL) != 0) return lt_errorf("interrupt_disarm: sigaction failed");
  return 0;
}
