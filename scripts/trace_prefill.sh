#!/usr/bin/env bash
# Phase sums of the prefill ws kernel on the device (a build with
# -DKVA_EXT_TRACE: scripts/stage_device.sh trace puts it in .dist/kvattn_trace;
# scripts/ext_trace.py): one bench line and two summary lines per shape,
# "B S heads d causal" per line of $TRACE_SHAPES. Logs under $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/.."
K=${KVATTN:-.dist/kvattn_trace}
O=${OUT:-/tmp}
i=0
while read -r B S H D C; do
  [ -z "$B" ] && continue
  i=$((i + 1))
  KVA_DEC_TRACE="$O/ext_trace_$i.txt" "$K" bench --device cuda --mode prefill --page 16 \
    --dtype bf16 --kv-dtype bf16 --batch "$B" --ctx "$S" --heads "$H" --head-dim "$D" \
    --causal "$C" 2>/dev/null | tail -1
  python3 scripts/ext_trace.py "$O/ext_trace_$i.txt" "B$B S$S $H d$D c$C"
done <<SHAPES
${TRACE_SHAPES:-16 1024 16:16 128 0
4 4096 16:16 128 0
1 16384 16:16 128 0
32 512 16:16 128 1
4 4096 16:16 128 1
1 16384 16:16 128 1
16 1024 32:8 128 1
16 1024 16:16 256 1}
SHAPES
