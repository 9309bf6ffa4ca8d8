/* main.c — the lutra executable: a LuaJIT host with the C API linked in (ffi.C resolves
 * lt_* here: main.c calls lt_version() so that the linker, under --as-needed, keeps
 * liblutra as a dependency), luajit-compatible options, a REPL (lua/lutra/repl.lua) and subcommands
 * (`lutra doctor`, `lutra selftest`). Options and the `arg` table follow luajit.c. */
#include "host.h"
#include "lutra.h"
#include <fcntl.h>
#include <lauxlib.h>
#include <limits.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef LUTRA_LUA_DIR
#define LUTRA_LUA_DIR ""
#endif

static const char *progname = "lutra";
static int repl_on_error; /* --repl-on-error (copied into lutra.host once it exists) */
static int keep_locals_on_error; /* -i: a failing script's locals are kept for the REPL */

/* lutra.host's fields repl_on_error (the post-mortem REPL is armed) and error_reported (the
 * error was printed by a handler): shared with lutra.errors.pcall, whose handler may open
 * the post-mortem before the error reaches the host. */
static int host_flag(lua_State *L, const char *name) {
  lua_getfield(L, LUA_REGISTRYINDEX, "_LOADED");
  lua_getfield(L, -1, "lutra.host");
  int on = 0;
  if (lua_istable(L, -1)) {
    lua_getfield(L, -1, name);
    on = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  lua_pop(L, 2);
  return on;
}

static void set_host_flag(lua_State *L, const char *name, int on) {
  lua_getfield(L, LUA_REGISTRYINDEX, "_LOADED");
  lua_getfield(L, -1, "lutra.host");
  if (lua_istable(L, -1)) {
    lua_pushboolean(L, on);
    lua_setfield(L, -2, name);
  }
  lua_pop(L, 2);
}

static void print_usage(FILE *f) {
  fprintf(f,
          "usage: %s [options] [script [args]]\n"
          "       %s doctor              show the build, LuaJIT, BLAS, threads, CUDA, NCCL, MPI\n"
          "       %s selftest [args]     run require('lutra.selftest').main(args)\n"
          "       %s launch|ckpt|convert|chat|generate|plot ...   see `lutra COMMAND --help`\n"
          "With no script and no -e, opens the REPL (with `lutra` loaded).\n"
          "Options:\n"
          "  -e chunk          execute the string chunk (repeatable)\n"
          "  -l name           require library name\n"
          "  -i                open the REPL after running the script (its locals kept)\n"
          "  -j cmd            LuaJIT control command (as luajit -j)\n"
          "  -O[opt]           LuaJIT optimization flags\n"
          "  -E                ignore LUA_INIT, LUA_PATH and LUA_CPATH\n"
          "  --repl-on-error   on an uncaught error, open the REPL at the frame that raised it\n"
          "  -v, --version     print the lutra and LuaJIT versions\n"
          "  -h, --help        print this help\n"
          "  --                stop handling options\n"
          "  -                 execute stdin as a script\n"
          "Inside a script, require('lutra').debug() opens the REPL in the caller's frame.\n"
          "Environment: LUTRA_HISTORY (REPL history file, default ~/.lutra_history; empty: none),\n"
          "  LUTRA_REPL_ON_ERROR=1 (as --repl-on-error), LUA_PATH, LUA_CPATH, LUA_INIT (as luajit).\n",
          progname, progname, progname, progname);
}

/* lutra.host.post_mortem(msg, handler): require("lutra.repl").post_mortem(msg, handler), for
 * lutra.errors.pcall's handler (lutra.errors sits below lutra.repl and cannot require it). */
static int host_post_mortem(lua_State *L) {
  lua_settop(L, 2);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "lutra.repl");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, "post_mortem");
  lua_pushvalue(L, 1);
  lua_pushvalue(L, 2);
  lua_call(L, 2, 0);
  return 0;
}

static void report(lua_State *L, int status) {
  if (status && !host_flag(L, "error_reported") && !lua_isnil(L, -1)) {
    const char *msg = lua_tostring(L, -1);
    fprintf(stderr, "%s\n", msg ? msg : "(error object is not a string)");
    fflush(stderr);
  }
  if (status) lua_pop(L, 1);
}

/* Whether the message at idx is in lutra.errors.usage_errors (raised by lutra.errors.usage). */
static int is_usage_error(lua_State *L, int idx) {
  int usage = 0;
  lua_getfield(L, LUA_REGISTRYINDEX, "_LOADED");
  lua_getfield(L, -1, "lutra.errors");
  if (lua_istable(L, -1)) {
    lua_getfield(L, -1, "usage_errors");
    if (lua_istable(L, -1)) {
      lua_pushvalue(L, idx);
      lua_rawget(L, -2);
      usage = lua_toboolean(L, -1);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 2);
  return usage;
}

/* Message handler: error text plus a Lua traceback, built before the stack unwinds; with
 * --repl-on-error it also opens the REPL at the failing frame (repl.post_mortem). */
static int message_handler(lua_State *L) {
  if (!lua_isstring(L, 1)) { /* a non-string error object: try its __tostring */
    if (lua_isnoneornil(L, 1) || !luaL_callmeta(L, 1, "__tostring") || !lua_isstring(L, -1)) {
      lua_settop(L, 1);
      lua_pushliteral(L, "(error object is not a string)");
    }
    lua_replace(L, 1);
  }
  if (is_usage_error(L, 1)) return 1; /* a mistyped option: its one line is enough */
  luaL_traceback(L, L, lua_tostring(L, 1), 1);
  if (keep_locals_on_error) { /* the stack is still there: lutra.repl.keep_locals reads the script's */
    keep_locals_on_error = 0;
    lua_getglobal(L, "require");
    lua_pushliteral(L, "lutra.repl");
    if (lua_pcall(L, 1, 1, 0) == 0) {
      lua_getfield(L, -1, "keep_locals");
      if (lua_pcall(L, 0, 0, 0) != 0) lua_pop(L, 1);
    }
    lua_pop(L, 1); /* the module, or require's error */
  }
  if (!host_flag(L, "repl_on_error")) return 1;
  fprintf(stderr, "%s\n", lua_tostring(L, -1));
  fflush(stderr);
  set_host_flag(L, "error_reported", 1);
  set_host_flag(L, "repl_on_error", 0); /* an error inside the post-mortem REPL must not nest another one */
  lua_getglobal(L, "require");
  lua_pushliteral(L, "lutra.repl");
  if (lua_pcall(L, 1, 1, 0) == 0) {
    lua_getfield(L, -1, "post_mortem");
    lua_pushvalue(L, 1);
    if (lua_pcall(L, 1, 0, 0) != 0) fprintf(stderr, "lutra: post-mortem REPL failed: %s\n", lua_tostring(L, -1));
  } else {
    fprintf(stderr, "lutra: cannot open the post-mortem REPL: %s\n", lua_tostring(L, -1));
  }
  lua_settop(L, 2);
  return 1;
}

/* Calls the function under narg args on the stack with the message handler and Ctrl-C
 * armed; results stay on the stack (nres) or the error message does. */
static int docall(lua_State *L, int narg, int nres) {
  int base = lua_gettop(L) - narg;
  lua_pushcfunction(L, message_handler);
  lua_insert(L, base);
  lutra_host_arm_sigint(L);
  int status = lua_pcall(L, narg, nres, base);
  lutra_host_disarm_sigint();
  lua_remove(L, base);
  return status;
}

static int dostring(lua_State *L, const char *s, const char *name) {
  int status = luaL_loadbuffer(L, s, strlen(s), name) || docall(L, 0, 0);
  report(L, status);
  return status;
}

/* Calls require(name).fname(...) with the narg values on the stack; nres results. */
static int call_module(lua_State *L, const char *name, const char *fname, int narg, int nres) {
  lua_getglobal(L, "require");
  lua_pushstring(L, name);
  if (docall(L, 1, 1)) {
    lua_insert(L, -(narg + 1));
    lua_pop(L, narg);
    return 1;
  }
  lua_getfield(L, -1, fname);
  lua_remove(L, -2);
  lua_insert(L, -(narg + 1));
  return docall(L, narg, nres);
}

/* ---- package.path: the source lua/ dir, then next to the executable, then the user's ---- */

static void setup_package_path(lua_State *L) {
  char exe[PATH_MAX], dir[PATH_MAX] = ".";
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(dir, sizeof dir, "%s", exe);
  }
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  const char *user = lua_tostring(L, -1);
  lua_pushfstring(L,
                  "%s/?.lua;%s/?/init.lua;"
                  "%s/../lua/?.lua;%s/../lua/?/init.lua;"
                  "%s/../share/lutra/lua/?.lua;%s/../share/lutra/lua/?/init.lua;%s",
                  LUTRA_LUA_DIR, LUTRA_LUA_DIR, dir, dir, dir, dir, user ? user : "");
  lua_setfield(L, -3, "path");
  lua_pop(L, 2);
}

/* ---- luajit-style options -------------------------------------------------------------- */

enum { FLAG_INTERACTIVE = 1, FLAG_VERSION = 2, FLAG_EXEC = 4, FLAG_NOENV = 8, FLAG_HELP = 16 };

static int bad_option; /* argv's index of the option collect_args refused */

/* Returns the index of the script in argv (argc if none), or -1 on a bad option (bad_option). */
static int collect_args(int argc, char **argv, int *flags) {
  int i;
  for (i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-') return i;
    if (strcmp(a, "--repl-on-error") == 0)
      repl_on_error = 1;
    else if (strcmp(a, "--version") == 0)
      *flags |= FLAG_VERSION;
    else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
      *flags |= FLAG_HELP;
    else if (strcmp(a, "--") == 0)
      return i + 1;
    else if (strcmp(a, "-") == 0)
      return i;
    else if (strcmp(a, "-i") == 0)
      *flags |= FLAG_INTERACTIVE;
    else if (strcmp(a, "-v") == 0)
      *flags |= FLAG_VERSION;
    else if (strcmp(a, "-E") == 0)
      *flags |= FLAG_NOENV;
    else if (a[1] == 'O')
      continue;
    else if (a[1] == 'e' || a[1] == 'l' || a[1] == 'j') {
      if (a[1] == 'e') *flags |= FLAG_EXEC;
      if (a[2] == '\0' && ++i >= argc) {
        bad_option = i - 1;
        return -1;
      }
    } else {
      bad_option = i;
      return -1;
    }
  }
  return i;
}

/* -j cmd and -O opts, as luajit does: jit.<cmd>(opts...) or require("jit.<cmd>").start(opts...). */
static const char jit_command_lua[] = "local kind, cmd = ...\n"
                                      "local name, opts = 'opt', cmd\n"
                                      "if kind == 'j' then name, opts = cmd:match('^([^=]*)=?(.*)$') end\n"
                                      "local f = kind == 'j' and jit[name]\n"
                                      "if type(f) ~= 'function' then f = require('jit.' .. name).start end\n"
                                      "local args = {}\n"
                                      "for a in (opts .. ','):gmatch('([^,]*),') do args[#args + 1] = a end\n"
                                      "if opts == '' then f() else f(unpack(args)) end\n";

static int do_jit_command(lua_State *L, const char *kind, const char *cmd) {
  int status = luaL_loadbuffer(L, jit_command_lua, strlen(jit_command_lua), "=(jit command)");
  if (status == 0) {
    lua_pushstring(L, kind);
    lua_pushstring(L, cmd);
    status = docall(L, 2, 0);
  }
  report(L, status);
  return status;
}

static int run_options(lua_State *L, char **argv, int script) {
  for (int i = 1; i < script; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || a[1] == '-' || a[1] == '\0') continue;
    const char *val = a + 2;
    if ((a[1] == 'e' || a[1] == 'l' || a[1] == 'j') && *val == '\0') val = argv[++i];
    int status = 0;
    if (a[1] == 'e') {
      status = dostring(L, val, "=(command line)");
    } else if (a[1] == 'l') {
      lua_getglobal(L, "require");
      lua_pushstring(L, val);
      status = docall(L, 1, 0);
      report(L, status);
    } else if (a[1] == 'j') {
      status = do_jit_command(L, "j", val);
    } else if (a[1] == 'O') {
      status = do_jit_command(L, "O", val);
    }
    if (status) return status;
  }
  return 0;
}

/* arg[i - script] = argv[i]: arg[0] is the script, arg[-1] what came before it. */
static void create_arg_table(lua_State *L, int argc, char **argv, int script) {
  lua_createtable(L, argc - script, script + 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
}

/* -i: the script's text with a call appended that keeps its main-chunk locals for the REPL
 * (lutra.repl.keep_locals), a first "#!" line blanked as luaL_loadfile skips it. A script that
 * does not compile so (one ending in `return`), bytecode and stdin load as they are. */
static const char keep_locals_call[] = "\n;require('lutra.repl').keep_locals()\n";

static int load_script(lua_State *L, const char *fname, int keep_locals) {
  FILE *f = keep_locals && fname ? fopen(fname, "rb") : NULL;
  if (!f) return luaL_loadfile(L, fname);
  size_t cap = 1 << 16, n = 0, got;
  char *buf = malloc(cap);
  while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) {
      char *more = realloc(buf, cap * 2);
      if (!more) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = more;
      cap *= 2;
    }
  }
  int readable = !ferror(f);
  fclose(f);
  int status = -1;
  if (buf && readable && !(n > 0 && buf[0] == '\033') && n + sizeof keep_locals_call <= cap) {
    for (size_t i = 0; n > 0 && buf[0] == '#' && i < n && buf[i] != '\n'; i++) buf[i] = ' ';
    memcpy(buf + n, keep_locals_call, sizeof keep_locals_call - 1);
    lua_pushfstring(L, "@%s", fname);
    status = luaL_loadbuffer(L, buf, n + sizeof keep_locals_call - 1, lua_tostring(L, -1));
    lua_remove(L, -2);
    if (status) lua_pop(L, 1);
  }
  free(buf);
  return status == 0 ? 0 : luaL_loadfile(L, fname);
}

static int run_script(lua_State *L, int argc, char **argv, int script, int interactive) {
  const char *fname = argv[script];
  if (strcmp(fname, "-") == 0 && strcmp(argv[script - 1], "--") != 0) fname = NULL; /* stdin */
  int status = load_script(L, fname, interactive);
  if (status == 0) {
    int narg = argc - script - 1;
    luaL_checkstack(L, narg + 3, "too many arguments to script");
    for (int i = script + 1; i < argc; i++) lua_pushstring(L, argv[i]);
    keep_locals_on_error = interactive;
    status = docall(L, narg, 0);
    keep_locals_on_error = 0;
  } else if (lua_tostring(L, -1) && strncmp(lua_tostring(L, -1), "cannot open", 11) == 0) {
    fprintf(stderr, "%s: ", progname);
    if (fname && !strchr(fname, '/') && !strchr(fname, '.')) /* a mistyped command, more likely than a file */
      lua_pushfstring(L, "%s (nor is it a command: doctor, selftest, launch, ckpt, convert, chat, generate)",
                      lua_tostring(L, -1));
    else
      lua_pushvalue(L, -1);
    lua_replace(L, -2);
  }
  report(L, status);
  return status;
}

static int print_version(lua_State *L) {
  lua_getglobal(L, "jit");
  lua_getfield(L, -1, "version");
  printf("lutra %s (%s)\n", lt_version(), lua_isstring(L, -1) ? lua_tostring(L, -1) : LUAJIT_VERSION);
  lua_pop(L, 2);
  fflush(stdout);
  return 0;
}

static int run_repl(lua_State *L, int banner) {
  lua_newtable(L);
  lua_pushboolean(L, banner);
  lua_setfield(L, -2, "banner");
  int status = call_module(L, "lutra.shell", "main", 1, 0);
  report(L, status);
  return status;
}

/* `lutra selftest [args]`: the module's status (77: no GPU to test). A missing module is a
 * broken installation, a failure, never a skip. */
static int run_selftest(lua_State *L, int argc, char **argv) {
  create_arg_table(L, argc, argv, 1);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "searchpath");
  lua_pushliteral(L, "lutra.selftest");
  lua_getfield(L, -3, "path");
  lua_call(L, 2, 2);
  if (lua_isnil(L, -2)) {
    fprintf(stderr, "lutra selftest: module lutra.selftest not found:%s\n", lua_tostring(L, -1));
    return 1;
  }
  lua_settop(L, 0);
  lua_createtable(L, argc - 2, 0);
  for (int i = 2; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - 1);
  }
  if (call_module(L, "lutra.selftest", "main", 1, 1)) {
    report(L, 1);
    return 1;
  }
  if (lua_isnumber(L, -1)) return (int)lua_tointeger(L, -1);
  return (lua_isnil(L, -1) || lua_toboolean(L, -1)) ? 0 : 1;
}

/* Subcommands written in Lua (lua/lutra/commands.lua maps each to its module). */
static int is_lua_command(const char *word) {
  static const char *const names[] = {"launch", "ckpt", "convert", "chat", "generate", "plot"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(word, names[i]) == 0) return 1;
  return 0;
}

static int run_main(lua_State *L, int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "doctor") == 0) {
    create_arg_table(L, argc, argv, 1);
    int status = call_module(L, "lutra.doctor", "main", 0, 0);
    report(L, status);
    return status ? 1 : 0;
  }
  if (argc >= 2 && strcmp(argv[1], "selftest") == 0) return run_selftest(L, argc, argv);
  if (argc >= 2 && is_lua_command(argv[1])) {
    /* arg[0] is the command's name, arg[1..] its words; lutra.commands.main returns the exit status */
    create_arg_table(L, argc, argv, 1);
    lua_pushstring(L, argv[1]);
    lua_getglobal(L, "arg");
    if (call_module(L, "lutra.commands", "main", 2, 1)) {
      report(L, 1);
      return 1;
    }
    if (lua_isnumber(L, -1)) return (int)lua_tointeger(L, -1);
    return (lua_isnil(L, -1) || lua_toboolean(L, -1)) ? 0 : 1;
  }

  /* `lutra launch --repl-on-error` asks every rank for the post-mortem REPL this way */
  const char *env_repl_on_error = getenv("LUTRA_REPL_ON_ERROR");
  if (env_repl_on_error && *env_repl_on_error && strcmp(env_repl_on_error, "0") != 0) repl_on_error = 1;
  int flags = 0;
  int script = collect_args(argc, argv, &flags);
  set_host_flag(L, "repl_on_error", repl_on_error);
  if (script < 0) {
    const char *a = argv[bad_option];
    if (a[1] == 'e' || a[1] == 'l' || a[1] == 'j')
      fprintf(stderr, "%s: option '%s' needs an argument (`%s --help` lists the options)\n", progname, a, progname);
    else
      fprintf(stderr, "%s: unknown option '%s' (`%s --help` lists the options)\n", progname, a, progname);
    fprintf(stderr, "usage: %s [options] [script [args]]\n", progname);
    return 1;
  }
  if (flags & FLAG_HELP) {
    print_usage(stdout);
    return 0;
  }
  if (!(flags & FLAG_NOENV)) {
    const char *init = getenv("LUA_INIT");
    if (init) {
      int status = init[0] == '@' ? luaL_loadfile(L, init + 1) : luaL_loadbuffer(L, init, strlen(init), "=LUA_INIT");
      status = status || docall(L, 0, 0);
      report(L, status);
      if (status) return 1;
    }
  }
  create_arg_table(L, argc, argv, script);
  if (flags & FLAG_VERSION) print_version(L);
  if (run_options(L, argv, script)) return 1;
  /* As python -i: after a failed script, -i still opens the REPL (the exit status stays 1). */
  int failed = script < argc && run_script(L, argc, argv, script, (flags & FLAG_INTERACTIVE) != 0);
  if (failed && !(flags & FLAG_INTERACTIVE)) return 1;
  if ((flags & FLAG_INTERACTIVE) || (script == argc && !(flags & (FLAG_EXEC | FLAG_VERSION))))
    failed |= run_repl(L, script == argc);
  return failed ? 1 : 0;
}

int main(int argc, char **argv) {
  /* A closed stdin/stdout/stderr would be taken by the next open (the REPL's wake-up pipe). */
  for (int fd = 0; fd < 3; fd++)
    if (fcntl(fd, F_GETFD) < 0) (void)!open("/dev/null", fd ? O_WRONLY : O_RDONLY);
  lutra_install_crash_handler();
  if (argv[0] && argv[0][0]) {
    const char *slash = strrchr(argv[0], '/');
    progname = slash ? slash + 1 : argv[0];
  }
  /* -E must be known before luaL_openlibs reads LUA_PATH. */
  int noenv = 0;
  for (int i = 1; i < argc && argv[i][0] == '-' && strcmp(argv[i], "--") != 0; i++)
    if (strcmp(argv[i], "-E") == 0) noenv = 1;
  lua_State *L = luaL_newstate();
  if (!L) {
    fprintf(stderr, "%s: cannot create the Lua state: not enough memory\n", progname);
    return 1;
  }
  if (noenv) {
    lua_pushboolean(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, "LUA_NOENV");
  }
  lua_gc(L, LUA_GCSTOP, 0);
  luaL_openlibs(L);
  lua_gc(L, LUA_GCRESTART, -1);
  setup_package_path(L);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "loaded");
  luaopen_lutra_host(L);
  lua_pushcfunction(L, host_post_mortem);
  lua_setfield(L, -2, "post_mortem");
  lua_setfield(L, -2, "lutra.host");
  lua_pop(L, 2);
  int status = run_main(L, argc, argv);
  fflush(stdout);
  lua_close(L);
  return status;
}
