#include "emu_check.h"
void emu_suite_optim(void) {}
