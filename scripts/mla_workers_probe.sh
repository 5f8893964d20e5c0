#!/usr/bin/env bash
# Per-SM rate of the MLA kernel at memory-bound shapes: B uniform requests on
# B workers (one request each, no cuts) for B from all SMs down to half; if
# the latent rate holds as SMs go idle, the active SMs can take over idle
# ones' bandwidth (and a schedule's tail costs little), else the rate falls
# with B and each SM runs near its own limit.
#   [KVA_BIN=.dist] bash scripts/mla_workers_probe.sh [heads...]
set -uo pipefail
K=${KVA_BIN:-.dist}/kvattn
for h in ${*:-64 16}; do
  for w in 132 120 108 96 84 66; do
    "$K" bench --device cuda --mode mla --page 64 --heads "$h:1" --sq 1 --batch "$w" --ctx 4096 \
      --workers "$w" --json 2>/dev/null
  done
done | python3 -c '
import json, sys
for l in sys.stdin:
    if not l.startswith("{"): continue
    r = json.loads(l)
    print("heads %-6s batch=workers %4d  %7.0f GB/s  ratio %.3f  %.1f GB/s per worker"
          % (r["heads"], r["batch"], r["kv_gbps"], r["ratio"], r["kv_gbps"] / r["batch"]))
'
