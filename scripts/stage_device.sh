#!/usr/bin/env bash
# Build the CUDA configuration here and stage the binaries the device needs in
# .dist/ (git-ignored), to be named in the device tool's `carry`.
#   bash scripts/stage_device.sh [trace|mlatrace|mla6timeline|mla9timeline|mla9phases|mla10phases]
# trace: also a CLI built with -DKVA_EXT_TRACE (build-trace/) as
# .dist/kvattn_trace, for scripts/trace_prefill.sh; mlatrace: one built with
# -DKVA_MLA_TRACE (build-mlatrace/) as .dist/kvattn_mlatrace, for
# scripts/mla_trace.py; mla6timeline: one built with -DKVA_MLA6_TIMELINE
# (build-mla6tl/) as .dist/kvattn_mla6tl, whose MLA v6 writes the
# KVA_DEC_TRACE timeline; mla9timeline: the same for v9 (-DKVA_MLA9_TIMELINE,
# build-mla9tl/, .dist/kvattn_mla9tl); mla9phases: v9's first chunk end in
# detail (-DKVA_MLA9_PHASES, build-mla9ph/, .dist/kvattn_mla9ph, read by
# scripts/mla9_phases.py); mla10phases: v10's cycles a block per phase
# (-DKVA_MLA10_PHASES, build-mla10ph/, .dist/kvattn_mla10ph, read by
# scripts/mla10_phases.py).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON >/dev/null
# ptxas's C7512, C7513 and C7520 (wgmma serialized) are only info lines,
# and cost ~25% of the prefill kernel's speed (C7513), ~30% of MLA v9's
# (C7512: too few registers for its setmaxnreg share, 2026-11-26) and
# ~35% of MLA v5's (C7520: a wait loop in one thread's branch while wgmmas were in flight,
# 2026-11-25): refuse to stage such a build
log=$(mktemp)
cmake --build build-cuda 2>&1 | tee "$log"
if grep -qE "C7512|C7513|C7520" "$log"; then
  grep -E "C7512|C7513|C7520" "$log" | head -3
  echo "stage_device.sh: ptxas serialized wgmma (C7512/C7513/C7520) in a kernel rebuilt above; not staged" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
rm -rf .dist && mkdir -p .dist
cp build-cuda/kvattn .dist/
cp build-cuda/libkvattn.so .dist/ 2>/dev/null || true
for f in build-cuda/test_cuda_* build-cuda/test_graph build-cuda/test_paged_plan build-cuda/test_mla build-cuda/example_*; do [ -x "$f" ] && cp "$f" .dist/; done
# a CLI built with one trace define: build dir, define, name in .dist
trace_cli() {
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
    -DCMAKE_CUDA_FLAGS="-D$2" >/dev/null
  cmake --build "$1" --target kvattn_cli >/dev/null
  cp "$1/kvattn" ".dist/$3"
}
case "${1:-}" in
  trace) trace_cli build-trace KVA_EXT_TRACE kvattn_trace ;;
  mlatrace) trace_cli build-mlatrace KVA_MLA_TRACE kvattn_mlatrace ;;
  mla6timeline) trace_cli build-mla6tl KVA_MLA6_TIMELINE kvattn_mla6tl ;;
  mla9timeline) trace_cli build-mla9tl KVA_MLA9_TIMELINE kvattn_mla9tl ;;
  mla9phases) trace_cli build-mla9ph KVA_MLA9_PHASES kvattn_mla9ph ;;
  mla10phases) trace_cli build-mla10ph KVA_MLA10_PHASES kvattn_mla10ph ;;
esac
du -sh .dist
