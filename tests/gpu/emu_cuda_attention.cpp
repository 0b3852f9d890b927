/* emu_cuda_attention.cpp: kernels/cuda/cuda_attention.cu built for the host emulator
 * (emu.h), so check_kernels runs against the CUDA sources without a GPU. */
#include "emu.h"

#include "kernels/cuda/cuda_attention.cu"
