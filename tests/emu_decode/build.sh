#!/bin/bash
# Host emulator of the decode kernels (no GPU needed): compiles the real
# kernel source (src/cuda/decode_kernel.cuh) with g++ against the extend
# emulator's runtime (tests/emu: coroutine threads, warp collectives,
# cp.async landing at wait_group, ldmatrix/mma by definition, bank-conflict
# counting) and checks it against a double-precision reference, including
# the split-KV combine. Not part of the CMake build.
#   bash tests/emu_decode/build.sh && /tmp/kva_emu_decode [case|-1] [random cases]
set -e
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/emu/build_common.sh
. "$here/../emu/build_common.sh"
emu_build "$here" "${EMU_OUT:-/tmp/kva_emu_decode}" decode_emu.cpp src/core/split_schedule.c
