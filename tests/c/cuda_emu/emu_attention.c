#include "emu_check.h"
void emu_suite_attention(void) {}
