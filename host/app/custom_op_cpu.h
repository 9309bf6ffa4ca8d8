/* custom_op_cpu.h — CPU bodies of custom ops run on lutra's threads (custom_op_cpu.c).
 *
 * One LuaJIT state runs on one thread at a time, so a body that the script wrote in Lua runs on
 * a pool of worker states, one per OpenMP thread, each holding the body loaded from the same
 * bytecode (string.dump of a function without upvalues: nothing of the script's state goes
 * along). A call splits rows [0, rows) into nparts contiguous ranges; part p runs rows
 * [rows*p/nparts, rows*(p+1)/nparts) in the state of the thread that takes it. The worker module
 * lutra.custom_op.worker (loaded by each state from package_path) turns the argument block,
 * passed as a light userdata, into the body's table. Bound through the FFI by
 * lua/lutra/custom_op/cpu.lua; these live in the executable, which embeds LuaJIT, not in
 * liblutra, which knows nothing of Lua. Every entry returns 0, or -1 with lt_last_error(). */
#ifndef LUTRA_APP_CUSTOM_OP_CPU_H
#define LUTRA_APP_CUSTOM_OP_CPU_H
#include <stdint.h>

/* Where the worker states find lutra's Lua modules (the main state's package.path). */
int lt_custom_op_cpu_init(const char *package_path);
/* Keeps a copy of a body's bytecode (len bytes; name: its chunk name, for messages) and of
 * the names of its arguments ("y,x,b|alpha,beta": tensors, then numbers); *id names it. */
int lt_custom_op_cpu_register(const char *bytecode, int64_t len, const char *name, const char *names, int *id);
/* Runs body id over rows [0, rows) in nparts parts on the worker states. args: the argument
 * block (lutra.custom_op.abi's lt_kernel_args), read by every part. An error raised inside
 * the body comes back as "rows LO..HI: <file>:<line>: <message>" (the first failing part). */
int lt_custom_op_cpu_run(int id, const void *args, int64_t rows, int nparts);
/* How many worker states exist (they are made on demand, up to lt_get_num_threads()). */
int lt_custom_op_cpu_workers(void);

#endif
