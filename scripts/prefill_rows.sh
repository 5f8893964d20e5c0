#!/usr/bin/env bash
# Issue 4's prefill rows (B x S = 16384, page 16), one `kvattn bench` argument
# line each: causal 16:16 d=128 at S = 512..16384, then with `full` the
# non-causal, d=64, d=256 and GQA 32:8 rows at S = 1024, 4096, 16384.
#   bash scripts/prefill_rows.sh quick|full
for s in 512 1024 2048 4096 8192 16384; do
  echo "--batch $((16384 / s)) --ctx $s --heads 16:16 --head-dim 128 --causal 1"
done
[ "${1:-quick}" = full ] || exit 0
for s in 1024 4096 16384; do
  b=$((16384 / s))
  echo "--batch $b --ctx $s --heads 16:16 --head-dim 128 --causal 0"
  echo "--batch $b --ctx $s --heads 16:16 --head-dim 64 --causal 1"
  echo "--batch $b --ctx $s --heads 16:16 --head-dim 256 --causal 1"
  echo "--batch $b --ctx $s --heads 32:8 --head-dim 128 --causal 1"
done
