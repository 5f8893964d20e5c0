/* kvattn: the command-line front end (check, bench, demo). */
#include <stdio.h>
#include <string.h>

#include "cli_common.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvattn <command> [options]\n"
          "  check   randomized sweep of every feature against the double reference\n"
          "  bench   time attention; GB/s of KV read, TFLOP/s, ratio to a copy ceiling\n"
          "  demo    simulated serving workload (continuous batching through the pool)\n"
          "kvattn <command> --help for its options\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "check")) return cli_check(argc - 1, argv + 1);
  if (!strcmp(argv[1], "bench")) return cli_bench(argc - 1, argv + 1);
  if (!strcmp(argv[1], "demo")) return cli_demo(argc - 1, argv + 1);
  fprintf(stderr, "kvattn: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
