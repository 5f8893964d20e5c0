#!/usr/bin/env bash
# A/B of the MLA kernels (KVA_MLA_KERNEL=v2|v3) on FlashMLA's table rows,
# interleaved in one call: [KVA_AB="v2 v3"] bash scripts/ab_mla.sh [repeats]
# (default KVA_AB="v2 v3"; v3 runs 16-bit latents only, its fp8 row is v2)
set -uo pipefail
K=${KVA_BIN:-.dist}/kvattn n=${1:-2}
for rep in $(seq "$n"); do
  for v in ${KVA_AB:-v2 v3}; do
    for cfg in "--heads 16:1 --sq 1" "--heads 64:1 --sq 1" "--heads 64:1 --sq 1 --varlen" "--heads 32:1 --sq 2" \
               "--heads 128:1 --sq 1" "--heads 64:1 --sq 2" "--heads 128:1 --sq 2" "--heads 64:1 --sq 1 --kv-dtype fp8"; do
      # shellcheck disable=SC2086
      KVA_MLA_KERNEL=$v "$K" bench --device cuda --mode mla --batch 128 --ctx 4096,8192 --page 64 $cfg --json 2>/dev/null |
        sed "s|^{|{\"kernel\":\"$v\",|"
    done
  done
done | python3 "$(dirname "$0")/ab_summary.py" mla
