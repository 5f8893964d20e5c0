#!/usr/bin/env bash
# Prefill rows of issue 4 timed under sustained load, kvattn and torch's cuDNN
# SDPA row by row in one device call (which runs first alternates by row):
# each side launches back to back for WARM_MS before its samples, so both
# are timed at the clock the H100 holds at its power cap, not at the boost
# clock of a short burst. nvidia-smi samples SM clock, power and the clock
# event reasons during each run. Table last; raw JSON in $OUT/sustained.jsonl.
#   [WARM_MS=1500] [SAMPLES=300] [ROWS=all|quick] bash scripts/prefill_sustained.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
K=${KVA_BIN:-.dist}/kvattn OUT=${OUT:-/tmp/kva_out}
W=${WARM_MS:-1500} N=${SAMPLES:-300}
mkdir -p "$OUT"
J="$OUT/sustained.jsonl"
: >"$J"
# B S HQ HKV D CAUSAL of each row (scripts/prefill_rows.sh's bench arguments)
rows() {
  bash scripts/prefill_rows.sh "$([ "${ROWS:-all}" = quick ] && echo quick || echo full)" |
    sed -E 's/--batch ([0-9]+) --ctx ([0-9]+) --heads ([0-9]+):([0-9]+) --head-dim ([0-9]+) --causal ([01])/\1 \2 \3 \4 \5 \6/'
}
# nvidia-smi in the background; prints its pid
smi_start() {
  nvidia-smi --query-gpu=clocks.sm,power.draw.instant,clocks_event_reasons.active \
    --format=csv,noheader,nounits -lms 50 >"$1" 2>/dev/null &
  echo $!
}
# one JSON line from the run's JSON ($2) plus its clock/power samples ($1)
tag() {
  python3 - "$1" "$2" <<'PY'
import json, statistics, sys
v = []
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split(",")]
    try:
        v.append((float(f[0]), float(f[1]), f[2]))
    except (ValueError, IndexError):
        pass
busy = [x for x in v if x[1] > 250] or v
r = json.loads(sys.argv[2])
r["clock_mhz"] = statistics.median(x[0] for x in busy) if busy else 0
r["power_w"] = statistics.median(x[1] for x in busy) if busy else 0
r["power_cap_samples"] = sum(1 for x in busy if int(x[2], 16) & 4) if busy else 0
r["samples_smi"] = len(busy)
print(json.dumps(r))
PY
}
ours() {
  local p out
  p=$(smi_start "$OUT/smi.txt")
  out=$("$K" bench --device cuda --mode prefill --batch "$1" --ctx "$2" --heads "$3:$4" --head-dim "$5" \
    --causal "$6" --page 16 --dtype bf16 --kv-dtype bf16 --warm-ms "$W" --iters "$N" --json 2>/dev/null |
    sed 's/^{/{"side":"kvattn",/')
  kill "$p" 2>/dev/null; wait "$p" 2>/dev/null
  [ -n "$out" ] && tag "$OUT/smi.txt" "$out" >>"$J"
}
theirs() {
  local p out
  p=$(smi_start "$OUT/smi.txt")
  out=$(python3 bench/torch_baselines.py row "$@" "$W" "$N" 2>/dev/null | sed 's/^{/{"side":"cudnn",/')
  kill "$p" 2>/dev/null; wait "$p" 2>/dev/null
  [ -n "$out" ] && tag "$OUT/smi.txt" "$out" >>"$J"
}
i=0
while read -r b s hq hkv d c; do
  row=("$b" "$s" "$hq" "$hkv" "$d" "$c")
  if [ $((i % 2)) -eq 0 ]; then ours "${row[@]}"; theirs "${row[@]}"
  else theirs "${row[@]}"; ours "${row[@]}"; fi
  i=$((i + 1))
done < <(rows)
python3 - "$J" "$W" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    s = r.get("ctx", r.get("seq"))
    key = (r["heads"], r["head_dim"], int(r["causal"]), s)
    rows.setdefault(key, {})[r["side"]] = r
print("sustained prefill (warm %s ms each side): TFLOP/s [median SM MHz, W]" % sys.argv[2])
for key in sorted(rows, key=lambda k: (k[2] == 0, k[1], k[0], k[3])):
    a, c = rows[key].get("kvattn"), rows[key].get("cudnn")
    f = lambda r: "%6.1f [%4.0f, %3.0f]" % (r["tflops"], r["clock_mhz"], r["power_w"]) if r else "  --  "
    ratio = "%.2f" % (a["tflops"] / c["tflops"]) if a and c else "--"
    print("heads %-5s d=%-3d causal %d S=%-5d  kvattn %s  cudnn %s  ratio %s" % (
        key[0], key[1], key[2], key[3], f(a), f(c), ratio))
PY
