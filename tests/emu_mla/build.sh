#!/bin/bash
# Host emulator of the MLA decode kernel (no GPU needed): compiles the real
# kernel source (src/cuda/mla_kernel.cuh) with g++ against the extend
# emulator's runtime (tests/emu: coroutine threads, cp.async landing at
# wait_group, wgmma by descriptor with operand and async-proxy visibility
# checks) and checks it against a double-precision reference, including the
# in-kernel merge of split requests. Not part of the CMake build.
#   bash tests/emu_mla/build.sh && /tmp/kva_emu_mla [case|-1] [random cases] [seed]
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${EMU_OUT:-/tmp/kva_emu_mla}
INC="-I$here -I$root/tests/emu -I$root/src -I$root/include -I/usr/local/cuda/include"
W="-Wall -Wno-array-bounds -Wno-unused-function -Wno-unknown-pragmas -Wno-attributes"
gcc -std=c11 -O2 -Wall -Wextra -I$root/src -I$root/include -c "$root/src/core/split_schedule.c" -o "$out.sched.o"
g++ -std=c++17 -O2 $W $INC -c "$root/tests/emu/emu_rt.cpp" -o "$out.rt.o"
g++ -std=c++17 -O2 $W $INC -c "$here/mla_emu.cpp" -o "$out.main.o"
g++ -o "$out" "$out.main.o" "$out.rt.o" "$out.sched.o" -lm
