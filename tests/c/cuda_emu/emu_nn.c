#include "emu_check.h"
void emu_suite_norm(void) {}
void emu_suite_loss(void) {}
void emu_suite_embedding(void) {}
void emu_suite_rope(void) {}
void emu_suite_rng(void) {}
