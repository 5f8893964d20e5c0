#!/usr/bin/env bash
# Builds and runs every test (the README's test command; CI runs exactly this):
#   1. release build (CUDA backend when nvcc is found) + ctest; GPU tests
#      skip loudly (exit 77) without a GPU,
#   2. AddressSanitizer + UBSan build (CPU only) + ctest,
#   3. libFuzzer targets (clang only), each for KVA_FUZZ_SECONDS (default 30),
#   4. the CUDA kernels' host emulators (scripts/test_emulators.sh: the real
#      kernel sources on the CPU against a double reference; no GPU needed),
#   5. the Python package: a venv in build-py/venv, pip install numpy pytest and
#      ./python (bundling build/libkvattn.so from stage 1), pytest on the CPU
#      tests; the GPU tests skip loudly without torch and a GPU.
# Every stage runs even if an earlier one failed; the last line summarizes and
# the exit status is non-zero if any stage failed.
set -uo pipefail
cd "$(dirname "$0")/.."
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
jobs=$(nproc 2>/dev/null || echo 2)
fuzz_seconds=${KVA_FUZZ_SECONDS:-30}
results=()
passed=0 failed=0 skipped=0

# Prints the skip reasons ctest swallowed (tests exiting 77 print a SKIP line).
report_skips() {
  local log=$1/Testing/Temporary/LastTest.log
  [ -f "$log" ] || return 0
  grep -hi "skip" "$log" | sort -u | sed 's/^/   skipped: /'
}

stage() { # stage NAME COMMAND...
  local name=$1
  shift
  echo
  echo "== $name"
  local t0=$SECONDS
  if "$@"; then
    results+=("$name: ok ($((SECONDS - t0)) s)")
    passed=$((passed + 1))
  else
    results+=("$name: FAILED")
    failed=$((failed + 1))
  fi
}

release() {
  mkdir -p build
  cmake -S . -B build "${gen[@]}" -DCMAKE_BUILD_TYPE=Release >build/configure.log 2>&1 ||
    { cat build/configure.log; return 1; }
  grep "kvattn: CUDA backend" build/configure.log
  cmake --build build -j "$jobs" || return 1
  local rc=0
  (cd build && ctest --output-on-failure -j "$jobs") || rc=1
  report_skips build
  return $rc
}

sanitize() {
  cmake -S . -B build-asan "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVA_SANITIZE=ON >/dev/null || return 1
  cmake --build build-asan -j "$jobs" || return 1
  local rc=0
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --output-on-failure -j "$jobs") || rc=1
  report_skips build-asan
  return $rc
}

fuzz() {
  CC=clang cmake -S . -B build-fuzz "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVA_FUZZ=ON >/dev/null || return 1
  cmake --build build-fuzz -j "$jobs" || return 1
  local n=0 f
  for f in build-fuzz/fuzz_*; do
    [ -x "$f" ] && [ -f "$f" ] || continue
    echo "-- $f for $fuzz_seconds s"
    # crash reproducers land in build-fuzz/, not in the source tree
    "$f" -max_total_time="$fuzz_seconds" -print_final_stats=1 -artifact_prefix=build-fuzz/ \
      >"$f.log" 2>&1 || { tail -40 "$f.log"; return 1; }
    grep -E "stat::number_of_executed_units|cov:" "$f.log" | tail -2
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] || { echo "no fuzz targets were built"; return 1; }
}

python_pkg() {
  local venv=build-py/venv py=python3
  command -v "$py" >/dev/null || { echo "python3 not found"; return 1; }
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv" || return 1
  "$venv/bin/python" -m pip install -q --disable-pip-version-check numpy pytest || return 1
  # the wheel bundles build/libkvattn.so (stage 1); reinstall so it is this build's
  KVATTN_LIBRARY="$PWD/build/libkvattn.so" "$venv/bin/python" -m pip install -q \
    --disable-pip-version-check --force-reinstall --no-deps ./python || return 1
  local log=build-py/pytest.log rc=0
  # run outside the source tree's python/ so the installed package is what is tested
  "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider python/tests >"$log" 2>&1 || rc=1
  grep -vE "^SKIPPED" "$log" | tail -15
  # one loud line per skip reason (GPU tests without torch/GPU, MLA without its kernels)
  grep -E "^SKIPPED" "$log" | sed -E 's/^SKIPPED \[([0-9]+)\] [^ ]*: /\1\t/' |
    awk -F'\t' '{n[$2] += $1} END {for (r in n) printf "   skipped: %d python tests: %s\n", n[r], r}'
  return $rc
}

stage "release build + ctest" release
stage "ASan+UBSan build + ctest" sanitize
if command -v clang >/dev/null; then
  stage "libFuzzer targets (${fuzz_seconds} s each)" fuzz
else
  echo
  echo "== libFuzzer targets SKIPPED: clang not found"
  results+=("libFuzzer targets: skipped (no clang)")
  skipped=$((skipped + 1))
fi
if command -v g++ >/dev/null; then
  stage "CUDA kernels on the host emulators (CPU)" bash scripts/test_emulators.sh
else
  echo
  echo "== CUDA kernels on the host emulators SKIPPED: g++ not found"
  results+=("host emulators: skipped (no g++)")
  skipped=$((skipped + 1))
fi
stage "Python package (pip install ./python + pytest, CPU)" python_pkg

echo
printf '   %s\n' "${results[@]}"
echo "test_all: $passed passed, $failed failed, $skipped skipped (stages)"
[ "$failed" -eq 0 ]
