/* crash.c — a fatal signal (a segmentation fault, a bus error, an illegal instruction)
 * prints where it happened before the process dies, so that a crash in a CI log or on a
 * cluster node leaves a C backtrace rather than only "Segmentation fault". The signal is
 * then re-raised with its default action: the exit status and any core dump stay as they
 * would have been. Under mpirun, MPI_Init installs OpenMPI's own handler instead; under
 * AddressSanitizer its report is better, so nothing is installed there. */
#include "host.h"
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define LUTRA_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LUTRA_UNDER_ASAN 1
#endif
#endif

#ifndef LUTRA_UNDER_ASAN
static void write_str(const char *s) { (void)!write(STDERR_FILENO, s, strlen(s)); }

static void on_fatal_signal(int sig) {
  /* only async-signal-safe calls: write, backtrace_symbols_fd (preloaded below), raise */
  char line[160];
  const char *name = sig == SIGSEGV  ? "SIGSEGV (invalid memory access)"
                     : sig == SIGBUS ? "SIGBUS (bus error)"
                     : sig == SIGILL ? "SIGILL (illegal instruction)"
                                     : "SIGFPE (arithmetic fault)";
  /* snprintf is not on the async-signal-safe list, but glibc's does not allocate for %d/%s */
  snprintf(line, sizeof line, "\nlutra: fatal signal %s in process %d; C backtrace:\n", name, (int)getpid());
  write_str(line);
  void *frames[64];
  int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  write_str("lutra: (symbolize with: addr2line -f -e <binary or liblutra.so> <offset>)\n");
  raise(sig); /* SA_RESETHAND: the default action now, with the original exit status */
}

#endif

void lutra_install_crash_handler(void) {
#ifndef LUTRA_UNDER_ASAN
  const char *off = getenv("LUTRA_NO_CRASH_HANDLER");
  if (off && *off && strcmp(off, "0") != 0) return;
  void *warm[1];
  backtrace(warm, 1); /* loads libgcc's unwinder now, not inside the handler */
  /* an alternate stack, so that a stack overflow can still report */
  static char alt_stack[64 * 1024];
  stack_t ss = {.ss_sp = alt_stack, .ss_size = sizeof alt_stack, .ss_flags = 0};
  sigaltstack(&ss, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fatal_signal;
  sa.sa_flags = SA_RESETHAND | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
#endif
}
