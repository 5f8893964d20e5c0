#!/usr/bin/env bash
# The first device call on an H100 (none lent since 2026-11-28): what the
# H200 chose without an H100 measurement, measured there in one call.
#   bash scripts/stage_device.sh here, then on the device (carry .dist):
#   bash scripts/h100_first_call.sh [repeats, default 2]
# 1. v6 forced where the H100 runs other kernels: test_cuda_mla with
#    KVA_MLA_SMALL=6 (16-bit, up to 64 rows) and KVA_MLA_F8=6 (fp8 from 33
#    rows), and `check --only mla` with both; v9's fp8 converted in place
#    (KVA_MLA9_F8IP=1, H200 only so far) likewise.
# 2. A/B (ABBA medians, scripts/ab_mla.sh): FlashMLA's 20 memory-bound
#    16-bit rows, v2 (the H100's default) against v6; its fp8 rows of 64 and
#    of 128-256 rows, v9 (the H100's default: byte stages) against v9 in
#    place and v6.
# 3. FlashMLA's table as the default runs it (scripts/device_run.sh mla).
# 4. The decode kernel as the fifty-third session changed it on the H200
#    alone (fp8 K in f16, row tiles from the batch, three CTAs an SM for
#    fp8 KV): test_cuda_backend and the decode table (device_run.sh decode).
# Works on any Hopper device (on the H200 the defaults are v6, so each A/B
# still compares the two kernels). Logs under $OUT; a short table last.
set -uo pipefail
OUT=${OUT:-/tmp/kvattn_out}
mkdir -p "$OUT"
BIN=${KVA_BIN:-.dist}
n=${1:-2}
L=$OUT/h100_first_call.txt
: >"$L"
say() { echo "$*" | tee -a "$L"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a "$L"
for env in KVA_MLA_SMALL=6 KVA_MLA_F8=6 KVA_MLA9_F8IP=1,KVA_MLA_F8=9; do
  (cd "$BIN" && env ${env//,/ } timeout 180 ./test_cuda_mla >"$OUT/test_cuda_mla_${env%%=*}.log" 2>&1)
  say "test_cuda_mla $env: rc=$? $(tail -1 "$OUT/test_cuda_mla_${env%%=*}.log")"
done
env KVA_MLA9_F8IP=1 KVA_MLA_F8=9 timeout 180 "$BIN/kvattn" check --device cuda --only mla --cases 100 \
  --seed "$(date +%s)" >"$OUT/check_mla_v9ip.log" 2>&1
say "check --only mla (v9's fp8 in place): rc=$? $(tail -1 "$OUT/check_mla_v9ip.log")"
env KVA_MLA_SMALL=6 KVA_MLA_F8=6 timeout 180 "$BIN/kvattn" check --device cuda --only mla --cases 120 \
  --seed "$(date +%s)" >"$OUT/check_mla_v6.log" 2>&1
say "check --only mla (v6 forced where the H100 runs v2/v9): rc=$? $(tail -1 "$OUT/check_mla_v6.log")"
ab() { # name, shapes file, A/B environments
  KVA_BIN=$BIN KVA_AB_ENVS="$3" AB_SHAPES="$2" timeout 420 bash scripts/ab_mla.sh "$n" >"$OUT/ab_$1.txt" 2>&1
  say "== $1 (ms, medians of $n)"
  tee -a "$L" <"$OUT/ab_$1.txt"
}
ab mem16 scripts/shapes/mla_mem_all.txt "v2:KVA_MLA_SMALL=2 v6:KVA_MLA_SMALL=6"
ab fp8_64 scripts/shapes/mla_fp8_64rows.txt "v9:KVA_MLA_F8=9 v9ip:KVA_MLA_F8=9,KVA_MLA9_F8IP=1 v6:KVA_MLA_F8=6"
ab fp8_compute scripts/shapes/mla_fp8_compute.txt "v9:KVA_MLA_F8=9 v9ip:KVA_MLA_F8=9,KVA_MLA9_F8IP=1 v6:KVA_MLA_F8=6"
KVA_BIN=$BIN OUT=$OUT/table timeout 300 bash scripts/device_run.sh mla >"$OUT/table.log" 2>&1
say "== FlashMLA's table, defaults"
grep '^mla b=' "$OUT/table.log" | tee -a "$L"
(cd "$BIN" && timeout 300 ./test_cuda_backend >"$OUT/test_cuda_backend.log" 2>&1)
say "test_cuda_backend: rc=$? $(tail -1 "$OUT/test_cuda_backend.log")"
KVA_BIN=$BIN OUT=$OUT/decode timeout 300 bash scripts/device_run.sh decode >"$OUT/decode.log" 2>&1
say "== decode table, defaults"
sed -n '/^decode (GB\/s/,$p' "$OUT/decode.log" | tee -a "$L"
