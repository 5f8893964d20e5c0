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
done | python3 -c '
import sys, json, collections, statistics
d = collections.defaultdict(list)
for l in sys.stdin:
    r = json.loads(l)
    d[(r["sq"], int(r["heads"].split(":")[0]), r["ctx"], r["varlen"], r["kv_dtype"], r["kernel"])].append(r)
for k in sorted(d):
    rs = d[k]; t = statistics.median(x["time_ms"] for x in rs)
    r = min(rs, key=lambda x: abs(x["time_ms"] - t))
    print("sq=%d h=%-3d sk=%-5d var=%d %-4s %s %.4f ms %5.0f GB/s ratio %.3f %6.1f TFLOP/s [%s]" % (
        k[0], k[1], k[2], k[3], k[4], k[5], t, r["kv_gbps"], r["ratio"], r["tflops"], r["bound"]))
'
