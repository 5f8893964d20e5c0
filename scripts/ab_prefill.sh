#!/usr/bin/env bash
# A/B of the warp-specialized prefill kernel's loads (KVA_EXTEND_TMA=1 or 2: TMA
# boxes, 0: cp.async gather) on the issue's prefill rows, interleaved in one
# call (torch's cuDNN SDPA on the same shapes: bench/torch_baselines.py
# prefill, or noncausal for the noncausal rows):
#   [AB_SHAPES=quick|full|noncausal] bash scripts/ab_prefill.sh [repeats]
# With KVA_AB_BINS="name:path ..." it compares binaries instead (each at its
# default load path), e.g. KVA_AB_BINS="head:.dist/kvattn_head new:.dist/kvattn".
set -uo pipefail
K=${KVA_BIN:-.dist}/kvattn n=${1:-2}
rows() {
  if [ "${AB_SHAPES:-quick}" = noncausal ]; then # d=128 without a mask, a causal row as control
    for s in 512 1024 2048 4096 8192 16384; do
      echo "--batch $((16384 / s)) --ctx $s --heads 16:16 --head-dim 128 --causal 0"
    done
    for s in 1024 4096 16384; do
      echo "--batch $((16384 / s)) --ctx $s --heads 32:8 --head-dim 128 --causal 0"
    done
    echo "--batch 4 --ctx 4096 --heads 16:16 --head-dim 128 --causal 1"
    # mixed extend batches (every item's last tile runs past kv_len)
    echo "--mode mixed --batch 32 --ctx 2048 --prefix 8192 --heads 16:16 --head-dim 128 --causal 1"
    echo "--mode mixed --batch 32 --ctx 2048 --prefix 8192 --heads 32:8 --head-dim 128 --causal 1"
    echo "--mode mixed --batch 32 --ctx 2048 --prefix 8192 --heads 16:16 --head-dim 128 --causal 0"
    return
  fi
  bash "$(dirname "$0")/prefill_rows.sh" "${AB_SHAPES:-quick}"
}
for rep in $(seq "$n"); do
  rows | while read -r cfg; do
    if [ -n "${KVA_AB_BINS:-}" ]; then
      for nb in $KVA_AB_BINS; do
        # shellcheck disable=SC2086
        "${nb#*:}" bench --device cuda --mode prefill --page ${AB_PAGE:-16} --dtype bf16 \
          --kv-dtype bf16 --json $cfg 2>/dev/null | sed "s|^{|{\"kernel\":\"${nb%%:*}\",|"
      done
      continue
    fi
    for v in ${KVA_AB:-1 2 0}; do
      # shellcheck disable=SC2086
      KVA_EXTEND_TMA=$v "$K" bench --device cuda --mode prefill --page ${AB_PAGE:-16} --dtype bf16 \
        --kv-dtype bf16 --json $cfg 2>/dev/null | sed "s|^{|{\"kernel\":\"tma$v\",|"
    done
  done
done | python3 "$(dirname "$0")/ab_summary.py" prefill
