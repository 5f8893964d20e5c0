#!/usr/bin/env bash
# A/B of two kvattn builds on the fp8-vs-bf16 decode rows of issue 3
# (tokens/s of fp8 KV over bf16 KV at the same shape), interleaved:
#   bash scripts/ab_fp8.sh .dist/kvattn_A .dist/kvattn [more builds] [repeats]
set -uo pipefail
# builds: every argument but a trailing number (the repeats, default 3)
bins=("$@") n=3
if [[ ${bins[-1]} =~ ^[0-9]+$ ]]; then n=${bins[-1]}; unset 'bins[-1]'; fi
c="--device cuda --mode decode --heads 32:8 --head-dim 128 --page 16 --dtype bf16 --json"
for rep in $(seq "$n"); do
  for bin in "${bins[@]}"; do
    for kv in bf16 fp8; do
      for cfg in "--batch 64,128,256 --ctx 4096" "--batch 1,4 --ctx 131072"; do
        # shellcheck disable=SC2086
        "$bin" bench $c --kv-dtype $kv $cfg 2>/dev/null | sed "s|^{|{\"bin\":\"$(basename "$bin")\",|"
      done
    done
  done
done | python3 "$(dirname "$0")/ab_summary.py" fp8
