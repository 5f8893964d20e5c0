#!/usr/bin/env bash
# Build the CUDA configuration here and stage the binaries the device needs in
# .dist/ (git-ignored), to be named in the device tool's `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON >/dev/null
cmake --build build-cuda
rm -rf .dist && mkdir -p .dist
cp build-cuda/kvattn .dist/
cp build-cuda/libkvattn.so .dist/ 2>/dev/null || true
for f in build-cuda/test_cuda_* build-cuda/test_graph build-cuda/test_paged_plan build-cuda/test_mla build-cuda/example_*; do [ -x "$f" ] && cp "$f" .dist/; done
du -sh .dist
