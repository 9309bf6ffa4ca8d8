/* host.h — what the pieces of the lutra executable share (main.c, lineedit.c, crash.c). */
#ifndef LUTRA_APP_HOST_H
#define LUTRA_APP_HOST_H
#include <lua.h>

/* Opens the `lutra.host` module (line input, history, completion) and leaves its table
 * on the stack. */
int luaopen_lutra_host(lua_State *L);

/* SIGINT: while a line is being read it cancels the line; otherwise it interrupts the
 * running Lua code with an "interrupted!" error (a second Ctrl-C kills the process). */
void lutra_host_arm_sigint(lua_State *L);
void lutra_host_disarm_sigint(void);

/* SIGSEGV, SIGBUS, SIGILL, SIGFPE print a C backtrace on stderr, then end the process as
 * they would have (crash.c). LUTRA_NO_CRASH_HANDLER=1 leaves them alone. */
void lutra_install_crash_handler(void);

#endif
