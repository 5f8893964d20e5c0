#!/usr/bin/env bash
# The CUDA kernels on the CPU: builds the host emulators (tests/emu,
# tests/emu_decode, tests/emu_mla: the real kernel sources compiled with
# g++ against emulated PTX) and runs each on its fixed cases plus a few
# random ones, every MLA kernel included. CI has no GPU, so this is how it
# checks the kernels' logic (their speed and the real PTX need the device).
#   bash scripts/test_emulators.sh [random cases] [seed]
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:-10} seed=${2:-$(date +%s)}
out=build-emu
mkdir -p "$out"
echo "emulators: $n random cases a run, seed $seed"
rc=0
run() { # run NAME COMMAND...: its last line (builds: "built"), the log's tail if it failed
  local name=$1 log=$out/$1.log
  shift
  if "$@" >"$log" 2>&1; then
    case $name in build-*) echo "   $name: built" ;; *) echo "   $name: $(tail -1 "$log")" ;; esac
  else
    tail -30 "$log"
    echo "   $name: FAILED (log $log)"
    rc=1
  fi
}
run build-extend env EMU_OUT="$out/emu" bash tests/emu/build.sh
run build-decode env EMU_OUT="$out/emu_decode" bash tests/emu_decode/build.sh
run build-mla env EMU_OUT="$out/emu_mla" bash tests/emu_mla/build.sh
# v10 with one S^T warpgroup (a build option; the default has two)
run build-mla-v10sw1 env EMU_OUT="$out/emu_mla_sw1" EMU_CXXFLAGS="-DKVA_MLA10_SWG16=1 -DKVA_MLA10_SWG32=1" \
  bash tests/emu_mla/build.sh
[ $rc -eq 0 ] || exit 1
run extend "$out/emu" -1 "$n"
run decode "$out/emu_decode" -1 "$n"
for k in v2 v5 v6 v9 v10; do
  run "mla-$k" env EMU_MLA_KERNEL=$k "$out/emu_mla" -1 "$n" "$seed"
done
run mla-v10-sw1 env EMU_MLA_KERNEL=v10 "$out/emu_mla_sw1" -1 "$n" "$seed"
# v9's fp8 converted in place (KVA_MLA9_F8IP on the device)
run mla-v9-f8ip env EMU_MLA_KERNEL=v9 EMU_MLA9_F8IP=1 "$out/emu_mla" -1 "$n" "$seed"

exit $rc
