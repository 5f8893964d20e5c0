# shellcheck shell=bash
# Sourced by the emulators' build.sh (tests/emu, tests/emu_decode,
# tests/emu_mla): emu_build HERE OUT MAIN SCHED compiles the harness MAIN
# (a .cpp in HERE) and the runtime (tests/emu/emu_rt.cpp) with g++, the
# library's schedule builder SCHED (a .c under src) with gcc, and links
# them into OUT. HERE's cuda/ptx.cuh comes first on the include path, so
# the kernels see the emulated PTX helpers instead of src/cuda/ptx.cuh.
emu_build() {
  local here=$1 out=$2 main=$3 sched=$4
  local root
  root=$(cd "$here/../.." && pwd)
  local inc="-I$here -I$root/tests/emu -I$root/src -I$root/include -I/usr/local/cuda/include"
  local w="-Wall -Wno-array-bounds -Wno-unused-function -Wno-unknown-pragmas -Wno-attributes ${EMU_CXXFLAGS:-}"
  # shellcheck disable=SC2086
  gcc -std=c11 -O2 -Wall -Wextra $inc -c "$root/$sched" -o "$out.sched.o" &&
    g++ -std=c++17 -O2 $w $inc -c "$root/tests/emu/emu_rt.cpp" -o "$out.rt.o" &&
    g++ -std=c++17 -O2 $w $inc -c "$here/$main" -o "$out.main.o" &&
    g++ -o "$out" "$out.main.o" "$out.rt.o" "$out.sched.o" -lm
}
