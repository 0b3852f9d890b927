/* cuda_backend.cu: the CUDA implementation of backend.h: device and stream,
 * memory, fp16 weights, KV stores, the step's batch arrays and the cuBLAS matmul. */
#include <math.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_attention_plan.h"
#include "cuda_internal.h"

/* Errors the CUDA context survives: an allocation that failed, a launch
 * or copy refused for its arguments or resources, a graph capture the
 * runtime invalidated. They fail the step they happen in and nothing else;
 * some of them (an invalid configuration) are bugs that would come back
 * every step, and the engine takes DP_ENGINE_FAIL_STREAK failed steps in a
 * row as a lost device.
 * Every other error (an illegal address, a failed launch, an uncorrectable
 * ECC error, a device gone) is sticky: the context is unusable until the
 * process ends, so the backend reports DP_EDEVICE from then on and the
 * daemon exits to be restarted. Unlisted errors count as sticky: a
 * needless restart costs less than a daemon failing every request. */
static bool cuda_error_recoverable(cudaError_t e)
{
    switch (e) {
    case cudaErrorMemoryAllocation:
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorLaunchOutOfResources:
    case cudaErrorInvalidPitchValue:
    case cudaErrorNotReady:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureUnjoined:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorCapturedEvent:
    case cudaErrorGraphExecUpdateFailure:
        return true;
    default:
        return false;
    }
}

/* Records a failure (runtime or cuBLAS): the first is kept, unless a
 * sticky one follows it. */
static void cuda_fail(cuda_backend *c, bool sticky, const char *what, const char *why)
{
    if (c->failed && !(sticky && !c->lost))
        return;
    c->failed = sticky ? DP_EDEVICE : DP_EIO;
    c->lost = sticky;
    snprintf(c->fail_msg, sizeof c->fail_msg, "%s: %s", what, why);
    dp_log(DP_LOG_ERROR, "cuda: %s: %s", c->fail_msg,
           sticky ? "the device is lost for this process" : "this step fails");
}

void cuda_note_error(cuda_backend *c, const char *what, cudaError_t e)
{
    cuda_fail(c, !cuda_error_recoverable(e), what, cudaGetErrorString(e));
}

/* A recoverable failure ends with its step: the next one starts clean. */
static void cuda_recover(cuda_backend *c)
{
    if (!c->failed || c->lost)
        return;
    cudaGetLastError(); /* a non-sticky error stays until read */
    cudaError_t e = cudaStreamSynchronize(c->stream);
    c->failed = 0;
    if (e != cudaSuccess) {
        cuda_note_error(c, "recovery", e);
        return;
    }
    c->recovered++;
    dp_log(DP_LOG_INFO, "cuda: recovered from %s (%llu so far)", c->fail_msg,
           (unsigned long long)c->recovered);
}

static int cuda_recover_op(dp_backend *be)
{
    cuda_backend *c = cuda_of(be);
    cuda_bind(c);
    cuda_recover(c);
    return c->lost ? DP_EDEVICE : 0;
}

void cuda_check_launch(cuda_backend *c, const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        cuda_note_error(c, what, e);
}

/* cuBLAS: a refusal up front (no memory, an argument, a shape or type the
 * library or this architecture does not support) leaves the context as it
 * was and is recoverable; anything else (an execution failure: a kernel that
 * faulted) counts as sticky. A refusal that comes back every step is taken
 * as fatal by the engine (DP_ENGINE_FAIL_STREAK), not here. */
static bool cuda_blas_recoverable(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_ALLOC_FAILED:
    case CUBLAS_STATUS_INVALID_VALUE:
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return true;
    default:
        return false;
    }
}

void cuda_note_blas(cuda_backend *c, const char *what, cublasStatus_t s)
{
    cuda_fail(c, !cuda_blas_recoverable(s), what, cublasGetStatusString(s));
}

int cuda_scratch_grow(cuda_backend *c, void **p, size_t *cap, size_t want, size_t elem)
{
    if (want <= *cap && *p)
        return 0;
    if (c->step_mode == DP_STEP_RECORD) {
        /* No synchronization or allocation inside a capture: the recording
         * is abandoned and the step issued again (cuda_graph.cu). */
        c->rec_spoiled = true;
        return DP_ENOMEM;
    }
    cuda_graphs_clear(c); /* recorded steps hold the old pointer */
    size_t n = want + want / 4 + 1024;
    /* Work queued on the stream may still read the old buffer. */
    cudaStreamSynchronize(c->stream);
    cudaFree(*p);
    *p = NULL;
    *cap = 0;
    cudaError_t e = cudaMalloc(p, n * elem);
    if (e != cudaSuccess) {
        *p = NULL;
        cuda_note_error(c, "scratch allocation", e);
        return DP_ENOMEM;
    }
    *cap = n;
    return 0;
}

static void *cuda_alloc(dp_backend *be, size_t bytes)
{
    cuda_backend *c = cuda_of(be);
    cuda_bind(c);
    void *p = NULL;
    /* cudaMalloc(0) yields NULL, which callers read as out of memory. */
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is not sticky: clear it */
        return NULL;
    }
    c->alloc_bytes += bytes;
    return p;
}

static void cuda_free(dp_backend *be, void *p)
{
    cuda_xh_forget(cuda_of(be)); /* a later buffer may get the same address */
    cuda_graphs_clear(cuda_of(be)); /* and so may a later model's */
    cuda_bind(cuda_of(be));
    cudaFree(p);
}

/* Synchronous: the caller may reuse or free src as soon as this returns
 * (uploads are set-up and test traffic, not per-step work). */
static int cuda_upload(dp_backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_xh_forget(cuda_of(be)); /* it writes device floats */
    cuda_backend *c = cuda_of(be);
    cuda_bind(c);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        cuda_note_error(c, "upload", e);
        return c->failed ? c->failed : DP_EIO;
    }
    return 0;
}

/* The one synchronization of a step: the logits must be on the host. A failed
 * launch earlier in the step is reported here, since the ops are void. */
static int cuda_download(dp_backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_backend *c = cuda_of(be);
    cuda_bind(c);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess)
        cuda_note_error(c, "download", e);
    return c->failed ? c->failed : 0;
}

/* ---- weights -------------------------------------------------------------
 * A 2-D weight of a block type cuda_wquant.cu reads (Q4_0 .. Q8_0, the K
 * types, IQ4_NL and IQ4_XS) is uploaded as the file's bytes and stays that
 * size on the device. Any other 2-D weight lives there as fp16: the host
 * dequantizes it once at load (quant_dequant_row) and the matmul is one
 * tensor-core GEMM. Vectors (norm weights, rows == 1) stay f32: they are tiny
 * and rmsnorm reads them as f32 like the CPU does. */

#define CUDA_BLAS_WORKSPACE ((size_t)32 << 20)
#define CUDA_WSTAGE_ELEMS ((size_t)8 << 20) /* 16 MiB of fp16 per staged copy */

static int cuda_copy_sync(cuda_backend *c, void *dst, const void *src, size_t bytes)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->stream);
    return e == cudaSuccess ? 0 : DP_EIO;
}

static int cuda_weight_load(dp_backend *be, dp_weight *w, uint32_t type, int64_t rows, int64_t cols,
                            const void *src, char *err, size_t errsz)
{
    cuda_backend *c = cuda_of(be);
    cuda_bind(c);
    memset(w, 0, sizeof *w);
    if (!quant_type_supported(type))
        return dp_err(err, errsz, DP_EUNSUPPORTED, "weight type %s is not supported",
                      quant_type_name(type));
    if (rows < 1 || cols < 1)
        return dp_err(err, errsz, DP_EINVAL, "weight of %lld x %lld elements", (long long)rows,
                      (long long)cols);
    uint64_t row_bytes;
    int rc = quant_row_bytes(type, (uint64_t)cols, &row_bytes);
    if (rc)
        return dp_err(err, errsz, rc, "weight row of %lld %s elements has no valid size",
                      (long long)cols, quant_type_name(type));
    const bool vec = rows == 1;
    /* Whole blocks per row: a row is dequantized 32 values at a time. */
    const bool blocks = !vec && cuda_wq_supported(type) && cols % 32 == 0;
    const size_t elem = vec ? sizeof(float) : sizeof(uint16_t);
    const size_t nbytes = blocks ? (size_t)rows * (size_t)row_bytes : (size_t)rows * (size_t)cols * elem;
    void *d = NULL;
    cudaError_t e = cudaMalloc(&d, nbytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dp_err(err, errsz, DP_ENOMEM, "out of device memory for a %zu-byte weight", nbytes);
    }
    const uint8_t *s = (const uint8_t *)src;
    float *tmp = NULL;
    if (vec) {
        tmp = (float *)malloc((size_t)cols * sizeof *tmp);
        if (!tmp) {
            rc = dp_err(err, errsz, DP_ENOMEM, "out of memory");
            goto fail;
        }
        if ((rc = quant_dequant_row(type, s, tmp, cols))) {
            rc = dp_err(err, errsz, rc, "cannot dequantize %s", quant_type_name(type));
            goto fail;
        }
        if (cuda_copy_sync(c, d, tmp, nbytes)) {
            rc = dp_err(err, errsz, DP_EIO, "weight upload failed");
            goto fail;
        }
    } else if (type == DP_TYPE_F16 || blocks) {
        /* Already the device format: one straight copy. */
        if (cuda_copy_sync(c, d, s, nbytes)) {
            rc = dp_err(err, errsz, DP_EIO, "weight upload failed");
            goto fail;
        }
    } else {
        if (!c->wstage) {
            if (cudaMallocHost((void **)&c->wstage, CUDA_WSTAGE_ELEMS * sizeof(uint16_t)) !=
                cudaSuccess) {
                cudaGetLastError();
                c->wstage = NULL;
                rc = dp_err(err, errsz, DP_ENOMEM, "out of pinned memory for weight staging");
                goto fail;
            }
            c->wstage_cap = CUDA_WSTAGE_ELEMS;
        }
        tmp = (float *)malloc((size_t)cols * sizeof *tmp);
        if (!tmp) {
            rc = dp_err(err, errsz, DP_ENOMEM, "out of memory");
            goto fail;
        }
        /* Rows are converted into the staging buffer a chunk at a time; a row
         * longer than the buffer is not a weight any model has. */
        int64_t chunk = (int64_t)(c->wstage_cap / (size_t)cols);
        if (chunk < 1) {
            rc = dp_err(err, errsz, DP_EUNSUPPORTED, "weight rows of %lld elements are too long",
                        (long long)cols);
            goto fail;
        }
        uint16_t *dd = (uint16_t *)d;
        for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
            int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
            for (int64_t r = 0; r < nr; r++) {
                const uint8_t *sr = s + (size_t)(r0 + r) * row_bytes;
                const float *f = (const float *)sr;
                if (type != DP_TYPE_F32) {
                    if ((rc = quant_dequant_row(type, sr, tmp, cols))) {
                        rc = dp_err(err, errsz, rc, "cannot dequantize %s", quant_type_name(type));
                        goto fail;
                    }
                    f = tmp;
                } else {
                    /* f32 rows may be unaligned in a GGUF buffer: copy first. */
                    memcpy(tmp, sr, (size_t)cols * sizeof *tmp);
                    f = tmp;
                }
                uint16_t *o = c->wstage + (size_t)r * (size_t)cols;
                for (int64_t j = 0; j < cols; j++)
                    o[j] = dp_f32_to_fp16(f[j]);
            }
            if (cuda_copy_sync(c, dd + (size_t)r0 * (size_t)cols, c->wstage,
                               (size_t)nr * (size_t)cols * sizeof(uint16_t))) {
                rc = dp_err(err, errsz, DP_EIO, "weight upload failed");
                goto fail;
            }
        }
    }
    free(tmp);
    w->type = vec ? (uint32_t)DP_TYPE_F32 : blocks ? type : (uint32_t)DP_TYPE_F16;
    w->rows = rows;
    w->cols = cols;
    w->data = d;
    w->nbytes = nbytes;
    c->weight_bytes += nbytes;
    return 0;
fail:
    free(tmp);
    cudaFree(d);
    return rc;
}

static void cuda_weight_free(dp_backend *be, dp_weight *w)
{
    cuda_backend *c = cuda_of(be);
    cuda_bind(c);
    if (w->data)
        c->weight_bytes -= w->nbytes < c->weight_bytes ? w->nbytes : c->weight_bytes;
    cuda_graphs_clear(c);
    cudaFree(w->data);
    memset(w, 0, sizeof *w);
}

/* ---- memory plan and host memory ------------------------------------------ */

static int cuda_mem_info(dp_backend *be, size_t *free_bytes, size_t *total_bytes)
{
    cuda_bind(cuda_of(be));
    /* Counts every process on the device, and this one's context too. */
    cudaError_t e = cudaMemGetInfo(free_bytes, total_bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return DP_EIO;
    }
    return 0;
}

static void cuda_mem_usage(dp_backend *be, size_t *weight_bytes, size_t *alloc_bytes)
{
    cuda_backend *c = cuda_of(be);
    *weight_bytes = c->weight_bytes;
    *alloc_bytes = c->alloc_bytes;
}

/* Pinned host memory: the host tier's arena, so that its block copies are
 * true DMA copies that run asynchronously on the stream. */
static void *cuda_host_alloc(dp_backend *be, size_t bytes)
{
    cuda_bind(cuda_of(be));
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 256, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cuda_host_free(dp_backend *be, void *p)
{
    if (!p)
        return;
    cuda_backend *c = cuda_of(be);
    cuda_bind(c);
    /* Copies queued into or out of p must finish first. */
    cudaStreamSynchronize(c->stream);
    cudaFreeHost(p);
}

/* ---- KV stores ----------------------------------------------------------- */

/* f16 rows (an f32 layout is kept in f16 too), or q8_0 / q4_0 rows where
 * head_dim is whole groups of 32, or kivi4 groups (a view of an f16 arena
 * only: kv_create refuses it) of an even number of tokens up to 256 where
 * head_dim is whole groups of 64 (the CPU's rule, so that the manager sizes
 * both backends alike). */
static size_t cuda_kv_block_bytes(dp_backend *be, const dp_kv_layout *l)
{
    if (l->type < 0 || l->type >= DP_KV_TYPE_COUNT || l->head_dim <= 0 || l->block_tokens <= 0)
        return 0;
    if (dp_kv_type_grouped(l->type))
        return l->block_tokens % 2 || l->block_tokens > 256 || l->head_dim % KIVI_VGROUP ||
                       l->head_dim > CUDA_MAX_HEAD_DIM
                   ? 0
                   : 2 * (size_t)l->n_layers * (size_t)l->n_kv_heads *
                         cuda_kivi_head_bytes(l->head_dim, l->block_tokens);
    if (cuda_kv_quant(l->type) && l->head_dim % CUDA_QK)
        return 0;
    return 2 * (size_t)l->n_layers * (size_t)l->n_kv_heads * (size_t)l->block_tokens *
           cuda_kv_row_bytes(l->type, l->head_dim);
}

/* The geometry every store shares: rows the kernels can read. */
static bool cuda_kv_layout_ok(const dp_kv_layout *l)
{
    if (l->n_layers <= 0 || l->n_kv_heads <= 0 || l->head_dim <= 0 || l->block_tokens <= 0 ||
        l->n_blocks <= 0 || l->type < 0 || l->type >= DP_KV_TYPE_COUNT)
        return false;
    /* The kernels move f16 rows as 16-byte vectors and size shared memory
     * for head_dim <= 256 (every LLaMA-family model fits). */
    if (l->head_dim % CUDA_KV_VEC || l->head_dim > CUDA_MAX_HEAD_DIM) {
        dp_log(DP_LOG_ERROR, "cuda: head_dim %d is not supported (a multiple of %d up to %d)",
               l->head_dim, CUDA_KV_VEC, CUDA_MAX_HEAD_DIM);
        return false;
    }
    if (cuda_kv_quant(l->type) && l->head_dim % CUDA_QK) {
        dp_log(DP_LOG_ERROR, "cuda: a %s KV cache needs head_dim in groups of %d (got %d)",
               dp_kv_type_name(l->type), CUDA_QK, l->head_dim);
        return false;
    }
    if (dp_kv_type_grouped(l->type) && !cuda_kv_block_bytes(NULL, l)) {
        dp_log(DP_LOG_ERROR,
               "cuda: a %s KV cache needs head_dim in groups of %d and an even group of "
               "at most 256 tokens (got head_dim %d, group %d)",
               dp_kv_type_name(l->type), KIVI_VGROUP, l->head_dim, l->block_tokens);
        return false;
    }
    return true;
}

/* The fields of a store that follow from its layout; blk_bytes: its block
 * stride (a view's is its base's; 0: its own blocks'). */
static void cuda_kv_fields(dp_kv_store *kv, const dp_kv_layout *l, size_t blk_bytes)
{
    kv->l = *l;
    kv->type = cuda_kv_quant(l->type) || dp_kv_type_grouped(l->type) ? l->type : DP_KV_F16;
    kv->row_bytes = cuda_kv_row_bytes(l->type, l->head_dim);
    kv->blk_bytes = blk_bytes ? blk_bytes
                              : (size_t)l->n_kv_heads * (size_t)l->block_tokens * kv->row_bytes;
    kv->head_bytes = dp_kv_type_grouped(l->type)
                         ? cuda_kivi_head_bytes(l->head_dim, l->block_tokens)
                         : 0;
}

static int cuda_kv_create(dp_backend *be, const dp_kv_layout *l, dp_kv_store **out)
{
    cuda_backend *c = cuda_of(be);
    cuda_bind(c);
    if (l->n_layers <= 0 || l->n_kv_heads <= 0 || l->head_dim <= 0 || l->block_tokens <= 0 ||
        l->n_blocks <= 0)
        return DP_EINVAL;
    if (!cuda_kv_layout_ok(l) || dp_kv_type_grouped(l->type))
        return DP_EUNSUPPORTED; /* a grouped type's residual lives in the arena it views */
    dp_kv_store *kv = (dp_kv_store *)calloc(1, sizeof *kv);
    if (!kv)
        return DP_ENOMEM;
    cuda_kv_fields(kv, l, 0);
    size_t half = cuda_kv_block_bytes(be, l) / 2 * (size_t)l->n_blocks;
    if (cudaMalloc((void **)&kv->k, half) != cudaSuccess ||
        cudaMalloc((void **)&kv->v, half) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(kv->k);
        cudaFree(kv->v);
        free(kv);
        return DP_ENOMEM;
    }
    /* Zeros, so that no slot ever holds a NaN bit pattern (a padded key of an
     * attention tile is weighted 0, and 0 * NaN would poison the sum). */
    if (cudaMemsetAsync(kv->k, 0, half, c->stream) != cudaSuccess ||
        cudaMemsetAsync(kv->v, 0, half, c->stream) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(kv->k);
        cudaFree(kv->v);
        free(kv);
        return DP_EIO;
    }
    *out = kv;
    return 0;
}

static void cuda_kv_destroy(dp_backend *be, dp_kv_store *kv)
{
    if (!kv)
        return;
    cuda_backend *c = cuda_of(be);
    cuda_bind(c);
    cuda_graphs_clear(c);
    cudaStreamSynchronize(c->stream);
    if (!kv->view) {
        cudaFree(kv->k);
        cudaFree(kv->v);
    }
    free(kv);
}

/* The base's memory read in another type (backend.h kv_view): the same
 * geometry and block count, each block within the base's bytes, the
 * base's block stride. Folded views (the exempt layers' third store) are
 * not kept: a step addresses two stores here (kv_max_stores). */
static int cuda_kv_view(dp_backend *be, dp_kv_store *base, const dp_kv_layout *l,
                        dp_kv_store **out)
{
    const dp_kv_layout *b = &base->l;
    if (l->type < 0 || l->type >= DP_KV_TYPE_COUNT)
        return DP_EINVAL;
    if (l->n_layers != b->n_layers || l->n_blocks != b->n_blocks ||
        l->n_kv_heads != b->n_kv_heads || l->head_dim != b->head_dim)
        return DP_EUNSUPPORTED;
    if (!cuda_kv_layout_ok(l))
        return DP_EUNSUPPORTED;
    const bool grouped = dp_kv_type_grouped(l->type);
    const size_t own =
        (size_t)l->n_kv_heads * (grouped ? cuda_kivi_head_bytes(l->head_dim, l->block_tokens)
                                         : (size_t)l->block_tokens *
                                               cuda_kv_row_bytes(l->type, l->head_dim));
    /* Rows of f16 are moved as 16-byte vectors: blocks must stay aligned.
     * A kivi4 view reads its lead and residual as the base's f16 rows. */
    if (own > base->blk_bytes || (!cuda_kv_quant(l->type) && base->blk_bytes % 16) ||
        (grouped && (base->view || base->type != DP_KV_F16)))
        return DP_EINVAL;
    dp_kv_store *kv = (dp_kv_store *)calloc(1, sizeof *kv);
    if (!kv)
        return DP_ENOMEM;
    cuda_kv_fields(kv, l, base->blk_bytes);
    if (grouped) {
        kv->base_bt = b->block_tokens;
        kv->l.base_tokens = b->block_tokens;
        kv->row_bytes = base->row_bytes; /* the lead's and the residual's f16 rows */
    }
    kv->k = base->k;
    kv->v = base->v;
    kv->view = true;
    *out = kv;
    return 0;
}

static const dp_kv_layout *cuda_kv_get_layout(dp_backend *be, const dp_kv_store *kv)
{
    return &kv->l;
}

/* ---- the step's batch -----------------------------------------------------
 * All index arrays travel in one async copy from a pinned staging buffer:
 * tokens, pos, seq, slot [n_tokens each], block tables [n_seqs * stride],
 * out_tokens [n_out], capture_tokens [n_capture], seq_store widened to int32
 * [n_seqs], and the query tiles the attention kernel walks [n_tiles + 1].
 *
 * A decode step (one token per sequence, nothing captured) may be recorded
 * and replayed (cuda_graph.cu), keyed by its shape. So that the shape repeats
 * from step to step while contexts grow, such a step rounds the block-table
 * stride and the longest context (which sizes attention's split-K launch) up
 * to powers of two: kernels read a table only up to each token's own block
 * and stop at each row's own slot, so the rounding changes no result. It is
 * applied whether or not recording is on, so that both give the same bits. */

static int32_t round_pow2(int32_t x, int32_t lo)
{
    int32_t r = lo;
    while (r < x && r < (INT32_MAX >> 1))
        r <<= 1;
    return r < x ? x : r;
}

static int cuda_arrays_reserve(cuda_backend *c, size_t need)
{
    if (need <= c->arrays_cap)
        return 0;
    size_t n = need + need / 2 + 4096;
    cuda_graphs_clear(c);            /* recorded steps read the old arrays */
    cudaStreamSynchronize(c->stream); /* queued kernels may read the old arrays */
    cudaFreeHost(c->h_arrays);
    cudaFree(c->d_arrays);
    c->h_arrays = NULL;
    c->d_arrays = NULL;
    c->arrays_cap = 0;
    c->arrays_pending = false;
    if (cudaMallocHost((void **)&c->h_arrays, n * sizeof(int32_t)) != cudaSuccess ||
        cudaMalloc((void **)&c->d_arrays, n * sizeof(int32_t)) != cudaSuccess) {
        cudaGetLastError();
        cudaFreeHost(c->h_arrays);
        cudaFree(c->d_arrays);
        c->h_arrays = NULL;
        c->d_arrays = NULL;
        return DP_ENOMEM;
    }
    c->arrays_cap = n;
    return 0;
}

static int cuda_batch_set(dp_backend *be, const dp_batch *b)
{
    cuda_backend *c = cuda_of(be);
    cuda_bind(c);
    cuda_recover(c);
    if (c->failed)
        return c->failed;
    if (b->n_tokens < 1 || b->n_seqs < 1 || b->max_blocks < 1 || b->n_out < 0)
        return DP_EINVAL;
    /* A step addresses two stores here (kv_max_stores): exempt layers and
     * decode types other than the server's would be more. */
    if (b->n_exempt > 0 || (b->layer_map && (b->w_store < 0 || b->w_store >= DP_KV_MAX_STORES)))
        return DP_EUNSUPPORTED;
    for (int32_t s = 0; s < b->n_seqs; s++)
        if (b->seq_store[s] >= CUDA_KV_STORES)
            return DP_EUNSUPPORTED;
    const size_t nt = (size_t)b->n_tokens, ns = (size_t)b->n_seqs;
    const int32_t n_capture = b->n_capture > 0 ? b->n_capture : 0;
    /* One token per sequence (so every query tile is one token) and no
     * capture: a decode step (recorded only without a layer map: the
     * sliding layers' tables are not in a recorded step's key). */
    const bool decode = b->n_tokens <= CUDA_GRAPH_MAX_TOKENS && dp_batch_is_decode(b) &&
                        !b->layer_map;
    const int32_t stride = decode ? round_pow2(b->max_blocks, 8) : b->max_blocks;
    const size_t nbt = ns * (size_t)stride;
    /* Tiles: at most one per token. */
    /* The sliding layers' tables and one store index (0) per sequence. */
    const size_t nwt = b->layer_map ? ns * (size_t)b->w_max_blocks + ns : 0;
    const size_t need = 4 * nt + nbt + (size_t)b->n_out + (size_t)n_capture + 3 * ns + nwt + nt + 1;
    /* The previous step's copy may still be reading the staging buffer (a
     * step without logits ends without a download). */
    if (c->arrays_pending) {
        cudaEventSynchronize(c->arrays_copied);
        c->arrays_pending = false;
    }
    if (cuda_arrays_reserve(c, need))
        return DP_ENOMEM;
    int32_t *h = c->h_arrays;
    memcpy(h, b->tokens, nt * sizeof *h);
    memcpy(h + nt, b->pos, nt * sizeof *h);
    memcpy(h + 2 * nt, b->seq, nt * sizeof *h);
    memcpy(h + 3 * nt, b->slot, nt * sizeof *h);
    if (stride == b->max_blocks) {
        memcpy(h + 4 * nt, b->block_tables, nbt * sizeof *h);
    } else {
        for (size_t s = 0; s < ns; s++) {
            int32_t *row = h + 4 * nt + s * (size_t)stride;
            memcpy(row, b->block_tables + s * (size_t)b->max_blocks,
                   (size_t)b->max_blocks * sizeof *h);
            memset(row + b->max_blocks, 0, (size_t)(stride - b->max_blocks) * sizeof *h);
        }
    }
    size_t o = 4 * nt + nbt;
    if (b->n_out)
        memcpy(h + o, b->out_tokens, (size_t)b->n_out * sizeof *h);
    o += (size_t)b->n_out;
    const size_t o_capture = o;
    if (n_capture)
        memcpy(h + o, b->capture_tokens, (size_t)n_capture * sizeof *h);
    o += (size_t)n_capture;
    for (size_t s = 0; s < ns; s++)
        h[o + s] = b->seq_store[s];
    const size_t o_store = o;
    o += ns;
    /* Grouped stores' sealed counts and residual offsets, always present so
     * that the arrays' offsets follow from the shape alone (a recorded step
     * is keyed by it): INT32_MAX and 0 where the batch has none. */
    const size_t o_sealed = o;
    for (size_t s = 0; s < ns; s++) {
        h[o + s] = b->seq_sealed ? b->seq_sealed[s] : INT32_MAX;
        h[o + ns + s] = b->seq_sealed ? b->seq_roff[s] : 0;
    }
    o += 2 * ns;
    const size_t o_w = o;
    if (nwt) {
        memcpy(h + o, b->w_block_tables, ns * (size_t)b->w_max_blocks * sizeof *h);
        memset(h + o + ns * (size_t)b->w_max_blocks, 0, ns * sizeof *h);
        o += nwt;
    }
    /* Query tiles: the keys of a prefill chunk are read once per tile. */
    const size_t o_tiles = o;
    int32_t max_len = 0, max_slots = 0;
    const int32_t n_tiles = cuda_att_tiles(b->seq, b->n_tokens, h + o_tiles, &max_len);
    for (int32_t i = 0; i < b->n_tokens; i++)
        if (b->slot[i] + 1 > max_slots)
            max_slots = b->slot[i] + 1;
    if (decode)
        max_slots = round_pow2(max_slots, CUDA_ATT_KT);
    const size_t used = o_tiles + (size_t)n_tiles + 1;
    cudaError_t e = cudaMemcpyAsync(c->d_arrays, h, used * sizeof *h, cudaMemcpyHostToDevice,
                                    c->stream);
    if (e == cudaSuccess)
        e = cudaEventRecord(c->arrays_copied, c->stream);
    if (e != cudaSuccess) {
        cuda_note_error(c, "batch copy", e);
        return c->failed ? c->failed : DP_EIO;
    }
    c->arrays_pending = true;
    const int32_t *d = c->d_arrays;
    c->bd.tokens = d;
    c->bd.pos = d + nt;
    c->bd.seq = d + 2 * nt;
    c->bd.slot = d + 3 * nt;
    c->bd.block_tables = d + 4 * nt;
    c->bd.out_tokens = d + 4 * nt + nbt;
    c->bd.capture_tokens = d + o_capture;
    c->bd.seq_store = d + o_store;
    c->bd.tile_start = d + o_tiles;
    c->bd.seq_sealed = d + o_sealed;
    c->bd.seq_roff = d + o_sealed + ns;
    c->n_tokens = b->n_tokens;
    c->n_seqs = b->n_seqs;
    c->max_blocks = stride;
    c->step_graphable = decode;
    c->n_out = b->n_out;
    c->n_capture = n_capture;
    c->n_tiles = n_tiles;
    c->max_tile_len = max_len;
    c->max_slots = max_slots;
    c->layer_map = b->layer_map;
    if (nwt) {
        c->bw = c->bd;
        c->bw.slot = c->bd.pos;
        c->bw.block_tables = d + o_w;
        c->bw.seq_store = d + o_w + ns * (size_t)b->w_max_blocks;
        c->w_store = b->w_store;
        c->w_max_blocks = b->w_max_blocks;
        c->w_max_slots = 1;
        for (int32_t i = 0; i < b->n_tokens; i++)
            if (b->pos[i] + 1 > c->w_max_slots)
                c->w_max_slots = b->pos[i] + 1;
    }
    return 0;
}

/* ---- matmul ---------------------------------------------------------------
 * rmsnorm may have left x's fp16 copy in xh already (xh_of). */
int cuda_x_half(cuda_backend *c, const float *x, size_t n)
{
    if (x == c->xh_of && n <= c->xh_of_n)
        return 0;
    cuda_xh_forget(c);
    if (cuda_scratch_grow(c, (void **)&c->xh, &c->xh_cap, n, sizeof(__half)))
        return 1;
    cuda_to_half(c, c->xh, x, (int64_t)n);
    c->xh_of = x;
    c->xh_of_n = n;
    return 0;
}

/*
 * y[m, rows] = x[m, cols] . W^T, all row-major. cuBLAS is column-major, and a
 * row-major [a, b] matrix is the same memory as a column-major [b, a] one
 * (its transpose) with leading dimension b. So:
 *   W (row-major [rows, cols]) is column-major W^T [cols, rows], ld = cols;
 *   x (row-major [m, cols])    is column-major x^T [cols, m],    ld = cols;
 *   y (row-major [m, rows])    is column-major y^T [rows, m],    ld = rows.
 * y^T = W . x^T, i.e. C[rows, m] = op(A) . B with A = W's memory transposed
 * (CUBLAS_OP_T, lda = cols) and B = x's memory as is (CUBLAS_OP_N, ldb = cols):
 * the "TN" GEMM, cuBLAS's preferred layout for tensor cores. The activations
 * are converted to fp16 first; accumulation and output are f32. */
static void cuda_matmul(dp_backend *be, float *y, const float *x, const dp_weight *w, int32_t m)
{
    cuda_backend *c = cuda_of(be);
    if (m <= 0)
        return;
    if (w->type != DP_TYPE_F16 && w->type != DP_TYPE_F32) {
        cuda_wq_matmul(c, y, x, w, m);
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    const int rows = (int)w->rows, cols = (int)w->cols;
    cublasStatus_t s;
    if (w->type == DP_TYPE_F16) {
        if (cuda_x_half(c, x, (size_t)m * (size_t)cols))
            return;
        s = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, m, cols, &one, w->data,
                         CUDA_R_16F, cols, c->xh, CUDA_R_16F, cols, &zero, y, CUDA_R_32F, rows,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    } else {
        /* f32 weights exist only as vectors; kept for completeness. y may
         * be the buffer xh is a copy of. */
        cuda_xh_forget(c);
        s = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, m, cols, &one, w->data,
                         CUDA_R_32F, cols, x, CUDA_R_32F, cols, &zero, y, CUDA_R_32F, rows,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    if (s != CUBLAS_STATUS_SUCCESS)
        cuda_note_blas(c, "matmul", s);
    /* xh_of is x now (or nothing), and y never overlaps x: the GEMM reads x
     * while it writes y. */
}

/* ---- life cycle ------------------------------------------------------------ */

static void cuda_destroy(dp_backend *be)
{
    cuda_backend *c = cuda_of(be);
    cuda_bind(c);
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    cuda_graphs_clear(c);
    if (c->blas)
        cublasDestroy(c->blas);
    cudaFree(c->blas_ws);
    cudaFree(c->xh);
    cudaFree(c->wdq);
    cudaFree(c->part);
    cudaFree(c->kvp_idx);
    cudaFree(c->kvp_scratch);
    cudaFree(c->topk_dev);
    cudaFreeHost(c->topk_host);
    cudaFree(c->d_arrays);
    cudaFreeHost(c->h_arrays);
    cudaFreeHost(c->wstage);
    cudaFreeHost(c->kvp_host);
    if (c->arrays_copied)
        cudaEventDestroy(c->arrays_copied);
    if (c->kvp_copied)
        cudaEventDestroy(c->kvp_copied);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c);
}

/* Filled field by field: C++ has no designated initializers before C++20,
 * and a positional list would silently shift when backend.h gains an op. */
static dp_backend_ops cuda_make_ops(void)
{
    dp_backend_ops o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.destroy = cuda_destroy;
    o.alloc = cuda_alloc;
    o.free = cuda_free;
    o.upload = cuda_upload;
    o.download = cuda_download;
    o.weight_load = cuda_weight_load;
    o.weight_free = cuda_weight_free;
    o.kv_create = cuda_kv_create;
    o.kv_destroy = cuda_kv_destroy;
    o.kv_bytes_per_block = cuda_kv_block_bytes;
    o.kv_layout = cuda_kv_get_layout;
    o.kv_view = cuda_kv_view;
    o.kv_max_stores = CUDA_KV_STORES;
    /* Not measured on a device yet: the decode path's auto stays f16
     * (decode_kv_type = q8_0 asks for the quantized one). */
    o.kv_quant_default = false;
    o.batch_set = cuda_batch_set;
    o.recover = cuda_recover_op;
    o.embed = cuda_embed;
    o.rmsnorm = cuda_rmsnorm;
    o.matmul = cuda_matmul;
    o.rope = cuda_rope;
    o.kv_write = cuda_kv_write;
    o.attention = cuda_attention;
    o.add = cuda_add;
    o.add_bias = cuda_add_bias;
    o.swiglu = cuda_swiglu;
    o.geglu = cuda_geglu;
    o.scale = cuda_scale;
    o.gather_rows = cuda_gather_rows;
    o.capture_rows = cuda_capture_rows;
    o.kv_score_knorm = cuda_kv_score_knorm;
    o.kv_score_attn = cuda_kv_score_attn;
    o.kv_compact = cuda_kv_compact;
    o.kv_block_read = cuda_kv_block_read;
    o.kv_block_write = cuda_kv_block_write;
    o.mem_info = cuda_mem_info;
    o.mem_usage = cuda_mem_usage;
    o.host_alloc = cuda_host_alloc;
    o.host_free = cuda_host_free;
    o.logits_topk = cuda_logits_topk;
    cuda_graph_ops(&o);
    return o;
}

static const dp_backend_ops cuda_ops = cuda_make_ops();

extern "C" int backend_cuda_create(dp_backend **out, int device_index, char *err, size_t errsz)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dp_err(err, errsz, DP_EUNSUPPORTED, "no CUDA device: %s", cudaGetErrorString(e));
    }
    if (n <= 0)
        return dp_err(err, errsz, DP_EUNSUPPORTED, "no CUDA device: none found");
    if (device_index < 0 || device_index >= n)
        return dp_err(err, errsz, DP_EINVAL, "CUDA device %d out of range (%d device%s)",
                      device_index, n, n == 1 ? "" : "s");
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, device_index)) != cudaSuccess)
        return dp_err(err, errsz, DP_EIO, "CUDA device %d: %s", device_index, cudaGetErrorString(e));
    /* The build carries sm_80 and sm_90 code (+ compute_90 PTX). */
    if (prop.major < 8)
        return dp_err(err, errsz, DP_EUNSUPPORTED,
                      "CUDA device %d (%s) has compute capability %d.%d; 8.0 or newer is needed",
                      device_index, prop.name, prop.major, prop.minor);
    if ((e = cudaSetDevice(device_index)) != cudaSuccess)
        return dp_err(err, errsz, DP_EIO, "CUDA device %d: %s", device_index, cudaGetErrorString(e));
    cuda_backend *c = (cuda_backend *)calloc(1, sizeof *c);
    if (!c)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    c->base.ops = &cuda_ops;
    c->base.n_threads = 1;
    c->device = device_index;
    c->max_pitch = prop.memPitch ? prop.memPitch : (size_t)INT_MAX;
    c->sm_count = prop.multiProcessorCount;
    int rc = 0;
    cublasStatus_t bs;
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->arrays_copied, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->kvp_copied, cudaEventDisableTiming)) != cudaSuccess) {
        rc = dp_err(err, errsz, DP_EIO, "CUDA device %d: %s", device_index, cudaGetErrorString(e));
        goto fail;
    }
    if ((bs = cublasCreate(&c->blas)) != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        rc = dp_err(err, errsz, DP_EIO, "cuBLAS: %s", cublasGetStatusString(bs));
        goto fail;
    }
    if ((bs = cublasSetStream(c->blas, c->stream)) != CUBLAS_STATUS_SUCCESS) {
        rc = dp_err(err, errsz, DP_EIO, "cuBLAS: %s", cublasGetStatusString(bs));
        goto fail;
    }
    /* A workspace of our own, so that cuBLAS allocates nothing while a step
     * is being recorded (32 MiB: NVIDIA's recommendation for Hopper). */
    if ((e = cudaMalloc(&c->blas_ws, CUDA_BLAS_WORKSPACE)) != cudaSuccess) {
        c->blas_ws = NULL;
        rc = dp_err(err, errsz, DP_ENOMEM, "CUDA device %d: no memory for the cuBLAS workspace",
                    device_index);
        goto fail;
    }
    if ((bs = cublasSetWorkspace(c->blas, c->blas_ws, CUDA_BLAS_WORKSPACE)) !=
        CUBLAS_STATUS_SUCCESS) {
        rc = dp_err(err, errsz, DP_EIO, "cuBLAS: %s", cublasGetStatusString(bs));
        goto fail;
    }
    c->graph_policy = DP_GRAPHS_ON;
    if ((rc = cuda_attention_setup(c, err, errsz)))
        goto fail;
    dp_log(DP_LOG_INFO, "cuda: device %d: %s (sm_%d%d, %d SMs, %.1f GiB)", device_index, prop.name,
           prop.major, prop.minor, prop.multiProcessorCount,
           (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    *out = &c->base;
    return 0;
fail:
    cuda_destroy(&c->base);
    return rc;
}
