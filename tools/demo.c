#include "cli_common.h"
int cli_demo(int argc, char **argv) { (void)argc; (void)argv; return 2; }
