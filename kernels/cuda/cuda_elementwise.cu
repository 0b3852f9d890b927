/* cuda_elementwise.cu: the small ops' kernels: embedding lookup, RMSNorm, RoPE,
 * KV write into paged fp16 blocks, add, SwiGLU, row gathers, fp16 conversion,
 * and the logits' top-k for sampling (cuda_topk.cuh). */
#include <math.h>
#include <string.h>

#include "cuda_internal.h"

#define EW_THREADS 256

/* Grid size for a grid-stride loop over n items: enough blocks to fill the
 * device, no more (the loop covers the rest). */
static unsigned cuda_grid(const cuda_backend *c, int64_t n, int threads)
{
    int64_t want = (n + threads - 1) / threads;
    int64_t cap = (int64_t)c->sm_count * 32;
    if (want > cap)
        want = cap;
    return (unsigned)(want < 1 ? 1 : want);
}

bool cuda_kv_desc_make(dp_kv_store *const *stores, cuda_kv_desc *d)
{
    memset(d, 0, sizeof *d);
    bool any = false;
    for (int i = 0; i < CUDA_KV_STORES; i++) {
        const dp_kv_store *kv = stores[i];
        if (!kv)
            continue;
        d->k[i] = kv->k;
        d->v[i] = kv->v;
        d->n_blocks[i] = kv->l.n_blocks;
        d->block_tokens[i] = kv->l.block_tokens;
        d->type[i] = kv->type;
        d->row_bytes[i] = (int32_t)kv->row_bytes;
        d->blk_bytes[i] = (int64_t)kv->blk_bytes;
        d->base_bt[i] = kv->base_bt;
        d->head_bytes[i] = (int64_t)kv->head_bytes;
        d->n_kv = kv->l.n_kv_heads;
        d->head_dim = kv->l.head_dim;
        any = true;
    }
    return any;
}

bool cuda_layer_at_make(const cuda_backend *c, dp_kv_store *const *stores, int32_t layer,
                        cuda_layer_at *a)
{
    const int32_t m = c->layer_map ? c->layer_map[layer] : layer;
    a->bd = &c->bd;
    a->layer = m;
    a->max_blocks = c->max_blocks;
    a->max_slots = c->max_slots;
    if (m >= 0)
        return cuda_kv_desc_make(stores, &a->kd);
    dp_kv_store *one[DP_KV_MAX_STORES] = {stores[c->w_store]};
    a->bd = &c->bw;
    a->layer = -1 - m;
    a->max_blocks = c->w_max_blocks;
    a->max_slots = c->w_max_slots;
    return cuda_kv_desc_make(one, &a->kd);
}

/* ---- embedding ----------------------------------------------------------- */

__device__ __forceinline__ float cuda_ld(const __half *p, size_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float cuda_ld(const float *p, size_t i) { return p[i]; }

template <typename T>
__global__ void cuda_embed_kernel(const T *table, const int32_t *tokens, float *out, int32_t dim)
{
    const size_t row = (size_t)tokens[blockIdx.x] * (size_t)dim;
    float *o = out + (size_t)blockIdx.x * (size_t)dim;
    for (int32_t d = threadIdx.x; d < dim; d += blockDim.x)
        o[d] = cuda_ld(table, row + (size_t)d);
}

void cuda_embed(dp_backend *be, const dp_weight *table, float *out, int32_t n)
{
    cuda_xh_forget(cuda_of(be)); /* it writes device floats */
    cuda_backend *c = cuda_of(be);
    if (n <= 0)
        return;
    const int32_t dim = (int32_t)table->cols;
    if (cuda_wq_supported(table->type))
        cuda_wq_embed(c, table, out, n);
    else if (table->type == DP_TYPE_F16)
        CUDA_LAUNCH(cuda_embed_kernel, n, EW_THREADS, 0, c->stream, (const __half *)table->data,
                    c->bd.tokens, out, dim);
    else
        CUDA_LAUNCH(cuda_embed_kernel, n, EW_THREADS, 0, c->stream, (const float *)table->data,
                    c->bd.tokens, out, dim);
    cuda_check_launch(c, "embed");
}

/* ---- RMSNorm ---------------------------------------------------------------- */

/* Sum over the block; every thread gets the result. red holds 32 floats. */
__device__ float cuda_block_sum(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    const int n_warps = (blockDim.x + 31) / 32;
    v = lane < n_warps ? red[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* One block per row; f32 accumulation (the CPU uses double, the difference
 * is far below fp16 rounding for any dim a model has). oh, when set, gets
 * the output's fp16 copy for the matmuls that follow (the same values
 * cuda_to_half would make from out). */
template <typename T>
__global__ void cuda_rmsnorm_kernel(float *out, __half *oh, const float *x, const T *w,
                                    int32_t dim, float eps)
{
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * (size_t)dim;
    float *o = out + (size_t)blockIdx.x * (size_t)dim;
    float ss = 0.0f;
    for (int32_t d = threadIdx.x; d < dim; d += blockDim.x)
        ss += xr[d] * xr[d];
    ss = cuda_block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)dim + eps);
    __half *ohr = oh ? oh + (size_t)blockIdx.x * (size_t)dim : NULL;
    for (int32_t d = threadIdx.x; d < dim; d += blockDim.x) {
        const float v = xr[d] * inv * cuda_ld(w, (size_t)d);
        o[d] = v;
        if (ohr)
            ohr[d] = cuda_sat_half(v); /* no inf reaches the GEMM */
    }
}

void cuda_rmsnorm(dp_backend *be, float *out, const float *x, const dp_weight *w, int32_t n,
                  int32_t dim, float eps)
{
    cuda_backend *c = cuda_of(be);
    cuda_xh_forget(c);
    if (n <= 0)
        return;
    /* The fused fp16 copy (see cuda_backend.xh_of); without room for it
     * (a failed grow), rmsnorm alone, and the matmuls convert as before. */
    const size_t ne = (size_t)n * (size_t)dim;
    __half *oh = cuda_scratch_grow(c, (void **)&c->xh, &c->xh_cap, ne, sizeof(__half)) ? NULL : c->xh;
    if (w->type == DP_TYPE_F16)
        CUDA_LAUNCH(cuda_rmsnorm_kernel, n, EW_THREADS, 0, c->stream, out, oh, x,
                    (const __half *)w->data, dim, eps);
    else
        CUDA_LAUNCH(cuda_rmsnorm_kernel, n, EW_THREADS, 0, c->stream, out, oh, x,
                    (const float *)w->data, dim, eps);
    cuda_check_launch(c, "rmsnorm");
    if (oh) {
        c->xh_of = out;
        c->xh_of_n = ne;
    }
}

/* ---- RoPE --------------------------------------------------------------------
 * One thread per (token, rotated pair), looping over every head: the angle is
 * computed once and shared. The angle is computed in double like the CPU
 * reference: theta = pos * base^(-2i/n_rot) reaches 1e5 rad at long
 * positions, where a float angle (and a float sincos's range reduction) is
 * off by far more than fp16 rounding. It costs one pow and one sincos per
 * (token, pair), nothing next to the matmuls. */
__global__ void cuda_rope_kernel(float *q, float *k, const int32_t *pos, int32_t n,
                                 int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                 int32_t n_rot, float freq_base, float freq_scale, bool neox,
                                 const float *freq_factors, float mscale, float ext_factor,
                                 float corr_lo, float corr_hi)
{
    const int32_t half = n_rot / 2;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n * half)
        return;
    const int32_t i = (int32_t)(idx / half), d = (int32_t)(idx % half);
    const double p = (double)pos[i] * (double)freq_scale;
    double th = p * pow((double)freq_base, -2.0 * d / n_rot);
    if (freq_factors)
        th /= (double)freq_factors[d];
    if (ext_factor != 0.0f) { /* YaRN: mix with the unscaled angle (backend.h) */
        const double y = ((double)d - corr_lo) / fmax(0.001, (double)corr_hi - corr_lo);
        const double mix = (1.0 - fmin(1.0, fmax(0.0, y))) * ext_factor;
        th = th * (1.0 - mix) + th / freq_scale * mix;
    }
    double sd, cd;
    sincos(th, &sd, &cd);
    const float cs = (float)(cd * (double)mscale), sn = (float)(sd * (double)mscale);
    const int32_t a = neox ? d : 2 * d, b = neox ? d + half : 2 * d + 1;
    float *qr = q + (size_t)i * (size_t)n_heads * (size_t)head_dim;
    for (int32_t h = 0; h < n_heads; h++) {
        float *x = qr + (size_t)h * head_dim;
        const float x0 = x[a], x1 = x[b];
        x[a] = x0 * cs - x1 * sn;
        x[b] = x0 * sn + x1 * cs;
    }
    float *kr = k + (size_t)i * (size_t)n_kv_heads * (size_t)head_dim;
    for (int32_t h = 0; h < n_kv_heads; h++) {
        float *x = kr + (size_t)h * head_dim;
        const float x0 = x[a], x1 = x[b];
        x[a] = x0 * cs - x1 * sn;
        x[b] = x0 * sn + x1 * cs;
    }
}

void cuda_rope(dp_backend *be, float *q, float *k, int32_t n, int32_t n_heads,
               int32_t n_kv_heads, int32_t head_dim, const dp_rope_params *rp)
{
    cuda_xh_forget(cuda_of(be)); /* it writes device floats */
    cuda_backend *c = cuda_of(be);
    const int32_t half = rp->n_rot / 2;
    if (n <= 0 || half <= 0)
        return;
    const int64_t total = (int64_t)n * half;
    const unsigned blocks = (unsigned)((total + EW_THREADS - 1) / EW_THREADS);
    CUDA_LAUNCH(cuda_rope_kernel, blocks, EW_THREADS, 0, c->stream, q, k, c->bd.pos, n, n_heads,
                n_kv_heads, head_dim, rp->n_rot, rp->freq_base, rp->freq_scale, rp->neox,
                rp->freq_factors, rp->mscale, rp->ext_factor, rp->corr_lo, rp->corr_hi);
    cuda_check_launch(c, "rope");
}

/* ---- KV write ------------------------------------------------------------------
 * One thread per (token, kv head, 8 dims): converts 8 floats of K and of V to
 * fp16 and stores each as one 16-byte vector into the token's slot. In a
 * quantized store the first quarter of those threads each quantize a group
 * of 32 dims (the CPU's rounding, so both backends write the same bytes). */
__global__ void cuda_kv_write_kernel(cuda_kv_desc kd, int32_t layer, cuda_batch_dev bd,
                                     int32_t max_blocks, int32_t n_tokens, const float *k,
                                     const float *v)
{
    const int32_t hd = kd.head_dim, n_kv = kd.n_kv;
    const int32_t vecs = hd / CUDA_KV_VEC;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n_tokens * n_kv * vecs)
        return;
    const int32_t vi = (int32_t)(idx % vecs);
    const int32_t h = (int32_t)((idx / vecs) % n_kv);
    const int32_t i = (int32_t)(idx / ((int64_t)vecs * n_kv));
    const int32_t slot = bd.slot[i];
    if (slot < 0)
        return; /* a padding token (backend.h step_pad) has no slot */
    const int32_t s = bd.seq[i];
    const int32_t st = bd.seq_store[s];
    const int32_t bt = cuda_pick(kd.block_tokens, st);
    int32_t type = cuda_pick(kd.type, st);
    if (cuda_kv_quant(type) && vi >= hd / CUDA_QK)
        return;
    const int32_t *table = bd.block_tables + (size_t)s * (size_t)max_blocks;
    int32_t block, rbt, tok;
    if (type == DP_KV_KIVI4) {
        /* A grouped store's new token joins its residual, an f16 row of the
         * base; a slot below the sealed groups is never written (its group
         * is kv_compact's). */
        const int32_t sealed = bd.seq_sealed[s];
        if (slot < sealed)
            return;
        rbt = cuda_pick(kd.base_bt, st);
        const cuda_kivi_at a = cuda_kivi_locate(table, rbt, bt, sealed, bd.seq_roff[s], slot);
        block = a.block;
        tok = a.tok;
        type = DP_KV_F16;
    } else {
        rbt = bt;
        block = table[slot / bt];
        tok = slot % bt;
    }
    const size_t row = cuda_kv_off(layer, cuda_pick(kd.n_blocks, st), block,
                                   cuda_pick(kd.blk_bytes, st), h, rbt, tok,
                                   (size_t)cuda_pick(kd.row_bytes, st));
    uint8_t *kr = cuda_pick(kd.k, st) + row, *vr = cuda_pick(kd.v, st) + row;
    if (cuda_kv_quant(type)) {
        const size_t src = ((size_t)i * n_kv + h) * (size_t)hd + (size_t)vi * CUDA_QK;
        cuda_kv_group_put(kr, type, vi, k + src);
        cuda_kv_group_put(vr, type, vi, v + src);
        return;
    }
    const size_t src = ((size_t)i * n_kv + h) * (size_t)hd + (size_t)vi * CUDA_KV_VEC;
    __align__(16) __half2 hk[CUDA_KV_VEC / 2], hv[CUDA_KV_VEC / 2];
#pragma unroll
    for (int j = 0; j < CUDA_KV_VEC / 2; j++) {
        hk[j] = __halves2half2(cuda_sat_half(k[src + 2 * j]), cuda_sat_half(k[src + 2 * j + 1]));
        hv[j] = __halves2half2(cuda_sat_half(v[src + 2 * j]), cuda_sat_half(v[src + 2 * j + 1]));
    }
    const size_t o = (size_t)vi * CUDA_KV_VEC * sizeof(__half);
    CUDA_CHECK_ALIGN(kr + o, 16);
    *(uint4 *)(kr + o) = *(const uint4 *)hk;
    *(uint4 *)(vr + o) = *(const uint4 *)hv;
}

void cuda_kv_write(dp_backend *be, dp_kv_store *const *stores, int32_t layer, const float *k,
                   const float *v)
{
    cuda_backend *c = cuda_of(be);
    cuda_layer_at a;
    if (!cuda_layer_at_make(c, stores, layer, &a) || c->n_tokens <= 0)
        return;
    const int64_t total = (int64_t)c->n_tokens * a.kd.n_kv * (a.kd.head_dim / CUDA_KV_VEC);
    const unsigned blocks = (unsigned)((total + EW_THREADS - 1) / EW_THREADS);
    CUDA_LAUNCH(cuda_kv_write_kernel, blocks, EW_THREADS, 0, c->stream, a.kd, a.layer, *a.bd,
                a.max_blocks, c->n_tokens, k, v);
    cuda_check_launch(c, "kv_write");
}

/* ---- add, SwiGLU, gather, fp16 conversion --------------------------------------- */

__global__ void cuda_add_kernel(float *x, const float *y, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

void cuda_add(dp_backend *be, float *x, const float *y, int64_t n)
{
    cuda_xh_forget(cuda_of(be)); /* it writes device floats */
    cuda_backend *c = cuda_of(be);
    if (n <= 0)
        return;
    CUDA_LAUNCH(cuda_add_kernel, cuda_grid(c, n, EW_THREADS), EW_THREADS, 0, c->stream, x, y, n);
    cuda_check_launch(c, "add");
}

/* y[n, cols] += b, one thread per element (grid-stride). */
template <typename T>
__global__ void cuda_add_bias_kernel(float *y, const T *b, int32_t cols, int64_t total)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += cuda_ld(b, (size_t)(i % cols));
}

void cuda_add_bias(dp_backend *be, float *y, const dp_weight *b, int32_t n, int32_t cols)
{
    cuda_xh_forget(cuda_of(be)); /* it writes device floats */
    cuda_backend *c = cuda_of(be);
    const int64_t total = (int64_t)n * cols;
    if (total <= 0)
        return;
    if (b->type == DP_TYPE_F16)
        CUDA_LAUNCH(cuda_add_bias_kernel, cuda_grid(c, total, EW_THREADS), EW_THREADS, 0, c->stream,
                    y, (const __half *)b->data, cols, total);
    else
        CUDA_LAUNCH(cuda_add_bias_kernel, cuda_grid(c, total, EW_THREADS), EW_THREADS, 0, c->stream,
                    y, (const float *)b->data, cols, total);
    cuda_check_launch(c, "add_bias");
}

/* The gated FFN's activation times up: SiLU (SwiGLU) or GELU's tanh form
 * (Gemma's GeGLU). out may alias gate (the forward pass writes it in
 * place). expf and tanhf, not their fast forms: the build does not use
 * fast math, so this matches the CPU's. */
__global__ void cuda_gated_kernel(float *out, const float *gate, const float *up, int64_t n,
                                  bool gelu)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        const float a = gelu ? 0.5f * g *
                                   (1.0f + tanhf(0.79788456080286535588f *
                                                 (g + 0.044715f * g * g * g)))
                             : g / (1.0f + expf(-g));
        out[i] = a * up[i];
    }
}

static void gated(dp_backend *be, float *out, const float *gate, const float *up, int64_t n,
                  bool gelu)
{
    cuda_xh_forget(cuda_of(be)); /* it writes device floats */
    cuda_backend *c = cuda_of(be);
    if (n <= 0)
        return;
    CUDA_LAUNCH(cuda_gated_kernel, cuda_grid(c, n, EW_THREADS), EW_THREADS, 0, c->stream, out,
                gate, up, n, gelu);
    cuda_check_launch(c, gelu ? "geglu" : "swiglu");
}

void cuda_swiglu(dp_backend *be, float *out, const float *gate, const float *up, int64_t n)
{
    gated(be, out, gate, up, n, false);
}

void cuda_geglu(dp_backend *be, float *out, const float *gate, const float *up, int64_t n)
{
    gated(be, out, gate, up, n, true);
}

__global__ void cuda_scale_kernel(float *x, float s, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

void cuda_scale(dp_backend *be, float *x, float s, int64_t n)
{
    cuda_xh_forget(cuda_of(be)); /* it writes device floats */
    cuda_backend *c = cuda_of(be);
    if (n <= 0)
        return;
    CUDA_LAUNCH(cuda_scale_kernel, cuda_grid(c, n, EW_THREADS), EW_THREADS, 0, c->stream, x, s, n);
    cuda_check_launch(c, "scale");
}

__global__ void cuda_gather_kernel(float *out, const float *x, const int32_t *rows, int32_t dim)
{
    const float *src = x + (size_t)rows[blockIdx.x] * (size_t)dim;
    float *dst = out + (size_t)blockIdx.x * (size_t)dim;
    for (int32_t d = threadIdx.x; d < dim; d += blockDim.x)
        dst[d] = src[d];
}

void cuda_gather_rows(dp_backend *be, float *out, const float *x, int32_t dim)
{
    cuda_xh_forget(cuda_of(be)); /* it writes device floats */
    cuda_backend *c = cuda_of(be);
    if (c->n_out <= 0)
        return;
    CUDA_LAUNCH(cuda_gather_kernel, c->n_out, EW_THREADS, 0, c->stream, out, x, c->bd.out_tokens,
                dim);
    cuda_check_launch(c, "gather_rows");
}

/* Queries kept for importance scoring (see kv_score_attn). */
void cuda_capture_rows(dp_backend *be, float *out, const float *x, int32_t dim)
{
    cuda_xh_forget(cuda_of(be)); /* it writes device floats */
    cuda_backend *c = cuda_of(be);
    if (c->n_capture <= 0)
        return;
    CUDA_LAUNCH(cuda_gather_kernel, c->n_capture, EW_THREADS, 0, c->stream, out, x,
                c->bd.capture_tokens, dim);
    cuda_check_launch(c, "capture_rows");
}

__global__ void cuda_to_half_kernel(__half *dst, const float *src, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        dst[i] = cuda_sat_half(src[i]);
    }
}

void cuda_to_half(cuda_backend *c, __half *dst, const float *src, int64_t n)
{
    if (n <= 0)
        return;
    CUDA_LAUNCH(cuda_to_half_kernel, cuda_grid(c, n, EW_THREADS), EW_THREADS, 0, c->stream, dst,
                src, n);
    cuda_check_launch(c, "fp16 conversion");
}

/* ---- logits top-k (cuda_topk.cuh) ------------------------------------------------
 * One launch and one copy each way: the rows' inverse temperatures and mask
 * flags (and the mask ids) are staged in the pinned buffer and copied up
 * ahead of the kernel on the stream (no wait: the buffer is not written again
 * before this call's synchronization); the results of every row come back
 * packed in one buffer and are spread into the caller's arrays. This is the
 * step's synchronization, in place of the download of n * vocab logits. */
#include "cuda_topk.cuh"

int cuda_logits_topk(dp_backend *be, float *logits, int32_t n, int32_t vocab, int32_t k,
                     const float *temperature, const int32_t *mask_ids, int32_t n_mask,
                     const uint8_t *mask_rows, int32_t *ids, float *vals, float *row_max,
                     float *row_sum)
{
    cuda_backend *c = cuda_of(be);
    cuda_bind(c);
    if (n < 1 || k < 1 || k > DP_TOPK_MAX || k > vocab || n_mask < 0 || (n_mask > 0 && !mask_ids))
        return DP_EINVAL;
    bool masked = false;
    for (int32_t r = 0; mask_rows && n_mask > 0 && r < n; r++)
        masked |= mask_rows[r] != 0;
    const size_t in_words = 2 * (size_t)n + (masked ? (size_t)n_mask : 0);
    const size_t out_words = (size_t)n * (2 * (size_t)k + 2);
    const size_t words = in_words + out_words;
    if (cuda_scratch_grow(c, (void **)&c->topk_dev, &c->topk_dev_cap, words, sizeof(uint32_t)))
        return c->failed ? c->failed : DP_ENOMEM;
    if (words > c->topk_host_cap) {
        cudaStreamSynchronize(c->stream);
        cudaFreeHost(c->topk_host);
        c->topk_host = NULL;
        c->topk_host_cap = 0;
        if (cudaMallocHost((void **)&c->topk_host, words * sizeof(uint32_t)) != cudaSuccess) {
            cudaGetLastError();
            c->topk_host = NULL;
            return DP_ENOMEM;
        }
        c->topk_host_cap = words;
    }
    uint32_t *in = c->topk_host;
    for (int32_t r = 0; r < n; r++) {
        /* 1/T computed here exactly as the sampler computes it. */
        const float inv_t = temperature[r] > 0.0f ? 1.0f / temperature[r] : 1.0f;
        memcpy(&in[r], &inv_t, sizeof inv_t);
        in[n + r] = masked && mask_rows[r] ? 1u : 0u;
    }
    if (masked) {
        memcpy(in + 2 * n, mask_ids, (size_t)n_mask * sizeof *mask_ids);
        cuda_xh_forget(c); /* it writes device floats */
    }
    cudaError_t e = cudaMemcpyAsync(c->topk_dev, in, in_words * sizeof(uint32_t),
                                    cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess) {
        cuda_note_error(c, "logits_topk", e);
        return c->failed;
    }
    CUDA_LAUNCH(cuda_topk_kernel, n, TOPK_THREADS, 0, c->stream, logits, n, vocab, k,
                masked ? n_mask : 0, (const uint32_t *)c->topk_dev, c->topk_dev + in_words);
    cuda_check_launch(c, "logits_topk");
    e = cudaMemcpyAsync(c->topk_host + in_words, c->topk_dev + in_words,
                        out_words * sizeof(uint32_t), cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess)
        cuda_note_error(c, "logits_topk", e);
    if (c->failed)
        return c->failed;
    const uint32_t *out = c->topk_host + in_words;
    const size_t nk = (size_t)n * (size_t)k;
    memcpy(ids, out, nk * sizeof *ids);
    memcpy(vals, out + nk, nk * sizeof *vals);
    memcpy(row_max, out + 2 * nk, (size_t)n * sizeof *row_max);
    memcpy(row_sum, out + 2 * nk + n, (size_t)n * sizeof *row_sum);
    return 0;
}
