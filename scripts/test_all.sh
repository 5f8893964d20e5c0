#!/usr/bin/env bash
# Builds and runs every test: the release build (with the CUDA backend when
# nvcc is found; GPU tests skip loudly without a GPU), an AddressSanitizer +
# UBSan build, and the libFuzzer targets for a short fixed time (clang).
set -euo pipefail
cd "$(dirname "$0")/.."
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
stages=0

echo "== release build + ctest"
cmake -S . -B build "${gen[@]}" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j 2
(cd build && ctest --output-on-failure -j 2)
stages=$((stages + 1))

echo "== AddressSanitizer + UBSan build + ctest"
cmake -S . -B build-asan "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVA_SANITIZE=ON >/dev/null
cmake --build build-asan -j 2
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j 2)
stages=$((stages + 1))

if command -v clang >/dev/null; then
  echo "== libFuzzer targets (${KVA_FUZZ_SECONDS:-30} s each)"
  CC=clang cmake -S . -B build-fuzz "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVA_FUZZ=ON >/dev/null
  cmake --build build-fuzz -j 2
  for f in build-fuzz/fuzz_*; do
    [ -x "$f" ] || continue
    echo "-- $f"
    "$f" -max_total_time="${KVA_FUZZ_SECONDS:-30}" -print_final_stats=0 2>&1 | tail -2
  done
  stages=$((stages + 1))
else
  echo "== libFuzzer targets SKIPPED: clang not found"
fi
echo "test_all: $stages passed, 0 failed"
