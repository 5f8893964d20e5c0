#!/usr/bin/env bash
# A/B of two kvattn builds on the decode shapes where fixed per-step costs
# show (short per-worker shares), interleaved so both see the same machine:
#   bash scripts/ab_decode.sh .dist/kvattn_A .dist/kvattn [more builds] [repeats]
set -uo pipefail
# builds: every argument but a trailing number (the repeats, default 3)
bins=("$@") n=3
if [[ ${bins[-1]} =~ ^[0-9]+$ ]]; then n=${bins[-1]}; unset 'bins[-1]'; fi
c="--device cuda --mode decode --heads 32:8 --head-dim 128 --page 16 --dtype bf16 --json"
for rep in $(seq "$n"); do
  for bin in "${bins[@]}"; do
    for cfg in "--kv-dtype bf16 --batch 1 --ctx 32768,65536" "--kv-dtype bf16 --batch 64 --ctx 2048" \
               "--kv-dtype bf16 --batch 64 --ctx 2048 --varlen" "--kv-dtype fp8 --batch 1 --ctx 131072" \
               "--kv-dtype bf16 --batch 128 --ctx 4096"; do
      # shellcheck disable=SC2086
      "$bin" bench $c $cfg 2>/dev/null | sed "s|^{|{\"bin\":\"$(basename "$bin")\",|"
    done
  done
done | python3 "$(dirname "$0")/ab_summary.py" decode
