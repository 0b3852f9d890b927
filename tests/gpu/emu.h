/* emu.h: a small CUDA emulator for tests: host C++ stand-ins for the CUDA
 * keywords and built-ins the kernels use, so kernels/cuda compiles with g++.
 *
 * Include it before anything else in a C++ file, then include a .cu/.cuh
 * file of kernels/cuda. Kernel launches (the CUDA_LAUNCH macro of
 * cuda_internal.h) run every block of the grid in turn; a block's threads are
 * coroutines (ucontext) that switch at __syncthreads (whole block), at warp
 * shuffles and __syncwarp (the warp). Between barriers threads run in a
 * shuffled order, so results that depend on the order reveal a race. Shared
 * memory (static in the emulation, one block runs at a time) and dynamic
 * shared memory start as NaN bytes. emu_runtime.cpp holds the scheduler and a
 * fake CUDA runtime and cuBLAS on host memory.
 *
 * Stream capture and graphs are emulated too: while a stream is captured,
 * launches, async copies, memsets and GEMMs are recorded instead of run, and
 * cudaGraphLaunch runs them in order; a call that would synchronize or
 * allocate during a capture stops the program (on a device it invalidates
 * the capture).
 *
 * What it cannot show: timing, coalescing, bank conflicts, the exact rounding
 * of device intrinsics, occupancy or launch-limit errors. */
#ifndef DP_TESTS_GPU_EMU_H
#define DP_TESTS_GPU_EMU_H

/* __shared__ variables become function statics, shared by the block's
 * coroutines. */
#define __global__
#define __device__
#define __shared__ static
#define __constant__
#define __launch_bounds__(n)

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <functional>
#include <tuple>

/* State of the running block (emu_runtime.cpp). */
extern int emu_cur;
extern uint3 emu_block_idx, emu_block_dim, emu_grid_dim;
extern unsigned char *emu_dyn_smem;
extern uint64_t emu_order_seed;

static inline uint3 emu_thread_idx(void) { return make_uint3((unsigned)emu_cur, 0, 0); }

#define threadIdx emu_thread_idx()
#define blockIdx emu_block_idx
#define blockDim emu_block_dim
#define gridDim emu_grid_dim
#define CUDA_DYN_SMEM(name) unsigned char *name = emu_dyn_smem

void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask);

/* A device access of n bytes must be n-aligned (a misaligned one faults on
 * a GPU; the host would not notice): kernels check the accesses whose
 * alignment is not obvious (cuda_internal.h CUDA_CHECK_ALIGN). */
void emu_misaligned(const void *p, int n, const char *file, int line);
#define CUDA_CHECK_ALIGN(p, n)                                                                     \
    do {                                                                                           \
        if ((uintptr_t)(p) % (uintptr_t)(n))                                                       \
            emu_misaligned((const void *)(p), (int)(n), __FILE__, __LINE__);                       \
    } while (0)

/* Device math the host library lacks (glibc declares an __expf it does not
 * export). */
#define __expf(x) expf(x)
/* IEEE single operations, never fused (the host build has no FMA). */
#define __fmul_rn(a, b) ((a) * (b))
#define __fadd_rn(a, b) ((a) + (b))
#define rsqrtf(x) (1.0f / sqrtf(x))
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

/* Threads switch only at barriers and shuffles, so a read-modify-write is
 * atomic as it stands. */
static inline int atomicAdd(int *p, int v)
{
    int o = *p;
    *p = o + v;
    return o;
}

/* Runs every block of the grid; body calls the kernel with its arguments. */
void emu_launch(dim3 grid, int threads, size_t smem, const std::function<void()> &body);

/* The arguments are evaluated at the launch and kept by value, as on a
 * device: a launch recorded by stream capture (cudaStreamBeginCapture) runs
 * later, with the values of its launch, whatever changed since. */
#define CUDA_LAUNCH(kernel, grid, block, smem, stream, ...)                                        \
    emu_launch(dim3(grid), (int)(block), (size_t)(smem),                                           \
               [emu_args = std::make_tuple(__VA_ARGS__)]() {                                     \
                   std::apply([](auto... a) { kernel(a...); }, emu_args);                          \
               })

#endif
