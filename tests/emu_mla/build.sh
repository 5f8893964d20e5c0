#!/bin/bash
# Host emulator of the MLA decode kernel (no GPU needed): compiles the real
# kernel source (src/cuda/mla_kernel.cuh) with g++ against the extend
# emulator's runtime (tests/emu: coroutine threads, cp.async landing at
# wait_group, wgmma by descriptor with operand and async-proxy visibility
# checks) and checks it against a double-precision reference, including the
# in-kernel merge of split requests. Not part of the CMake build.
#   bash tests/emu_mla/build.sh && /tmp/kva_emu_mla [case|-1] [random cases] [seed]
# EMU_MLA_KERNEL=v2|v5|v6|v9|v10 picks the kernel; for debugging, EMU_ONE_PASS,
# EMU_DIFF and EMU_CASE (see mla_emu.cpp).
set -e
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/emu/build_common.sh
. "$here/../emu/build_common.sh"
emu_build "$here" "${EMU_OUT:-/tmp/kva_emu_mla}" mla_emu.cpp src/core/split_schedule.c
