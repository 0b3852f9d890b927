/* emu_cuda_graph.cpp: kernels/cuda/cuda_graph.cu built for the host emulator
 * (emu.h): recorded steps are replayed by the emulator's capture support. */
#include "emu.h"

#include "kernels/cuda/cuda_graph.cu"
