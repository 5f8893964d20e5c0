#!/usr/bin/env bash
# Decode timelines on the device (tools/dec_trace.c, scripts/dec_trace.py):
# one bench line and one timeline summary per shape. Binary: .dist/kvattn
# (scripts/stage_device.sh) or $KVATTN; logs under $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/.."
K=${KVATTN:-.dist/kvattn}
O=${OUT:-/tmp}
common="--device cuda --mode decode --heads 32:8 --head-dim 128 --page 16 --dtype bf16 --kv-dtype bf16"
i=0
while read -r B L extra; do
  i=$((i + 1))
  KVA_DEC_TRACE="$O/dec_trace_$i.txt" "$K" bench $common --batch "$B" --ctx "$L" $extra
  python3 scripts/dec_trace.py "$O/dec_trace_$i.txt"
done <<SHAPES
${TRACE_SHAPES:-1 32768
1 131072
4 32768
64 2048
64 2048 --varlen}
SHAPES
