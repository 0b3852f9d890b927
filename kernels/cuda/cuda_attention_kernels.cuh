/* cuda_attention_kernels.cuh: the attention kernels (tiled online softmax and
 * the split-K merge); included by cuda_attention.cu and by the host emulator
 * tests/gpu/emu_attention.cpp, which runs these same kernels on the CPU. */
#ifndef DP_KERNELS_CUDA_ATTENTION_KERNELS_CUH
#define DP_KERNELS_CUDA_ATTENTION_KERNELS_CUH

#include <math.h>

#include "cuda_attention_plan.h"
#include "cuda_internal.h"

/* The emulator has no dynamic shared memory declaration; it defines this. */
#ifndef CUDA_DYN_SMEM
#define CUDA_DYN_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

/* How the work is cut.
 * - A query tile (built by batch_set) is a run of up to CUDA_QTILE
 *   consecutive batch tokens of one sequence: a decode token is a tile of
 *   one, a prefill chunk gives tiles of 16. They share one block table.
 * - A thread block takes CUDA_ATT_ROWS query rows of a tile that use the same
 *   KV head: row r is (token r / group, head kvh * group + r % group), so GQA
 *   heads and the tokens of a prefill chunk all reuse each K/V tile it loads.
 *   grid.y walks KV heads and, when a tile has more rows, row chunks.
 * - Keys are streamed CUDA_ATT_KT at a time through shared memory (fp16),
 *   with an online softmax per row (running max m, sum l, rescaled output).
 *   A row masks keys past its own slot, which is the causal rule on slots.
 * - Split-K (grid.z): when the grid is too small to fill the device (decode at
 *   small batch over a long context), each block covers split_len keys and
 *   writes an unnormalized partial (acc, m, l); a second kernel merges them.
 *   With one split the kernel normalizes and writes the output itself. */
static_assert(NT == 2 * KT, "score phase: two threads (dim halves) per key");
static_assert(KT == 64, "softmax phase: each lane owns keys lane and lane + 32");
static_assert(ROWS % N_WARPS == 0 && ROWS <= 16, "softmax phase: rows split over warps");

/* Dynamic shared memory: q rows (f32, pre-scaled), scores, K tile (rows
 * padded by one half2 so that lanes reading different keys at the same dim
 * hit different banks), V tile. */
static size_t cuda_att_smem(int32_t hd)
{
    return (size_t)(ROWS * hd + ROWS * KT) * sizeof(float) + (size_t)KT * (hd / 2 + 1) * 4 +
           (size_t)KT * (hd / 2) * 4;
}

/* Partial dot products of NR query rows with one key over dims [d2a, d2b)
 * (in half2 units). NR is a template so sc[] stays in registers. */
template <int NR>
__device__ __forceinline__ void cuda_att_dots(const float *qs, const __half2 *kr, int32_t hd,
                                              int32_t d2a, int32_t d2b, float *sc)
{
    for (int32_t d2 = d2a; d2 < d2b; d2++) {
        const float2 kf = __half22float2(kr[d2]);
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const float2 qv = *(const float2 *)(qs + i * hd + 2 * d2);
            sc[i] = fmaf(qv.x, kf.x, fmaf(qv.y, kf.y, sc[i]));
        }
    }
}

__global__ void __launch_bounds__(NT)
    cuda_attn_kernel(cuda_kv_desc kd, int32_t layer, cuda_batch_dev bd, int32_t max_blocks,
                     int32_t n_tokens, int32_t n_heads, int32_t n_rchunks, float scale,
                     int32_t window, const float *__restrict__ q, float *__restrict__ out,
                     float *__restrict__ part, int32_t split_len, int32_t n_splits)
{
    CUDA_DYN_SMEM(cuda_att_raw);
    __shared__ int32_t row_tok[ROWS], row_head[ROWS], row_slot[ROWS];
    __shared__ float row_m[ROWS], row_l[ROWS], row_corr[ROWS];
    __shared__ int32_t s_kmax, s_kmin;

    const int32_t hd = kd.head_dim, n_kv = kd.n_kv, group = n_heads / n_kv;
    const int32_t hd2 = hd / 2, kstride = hd2 + 1;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int32_t kvh = blockIdx.y / n_rchunks, rchunk = blockIdx.y % n_rchunks;
    const int32_t split = blockIdx.z;
    const int32_t t0 = bd.tile_start[blockIdx.x];
    const int32_t rows_total = (bd.tile_start[blockIdx.x + 1] - t0) * group;
    const int32_t r0 = rchunk * ROWS;
    if (r0 >= rows_total)
        return; /* a short tile: this row chunk is empty (uniform exit) */
    const int32_t R = min(ROWS, rows_total - r0);

    const int32_t s = bd.seq[t0];
    const int32_t st = bd.seq_store[s];
    const int32_t bt = cuda_pick(kd.block_tokens, st), ktype = cuda_pick(kd.type, st);
    const size_t row_bytes = (size_t)cuda_pick(kd.row_bytes, st);
    const size_t blk_bytes = (size_t)cuda_pick(kd.blk_bytes, st);
    const size_t layer_off = (size_t)layer * (size_t)cuda_pick(kd.n_blocks, st) * blk_bytes;
    const uint8_t *kbase = cuda_pick(kd.k, st) + layer_off;
    const uint8_t *vbase = cuda_pick(kd.v, st) + layer_off;
    /* A quantized store's rows are dequantized into the f16 tiles. A kivi4
     * store's sealed groups are too; its lead and residual are f16 rows of
     * its base (cuda_kivi_locate). */
    const bool quant = cuda_kv_quant(ktype), kivi = ktype == DP_KV_KIVI4;
    const int32_t *table = bd.block_tables + (size_t)s * (size_t)max_blocks;
    const int32_t rbt = kivi ? cuda_pick(kd.base_bt, st) : bt;
    const size_t head_bytes = kivi ? (size_t)cuda_pick(kd.head_bytes, st) : 0;
    const int32_t sealed = kivi ? bd.seq_sealed[s] : 0, roff = kivi ? bd.seq_roff[s] : 0;

    float *qs = (float *)cuda_att_raw;             /* [ROWS][hd] */
    float *ps = qs + ROWS * hd;                    /* [ROWS][KT] */
    __half2 *ks = (__half2 *)(ps + ROWS * KT);     /* [KT][kstride] */
    __half2 *vs = ks + KT * kstride;               /* [KT][hd2] */

    if (tid < ROWS) {
        if (tid < R) {
            const int32_t r = r0 + tid, tok = t0 + r / group;
            row_tok[tid] = tok;
            row_head[tid] = kvh * group + r % group;
            row_slot[tid] = bd.slot[tok];
        } else {
            row_tok[tid] = 0;
            row_head[tid] = 0;
            row_slot[tid] = -1;
        }
        row_m[tid] = -INFINITY;
        row_l[tid] = 0.0f;
        row_corr[tid] = 1.0f;
    }
    __syncthreads();
    if (tid == 0) {
        /* Keys [s_kmin, s_kmax]: every row's, a window's start the least of
         * the rows' (keys before it are never read: a sliding-window layer's
         * blocks there may be gone). */
        int32_t km = -1, kn = INT32_MAX;
        for (int32_t r = 0; r < R; r++) {
            km = max(km, row_slot[r]);
            kn = min(kn, window > 0 ? max(row_slot[r] - window + 1, 0) : 0);
        }
        s_kmax = km;
        s_kmin = kn == INT32_MAX ? 0 : kn;
    }
    for (int32_t idx = tid; idx < R * hd; idx += NT) {
        const int32_t r = idx / hd, d = idx % hd;
        qs[idx] = q[((size_t)row_tok[r] * (size_t)n_heads + (size_t)row_head[r]) * (size_t)hd + d] *
                  scale;
    }
    __syncthreads();
    const int32_t kb = max(split * split_len, s_kmin - s_kmin % KT);
    const int32_t ke = min(split * split_len + split_len, s_kmax + 1);

    /* PV phase: thread owns half2 column pc of rows prg * rpg .. + rpg. */
    const int32_t n_rg = NT / hd2; /* >= 1: hd2 <= 128 */
    const int32_t rpg = (ROWS + n_rg - 1) / n_rg;
    const int32_t pc = tid % hd2, prg = tid / hd2;
    const bool pv_active = prg < n_rg;
    float2 acc[ROWS];
#pragma unroll
    for (int i = 0; i < ROWS; i++)
        acc[i] = make_float2(0.0f, 0.0f);

    /* Score phase: thread owns key sj, dims half sh. */
    const int32_t sj = tid % KT, sh = tid / KT;
    const int32_t d2a = sh * (hd2 / 2), d2b = d2a + hd2 / 2; /* hd2 is a multiple of 4 */
    const int32_t vecs = hd / CUDA_KV_VEC;

    for (int32_t k0 = kb; k0 < ke; k0 += KT) {
        const int32_t nk = min(KT, ke - k0);
        /* 1. K and V rows of keys k0 .. k0 + nk into shared memory; the tail
         * of a short tile is zero (its scores are masked to weight 0). */
        /* Loads are issued LOADS_IN_FLIGHT at a time before their stores,
         * so each thread keeps several 16-byte requests outstanding. */
        for (int32_t base = tid; base < KT * vecs; base += NT * LOADS_IN_FLIGHT) {
            uint4 kk[LOADS_IN_FLIGHT], vv[LOADS_IN_FLIGHT];
#pragma unroll
            for (int u = 0; u < LOADS_IN_FLIGHT; u++) {
                const int32_t idx = base + u * NT, j = idx / vecs, vi = idx % vecs;
                kk[u] = make_uint4(0, 0, 0, 0);
                vv[u] = kk[u];
                if (idx < KT * vecs && j < nk && k0 + j >= s_kmin) {
                    const int32_t p = k0 + j;
                    int32_t blk = table[p / bt], tok = p % bt;
                    bool group = false;
                    if (kivi) {
                        const cuda_kivi_at a = cuda_kivi_locate(table, rbt, bt, sealed, roff, p);
                        blk = a.block;
                        tok = a.tok;
                        group = a.group;
                    }
                    const size_t row = (size_t)blk * blk_bytes +
                                       ((size_t)kvh * (size_t)rbt + (size_t)tok) * row_bytes;
                    if (group) {
                        const size_t hb = (size_t)blk * blk_bytes + (size_t)kvh * head_bytes;
                        const uint8_t *vr = vbase + hb + (size_t)tok * cuda_kivi_vrow_bytes(hd);
                        float xk[CUDA_KV_VEC], xv[CUDA_KV_VEC];
#pragma unroll
                        for (int e = 0; e < CUDA_KV_VEC; e++) {
                            xk[e] = cuda_kivi_k(kbase + hb, hd, bt, tok, vi * CUDA_KV_VEC + e);
                            xv[e] = cuda_kivi_v(vr, hd, vi * CUDA_KV_VEC + e);
                        }
                        kk[u] = cuda_pack8(xk);
                        vv[u] = cuda_pack8(xv);
                    } else if (quant) {
                        kk[u] = cuda_kv_load8(kbase + row, ktype, vi);
                        vv[u] = cuda_kv_load8(vbase + row, ktype, vi);
                    } else {
                        const size_t off = row + (size_t)vi * CUDA_KV_VEC * sizeof(__half);
                        CUDA_CHECK_ALIGN(kbase + off, 16);
                        kk[u] = *(const uint4 *)(kbase + off);
                        vv[u] = *(const uint4 *)(vbase + off);
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < LOADS_IN_FLIGHT; u++) {
                const int32_t idx = base + u * NT, j = idx / vecs, vi = idx % vecs;
                if (idx < KT * vecs) {
                    unsigned *kw = (unsigned *)(ks + j * kstride + vi * 4);
                    kw[0] = kk[u].x;
                    kw[1] = kk[u].y;
                    kw[2] = kk[u].z;
                    kw[3] = kk[u].w;
                    *(uint4 *)(vs + j * hd2 + vi * 4) = vv[u];
                }
            }
        }
        __syncthreads();

        /* 2. Scores: both dim halves of key sj for every row, summed through
         * shared memory, then masked by each row's slot. */
        float sc[ROWS];
#pragma unroll
        for (int i = 0; i < ROWS; i++)
            sc[i] = 0.0f;
        const __half2 *kr = ks + sj * kstride;
        if (R <= 1)
            cuda_att_dots<1>(qs, kr, hd, d2a, d2b, sc);
        else if (R <= 2)
            cuda_att_dots<2>(qs, kr, hd, d2a, d2b, sc);
        else if (R <= 4)
            cuda_att_dots<4>(qs, kr, hd, d2a, d2b, sc);
        else if (R <= 8)
            cuda_att_dots<8>(qs, kr, hd, d2a, d2b, sc);
        else
            cuda_att_dots<16>(qs, kr, hd, d2a, d2b, sc);
        if (sh == 1) {
#pragma unroll
            for (int i = 0; i < ROWS; i++)
                if (i < R)
                    ps[i * KT + sj] = sc[i];
        }
        __syncthreads();
        if (sh == 0) {
            const int32_t p = k0 + sj;
#pragma unroll
            for (int i = 0; i < ROWS; i++)
                if (i < R)
                    ps[i * KT + sj] = (sj < nk && p <= row_slot[i] &&
                                       (window <= 0 || p > row_slot[i] - window))
                                          ? sc[i] + ps[i * KT + sj]
                                          : -INFINITY;
        }
        __syncthreads();

        /* 3. Online softmax: a warp per row; lane owns keys lane, lane + 32. */
        for (int32_t r = warp; r < R; r += N_WARPS) {
            const float s0 = ps[r * KT + lane], s1 = ps[r * KT + lane + 32];
            float mx = fmaxf(s0, s1);
            for (int o = 16; o > 0; o >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_old = row_m[r], m_new = fmaxf(m_old, mx);
            float p0 = 0.0f, p1 = 0.0f, corr = 1.0f;
            if (m_new != -INFINITY) { /* else every key so far is masked */
                p0 = __expf(s0 - m_new); /* exp(-inf) = 0 for masked keys */
                p1 = __expf(s1 - m_new);
                corr = __expf(m_old - m_new);
            }
            ps[r * KT + lane] = p0;
            ps[r * KT + lane + 32] = p1;
            float sum = p0 + p1;
            for (int o = 16; o > 0; o >>= 1)
                sum += __shfl_xor_sync(0xffffffffu, sum, o);
            __syncwarp();
            if (lane == 0) {
                row_l[r] = row_l[r] * corr + sum;
                row_m[r] = m_new;
                row_corr[r] = corr;
            }
        }
        __syncthreads();

        /* 4. acc = acc * corr + P . V */
        if (pv_active) {
#pragma unroll
            for (int i = 0; i < ROWS; i++) {
                const int32_t r = prg * rpg + i;
                if (i < rpg && r < R) {
                    const float cr = row_corr[r];
                    acc[i].x *= cr;
                    acc[i].y *= cr;
                }
            }
            for (int32_t j = 0; j < nk; j++) {
                const float2 vf = __half22float2(vs[j * hd2 + pc]);
#pragma unroll
                for (int i = 0; i < ROWS; i++) {
                    const int32_t r = prg * rpg + i;
                    if (i < rpg && r < R) {
                        const float p = ps[r * KT + j];
                        acc[i].x = fmaf(p, vf.x, acc[i].x);
                        acc[i].y = fmaf(p, vf.y, acc[i].y);
                    }
                }
            }
        }
        __syncthreads(); /* the next tile overwrites ks, vs and ps */
    }

    const size_t n_rows_all = (size_t)n_tokens * (size_t)n_heads;
    if (pv_active) {
#pragma unroll
        for (int i = 0; i < ROWS; i++) {
            const int32_t r = prg * rpg + i;
            if (i < rpg && r < R) {
                const size_t orow = (size_t)row_tok[r] * (size_t)n_heads + (size_t)row_head[r];
                if (n_splits == 1) {
                    /* A padding token's rows see no key: zeros, not 0/0. */
                    const float inv = row_l[r] > 0.0f ? 1.0f / row_l[r] : 0.0f;
                    *(float2 *)(out + orow * hd + 2 * pc) =
                        make_float2(acc[i].x * inv, acc[i].y * inv);
                } else {
                    const size_t prow = (size_t)split * n_rows_all + orow;
                    *(float2 *)(part + prow * hd + 2 * pc) = acc[i];
                }
            }
        }
    }
    if (n_splits > 1 && tid < R) {
        const size_t orow = (size_t)row_tok[tid] * (size_t)n_heads + (size_t)row_head[tid];
        const size_t prow = (size_t)split * n_rows_all + orow;
        float *ml = part + (size_t)n_splits * n_rows_all * (size_t)hd;
        ml[2 * prow] = row_m[tid];
        ml[2 * prow + 1] = row_l[tid];
    }
}

/* Merges the splits of one (token, head) row: each split's partial is scaled
 * by exp(m_s - M) for the global max M; empty splits (m = -inf) add nothing. */
__global__ void cuda_attn_combine(const float *__restrict__ part, float *__restrict__ out,
                                  int32_t n_rows, int32_t hd, int32_t n_splits)
{
    const size_t row = blockIdx.x;
    const float *ml = part + (size_t)n_splits * (size_t)n_rows * (size_t)hd;
    float M = -INFINITY;
    for (int32_t s = 0; s < n_splits; s++)
        M = fmaxf(M, ml[2 * ((size_t)s * n_rows + row)]);
    float L = 0.0f;
    for (int32_t s = 0; s < n_splits; s++) {
        const float m = ml[2 * ((size_t)s * n_rows + row)];
        if (m != -INFINITY)
            L += __expf(m - M) * ml[2 * ((size_t)s * n_rows + row) + 1];
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f; /* 0: a padding row */
    for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
        for (int32_t s = 0; s < n_splits; s++) {
            const float m = ml[2 * ((size_t)s * n_rows + row)];
            if (m != -INFINITY)
                a += __expf(m - M) * part[((size_t)s * n_rows + row) * hd + d];
        }
        out[row * hd + d] = a * inv;
    }
}

#endif
