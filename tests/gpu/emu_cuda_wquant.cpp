/* emu_cuda_wquant.cpp: kernels/cuda/cuda_wquant.cu (quantized weights on the
 * device) built for the host emulator (emu.h). */
#include "emu.h"

#include "kernels/cuda/cuda_wquant.cu"
