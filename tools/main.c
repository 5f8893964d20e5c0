/* kvattn: the command-line front end (check, bench, demo). */
#include <stdio.h>
#include <string.h>

#include "cli_common.h"

static void usage(FILE *f) {
  fprintf(f,
          "kvattn %d.%d: paged KV cache, planning and attention for LLM serving\n"
          "usage: kvattn <command> [options]\n"
          "  check   randomized sweep of every feature against the double reference\n"
          "  bench   time attention: GB/s of KV read, TFLOP/s, ratio to a copy ceiling\n"
          "  demo    simulated serving workload (continuous batching through the pool)\n"
          "kvattn <command> --help prints a command's options. Examples:\n"
          "  kvattn demo\n"
          "  kvattn check --device cpu --cases 500\n"
          "  kvattn bench --mode decode --batch 16 --ctx 4096 --heads 32:8 --head-dim 128\n"
          "--device cuda: %s.\n",
          KVA_VERSION_MAJOR, KVA_VERSION_MINOR,
          kva_device_available(KVA_DEVICE_CUDA) == KVA_OK ? "a CUDA device is available" : "no CUDA device or backend here");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "check")) return cli_check(argc - 1, argv + 1);
  if (!strcmp(cmd, "bench")) return cli_bench(argc - 1, argv + 1);
  if (!strcmp(cmd, "demo")) return cli_demo(argc - 1, argv + 1);
  fprintf(stderr, "kvattn: unknown command '%s' (commands: check, bench, demo; see kvattn --help)\n",
          cmd);
  return 2;
}
