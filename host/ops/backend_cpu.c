/* backend_cpu.c — the CPU's table (host/ops/backend.h): the CPU rows of the ops whose fronts
 * hand the same plan to either device. The other entries are NULL: those fronts run their CPU
 * loops themselves. */
#include "ops/backend.h"
#include "ops/norm.h"
#include "ops/rope.h"

const lt_backend lt_backend_cpu = {
    .name = "cpu",
    .norm_forward = lt_norm_forward_cpu,
    .norm_backward = lt_norm_backward_cpu,
    .rope = lt_rope_cpu,
};
