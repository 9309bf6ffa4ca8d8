/* custom_op_cpu.c — the worker states that run custom ops' CPU bodies on lutra's threads
 * (custom_op_cpu.h says how a call is split). Each worker is a LuaJIT state of its own
 * (luaL_newstate with base, package, table, string, math, bit, jit and ffi), used by one thread
 * at a time: OpenMP thread t of a call uses worker t. Bodies are loaded into a worker the first
 * time it runs them, from bytecode only (mode "b"): what runs is the function the user's script
 * handed to lt.kernel, compiled by the main state's own parser. */
#include "app/custom_op_cpu.h"
#include "core/internal.h"
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { LT_ERROR_TEXT = 1024 }; /* as long as lt_last_error's text */

typedef struct body {
  char *bytecode, *name, *names;
  size_t len;
} body;

typedef struct worker {
  lua_State *L;
  int run_ref; /* lutra.custom_op.worker.run */
  int bodies_ref; /* id + 1 -> the loaded function */
} worker;

static char *package_path;
static body *bodies;
static int nbodies, cap_bodies;
static worker *workers;
static int nworkers;

static char *copy_of(const char *s, size_t n) {
  char *c = malloc(n + 1);
  if (c) memcpy(c, s, n), c[n] = 0;
  return c;
}

int lt_custom_op_cpu_init(const char *path) {
  if (!path) return lt_errorf("custom_op: package path is NULL");
  if (package_path) return 0; /* the first main state's path serves every worker */
  package_path = copy_of(path, strlen(path));
  return package_path ? 0 : lt_errorf("custom_op: out of host memory");
}

int lt_custom_op_cpu_register(const char *bytecode, int64_t len, const char *name, const char *names, int *id) {
  if (!bytecode || len <= 0 || !name || !names || !id) return lt_errorf("custom_op: register needs bytecode, a name and names");
  if (nbodies == cap_bodies) {
    int cap = cap_bodies ? 2 * cap_bodies : 16;
    body *b = realloc(bodies, (size_t)cap * sizeof *b);
    if (!b) return lt_errorf("custom_op: out of host memory");
    bodies = b, cap_bodies = cap;
  }
  body *b = &bodies[nbodies];
  b->bytecode = copy_of(bytecode, (size_t)len), b->len = (size_t)len;
  b->name = copy_of(name, strlen(name)), b->names = copy_of(names, strlen(names));
  if (!b->bytecode || !b->name || !b->names) return lt_errorf("custom_op: out of host memory");
  *id = nbodies++;
  return 0;
}

int lt_custom_op_cpu_workers(void) { return nworkers; }

static const struct {
  const char *name;
  lua_CFunction open;
} LIBS[] = {{"", luaopen_base},         {LUA_LOADLIBNAME, luaopen_package}, {LUA_TABLIBNAME, luaopen_table},
            {LUA_STRLIBNAME, luaopen_string}, {LUA_MATHLIBNAME, luaopen_math},  {LUA_BITLIBNAME, luaopen_bit},
            {LUA_JITLIBNAME, luaopen_jit},    {LUA_FFILIBNAME, luaopen_ffi}};

/* A new worker state with the libraries, package.path and the worker module's run function. */
static int new_worker(worker *w) {
  lua_State *L = luaL_newstate();
  if (!L) return lt_errorf("custom_op: cannot create a worker Lua state (out of memory)");
  for (size_t i = 0; i < sizeof LIBS / sizeof LIBS[0]; i++) {
    lua_pushcfunction(L, LIBS[i].open);
    lua_pushstring(L, LIBS[i].name);
    lua_call(L, 1, 0);
  }
  lua_getglobal(L, "package");
  lua_pushstring(L, package_path ? package_path : "");
  lua_setfield(L, -2, "path");
  lua_pop(L, 1);
  lua_getglobal(L, "require");
  lua_pushstring(L, "lutra.custom_op.worker");
  if (lua_pcall(L, 1, 1, 0) != 0) {
    int r = lt_errorf("custom_op: a worker state cannot load lutra.custom_op.worker: %s", lua_tostring(L, -1));
    lua_close(L);
    return r;
  }
  lua_getfield(L, -1, "run");
  w->run_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pop(L, 1);
  lua_newtable(L);
  w->bodies_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  w->L = L;
  return 0;
}

/* Workers for n threads, made here on the calling thread before any part runs. */
static int ensure_workers(int n) {
  if (n <= nworkers) return 0;
  worker *w = realloc(workers, (size_t)n * sizeof *w);
  if (!w) return lt_errorf("custom_op: out of host memory");
  workers = w;
  while (nworkers < n) {
    LT_TRY(new_worker(&workers[nworkers]));
    nworkers++;
  }
  return 0;
}

typedef struct job {
  int id, nparts;
  const void *args;
  int64_t rows;
  char (*errors)[LT_ERROR_TEXT]; /* one per part */
} job;

/* Runs rows [lo, hi) of body id in worker w; on an error leaves the message in err. */
static int run_rows(worker *w, int id, const void *args, int64_t lo, int64_t hi, char *err) {
  lua_State *L = w->L;
  const body *b = &bodies[id];
  lua_rawgeti(L, LUA_REGISTRYINDEX, w->run_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, w->bodies_ref);
  lua_rawgeti(L, -1, id + 1);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    if (luaL_loadbufferx(L, b->bytecode, b->len, b->name, "b") != 0) {
      snprintf(err, LT_ERROR_TEXT, "cannot load the body's bytecode: %s", lua_tostring(L, -1));
      lua_settop(L, 0);
      return -1;
    }
    lua_pushvalue(L, -1);
    lua_rawseti(L, -3, id + 1);
  }
  lua_remove(L, -2); /* the bodies table */
  lua_pushstring(L, b->names);
  lua_pushlightuserdata(L, (void *)args);
  lua_pushnumber(L, (lua_Number)lo);
  lua_pushnumber(L, (lua_Number)hi);
  if (lua_pcall(L, 5, 0, 0) != 0) {
    const char *msg = lua_tostring(L, -1);
    snprintf(err, LT_ERROR_TEXT, "rows %lld..%lld: %s", (long long)lo, (long long)hi, msg ? msg : "(error object is not a string)");
    lua_settop(L, 0);
    return -1;
  }
  return 0;
}

static int run_part(void *jp, int tid, int nthreads) {
  job *j = jp;
  int failed = 0;
  for (int p = tid; p < j->nparts; p += nthreads) {
    int64_t lo = j->rows * p / j->nparts, hi = j->rows * (p + 1) / j->nparts;
    if (tid >= nworkers) {
      snprintf(j->errors[p], LT_ERROR_TEXT, "thread %d of %d has no worker state (lt_set_num_threads during a call?)", tid, nthreads);
      failed = 1;
    } else if (lo < hi && run_rows(&workers[tid], j->id, j->args, lo, hi, j->errors[p])) failed = 1;
  }
  return failed;
}

int lt_custom_op_cpu_run(int id, const void *args, int64_t rows, int nparts) {
  if (id < 0 || id >= nbodies) return lt_errorf("custom_op: no body with id %d", id);
  if (!args || rows < 0 || nparts < 1) return lt_errorf("custom_op: run needs arguments, rows >= 0 and parts >= 1");
  if (rows == 0) return 0;
  LT_TRY(ensure_workers(lt_get_num_threads()));
  char(*errors)[LT_ERROR_TEXT] = calloc((size_t)nparts, sizeof *errors);
  if (!errors) return lt_errorf("custom_op: out of host memory");
  job j = {id, nparts, args, rows, errors};
  int status = 0;
  if (lt_run_parts(run_part, &j, nparts > 1)) {
    for (int p = 0; p < nparts; p++)
      if (errors[p][0]) {
        status = lt_errorf("%s", errors[p]);
        break;
      }
  }
  free(errors);
  return status;
}
