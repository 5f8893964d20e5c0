#!/bin/bash
# Host emulator of the extend kernels (no GPU needed): compiles the real
# kernel sources (src/cuda/extend_kernel.cuh, extend_wgmma.cuh,
# extend_ws.cuh) with g++ against emulated PTX (cuda/ptx.cuh here: warp
# collectives, named barriers, mbarriers, cp.async that lands late, wgmma by
# descriptor with async-proxy visibility checks) and checks them against a
# double-precision reference. Not part of the CMake build.
#   bash tests/emu/build.sh && /tmp/kva_emu [case|-1] [random cases] [kernel] [dims]
# kernel (same-type KV cases): 0 mma.sync, 1 wgmma (d128 only, others run
# mma.sync), 2 warp-specialized (d64/128/256); absent: random per case.
# dims: 1 = every random case is d128 with same-type KV, 64/128/256 = that
# head dim, 2 = any of the three (same-type KV), e.g. /tmp/kva_emu -1 300 2 1
# runs 300 random d128 cases on the warp-specialized kernel, /tmp/kva_emu -1
# 300 2 256 300 at d256 (plus the fixed cases).
set -e
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/emu/build_common.sh
. "$here/build_common.sh"
emu_build "$here" "${EMU_OUT:-/tmp/kva_emu}" emu_main.cpp src/cuda/extend_sched.c
