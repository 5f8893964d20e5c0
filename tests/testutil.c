#include "testutil.h"

int tu_checks = 0, tu_failures = 0;

int tu_summary(const char *name) {
  printf("%s: %d passed, %d failed\n", name, tu_checks - tu_failures, tu_failures);
  return tu_failures ? 1 : 0;
}
