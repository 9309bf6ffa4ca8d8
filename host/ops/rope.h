/* rope.h — the rope plan's CPU row (ops/rope_cpu.c); the plan is kernels/rope.h's. */
#ifndef LUTRA_OPS_ROPE_H
#define LUTRA_OPS_ROPE_H
#include "kernels/rope.h"

/* out = x rotated as the plan says, on the CPU: 0, or -1 with the error set (out of memory). */
int lt_rope_cpu(const lt_rope_plan *p);

#endif
