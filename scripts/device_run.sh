#!/usr/bin/env bash
# One device call: GPU checks, sanitizers, benchmarks, torch baselines; a short
# table last. Logs and JSON go under $OUT (the device tool returns them).
#
#   bash scripts/device_run.sh [stage ...]     stages: info check sanitize test
#                                              decode mla prefill torch graph python
#                                              kernels (default: all but kernels)
# Binaries: $KVA_BIN (default .dist, made here by scripts/stage_device.sh) or a
# fresh build in build-cuda when .dist is absent.
set -uo pipefail
OUT=${OUT:-/tmp/kvattn_out}
mkdir -p "$OUT"
BIN=${KVA_BIN:-.dist}
if [ ! -x "$BIN/kvattn" ]; then
  echo "== building (no $BIN/kvattn)"
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON >"$OUT/build.log" 2>&1 &&
    cmake --build build-cuda >>"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  BIN=build-cuda
fi
stages=${*:-info check sanitize test decode mla prefill torch graph python}
has() { case " $stages " in *" $1 "*) return 0 ;; esac; return 1; }
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
# The environment that runs MLA variant $1 (v2, v5, v6, or v5box4 / v6box4:
# with four-column-block boxes, which the default runs only from 256 rows up;
# v9f8 / v9f8ip: fp8 from 33 rows on v9's byte stages / converted in place,
# 16-bit latents as the default)
mla_variant_env() {
  case $1 in
    v5box4 | v6box4) echo "KVA_MLA_KERNEL=${1%box4} KVA_MLA5_BOX=4" ;;
    v9f8) echo "KVA_MLA_F8=9" ;;
    v9f8ip) echo "KVA_MLA_F8=9 KVA_MLA9_F8IP=1" ;;
    *) echo "KVA_MLA_KERNEL=$1 KVA_MLA5_BOX=0" ;;
  esac
}
K="$BIN/kvattn"

if has info; then
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv | tee "$OUT/gpu.txt"
fi

if has check; then
  echo "== kvattn check --device cuda"
  seed=$(date +%s)
  timeout 300 "$K" check --device cuda --cases ${KVA_CASES:-400} --seed "$seed" >"$OUT/check.log" 2>&1
  rc=$?
  grep -v '^ok' "$OUT/check.log" | tail -25
  note "check cuda (seed $seed): rc=$rc $(tail -1 "$OUT/check.log")"
fi

if has sanitize; then
  for tool in memcheck racecheck synccheck; do
    timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 "$K" check --device cuda --cases ${KVA_SAN_CASES:-6} --seed 7 --small >"$OUT/san_$tool.log" 2>&1
    rc=$?
    tail -4 "$OUT/san_$tool.log"
    note "compute-sanitizer $tool: rc=$rc $(grep -E 'ERROR SUMMARY|passed' "$OUT/san_$tool.log" | tail -2 | tr '\n' ' ')"
  done
  for tool in memcheck racecheck synccheck; do # the prefill kernel's TMA path, partial tiles included
    timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 "$K" bench --device cuda --mode mixed \
      --batch 6 --ctx 300 --prefix 400 --page 16 --heads 4:2 --iters 1 >"$OUT/san_ext_$tool.log" 2>&1
    rc=$?
    note "compute-sanitizer $tool (TMA prefill): rc=$rc $(grep -E 'ERROR SUMMARY' "$OUT/san_ext_$tool.log" | tail -1)"
  done
  for v in v2 v5 v5box4 v6 v6box4 v9f8 v9f8ip; do # each MLA kernel on every case (the default picks by rows)
    for tool in memcheck racecheck synccheck; do
      # shellcheck disable=SC2046
      env $(mla_variant_env $v) timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 "$K" check --device cuda --cases ${KVA_SAN_CASES:-6} --seed 9 --small --only mla >"$OUT/san_mla_${v}_$tool.log" 2>&1
      rc=$?
      note "compute-sanitizer $tool (MLA cases, $v): rc=$rc $(grep -E 'ERROR SUMMARY|passed' "$OUT/san_mla_${v}_$tool.log" | tail -2 | tr '\n' ' ')"
    done
  done
fi

if has test; then
  for t in "$BIN"/test_cuda_* "$BIN"/test_graph "$BIN"/test_paged_plan "$BIN"/test_mla; do
    [ -x "$t" ] || continue
    timeout 300 "$t" >"$OUT/$(basename "$t").log" 2>&1
    rc=$?
    tail -3 "$OUT/$(basename "$t").log"
    note "$(basename "$t"): rc=$rc $(tail -1 "$OUT/$(basename "$t").log")"
  done
  if [ -x "$BIN/test_cuda_mla" ]; then
    for v in v2 v5 v5box4 v6 v6box4 v9f8 v9f8ip; do # each MLA kernel on every shape
      # shellcheck disable=SC2046
      env $(mla_variant_env $v) timeout 300 "$BIN/test_cuda_mla" >"$OUT/test_cuda_mla_$v.log" 2>&1
      note "test_cuda_mla ($v): rc=$? $(tail -1 "$OUT/test_cuda_mla_$v.log")"
    done
  fi
fi

if has kernels; then
  # the non-default d=128 extend kernels (KVA_EXTEND_KERNEL=wgmma|mma)
  for kern in wgmma mma; do
    KVA_EXTEND_KERNEL=$kern timeout 200 "$BIN/test_cuda_extend" >"$OUT/${kern}_test.log" 2>&1
    note "$kern test_cuda_extend: rc=$? $(tail -1 "$OUT/${kern}_test.log")"
    KVA_EXTEND_KERNEL=$kern timeout 200 "$K" check --device cuda --cases ${KVA_CASES:-400} --seed 11 >"$OUT/${kern}_check.log" 2>&1
    note "$kern check cuda: rc=$? $(tail -1 "$OUT/${kern}_check.log")"
  done
fi

if has decode; then
  D="$OUT/bench_decode.jsonl"
  : >"$D"
  common="--device cuda --mode decode --heads 32:8 --head-dim 128 --page 16 --dtype bf16 --json"
  "$K" bench $common --kv-dtype bf16 --batch 64,128,256 --ctx 2048,4096,8192 >>"$D"
  "$K" bench $common --kv-dtype bf16 --batch 64,128,256 --ctx 2048,4096,8192 --varlen >>"$D"
  "$K" bench $common --kv-dtype bf16 --batch 1,4 --ctx 32768,65536,131072 >>"$D"
  "$K" bench $common --kv-dtype fp8 --batch 64,128,256 --ctx 4096 >>"$D"
  "$K" bench $common --kv-dtype fp8 --batch 1,4 --ctx 131072 >>"$D"
  "$K" bench --device cuda --mode decode --heads 32:8 --head-dim 128 --page 1 --dtype bf16 --kv-dtype bf16 --batch 64,128 --ctx 4096 --json >>"$D"
  "$K" bench --device cuda --mode decode --heads 32:32 --head-dim 128 --page 16 --dtype bf16 --kv-dtype bf16 --batch 64 --ctx 4096 --json >>"$D"
  "$K" bench --device cuda --mode decode --heads 32:1 --head-dim 128 --page 16 --dtype bf16 --kv-dtype bf16 --batch 128 --ctx 4096 --json >>"$D"
fi

if has mla; then
  # FlashMLA's table: b=128, s_q 1/2, mean_sk 4096/8192, h_q 16..128, page 64, causal, varlen off/on
  M="$OUT/bench_mla.jsonl"
  : >"$M"
  for sq in 1 2; do for h in 16 32 64 128; do for v in "" --varlen; do
    # shellcheck disable=SC2086
    "$K" bench --device cuda --mode mla --batch 128 --ctx 4096,8192 --heads $h:1 --sq $sq $v \
      --page 64 --dtype bf16 --kv-dtype bf16 --json >>"$M"
  done; done; done
  "$K" bench --device cuda --mode mla --batch 128 --ctx 8192 --heads 64:1 --sq 1 --page 64 \
    --dtype bf16 --kv-dtype fp8 --json >>"$M"
  "$K" bench --device cuda --mode mla --batch 128 --ctx 8192 --heads 128:1 --sq 2 --page 64 \
    --dtype bf16 --kv-dtype fp8 --json >>"$M"
  python3 - "$M" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    print("mla b=%d sq=%d h=%-3d sk=%-5d var=%d kv=%-4s %7.4f ms %6.0f GB/s ratio %.3f %6.1f TFLOP/s [%s] FlashMLA's count %6.0f GB/s" % (
        j["batch"], j["sq"], int(j["heads"].split(":")[0]), j["ctx"], j["varlen"], j["kv_dtype"],
        j["time_ms"], j["kv_gbps"], j["ratio"], j["tflops"], j.get("bound", ""), j.get("flashmla_gbps", 0)))
PY
fi

if has prefill; then
  # every row with the three d=128 kernels: ws (default), wgmma, mma (d=64/256
  # and fp8 KV run mma.sync whatever KVA_EXTEND_KERNEL says)
  P="$OUT/bench_prefill.jsonl"
  : >"$P"
  pf() { for kern in ${PF_KERNELS:-ws wgmma mma}; do
      KVA_EXTEND_KERNEL=$kern "$K" bench --device cuda --page 16 \
        --dtype bf16 --kv-dtype bf16 --json "$@" | sed "s/^{/{\"kernel\":\"$kern\",/" >>"$P"
    done; }
  for s in 512 1024 2048 4096 8192 16384; do
    b=$((16384 / s))
    pf --mode prefill --batch $b --ctx $s --heads 16:16 --head-dim 128 --causal 1
  done
  # (wgmma is the d=128 non-ws kernel: the other shapes compare ws with mma.sync)
  PF_KERNELS="ws mma"
  for s in 1024 4096 16384; do
    b=$((16384 / s))
    pf --mode prefill --batch $b --ctx $s --heads 16:16 --head-dim 128 --causal 0
    pf --mode prefill --batch $b --ctx $s --heads 16:16 --head-dim 64 --causal 1
    pf --mode prefill --batch $b --ctx $s --heads 16:16 --head-dim 256 --causal 1
    pf --mode prefill --batch $b --ctx $s --heads 32:8 --head-dim 128 --causal 1
  done
  # mixed extend batches: 32 requests, prefix U[0, 8192], new tokens U[1, 2048]
  pf --mode mixed --batch 32 --ctx 2048 --prefix 8192 --heads 16:16 --head-dim 128 --causal 1
  pf --mode mixed --batch 32 --ctx 2048 --prefix 8192 --heads 32:8 --head-dim 128 --causal 1
fi

if has torch; then
  timeout 240 python3 bench/torch_baselines.py prefill >"$OUT/torch.jsonl" 2>"$OUT/torch.err"
  note "torch baselines: rc=$? ($(wc -l <"$OUT/torch.jsonl") rows)"
fi

if has python; then
  # the Python package's whole suite (CPU and GPU tests) on the staged CUDA library
  KVATTN_LIBRARY=$BIN/libkvattn.so PYTHONPATH=python timeout 300 python3 -m pytest -q -rs python/tests \
    >"$OUT/pytest.log" 2>&1
  note "python tests (torch GPU + CPU): rc=$? $(tail -1 "$OUT/pytest.log")"
fi

if has graph; then
  for t in "$BIN"/example_*; do
    [ -x "$t" ] || continue
    timeout 120 "$t" >"$OUT/$(basename "$t").log" 2>&1
    note "$(basename "$t"): rc=$? $(tail -1 "$OUT/$(basename "$t").log")"
  done
fi

echo
echo "================ summary ================"
cat "$SUMMARY"
python3 scripts/bench_table.py "$OUT" 2>&1 | tee "$OUT/table.txt"
# the device tool returns at most 8 files: pack the logs into one archive
tar czf /tmp/kva_logs.tgz -C "$OUT" --exclude=summary.txt --exclude=table.txt . &&
  find "$OUT" -maxdepth 1 -type f ! -name summary.txt ! -name table.txt -delete &&
  mv /tmp/kva_logs.tgz "$OUT/logs.tgz"
