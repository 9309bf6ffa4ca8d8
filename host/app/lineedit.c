/* lineedit.c — the `lutra.host` Lua module: line input for the REPL (GNU readline on a
 * terminal, plain lines from a pipe), persistent history, tab completion computed by a
 * Lua function, and Ctrl-C handling. The REPL logic itself is Lua (lua/lutra/repl.lua). */
#include "host.h"
#include "lutra.h"
#include <errno.h>
#include <fcntl.h>
#include <lauxlib.h>
#include <readline/history.h>
#include <readline/readline.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>

/* ---- SIGINT ------------------------------------------------------------------------- */

static lua_State *sigint_L;
static volatile sig_atomic_t reading_line; /* 1 while host.readline waits for input */
static volatile sig_atomic_t got_sigint;

static void interrupt_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  luaL_where(L, 0);
  lua_pushfstring(L, "%sinterrupted!", lua_tostring(L, -1));
  lua_error(L);
}

/* The handler may run on any thread (OpenMP and OpenBLAS workers do not block SIGINT), so
 * it wakes the reader through a pipe rather than counting on EINTR in the main thread. */
static int wake_pipe[2] = {-1, -1};

static void on_sigint(int sig) {
  if (reading_line) {
    got_sigint = 1;
    if (wake_pipe[1] >= 0) {
      ssize_t w = write(wake_pipe[1], "", 1);
      (void)w;
    }
    return;
  }
  signal(sig, SIG_DFL); /* a second Ctrl-C before the hook runs kills the process */
  if (sigint_L) lua_sethook(sigint_L, interrupt_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

void lutra_host_arm_sigint(lua_State *L) {
  sigint_L = L;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint; /* no SA_RESTART: a blocked read must return EINTR */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
}

void lutra_host_disarm_sigint(void) { signal(SIGINT, SIG_DFL); }

/* ---- completion: readline asks, a Lua function answers ------------------------------ */

static lua_State *complete_L;
static int complete_fn_index; /* stack slot of the completer while host.readline runs */

/* The "word" readline completes is a dotted/colon path like `lutra.ze` or `t:fi`. */
static char word_breaks[] = " \t\n\"\\'`@$><=;|&{}()[]+-*/%^~#,!?";

static char *common_prefix(char **words, int n) {
  size_t len = strlen(words[0]);
  for (int i = 1; i < n; i++) {
    size_t k = 0;
    while (k < len && words[i][k] == words[0][k]) k++;
    len = k;
  }
  char *p = malloc(len + 1);
  if (!p) return NULL;
  memcpy(p, words[0], len);
  p[len] = 0;
  return p;
}

/* Calls completer(line up to the cursor) -> list of replacements for `text`. */
static char **complete_with_lua(const char *text, int start, int end) {
  (void)start;
  rl_attempted_completion_over = 1; /* never fall back to file names */
  rl_completion_append_character = '\0';
  lua_State *L = complete_L;
  if (!L || !complete_fn_index || !lua_isfunction(L, complete_fn_index)) return NULL;
  int top = lua_gettop(L);
  if (!lua_checkstack(L, 8)) return NULL;
  lua_pushvalue(L, complete_fn_index);
  lua_pushlstring(L, rl_line_buffer, (size_t)end);
  lua_pushstring(L, text);
  char **matches = NULL;
  if (lua_pcall(L, 2, 1, 0) == 0 && lua_istable(L, -1)) {
    int n = (int)lua_objlen(L, -1), kept = 0;
    matches = calloc((size_t)n + 2, sizeof *matches);
    for (int i = 1; matches && i <= n; i++) {
      lua_rawgeti(L, -1, i);
      const char *s = lua_tostring(L, -1);
      if (s) matches[1 + kept++] = strdup(s);
      lua_pop(L, 1);
    }
    if (matches && kept == 0) {
      free(matches);
      matches = NULL;
    } else if (matches && kept == 1) { /* one match: readline wants it in slot 0 alone */
      matches[0] = matches[1];
      matches[1] = NULL;
    } else if (matches) {
      matches[0] = common_prefix(matches + 1, kept);
    }
  }
  lua_settop(L, top);
  return matches;
}

/* ---- reading a line ----------------------------------------------------------------- */

static char *rl_result;
static int rl_finished;

static void on_line(char *line) {
  rl_result = line;
  rl_finished = 1;
  rl_callback_handler_remove();
}

/* Pushes the line, nil at end of input, or false when Ctrl-C cancelled it. */
static int read_terminal_line(lua_State *L, const char *prompt) {
  rl_finished = 0;
  rl_result = NULL;
  rl_outstream = (!isatty(1) && isatty(2)) ? stderr : stdout; /* stdout may be a log file */
  rl_callback_handler_install(prompt, on_line);
  int fd = fileno(rl_instream ? rl_instream : stdin);
  int interrupted = 0, failure = 0;
  while (!rl_finished) {
    if (got_sigint) {
      interrupted = 1;
      break;
    }
    fd_set fds;
    FD_ZERO(&fds);
    FD_SET(fd, &fds);
    int nfds = fd + 1;
    if (wake_pipe[0] >= 0) {
      FD_SET(wake_pipe[0], &fds);
      if (wake_pipe[0] >= nfds) nfds = wake_pipe[0] + 1;
    }
    if (select(nfds, &fds, NULL, NULL, NULL) < 0) {
      if (errno == EINTR) continue;
      failure = errno;
      break;
    }
    if (wake_pipe[0] >= 0 && FD_ISSET(wake_pipe[0], &fds)) {
      char drain[64];
      while (read(wake_pipe[0], drain, sizeof drain) > 0) {
      }
    }
    if (FD_ISSET(fd, &fds) && !got_sigint) rl_callback_read_char();
  }
  if (interrupted) {
    rl_free_line_state();
    rl_callback_sigcleanup();
    rl_cleanup_after_signal();
    rl_callback_handler_remove();
    fputs("^C\n", rl_outstream);
    fflush(rl_outstream);
  } else if (failure) {
    rl_callback_handler_remove();
  }
  if (failure) return luaL_error(L, "readline: select failed: %s", strerror(failure));
  if (interrupted) {
    lua_pushboolean(L, 0);
  } else if (rl_result) {
    lua_pushstring(L, rl_result);
    free(rl_result);
  } else {
    lua_pushnil(L);
  }
  return 1;
}

static int read_plain_line(lua_State *L) {
  char *buf = NULL;
  size_t cap = 0;
  errno = 0;
  ssize_t n = getline(&buf, &cap, stdin);
  if (n < 0) {
    int interrupted = errno == EINTR && got_sigint;
    free(buf);
    clearerr(stdin);
    if (interrupted)
      lua_pushboolean(L, 0);
    else
      lua_pushnil(L);
    return 1;
  }
  if (n > 0 && buf[n - 1] == '\n') n--;
  if (n > 0 && buf[n - 1] == '\r') n--;
  lua_pushlstring(L, buf, (size_t)n);
  free(buf);
  return 1;
}

/* host.readline(prompt, completer) -> line | nil (EOF) | false (Ctrl-C).
 * completer(line_to_cursor, word) -> {replacement, ...}; only used on a terminal. */
static int host_readline(lua_State *L) {
  const char *prompt = luaL_optstring(L, 1, "> ");
  int saved_index = complete_fn_index;
  lua_State *saved_L = complete_L;
  complete_L = L;
  complete_fn_index = lua_isfunction(L, 2) ? 2 : 0;
  fflush(stdout);
  fflush(stderr);
  got_sigint = 0;
  reading_line = 1;
  lutra_host_arm_sigint(L);
  int n = isatty(0) ? read_terminal_line(L, prompt) : read_plain_line(L);
  reading_line = 0;
  complete_fn_index = saved_index;
  complete_L = saved_L;
  return n;
}

/* ---- history -------------------------------------------------------------------------- */

static char *history_path;

/* host.history_open(path): loads the file (created if missing); lines added later are
 * appended to it at once, so a crash or os.exit loses nothing. */
static int host_history_open(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (fd < 0) {
    lua_pushnil(L);
    lua_pushfstring(L, "%s: %s", path, strerror(errno));
    return 2;
  }
  close(fd);
  history_truncate_file(path, 1000);
  read_history(path);
  free(history_path);
  history_path = strdup(path);
  lua_pushboolean(L, 1);
  return 1;
}

static int host_add_history(lua_State *L) {
  const char *line = luaL_checkstring(L, 1);
  if (!*line) return 0;
  HIST_ENTRY *last = history_length > 0 ? history_get(history_base + history_length - 1) : NULL;
  if (last && strcmp(last->line, line) == 0) return 0;
  add_history(line);
  if (history_path) append_history(1, history_path);
  return 0;
}

static int host_isatty(lua_State *L) {
  lua_pushboolean(L, isatty(luaL_optint(L, 1, 0)));
  return 1;
}

int luaopen_lutra_host(lua_State *L) {
  static const luaL_Reg fns[] = {{"readline", host_readline},
                                 {"history_open", host_history_open},
                                 {"add_history", host_add_history},
                                 {"isatty", host_isatty},
                                 {NULL, NULL}};
  if (wake_pipe[0] < 0 && pipe(wake_pipe) == 0) {
    for (int i = 0; i < 2; i++) {
      fcntl(wake_pipe[i], F_SETFL, fcntl(wake_pipe[i], F_GETFL) | O_NONBLOCK);
      fcntl(wake_pipe[i], F_SETFD, FD_CLOEXEC);
    }
  }
  rl_readline_name = "lutra";
  rl_catch_signals = 0; /* SIGINT is ours (on_sigint): readline must not re-raise it */
  rl_completer_word_break_characters = word_breaks;
  rl_attempted_completion_function = complete_with_lua;
  using_history();
  lua_newtable(L);
  luaL_register(L, NULL, fns);
  lua_pushstring(L, lt_version());
  lua_setfield(L, -2, "version");
  return 1;
}
