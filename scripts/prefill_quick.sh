#!/usr/bin/env bash
# Quick prefill check + timing of the default extend kernel (for tuning
# rounds on the device): test_cuda_extend, a short check sweep, and causal /
# non-causal 16:16 d=128 rows at B x S = 16384 (TFLOP/s; no torch baseline:
# compare with the last full `scripts/device_run.sh prefill torch` table).
set -uo pipefail
BIN=${KVA_BIN:-.dist}
timeout 120 "$BIN/test_cuda_extend" | tail -1
timeout 120 "$BIN/kvattn" check --device cuda --cases ${KVA_CASES:-120} --seed $(date +%s) | tail -1
for c in 1 0; do for s in 512 1024 2048 4096 8192 16384; do
  "$BIN/kvattn" bench --device cuda --mode prefill --batch $((16384 / s)) --ctx $s --heads 16:16 \
    --head-dim 128 --page 16 --causal $c --json
done; done 2>/dev/null | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l)
    print("causal %d S=%5d  %.3f ms  %.1f TFLOP/s" % (r["causal"], r["ctx"], r["time_ms"], r["tflops"]))'
