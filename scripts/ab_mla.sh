#!/usr/bin/env bash
# A/B of the MLA kernels on FlashMLA's table rows, interleaved in one call:
#   [KVA_AB="v2 v5"] bash scripts/ab_mla.sh [repeats]
# KVA_AB: KVA_MLA_KERNEL values (default "v2 v5"; v5 runs 16-bit latents
# only, its fp8 row is v2). Or binaries: KVA_AB_BINS="name:path[:VAR=value[,VAR=value]] ..."
# (each run with KVA_MLA_KERNEL=${KVA_AB_KERNEL:-default} unless the environment
# given after the path, if any, says otherwise). Or environments:
# KVA_AB_ENVS="name:VAR=value[,VAR=value] ..." on one binary. AB_SHAPES: a file of
# bench arguments, one shape per line (default: the table's rows).
set -uo pipefail
K=${KVA_BIN:-.dist}/kvattn n=${1:-2}
shapes() {
  if [ -n "${AB_SHAPES:-}" ]; then cat "$AB_SHAPES"; return; fi
  for cfg in "--heads 16:1 --sq 1" "--heads 64:1 --sq 1" "--heads 64:1 --sq 1 --varlen" "--heads 32:1 --sq 2" \
             "--heads 128:1 --sq 1" "--heads 64:1 --sq 2" "--heads 128:1 --sq 2" "--heads 64:1 --sq 1 --kv-dtype fp8"; do
    echo "--batch 128 --ctx 4096,8192 $cfg"
  done
}
variants=${KVA_AB_BINS:-${KVA_AB_ENVS:-${KVA_AB:-v2 v5}}}
# per shape, every variant back to back; the order reversed every other repeat
# (ABBA), so that drift in the GPU's clocks falls on both sides alike
rev() { local out=; for x in $1; do out="$x $out"; done; echo "$out"; }
for rep in $(seq "$n"); do
  order=$variants
  [ $((rep % 2)) -eq 0 ] && order=$(rev "$variants")
  shapes | while read -r cfg; do
    for v in $order; do
      envs=
      if [ -n "${KVA_AB_BINS:-}" ]; then
        name=${v%%:*} bin=${v#*:} kern=${KVA_AB_KERNEL:-}
        case $bin in *:*) envs=${bin#*:} bin=${bin%%:*} ;; esac
      elif [ -n "${KVA_AB_ENVS:-}" ]; then name=${v%%:*} envs=${v#*:} bin=$K kern=${KVA_AB_KERNEL:-}
      else name=$v bin=$K kern=$v; fi
      # shellcheck disable=SC2086
      env KVA_MLA_KERNEL=$kern ${envs//,/ } "$bin" bench --device cuda --mode mla --page 64 $cfg --json 2>/dev/null |
        sed "s|^{|{\"kernel\":\"$name\",|"
    done
  done
done | python3 "$(dirname "$0")/ab_summary.py" mla
