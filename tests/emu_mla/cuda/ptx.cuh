/* Emulated PTX for the MLA kernel (test-only): the decode emulator's
 * helpers (which include the extend emulator's). */
#pragma once
#include "../../emu_decode/cuda/ptx.cuh"
