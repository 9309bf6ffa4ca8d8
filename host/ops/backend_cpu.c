/* backend_cpu.c — the CPU's table (host/ops/backend.h): the CPU rows of the ops whose fronts
 * hand the same plan to either device. The other entries are NULL: those fronts run their CPU
 * loops themselves. */
#include "ops/backend.h"
#include "ops/gather.h"
#include "ops/layer_norm.h"
#include "ops/rope.h"

const lt_backend lt_backend_cpu = {
    .name = "cpu",
    .layer_norm_forward = lt_layer_norm_forward_cpu,
    .layer_norm_backward = lt_layer_norm_backward_cpu,
    .gather = lt_gather_cpu,
    .rope = lt_rope_cpu,
};
