/* emu_runtime.cpp: the emulator's block scheduler (see emu.h) and a fake CUDA
 * runtime and cuBLAS on host memory, enough for kernels/cuda and check_kernels. */
#include "emu.h"

#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <vector>

/* ---- the scheduler ---------------------------------------------------------------- */

enum { EMU_RUN, EMU_WAIT_BLOCK, EMU_WAIT_WARP, EMU_DONE };
#define EMU_MAX_THREADS 1024
#define EMU_STACK (256 * 1024)

typedef struct emu_thread {
    ucontext_t ctx;
    int state;
    char *stack;
} emu_thread;

int emu_cur;
uint3 emu_block_idx, emu_block_dim, emu_grid_dim;
unsigned char *emu_dyn_smem;
uint64_t emu_order_seed = 0x2545f4914f6cdd1dull;

static emu_thread emu_t[EMU_MAX_THREADS];
static ucontext_t emu_main;
static const std::function<void()> *emu_body;
static float emu_xchg[EMU_MAX_THREADS];

static void emu_die(const char *what)
{
    fprintf(stderr, "emulator: %s (block %u,%u,%u)\n", what, emu_block_idx.x, emu_block_idx.y,
            emu_block_idx.z);
    exit(1);
}

static void emu_wait(int state)
{
    emu_t[emu_cur].state = state;
    swapcontext(&emu_t[emu_cur].ctx, &emu_main);
}

void __syncthreads(void) { emu_wait(EMU_WAIT_BLOCK); }

void __syncwarp(unsigned mask)
{
    (void)mask;
    emu_wait(EMU_WAIT_WARP);
}

float __shfl_xor_sync(unsigned mask, float v, int lane_mask)
{
    (void)mask;
    if (lane_mask < 0 || lane_mask > 31)
        emu_die("shuffle lane mask out of the warp");
    emu_xchg[emu_cur] = v;
    emu_wait(EMU_WAIT_WARP);
    const float r = emu_xchg[emu_cur ^ lane_mask];
    emu_wait(EMU_WAIT_WARP); /* nobody overwrites its slot before all have read */
    return r;
}

static void emu_entry(void)
{
    (*emu_body)();
    emu_t[emu_cur].state = EMU_DONE; /* returning resumes emu_main (uc_link) */
}

static uint64_t emu_rand(void)
{
    emu_order_seed ^= emu_order_seed << 13;
    emu_order_seed ^= emu_order_seed >> 7;
    emu_order_seed ^= emu_order_seed << 17;
    return emu_order_seed;
}

static void emu_run_block(int n)
{
    for (int i = 0; i < n; i++) {
        if (!emu_t[i].stack) {
            emu_t[i].stack = (char *)malloc(EMU_STACK);
            if (!emu_t[i].stack)
                emu_die("out of memory");
        }
        getcontext(&emu_t[i].ctx);
        emu_t[i].ctx.uc_stack.ss_sp = emu_t[i].stack;
        emu_t[i].ctx.uc_stack.ss_size = EMU_STACK;
        emu_t[i].ctx.uc_link = &emu_main;
        makecontext(&emu_t[i].ctx, emu_entry, 0);
        emu_t[i].state = EMU_RUN;
    }
    int order[EMU_MAX_THREADS];
    for (;;) {
        for (int i = 0; i < n; i++)
            order[i] = i;
        for (int i = n - 1; i > 0; i--) {
            int j = (int)(emu_rand() % (uint64_t)(i + 1)), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (int k = 0; k < n; k++) {
            const int i = order[k];
            if (emu_t[i].state != EMU_RUN)
                continue;
            emu_cur = i;
            swapcontext(&emu_main, &emu_t[i].ctx);
        }
        int done = 0, at_block = 0;
        for (int i = 0; i < n; i++) {
            done += emu_t[i].state == EMU_DONE;
            at_block += emu_t[i].state == EMU_WAIT_BLOCK;
        }
        if (done == n)
            return;
        bool released = false;
        for (int w = 0; w * 32 < n; w++) {
            int waiting = 0, live = 0;
            for (int i = w * 32; i < n && i < w * 32 + 32; i++) {
                live += emu_t[i].state != EMU_DONE;
                waiting += emu_t[i].state == EMU_WAIT_WARP;
            }
            if (live > 0 && waiting == live) {
                for (int i = w * 32; i < n && i < w * 32 + 32; i++)
                    if (emu_t[i].state == EMU_WAIT_WARP)
                        emu_t[i].state = EMU_RUN;
                released = true;
            }
        }
        if (!released && at_block == n - done) {
            for (int i = 0; i < n; i++)
                if (emu_t[i].state == EMU_WAIT_BLOCK)
                    emu_t[i].state = EMU_RUN;
            released = true;
        }
        if (!released)
            emu_die("deadlock: threads wait at barriers others never reach");
    }
}

static void emu_flush(void);

/* ---- stream capture: while on, stream work is recorded into emu_graph ---- */

struct CUgraph_st {
    std::vector<std::function<void()>> nodes;
};
struct CUgraphExec_st {
    std::vector<std::function<void()>> nodes;
};
static CUgraph_st *emu_capture;

/* True (after recording fn) when a capture is on. */
static bool emu_record(const std::function<void()> &fn)
{
    if (!emu_capture)
        return false;
    emu_capture->nodes.push_back(fn);
    return true;
}

static void emu_no_capture(const char *call)
{
    if (emu_capture) {
        fprintf(stderr, "emulator: %s during stream capture (it would invalidate the capture)\n",
                call);
        exit(1);
    }
}

/* ---- injected faults (emu_inject_error, for the backend's error handling):
 * the next launch does not run and raises err; a sticky error is then
 * returned by every later synchronizing or copying call, as a real context
 * that hit an illegal address does, and a non-sticky one by the next
 * cudaGetLastError only. ---- */
static cudaError_t emu_armed = cudaSuccess, emu_last = cudaSuccess, emu_sticky_err = cudaSuccess;
static bool emu_armed_sticky;

extern "C" void emu_inject_error(int err, int sticky)
{
    emu_armed = (cudaError_t)err;
    emu_armed_sticky = sticky != 0;
}

/* Whether a launch is swallowed by an armed fault (or a dead context). */
static bool emu_fault_launch(void)
{
    if (emu_sticky_err != cudaSuccess)
        return true;
    if (emu_armed == cudaSuccess)
        return false;
    if (emu_armed_sticky)
        emu_sticky_err = emu_armed;
    else
        emu_last = emu_armed;
    emu_armed = cudaSuccess;
    return true;
}

void emu_launch(dim3 grid, int threads, size_t smem, const std::function<void()> &body)
{
    if (threads < 1 || threads > EMU_MAX_THREADS || grid.x < 1 || grid.y < 1 || grid.z < 1 ||
        grid.y > 65535 || grid.z > 65535)
        emu_die("bad launch configuration");
    if (smem > 227 * 1024)
        emu_die("more dynamic shared memory than an H200 block may have");
    if (emu_record([=]() { emu_launch(grid, threads, smem, body); }))
        return;
    emu_flush();
    if (emu_fault_launch())
        return;
    std::vector<unsigned char> dyn(smem + 16);
    emu_body = &body;
    emu_grid_dim = make_uint3(grid.x, grid.y, grid.z);
    emu_block_dim = make_uint3((unsigned)threads, 1, 1);
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                emu_block_idx = make_uint3(x, y, z);
                memset(dyn.data(), 0xff, dyn.size()); /* NaN floats and halves */
                emu_dyn_smem = dyn.data();
                emu_run_block(threads);
            }
}

/* ---- a fake CUDA runtime: device memory is host memory, there is one device
 * and one stream's worth of order. Everything runs at once except async copies
 * from or to pinned host memory (cudaMallocHost, cudaHostAlloc): as on a
 * device, those run later, when the stream is next used or waited for. So host
 * code that reads a pinned buffer before waiting sees its old bytes, and host
 * code that rewrites a pinned source too early changes what gets copied. ---- */

static int emu_dummy_object;

typedef struct emu_copy {
    char *dst;
    const char *src;
    size_t dpitch, spitch, width, height;
} emu_copy;
static std::vector<emu_copy> emu_pending;
static std::vector<std::pair<const char *, size_t>> emu_pinned;

static bool emu_is_pinned(const void *p)
{
    for (const auto &r : emu_pinned)
        if ((const char *)p >= r.first && (const char *)p < r.first + r.second)
            return true;
    return false;
}

/* Runs the queued copies, in order: whatever comes next on the stream (or
 * waits for it) comes after them. */
static void emu_flush(void)
{
    for (const emu_copy &c : emu_pending)
        for (size_t r = 0; r < c.height; r++)
            memmove(c.dst + r * c.dpitch, c.src + r * c.spitch, c.width);
    emu_pending.clear();
}

static void emu_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t height, bool async)
{
    if (!async)
        emu_no_capture("a synchronous copy");
    if (emu_record([=]() { emu_copy2d(dst, dpitch, src, spitch, width, height, async); }))
        return;
    emu_flush();
    emu_copy c = {(char *)dst, (const char *)src, dpitch, spitch, width, height};
    if (async && (emu_is_pinned(dst) || emu_is_pinned(src)))
        emu_pending.push_back(c);
    else
        for (size_t r = 0; r < height; r++)
            memmove(c.dst + r * dpitch, c.src + r * spitch, width);
}

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = 1;
    return cudaSuccess;
}

/* The largest pitch 2-D copies take: 2^31 - 1 as on current GPUs, or the
 * emulator's knob DP_EMU_MAX_PITCH (not the product's), with which a test
 * makes the backend's 2-D copies over it fail and its per-layer path run. */
static size_t emu_max_pitch(void)
{
    const char *mp = getenv("DP_EMU_MAX_PITCH");
    return mp && *mp ? (size_t)strtoull(mp, NULL, 10) : (size_t)2147483647;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (device != 0)
        return cudaErrorInvalidDevice;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "CPU emulator");
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 132; /* an H200's, so launch plans match */
    prop->totalGlobalMem = (size_t)16 << 30;
    prop->memPitch = emu_max_pitch();
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetLastError(void)
{
    if (emu_sticky_err != cudaSuccess)
        return emu_sticky_err;
    cudaError_t e = emu_last;
    emu_last = cudaSuccess;
    return e;
}
const char *cudaGetErrorString(cudaError_t error) { return error ? "emulated CUDA error" : "no error"; }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    (void)flags;
    *s = (cudaStream_t)&emu_dummy_object;
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) { (void)s; return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    (void)s;
    emu_no_capture("cudaStreamSynchronize");
    emu_flush();
    return emu_sticky_err;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    (void)flags;
    *e = (cudaEvent_t)&emu_dummy_object;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) { (void)e; return cudaSuccess; }
/* An event completes at the point it was recorded; the emulator runs the
 * queue up to there at once (earlier than a device would: never a false
 * failure, though it may hide a missing wait on the event). */
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    (void)e;
    (void)s;
    emu_no_capture("cudaEventRecord"); /* legal on a device; the backend never needs it */
    emu_flush();
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    (void)e;
    emu_no_capture("cudaEventSynchronize");
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    (void)a;
    (void)b;
    *ms = 1.0f;
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    (void)func;
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize && value > 227 * 1024)
        return cudaErrorInvalidValue;
    return cudaSuccess;
}

/* A device access the kernels checked (emu.h CUDA_CHECK_ALIGN) was not
 * aligned to its size: a GPU would fault. */
void emu_misaligned(const void *p, int n, const char *file, int line)
{
    fprintf(stderr, "emu: misaligned %d-byte device access at %p (%s:%d)\n", n, p, file, line);
    abort();
}

/* Device allocations are poisoned with NaN bytes: nothing may rely on
 * cudaMalloc returning zeros. */
cudaError_t cudaMalloc(void **p, size_t size)
{
    emu_no_capture("cudaMalloc");
    if (emu_sticky_err != cudaSuccess)
        return emu_sticky_err;
    size_t n = (size + 255) & ~(size_t)255;
    *p = aligned_alloc(256, n ? n : 256);
    if (!*p)
        return cudaErrorMemoryAllocation;
    memset(*p, 0xff, n ? n : 256);
    return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
    emu_no_capture("cudaFree");
    emu_flush(); /* cudaFree waits for the device */
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t size)
{
    cudaError_t e = cudaMalloc(p, size);
    if (e == cudaSuccess)
        emu_pinned.push_back(std::make_pair((const char *)*p, size ? size : 1));
    return e;
}
cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags)
{
    (void)flags;
    return cudaMallocHost(p, size);
}
cudaError_t cudaFreeHost(void *p)
{
    emu_flush();
    for (size_t i = 0; i < emu_pinned.size(); i++)
        if (emu_pinned[i].first == (const char *)p) {
            emu_pinned.erase(emu_pinned.begin() + (long)i);
            break;
        }
    return cudaFree(p);
}
/* A fake 16 GiB device of which 12 GiB are free, whatever was allocated:
 * enough for the memory plan's arithmetic to be exercised. */
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = (size_t)12 << 30;
    *total_bytes = (size_t)16 << 30;
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    (void)kind;
    emu_copy2d(dst, n, src, n, n, 1, false);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t s)
{
    (void)kind;
    (void)s;
    if (emu_sticky_err != cudaSuccess)
        return emu_sticky_err;
    emu_copy2d(dst, n, src, n, n, 1, true);
    return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t s)
{
    (void)kind;
    (void)s;
    if (emu_sticky_err != cudaSuccess)
        return emu_sticky_err;
    if (dpitch > emu_max_pitch() || spitch > emu_max_pitch())
        return cudaErrorInvalidPitchValue;
    if (width > dpitch || width > spitch)
        return cudaErrorInvalidPitchValue;
    emu_copy2d(dst, dpitch, src, spitch, width, height, true);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int v, size_t n)
{
    emu_no_capture("cudaMemset");
    emu_flush();
    memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
    (void)s;
    if (emu_record([=]() { emu_flush(); memset(p, v, n); }))
        return cudaSuccess;
    emu_flush();
    memset(p, v, n);
    return cudaSuccess;
}

/* ---- graphs ---- */

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    (void)s;
    (void)mode;
    if (emu_capture)
        return cudaErrorIllegalState;
    emu_flush(); /* work queued before the capture is not part of it */
    emu_capture = new CUgraph_st;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    (void)s;
    if (!emu_capture)
        return cudaErrorIllegalState;
    *graph = emu_capture;
    emu_capture = NULL;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    (void)flags;
    emu_no_capture("cudaGraphInstantiate");
    *exec = new CUgraphExec_st;
    (*exec)->nodes = graph->nodes;
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    (void)s;
    emu_no_capture("cudaGraphLaunch"); /* legal on a device; never nested here */
    emu_flush();
    for (const auto &fn : exec->nodes)
        fn();
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    delete graph;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    delete exec;
    return cudaSuccess;
}

/* ---- a fake cuBLAS: GemmEx as the cuBLAS documentation defines it
 * (column-major, C = alpha op(A) op(B) + beta C, C not read when beta == 0),
 * written independently of how the backend maps its row-major operands. -------- */

cublasStatus_t cublasCreate_v2(cublasHandle_t *h)
{
    *h = (cublasHandle_t)&emu_dummy_object;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) { (void)h; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *workspace, size_t bytes)
{
    (void)h;
    (void)workspace;
    (void)bytes;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
    (void)h;
    (void)s;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) { return s ? "emulated cuBLAS error" : "success"; }

static float emu_elem(const void *p, cudaDataType t, size_t i)
{
    return t == CUDA_R_16F ? __half2float(((const __half *)p)[i]) : ((const float *)p)[i];
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo)
{
    (void)handle;
    (void)algo;
    if (emu_capture) {
        /* cuBLAS reads alpha and beta (host pointers) when called. */
        const float av = *(const float *)alpha, bv = *(const float *)beta;
        emu_record([=]() {
            cublasGemmEx(handle, transa, transb, m, n, k, &av, A, Atype, lda, B, Btype, ldb, &bv,
                         C, Ctype, ldc, computeType, algo);
        });
        return CUBLAS_STATUS_SUCCESS;
    }
    emu_flush();
    if (Ctype != CUDA_R_32F || computeType != CUBLAS_COMPUTE_32F ||
        (Atype != CUDA_R_16F && Atype != CUDA_R_32F) || (Btype != CUDA_R_16F && Btype != CUDA_R_32F))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0 || ldc < (m > 1 ? m : 1) ||
        lda < ((transa == CUBLAS_OP_N ? m : k) > 1 ? (transa == CUBLAS_OP_N ? m : k) : 1) ||
        ldb < ((transb == CUBLAS_OP_N ? k : n) > 1 ? (transb == CUBLAS_OP_N ? k : n) : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    const float a = *(const float *)alpha, b = *(const float *)beta;
    float *c = (float *)C;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int l = 0; l < k; l++) {
                const float x = transa == CUBLAS_OP_N ? emu_elem(A, Atype, (size_t)i + (size_t)l * lda)
                                                      : emu_elem(A, Atype, (size_t)l + (size_t)i * lda);
                const float y = transb == CUBLAS_OP_N ? emu_elem(B, Btype, (size_t)l + (size_t)j * ldb)
                                                      : emu_elem(B, Btype, (size_t)j + (size_t)l * ldb);
                s += (double)x * y;
            }
            float *cij = c + (size_t)i + (size_t)j * ldc;
            *cij = (float)(a * s) + (b != 0.0f ? b * *cij : 0.0f);
        }
    return CUBLAS_STATUS_SUCCESS;
}
