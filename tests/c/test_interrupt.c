/* lt_wall_time and lt_interrupt_*: Ctrl-C as a flag, the previous handler restored on a
 * second SIGINT and on disarm. */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "lutra.h"
#include <signal.h>
#include <string.h>
#include <time.h>

static volatile sig_atomic_t previous_calls;
static void previous_handler(int sig) {
  (void)sig;
  previous_calls++;
}

static void install_previous(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = previous_handler;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
}

static int current_is_previous(void) {
  struct sigaction now;
  sigaction(SIGINT, NULL, &now);
  return now.sa_handler == previous_handler;
}

int main(void) {
  // the wall clock moves forward, in seconds
  double t0 = lt_wall_time();
  struct timespec ms = {0, 20 * 1000 * 1000};
  nanosleep(&ms, NULL);
  double dt = lt_wall_time() - t0;
  CHECK(dt >= 0.019 && dt < 5.0, "20 ms sleep measured as %g s", dt);

  install_previous();
  CHECK(lt_interrupt_pending(0) == 0, "nothing pending before arming");
  CHECK_OK(lt_interrupt_arm());
  CHECK_OK(lt_interrupt_arm()); // arming twice keeps the first previous handler
  CHECK(!current_is_previous(), "armed: our handler is installed");
  raise(SIGINT);
  CHECK(lt_interrupt_pending(0) == 1, "a SIGINT sets the flag");
  CHECK(previous_calls == 0, "the previous handler was not called");
  CHECK(lt_interrupt_pending(1) == 1, "still pending; now cleared");
  CHECK(lt_interrupt_pending(0) == 0, "cleared");

  // a second SIGINT while the flag is set goes to the previous handler, which stays installed
  raise(SIGINT);
  raise(SIGINT);
  CHECK(previous_calls == 1, "the second SIGINT reached the previous handler (%d calls)", (int)previous_calls);
  CHECK(current_is_previous(), "the previous handler is back");
  CHECK_OK(lt_interrupt_disarm()); // already given back: a no-op
  CHECK(current_is_previous(), "still the previous handler");

  // disarm restores the previous handler and clears the flag
  CHECK_OK(lt_interrupt_arm());
  raise(SIGINT);
  CHECK_OK(lt_interrupt_disarm());
  CHECK(current_is_previous(), "disarm restores the previous handler");
  CHECK(lt_interrupt_pending(0) == 0, "disarm clears the flag");
  raise(SIGINT);
  CHECK(previous_calls == 2, "after disarm SIGINT reaches the previous handler (%d calls)", (int)previous_calls);
  return check_summary();
}
