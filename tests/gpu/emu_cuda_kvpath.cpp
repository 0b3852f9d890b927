/* emu_cuda_kvpath.cpp: kernels/cuda/cuda_kvpath.cu built for the host emulator
 * (emu.h), so check_kernels runs against the CUDA sources without a GPU. */
#include "emu.h"

#include "kernels/cuda/cuda_kvpath.cu"
