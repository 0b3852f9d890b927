/* cuda_kvpath.cu: the dual-path KV operations on the device: importance
 * scores (key norms, attention mass of captured queries), kv_compact, and the
 * host tier's block copies. */
#include <math.h>
#include <string.h>

#include "cuda_internal.h"

#define KVP_THREADS 256

/* The ops take host tables and index lists. They are packed into a pinned
 * staging buffer and moved in one async copy into kvp_idx: an async copy from
 * pageable memory would synchronize the stream first, and these ops run while
 * other sequences' steps are queued. */

/* A staging area for n int32s, once the previous copy out of it is done. */
static int32_t *cuda_kvp_stage(cuda_backend *c, size_t n)
{
    if (c->kvp_pending) {
        cudaEventSynchronize(c->kvp_copied);
        c->kvp_pending = false;
    }
    if (n > c->kvp_host_cap) {
        size_t cap = n + n / 2 + 1024;
        cudaFreeHost(c->kvp_host);
        c->kvp_host = NULL;
        c->kvp_host_cap = 0;
        if (cudaMallocHost((void **)&c->kvp_host, cap * sizeof(int32_t)) != cudaSuccess) {
            cudaGetLastError();
            c->kvp_host = NULL;
            return NULL;
        }
        c->kvp_host_cap = cap;
    }
    return c->kvp_host;
}

/* Copies the first n staged int32s to the device; NULL on failure. */
static int32_t *cuda_kvp_commit(cuda_backend *c, size_t n)
{
    if (cuda_scratch_grow(c, (void **)&c->kvp_idx, &c->kvp_idx_cap, n ? n : 1, sizeof(int32_t)))
        return NULL;
    if (n) {
        cudaError_t e = cudaMemcpyAsync(c->kvp_idx, c->kvp_host, n * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, c->stream);
        if (e == cudaSuccess)
            e = cudaEventRecord(c->kvp_copied, c->stream);
        if (e != cudaSuccess) {
            cuda_note_error(c, "kv path index copy", e);
            return NULL;
        }
        c->kvp_pending = true;
    }
    return c->kvp_idx;
}

/* Byte offset of the row of (layer, block, head, token) in a store. */
__device__ __forceinline__ size_t kvp_row(const dp_kv_store &s, int32_t layer, int32_t block,
                                          int32_t head, int32_t tok)
{
    return cuda_kv_off(layer, s.l.n_blocks, block, (int64_t)s.blk_bytes, head, s.l.block_tokens,
                       tok, s.row_bytes);
}

/* q . row for a key row of any type (q: hd floats). */
__device__ __forceinline__ float kvp_dot(const uint8_t *row, int32_t type, const float *q, int32_t hd)
{
    float d = 0.0f;
    if (!cuda_kv_quant(type)) {
        const __half2 *r = (const __half2 *)row;
        CUDA_CHECK_ALIGN(r, 4);
        for (int32_t e = 0; e < hd / 2; e++) {
            const float2 f = __half22float2(r[e]);
            d = fmaf(q[2 * e], f.x, fmaf(q[2 * e + 1], f.y, d));
        }
        return d;
    }
    float x[CUDA_QK];
    for (int32_t g = 0; g < hd / CUDA_QK; g++) {
        cuda_kv_group_get(row, type, g, x);
        for (int32_t e = 0; e < CUDA_QK; e++)
            d = fmaf(q[g * CUDA_QK + e], x[e], d);
    }
    return d;
}

/* ---- key norms ------------------------------------------------------------------- */

__global__ void cuda_knorm_kernel(dp_kv_store st, const int32_t *table, int32_t n_slots, float *out)
{
    const dp_kv_layout l = st.l;
    const int64_t total = (int64_t)l.n_layers * l.n_kv_heads * n_slots;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int32_t s = (int32_t)(idx % n_slots);
        const int32_t h = (int32_t)((idx / n_slots) % l.n_kv_heads);
        const int32_t layer = (int32_t)(idx / ((int64_t)n_slots * l.n_kv_heads));
        const uint8_t *row = st.k + kvp_row(st, layer, table[s / l.block_tokens], h,
                                            s % l.block_tokens);
        float ss = 0.0f;
        if (!cuda_kv_quant(st.type)) {
            const __half2 *r = (const __half2 *)row;
            CUDA_CHECK_ALIGN(r, 4);
            for (int32_t d = 0; d < l.head_dim / 2; d++) {
                const float2 f = __half22float2(r[d]);
                ss = fmaf(f.x, f.x, fmaf(f.y, f.y, ss));
            }
        } else {
            float x[CUDA_QK];
            for (int32_t g = 0; g < l.head_dim / CUDA_QK; g++) {
                cuda_kv_group_get(row, st.type, g, x);
                for (int32_t e = 0; e < CUDA_QK; e++)
                    ss = fmaf(x[e], x[e], ss);
            }
        }
        out[idx] = sqrtf(ss); /* idx is [layer][kv_head][slot] already */
    }
}

void cuda_kv_score_knorm(dp_backend *be, const dp_kv_store *kv, const int32_t *table,
                         int32_t n_slots, float *out)
{
    cuda_xh_forget(cuda_of(be)); /* it writes device floats */
    cuda_backend *c = cuda_of(be);
    cuda_bind(c);
    const dp_kv_layout *l = &kv->l;
    if (n_slots <= 0)
        return;
    if (kv->head_bytes) { /* grouped stores are not scored (as the CPU): no information */
        cudaError_t e = cudaMemsetAsync(out, 0, (size_t)l->n_layers * (size_t)l->n_kv_heads *
                                                    (size_t)n_slots * sizeof(float), c->stream);
        if (e != cudaSuccess)
            cuda_note_error(c, "kv_score_knorm", e);
        return;
    }
    const size_t n_tab = (size_t)((n_slots + l->block_tokens - 1) / l->block_tokens);
    int32_t *h = cuda_kvp_stage(c, n_tab);
    if (!h) {
        cuda_note_error(c, "kv_score_knorm: out of pinned memory", cudaErrorMemoryAllocation);
        return;
    }
    memcpy(h, table, n_tab * sizeof *h);
    const int32_t *dt = cuda_kvp_commit(c, n_tab);
    if (!dt)
        return;
    const int64_t total = (int64_t)l->n_layers * l->n_kv_heads * n_slots;
    int64_t blocks = (total + KVP_THREADS - 1) / KVP_THREADS;
    if (blocks > (int64_t)c->sm_count * 32)
        blocks = (int64_t)c->sm_count * 32;
    CUDA_LAUNCH(cuda_knorm_kernel, (unsigned)blocks, KVP_THREADS, 0, c->stream, *kv, dt,
                n_slots, out);
    cuda_check_launch(c, "kv_score_knorm");
}

/* ---- attention mass of captured queries -------------------------------------------
 * One block per (layer, KV head), like the CPU's task: for every captured
 * query and every query head of the group, a causal softmax row over the
 * slots (scores staged in a scratch row), added into the head's output row.
 * Each slot belongs to one thread throughout, so the sums need no atomics
 * and come out in the same order every run. */

/* Max or sum over the block; every thread gets the result. The trailing
 * barrier lets the caller reuse red[] right away. */
__device__ float kvp_block_reduce(float v, float *red, bool is_max)
{
    for (int o = 16; o > 0; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    const int n_warps = (blockDim.x + 31) / 32;
    v = lane < n_warps ? red[lane] : (is_max ? -INFINITY : 0.0f);
    for (int o = 16; o > 0; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    __syncthreads();
    return v;
}

__global__ void __launch_bounds__(KVP_THREADS)
    cuda_sattn_kernel(dp_kv_store st, const int32_t *table, int32_t n_slots,
                      const float *q, int64_t q_layer_stride, const int32_t *q_slot, int32_t n_q,
                      int32_t n_heads, float scale, float *scratch, float *out)
{
    const dp_kv_layout l = st.l;
    __shared__ float qs[CUDA_MAX_HEAD_DIM];
    __shared__ float red[32];
    const int32_t layer = blockIdx.x / l.n_kv_heads, kvh = blockIdx.x % l.n_kv_heads;
    const int32_t group = n_heads / l.n_kv_heads, hd = l.head_dim, bt = l.block_tokens;
    float *o = out + (size_t)blockIdx.x * (size_t)n_slots;
    float *sc = scratch + (size_t)blockIdx.x * (size_t)n_slots;
    for (int32_t s = threadIdx.x; s < n_slots; s += blockDim.x)
        o[s] = 0.0f;
    for (int32_t i = 0; i < n_q; i++) {
        const int32_t n = q_slot[i] + 1 < n_slots ? q_slot[i] + 1 : n_slots;
        for (int32_t g = 0; g < group; g++) {
            const float *qh = q + (size_t)layer * (size_t)q_layer_stride +
                              ((size_t)i * (size_t)n_heads + (size_t)(kvh * group + g)) * (size_t)hd;
            for (int32_t d = threadIdx.x; d < hd; d += blockDim.x)
                qs[d] = qh[d];
            __syncthreads();
            float mx = -INFINITY;
            for (int32_t s = threadIdx.x; s < n; s += blockDim.x) {
                float d = kvp_dot(st.k + kvp_row(st, layer, table[s / bt], kvh, s % bt), st.type,
                                  qs, hd);
                d *= scale;
                sc[s] = d;
                mx = fmaxf(mx, d);
            }
            mx = kvp_block_reduce(mx, red, true);
            float sum = 0.0f;
            for (int32_t s = threadIdx.x; s < n; s += blockDim.x) {
                const float e = expf(sc[s] - mx);
                sc[s] = e;
                sum += e;
            }
            sum = kvp_block_reduce(sum, red, false);
            const float inv = 1.0f / sum;
            for (int32_t s = threadIdx.x; s < n; s += blockDim.x)
                o[s] += sc[s] * inv;
            /* qs is rewritten next: kvp_block_reduce's trailing barrier has
             * already ordered every read of it before this point. */
        }
    }
}

void cuda_kv_score_attn(dp_backend *be, const dp_kv_store *kv, const int32_t *table,
                        int32_t n_slots, const float *q, int64_t q_layer_stride,
                        const int32_t *q_slot, int32_t n_q, int32_t n_heads, float scale, float *out)
{
    cuda_xh_forget(cuda_of(be)); /* it writes device floats */
    cuda_backend *c = cuda_of(be);
    cuda_bind(c);
    const dp_kv_layout *l = &kv->l;
    if (n_slots <= 0)
        return;
    const size_t rows = (size_t)l->n_layers * (size_t)l->n_kv_heads;
    if (n_q <= 0 || n_heads < l->n_kv_heads || n_heads % l->n_kv_heads || kv->head_bytes) {
        /* No queries (or a grouped store, never scored): no information
         * (zeros), like the CPU. */
        cudaError_t e = cudaMemsetAsync(out, 0, rows * (size_t)n_slots * sizeof(float), c->stream);
        if (e != cudaSuccess)
            cuda_note_error(c, "kv_score_attn", e);
        return;
    }
    const size_t n_tab = (size_t)((n_slots + l->block_tokens - 1) / l->block_tokens);
    int32_t *h = cuda_kvp_stage(c, n_tab + (size_t)n_q);
    if (!h) {
        cuda_note_error(c, "kv_score_attn: out of pinned memory", cudaErrorMemoryAllocation);
        return;
    }
    memcpy(h, table, n_tab * sizeof *h);
    memcpy(h + n_tab, q_slot, (size_t)n_q * sizeof *h);
    const int32_t *d = cuda_kvp_commit(c, n_tab + (size_t)n_q);
    if (!d || cuda_scratch_grow(c, (void **)&c->kvp_scratch, &c->kvp_scratch_cap,
                                rows * (size_t)n_slots, sizeof(float)))
        return;
    CUDA_LAUNCH(cuda_sattn_kernel, (unsigned)rows, KVP_THREADS, 0, c->stream, *kv, d,
                n_slots, q, q_layer_stride, d + n_tab, n_q, n_heads, scale, c->kvp_scratch, out);
    cuda_check_launch(c, "kv_score_attn");
}

/* ---- compaction ----------------------------------------------------------------------
 * One thread per (sequence, layer, head, kept slot, piece): copies that
 * piece of the K row and the V row. A piece is a 16-byte vector (8 dims)
 * between f16 stores, else a group of 32 dims: bytes as they are between
 * stores of one quantized type, else through f32 (d * q rounded once to
 * f16 on the way out of q8_0 / q4_0, the CPU's quantization on the way in,
 * so the two backends write the same bytes). Work is flattened over sequences
 * with a prefix sum of their row counts (rows = n_layers * n_kv * n_keep,
 * ordered like keep[]), found by binary search: the sequences of one call
 * are few, and the copy is bound by memory, not by the search. */

typedef struct cuda_compact_seq_dev {
    int32_t src_off, dst_off, keep_off, n_keep;
} cuda_compact_seq_dev;

/* A group's bytes in a quantized row. */
__device__ __forceinline__ int32_t kvp_group_bytes(int32_t type)
{
    return type == DP_KV_Q8_0 ? 34 : 18;
}

/* One piece (vi) of a row from s to d. */
__device__ __forceinline__ void kvp_copy_piece(const uint8_t *s, int32_t st, uint8_t *d, int32_t dt,
                                               int32_t vi)
{
    if (!cuda_kv_quant(st) && !cuda_kv_quant(dt)) {
        const size_t o = (size_t)vi * CUDA_KV_VEC * sizeof(__half);
        CUDA_CHECK_ALIGN(s + o, 16);
        CUDA_CHECK_ALIGN(d + o, 16);
        *(uint4 *)(d + o) = *(const uint4 *)(s + o);
    } else if (st == dt) { /* the group's bytes, as halves (groups are 2-byte aligned) */
        const int32_t gb = kvp_group_bytes(st);
        const uint16_t *a = (const uint16_t *)(s + (size_t)vi * gb);
        uint16_t *b = (uint16_t *)(d + (size_t)vi * gb);
        CUDA_CHECK_ALIGN(a, 2);
        CUDA_CHECK_ALIGN(b, 2);
        for (int32_t i = 0; i < gb / 2; i++)
            b[i] = a[i];
    } else {
        float x[CUDA_QK];
        cuda_kv_group_get(s, st, vi, x);
        cuda_kv_group_put(d, dt, vi, x);
    }
}

/* The last sequence whose first unit (row or group) is at or before unit u
 * (start[]: each sequence's first unit, in order). */
__device__ __forceinline__ int32_t kvp_seq_of(const int64_t *start, int32_t n_seqs, int64_t u)
{
    int32_t lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        const int32_t mid = (lo + hi + 1) / 2;
        if (start[mid] <= u)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

__global__ void cuda_compact_kernel(dp_kv_store src, dp_kv_store dst, const int64_t *row_start,
                                    const cuda_compact_seq_dev *sq, const int32_t *idx,
                                    int32_t n_seqs, int64_t total_rows, int32_t pieces)
{
    const dp_kv_layout ls = src.l, ld = dst.l;
    const int64_t total = total_rows * pieces;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = t / pieces;
        const int32_t vi = (int32_t)(t % pieces);
        const int32_t lo = kvp_seq_of(row_start, n_seqs, row);
        const cuda_compact_seq_dev q = sq[lo];
        const int64_t r = row - row_start[lo];
        const int32_t s = (int32_t)(r % q.n_keep);
        const int32_t h = (int32_t)((r / q.n_keep) % ls.n_kv_heads);
        const int32_t layer = (int32_t)(r / ((int64_t)q.n_keep * ls.n_kv_heads));
        const int32_t from = idx[q.keep_off + r];
        const int32_t sb = idx[q.src_off + from / ls.block_tokens];
        const int32_t db = idx[q.dst_off + s / ld.block_tokens];
        const size_t so = kvp_row(src, layer, sb, h, from % ls.block_tokens);
        const size_t doff = kvp_row(dst, layer, db, h, s % ld.block_tokens);
        kvp_copy_piece(src.k + so, src.type, dst.k + doff, dst.type, vi);
        kvp_copy_piece(src.v + so, src.type, dst.v + doff, dst.type, vi);
    }
}

/* Into a kivi4 store: one thread per (sequence, layer, head, group, item),
 * an item being one K channel over the group's tokens (its f16 scale and
 * minimum, then its codes) or one V row's 64 channels. Values come from the
 * source rows of any per-token type as f32 and are quantized with the CPU's
 * rounding (kernels/quant.c kivi_quant_k / kivi_quant_vrow), so the two
 * backends write the same bytes. Units are groups here (row_start counts
 * them); items = head_dim + g * head_dim / 64. */
__global__ void cuda_compact_kivi_kernel(dp_kv_store src, dp_kv_store dst, const int64_t *grp_start,
                                         const cuda_compact_seq_dev *sq, const int32_t *idx,
                                         int32_t n_seqs, int64_t total_groups, int32_t items)
{
    const dp_kv_layout ls = src.l;
    const int32_t g = dst.l.block_tokens, hd = ls.head_dim, sbt = ls.block_tokens;
    const int32_t nvg = hd / KIVI_VGROUP;
    const int64_t total = total_groups * items;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t gidx = t / items;
        const int32_t it = (int32_t)(t % items);
        const int32_t lo = kvp_seq_of(grp_start, n_seqs, gidx);
        const cuda_compact_seq_dev q = sq[lo];
        const int32_t ng = q.n_keep / g;
        const int64_t r = gidx - grp_start[lo];
        const int32_t gi = (int32_t)(r % ng);
        const int32_t h = (int32_t)((r / ng) % ls.n_kv_heads);
        const int32_t layer = (int32_t)(r / ((int64_t)ng * ls.n_kv_heads));
        const int32_t *keep = idx + q.keep_off +
                              ((size_t)layer * ls.n_kv_heads + h) * (size_t)q.n_keep +
                              (size_t)gi * g;
        const size_t hb =
            ((size_t)layer * dst.l.n_blocks + (size_t)idx[q.dst_off + gi]) * dst.blk_bytes +
            (size_t)h * dst.head_bytes;
        float m, id;
        __half dh, mh;
        if (it < hd) { /* K channel it over the group's tokens */
            float x[256]; /* g <= 256 (kv_block_bytes) */
            float mn = INFINITY, mx = -INFINITY;
            for (int32_t j = 0; j < g; j++) {
                const int32_t from = keep[j];
                const uint8_t *row =
                    src.k + kvp_row(src, layer, idx[q.src_off + from / sbt], h, from % sbt);
                x[j] = cuda_kv_elt(row, src.type, it);
                mn = j ? fminf(mn, x[j]) : x[j];
                mx = j ? fmaxf(mx, x[j]) : x[j];
            }
            cuda_kivi_scale(mn, mx, &dh, &mh, &m, &id);
            uint8_t *kh = dst.k + hb;
            CUDA_CHECK_ALIGN(kh + (size_t)it * 2, 2);
            *(__half *)(kh + (size_t)it * 2) = dh;
            *(__half *)(kh + (size_t)(hd + it) * 2) = mh;
            uint8_t *codes = kh + (size_t)hd * 4 + (size_t)it * (size_t)(g / 2);
            for (int32_t j = 0; j < g / 2; j++)
                codes[j] = (uint8_t)(cuda_kivi_code(x[2 * j], m, id) |
                                     cuda_kivi_code(x[2 * j + 1], m, id) << 4);
        } else { /* V row tk's channels c0 .. c0 + 63 */
            const int32_t tk = (it - hd) / nvg, c0 = (it - hd) % nvg * KIVI_VGROUP;
            const int32_t from = keep[tk];
            const uint8_t *row =
                src.v + kvp_row(src, layer, idx[q.src_off + from / sbt], h, from % sbt);
            float x[KIVI_VGROUP];
            float mn = 0.0f, mx = 0.0f;
            for (int32_t c = 0; c < KIVI_VGROUP; c++) {
                x[c] = cuda_kv_elt(row, src.type, c0 + c);
                mn = c ? fminf(mn, x[c]) : x[c];
                mx = c ? fmaxf(mx, x[c]) : x[c];
            }
            cuda_kivi_scale(mn, mx, &dh, &mh, &m, &id);
            uint8_t *vr = dst.v + hb + (size_t)tk * cuda_kivi_vrow_bytes(hd);
            CUDA_CHECK_ALIGN(vr + (size_t)(c0 / KIVI_VGROUP) * 4, 2);
            *(__half *)(vr + (size_t)(c0 / KIVI_VGROUP) * 4) = dh;
            *(__half *)(vr + (size_t)(c0 / KIVI_VGROUP) * 4 + 2) = mh;
            uint8_t *codes = vr + (size_t)nvg * 4 + (size_t)c0 / 2;
            for (int32_t j = 0; j < KIVI_VGROUP / 2; j++)
                codes[j] = (uint8_t)(cuda_kivi_code(x[2 * j], m, id) |
                                     cuda_kivi_code(x[2 * j + 1], m, id) << 4);
        }
    }
}

int cuda_kv_compact(dp_backend *be, const dp_kv_store *src, dp_kv_store *dst,
                    const dp_compact_seq *seqs, int32_t n_seqs)
{
    cuda_backend *c = cuda_of(be);
    cuda_bind(c);
    const dp_kv_layout *ls = &src->l, *ld = &dst->l;
    /* (No KV views here: a destination with fewer layers is refused.) */
    if (ls->n_layers != ld->n_layers)
        return DP_EINVAL;
    const bool kivi = dst->head_bytes != 0;
    const int rc = kv_compact_check(ls, ld, src->head_bytes != 0, kivi, seqs, n_seqs);
    if (rc)
        return rc;
    size_t n_idx = 0;
    int64_t total_rows = 0;
    const int64_t per_keep = (int64_t)ls->n_layers * ls->n_kv_heads;
    for (int32_t i = 0; i < n_seqs; i++) {
        const dp_compact_seq *q = &seqs[i];
        n_idx += (size_t)q->n_src_blocks + (size_t)q->n_dst_blocks + (size_t)per_keep * (size_t)q->n_keep;
        total_rows += per_keep * (kivi ? q->n_keep / ld->block_tokens : q->n_keep);
    }
    if (total_rows == 0)
        return 0;
    if (n_idx > (size_t)INT32_MAX)
        return DP_ERANGE;
    /* Packed as int32: row_start (int64, n_seqs of them), the per-sequence
     * descriptors, then every sequence's tables and keep lists. */
    const size_t n_hdr = 2 * (size_t)n_seqs + 4 * (size_t)n_seqs;
    int32_t *h = cuda_kvp_stage(c, n_hdr + n_idx);
    if (!h)
        return DP_ENOMEM;
    int64_t *row_start = (int64_t *)h;
    cuda_compact_seq_dev *desc = (cuda_compact_seq_dev *)(h + 2 * (size_t)n_seqs);
    int32_t *idx = h + n_hdr;
    size_t o = 0;
    int64_t rows = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        const dp_compact_seq *q = &seqs[i];
        row_start[i] = rows; /* (groups, for a kivi4 store) */
        rows += per_keep * (kivi ? q->n_keep / ld->block_tokens : q->n_keep);
        desc[i].n_keep = q->n_keep;
        desc[i].src_off = (int32_t)o;
        memcpy(idx + o, q->src_table, (size_t)q->n_src_blocks * sizeof *idx);
        o += (size_t)q->n_src_blocks;
        desc[i].dst_off = (int32_t)o;
        memcpy(idx + o, q->dst_table, (size_t)q->n_dst_blocks * sizeof *idx);
        o += (size_t)q->n_dst_blocks;
        desc[i].keep_off = (int32_t)o;
        memcpy(idx + o, q->keep, (size_t)per_keep * (size_t)q->n_keep * sizeof *idx);
        o += (size_t)per_keep * (size_t)q->n_keep;
    }
    int32_t *d = cuda_kvp_commit(c, n_hdr + n_idx);
    if (!d)
        return c->failed ? c->failed : DP_ENOMEM;
    const int32_t pieces = kivi ? ls->head_dim + ld->block_tokens * (ls->head_dim / KIVI_VGROUP)
                           : !cuda_kv_quant(src->type) && !cuda_kv_quant(dst->type)
                               ? ls->head_dim / CUDA_KV_VEC
                               : ls->head_dim / CUDA_QK;
    const int64_t total = total_rows * pieces;
    int64_t blocks = (total + KVP_THREADS - 1) / KVP_THREADS;
    if (blocks > (int64_t)c->sm_count * 32)
        blocks = (int64_t)c->sm_count * 32;
    /* A sequence with n_keep == 0 has no rows; the binary search never
     * lands on it because the next sequence starts at the same row. */
    if (kivi)
        CUDA_LAUNCH(cuda_compact_kivi_kernel, (unsigned)blocks, KVP_THREADS, 0, c->stream, *src,
                    *dst, (const int64_t *)d,
                    (const cuda_compact_seq_dev *)(d + 2 * (size_t)n_seqs), d + n_hdr, n_seqs,
                    total_rows, pieces);
    else
        CUDA_LAUNCH(cuda_compact_kernel, (unsigned)blocks, KVP_THREADS, 0, c->stream, *src, *dst,
                    (const int64_t *)d, (const cuda_compact_seq_dev *)(d + 2 * (size_t)n_seqs),
                    d + n_hdr, n_seqs, total_rows, pieces);
    cuda_check_launch(c, "kv_compact");
    return c->failed;
}

/* ---- host tier: one block to and from host memory ---------------------------------
 * The host image is the CPU backend's order, per layer K then V, each
 * [kv_head][token] rows of the store's type (fp16 rows are [head_dim];
 * kv_bytes_per_block is this backend's size). A block's rows of one layer are contiguous on the device,
 * n_blocks rows apart from layer to layer: one 2-D copy moves all layers' K,
 * another all V.
 *
 * Neither direction waits: the copies are queued on the stream, which orders
 * them with every kernel (a spilled block may be overwritten at once) and
 * with each other (a restore from a host entry runs after the spill that
 * filled it; a spill into an entry runs after an earlier restore from it).
 * The host tier never reads its entries on the CPU (kvcache/host.h), so no
 * host wait is needed. With pinned memory (host_alloc) the copies are DMA
 * and overlap the host; with pageable memory the runtime makes a copy to the
 * host synchronous and stages one from the host before returning, so the same
 * code stays correct there too. */
static int cuda_block_copy(cuda_backend *c, const dp_kv_store *kv, int32_t block, void *host,
                           bool to_host)
{
    const dp_kv_layout *l = &kv->l;
    if (block < 0 || block >= l->n_blocks)
        return DP_EINVAL;
    cuda_bind(c);
    /* The block's own bytes (a view's may use less than its stride). */
    const size_t per = (size_t)l->n_kv_heads *
                       (kv->head_bytes ? kv->head_bytes : (size_t)l->block_tokens * kv->row_bytes);
    const size_t dev_pitch = kv->blk_bytes * (size_t)l->n_blocks, host_pitch = 2 * per;
    const size_t off = kv->blk_bytes * (size_t)block;
    uint8_t *h = (uint8_t *)host;
    uint8_t *dk = (uint8_t *)kv->k + off, *dv = (uint8_t *)kv->v + off;
    cudaError_t e = cudaSuccess;
    if (dev_pitch > c->max_pitch) {
        /* A pool whose layer stride is over the runtime's largest pitch
         * (2 GiB on current GPUs) cannot use a 2-D copy: one copy per layer. */
        cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
        for (int32_t L = 0; L < l->n_layers && e == cudaSuccess; L++) {
            uint8_t *hk = h + (size_t)L * host_pitch, *lk = dk + (size_t)L * dev_pitch;
            uint8_t *lv = dv + (size_t)L * dev_pitch;
            e = to_host ? cudaMemcpyAsync(hk, lk, per, kind, c->stream)
                        : cudaMemcpyAsync(lk, hk, per, kind, c->stream);
            if (e == cudaSuccess)
                e = to_host ? cudaMemcpyAsync(hk + per, lv, per, kind, c->stream)
                            : cudaMemcpyAsync(lv, hk + per, per, kind, c->stream);
        }
    } else if (to_host) {
        e = cudaMemcpy2DAsync(h, host_pitch, dk, dev_pitch, per, (size_t)l->n_layers,
                              cudaMemcpyDeviceToHost, c->stream);
        if (e == cudaSuccess)
            e = cudaMemcpy2DAsync(h + per, host_pitch, dv, dev_pitch, per, (size_t)l->n_layers,
                                  cudaMemcpyDeviceToHost, c->stream);
    } else {
        e = cudaMemcpy2DAsync(dk, dev_pitch, h, host_pitch, per, (size_t)l->n_layers,
                              cudaMemcpyHostToDevice, c->stream);
        if (e == cudaSuccess)
            e = cudaMemcpy2DAsync(dv, dev_pitch, h + per, host_pitch, per, (size_t)l->n_layers,
                                  cudaMemcpyHostToDevice, c->stream);
    }
    if (e != cudaSuccess) {
        cuda_note_error(c, to_host ? "kv_block_read" : "kv_block_write", e);
        return c->failed ? c->failed : DP_EIO;
    }
    return 0;
}

int cuda_kv_block_read(dp_backend *be, const dp_kv_store *kv, int32_t block, void *host)
{
    return cuda_block_copy(cuda_of(be), kv, block, host, true);
}

int cuda_kv_block_write(dp_backend *be, dp_kv_store *kv, int32_t block, const void *host)
{
    return cuda_block_copy(cuda_of(be), kv, block, (void *)(uintptr_t)host, false);
}
