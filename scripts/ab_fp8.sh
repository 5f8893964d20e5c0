#!/usr/bin/env bash
# A/B of two kvattn builds on the fp8-vs-bf16 decode rows of issue 3
# (tokens/s of fp8 KV over bf16 KV at the same shape), interleaved:
#   bash scripts/ab_fp8.sh .dist/kvattn_A .dist/kvattn [repeats]
set -uo pipefail
A=$1 B=$2 n=${3:-3}
c="--device cuda --mode decode --heads 32:8 --head-dim 128 --page 16 --dtype bf16 --json"
for rep in $(seq "$n"); do
  for bin in "$A" "$B"; do
    for kv in bf16 fp8; do
      for cfg in "--batch 64,128,256 --ctx 4096" "--batch 1,4 --ctx 131072"; do
        # shellcheck disable=SC2086
        "$bin" bench $c --kv-dtype $kv $cfg 2>/dev/null | sed "s|^{|{\"bin\":\"$(basename "$bin")\",|"
      done
    done
  done
done | python3 -c '
import sys, json, collections, statistics
d = collections.defaultdict(list)
for l in sys.stdin:
    r = json.loads(l)
    d[(r["bin"], r["batch"], r["ctx"], r["kv_dtype"])].append(r["time_ms"])
for b in sorted({k[0] for k in d}):
    for (bb, B, L, kv) in sorted(k for k in d if k[0] == b and k[3] == "fp8"):
        t8 = statistics.median(d[(b, B, L, "fp8")]); t16 = statistics.median(d[(b, B, L, "bf16")])
        print("%-10s B=%-3d L=%-6d fp8 %.4f ms  bf16 %.4f ms  fp8 tokens/s = %.3fx bf16" % (b, B, L, t8, t16, t16 / t8))
'
