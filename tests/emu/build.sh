#!/bin/bash
# Host emulator of the extend kernels (no GPU needed): compiles the real
# kernel sources (src/cuda/extend_kernel.cuh, extend_wgmma.cuh) with g++
# against emulated PTX (cuda/ptx.cuh here: warp collectives, cp.async that
# lands only at wait_group, wgmma by descriptor) and checks them against a
# double-precision reference. Not part of the CMake build.
#   bash tests/emu/build.sh && /tmp/kva_emu [case|-1] [random cases] [wgmma 0|1]
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${EMU_OUT:-/tmp/kva_emu}
INC="-I$here -I$root/src -I$root/include -I/usr/local/cuda/include"
W="-Wall -Wno-array-bounds -Wno-unused-function -Wno-unknown-pragmas"
gcc -std=c11 -O2 -Wall -Wextra $INC -c "$root/src/cuda/extend_sched.c" -o "$out.sched.o"
g++ -std=c++17 -O2 $W $INC -c "$here/emu_rt.cpp" -o "$out.rt.o"
g++ -std=c++17 -O2 $W $INC -c "$here/emu_main.cpp" -o "$out.main.o"
g++ -o "$out" "$out.main.o" "$out.rt.o" "$out.sched.o" -lm
