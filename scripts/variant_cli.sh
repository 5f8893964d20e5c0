#!/usr/bin/env bash
# A scratch CLI for A/B runs on the device: build-cuda's kvattn relinked
# with src/cuda/mla.cu (or the units named in KVA_VARIANT_UNITS, e.g.
# "decode_d128.cu decode_d64.cu") compiled from another source tree (a git
# worktree holding the variant) and/or with extra nvcc flags (e.g.
# -DSOME_KNOB=1).
#   [KVA_VARIANT_UNITS="..."] bash scripts/variant_cli.sh SRC_TREE NAME [nvcc flags ...]
# -> .ab/NAME/kvattn (git-ignored; name .ab in the device tool's carry),
# then e.g. KVA_AB_BINS="base:.ab/base/kvattn NAME:.ab/NAME/kvattn"
# bash scripts/ab_mla.sh 3. Prints v6's ptxas spill lines and any
# serialized-wgmma warning (C7512/C7513/C7515/C7517/C7520). Needs a configured,
# built build-cuda (scripts/stage_device.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src=$(cd "$1" && pwd) name=$2
shift 2
B=$root/build-cuda
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cp "$B/libkvattn.a" "$t/libkvattn.a"
for u in ${KVA_VARIANT_UNITS:-mla.cu}; do
  "$nvcc" -DKVA_WITH_CUDA=1 -D_GNU_SOURCE -I"$src/include" -I"$src/src" \
    -gencode=arch=compute_90a,code=sm_90a -Xptxas=-v -O3 -Xcompiler=-fPIC "$@" \
    -c "$src/src/cuda/$u" -o "$t/$u.o" >"$t/ptxas.log" 2>&1 || { tail -20 "$t/ptxas.log"; exit 1; }
  grep -A2 "kva_mla_kernel_v6" "$t/ptxas.log" | grep spill | sort | uniq -c || true
  grep -E "C75(12|13|15|17|20)" "$t/ptxas.log" | head -3 || true
  # the archive member is UNIT.o (mla.cu.o), as CMake names it
  ar r "$t/libkvattn.a" "$t/$u.o" 2>/dev/null
done
mkdir -p "$root/.ab/$name"
# CMake's own link line for the CLI, with the patched archive and output
link=$(ninja -C "$B" -t commands kvattn_cli | tail -1)
link=${link#: && }
link=${link% && :}
link=$(echo "$link" | sed -e "s| libkvattn.a | $t/libkvattn.a |" -e "s| -o kvattn | -o $root/.ab/$name/kvattn |")
(cd "$B" && eval "$link")
echo "built .ab/$name/kvattn"
