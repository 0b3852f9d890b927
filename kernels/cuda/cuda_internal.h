/* cuda_internal.h: state shared by the CUDA backend's files (ops table and
 * memory, element-wise kernels, attention, KV path). Not a public surface. */
#ifndef DP_KERNELS_CUDA_INTERNAL_H
#define DP_KERNELS_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <string.h>

/* The project's headers are C without extern "C" guards. */
extern "C" {
#include "common/dp.h"
#include "kernels/backend.h"
#include "kernels/quant.h"
}

/* KV rows are moved as 16-byte vectors (8 halves), and the attention kernel
 * keeps a tile of query rows in shared memory sized for this head_dim. */
#define CUDA_KV_VEC 8
#define CUDA_MAX_HEAD_DIM 256

/* Attention tiling: a query tile is up to CUDA_QTILE consecutive batch tokens
 * of one sequence (a prefill chunk; a decode token is a tile of one), and one
 * thread block handles up to CUDA_ATT_ROWS (token, head) rows of it against
 * CUDA_ATT_KT keys at a time. */
#define CUDA_QTILE 16
#define CUDA_ATT_ROWS 16
#define CUDA_ATT_KT 64
#define CUDA_ATT_THREADS 128

/* Kernel launches go through this macro so that the host emulator
 * (tests/gpu/emu.h) can run the same sources on the CPU. */
#ifndef CUDA_LAUNCH
#define CUDA_LAUNCH(kernel, grid, block, smem, stream, ...)                                        \
    kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#endif

/* KV rows: f16 (DP_KV_F16; an f32 layout is kept in f16 too), or the
 * CPU's q8_0 / q4_0 rows (kernels/quant.c): per 32 values an f16 scale d,
 * then 32 int8 (x = d * q) or 16 bytes of nibbles (x = d * (q - 8), value
 * j in the low nibble of byte j, value j + 16 in its high nibble). The same
 * bytes as the CPU backend's, so host copies and the two backends agree. */
#define CUDA_QK 32
static inline __host__ __device__ bool cuda_kv_quant(int32_t type)
{
    return type == DP_KV_Q8_0 || type == DP_KV_Q4_0;
}
static inline __host__ __device__ size_t cuda_kv_row_bytes(int32_t type, int32_t hd)
{
    return type == DP_KV_Q8_0 ? (size_t)hd / CUDA_QK * 34
           : type == DP_KV_Q4_0 ? (size_t)hd / CUDA_QK * 18
                                : (size_t)hd * sizeof(__half);
}

struct dp_kv_store {
    dp_kv_layout l;
    /* [layer][block] blocks of blk_bytes, each [kv_head][token] rows of
     * row_bytes. A view (kv_view) reads its base's memory in another type:
     * its blocks keep the base's stride, blk_bytes. */
    uint8_t *k;
    uint8_t *v;
    int32_t type;   /* the rows the kernels read: DP_KV_F16 (for an f32 layout too), Q8_0,
                     * Q4_0; KIVI4 for a grouped view (below) */
    size_t row_bytes, blk_bytes;
    bool view;
    /* A kivi4 view (backend.h: grouped): block b of layer L holds one group
     * of l.block_tokens tokens per KV head, head_bytes apart, in the CPU's
     * bytes (kernels/quant.h kivi_*); a sequence's lead and residual are the
     * f16 base's rows (base_bt tokens a block, row_bytes = its f16 row). */
    int32_t base_bt;
    size_t head_bytes;
};

/* One head's bytes in a kivi4 block: its K and V groups (each in its own
 * half of the store, as every type's K and V), the larger of the two. */
static inline __host__ __device__ size_t cuda_kivi_vrow_bytes(int32_t hd)
{
    return (size_t)hd / KIVI_VGROUP * 4 + (size_t)hd / 2; /* quant.h kivi_vrow_bytes */
}
static inline __host__ __device__ size_t cuda_kivi_head_bytes(int32_t hd, int32_t g)
{
    const size_t k = (size_t)hd * 4 + (size_t)hd * (size_t)(g / 2); /* quant.h kivi_k_bytes */
    const size_t v = (size_t)g * cuda_kivi_vrow_bytes(hd);
    return k > v ? k : v;
}

/* The stores of a step, as kernels see them (passed by value). Every store
 * of a model shares n_kv_heads and head_dim; block geometry and type may
 * differ. The two paths' stores: a third (exempt layers, other decode
 * types) is refused by batch_set (kv_max_stores). */
#define CUDA_KV_STORES 2
typedef struct cuda_kv_desc {
    uint8_t *k[CUDA_KV_STORES];
    uint8_t *v[CUDA_KV_STORES];
    int32_t n_blocks[CUDA_KV_STORES];
    int32_t block_tokens[CUDA_KV_STORES];
    int32_t type[CUDA_KV_STORES];
    int32_t row_bytes[CUDA_KV_STORES];
    int64_t blk_bytes[CUDA_KV_STORES];
    int32_t base_bt[CUDA_KV_STORES];    /* kivi4: the base's block_tokens */
    int64_t head_bytes[CUDA_KV_STORES]; /* kivi4: cuda_kivi_head_bytes */
    int32_t n_kv;
    int32_t head_dim;
} cuda_kv_desc;

/* Member i of a desc array without a dynamic index into the kernel's
 * parameter space (which would copy the struct to local memory). */
template <typename T>
__device__ __forceinline__ T cuda_pick(const T (&a)[CUDA_KV_STORES], int32_t i)
{
    static_assert(CUDA_KV_STORES == 2, "cuda_pick selects between two stores");
    return i ? a[1] : a[0];
}

/* Fills d from stores[]; false when every entry is NULL. */
bool cuda_kv_desc_make(dp_kv_store *const *stores, cuda_kv_desc *d);

/* ---- quantized KV rows on the device ------------------------------------------------
 * Every access is aligned to its size (a row of q8_0 is 34-byte groups:
 * its scale and its values are only 2-byte aligned), so values are read as
 * bytes and halves, never as wider words. CUDA_CHECK_ALIGN is the
 * emulator's check (tests/gpu/emu.h); on a device it is nothing. */
#ifndef CUDA_CHECK_ALIGN
#define CUDA_CHECK_ALIGN(p, n)
#endif

static __device__ __forceinline__ float cuda_kv_scale(const uint8_t *g)
{
    CUDA_CHECK_ALIGN(g, 2);
    return __half2float(*(const __half *)g);
}

/* Values [8 * i8, 8 * i8 + 8) of a quantized row as the 16 bytes of 8
 * halves an f16 row would hold there (d * q computed in f32, rounded once
 * to f16, as the f16 tile holds them). */
static __device__ __forceinline__ uint4 cuda_kv_load8(const uint8_t *row, int32_t type, int32_t i8)
{
    const int32_t g = i8 / 4, j0 = (i8 % 4) * 8;
    float x[8];
    if (type == DP_KV_Q8_0) {
        const uint8_t *b = row + (size_t)g * 34;
        const float d = cuda_kv_scale(b);
        const int8_t *q = (const int8_t *)(b + 2) + j0;
#pragma unroll
        for (int j = 0; j < 8; j++)
            x[j] = d * (float)q[j];
    } else {
        const uint8_t *b = row + (size_t)g * 18;
        const float d = cuda_kv_scale(b);
        const uint8_t *q = b + 2 + (j0 & 15);
        const int sh = j0 < 16 ? 0 : 4;
#pragma unroll
        for (int j = 0; j < 8; j++)
            x[j] = d * (float)(((q[j] >> sh) & 15) - 8);
    }
    __half2 h[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
        h[j] = __floats2half2_rn(x[2 * j], x[2 * j + 1]);
    uint4 out; /* (through memcpy: no access of a uint4 as half2) */
    memcpy(&out, h, sizeof out);
    return out;
}

/* Group g (values 32g .. 32g + 31) of a row of any type, in f32 (as the
 * CPU's dequantization gives them). */
static __device__ __forceinline__ void cuda_kv_group_get(const uint8_t *row, int32_t type,
                                                         int32_t g, float *x)
{
    if (type == DP_KV_Q8_0) {
        const uint8_t *b = row + (size_t)g * 34;
        const float d = cuda_kv_scale(b);
        const int8_t *q = (const int8_t *)(b + 2);
        for (int j = 0; j < CUDA_QK; j++)
            x[j] = d * (float)q[j];
    } else if (type == DP_KV_Q4_0) {
        const uint8_t *b = row + (size_t)g * 18;
        const float d = cuda_kv_scale(b);
        for (int j = 0; j < 16; j++) {
            x[j] = d * (float)((b[2 + j] & 15) - 8);
            x[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
    } else {
        const __half *h = (const __half *)row + (size_t)g * CUDA_QK;
        CUDA_CHECK_ALIGN(h, 2);
        for (int j = 0; j < CUDA_QK; j++)
            x[j] = __half2float(h[j]);
    }
}

/* f32 to f16, saturated at the f16 range (as the CPU's kv_f2h): a K or V
 * value over 65504 kept as inf would make its attention rows NaN, and
 * inf * 0 in a GEMM is NaN too. A NaN compares false and stays NaN, so a
 * bug upstream still shows. */
static __device__ __forceinline__ __half cuda_sat_half(float v)
{
    if (fabsf(v) > 65504.0f)
        v = copysignf(65504.0f, v);
    return __float2half_rn(v);
}

/* The CPU's rounding (kernels/quant.c q_round): nearest, ties away from
 * zero, clamped first; NaN gives 0. x is the product x * (1 / d), rounded
 * on its own: __fmul_rn and __fadd_rn keep nvcc from fusing it with the
 * 0.5 into one FMA, which rounds once where the CPU rounds twice (a value
 * just under 0.5 would then give 0 where the CPU gives 1). */
static __device__ __forceinline__ int cuda_q_round(float x, int lo, int hi)
{
    if (x != x)
        return 0;
    if (x <= (float)lo)
        return lo;
    if (x >= (float)hi)
        return hi;
    const int q = (int)(x < 0.0f ? __fadd_rn(x, -0.5f) : __fadd_rn(x, 0.5f));
    return q < lo ? lo : q > hi ? hi : q;
}

/* Writes group g of a row from 32 f32 values: the CPU's quantization
 * (kernels/quant.c quant_q8_0 / quant_q4_0), the scale rounded to f16
 * first and the values divided by it as stored; f16 rounds each value. */
static __device__ __forceinline__ void cuda_kv_group_put(uint8_t *row, int32_t type, int32_t g,
                                                         const float *x)
{
    if (type == DP_KV_Q8_0) {
        uint8_t *b = row + (size_t)g * 34;
        float amax = 0.0f;
        for (int j = 0; j < CUDA_QK; j++)
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const __half dh = __float2half_rn(amax / 127.0f);
        CUDA_CHECK_ALIGN(b, 2);
        *(__half *)b = dh;
        const float d = __half2float(dh), id = d > 0.0f ? 1.0f / d : 0.0f;
        int8_t *q = (int8_t *)(b + 2);
        for (int j = 0; j < CUDA_QK; j++)
            q[j] = (int8_t)cuda_q_round(__fmul_rn(x[j], id), -127, 127);
    } else if (type == DP_KV_Q4_0) {
        uint8_t *b = row + (size_t)g * 18;
        float amax = 0.0f, m = 0.0f;
        for (int j = 0; j < CUDA_QK; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                m = x[j];
            }
        const __half dh = __float2half_rn(m / -8.0f);
        CUDA_CHECK_ALIGN(b, 2);
        *(__half *)b = dh;
        const float d = __half2float(dh), id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 16; j++) {
            const int lo = cuda_q_round(__fmul_rn(x[j], id), -8, 7) + 8;
            const int hi = cuda_q_round(__fmul_rn(x[j + 16], id), -8, 7) + 8;
            b[2 + j] = (uint8_t)(lo | (hi << 4));
        }
    } else {
        __half *h = (__half *)row + (size_t)g * CUDA_QK;
        CUDA_CHECK_ALIGN(h, 2);
        for (int j = 0; j < CUDA_QK; j++)
            h[j] = cuda_sat_half(x[j]);
    }
}

/* Byte offset of (layer, block, head, token)'s row in a store. */
static __host__ __device__ __forceinline__ size_t cuda_kv_off(int32_t layer, int32_t n_blocks,
                                                              int32_t block, int64_t blk_bytes,
                                                              int32_t head, int32_t bt, int32_t tok,
                                                              size_t row_bytes)
{
    return ((size_t)layer * (size_t)n_blocks + (size_t)block) * (size_t)blk_bytes +
           ((size_t)head * (size_t)bt + (size_t)tok) * row_bytes;
}

/* ---- kivi4 rows on the device ---------------------------------------------------------
 * Where slot p of a grouped sequence lives (backend.h seq_sealed; the same
 * arithmetic as dp_kv_group_*, which are host functions): its lead (the
 * base's f16 block at table[0]), a sealed group, or its residual (the
 * base's blocks after the groups). sealed INT32_MAX: every slot is a group
 * from table[0], with no lead. */
typedef struct cuda_kivi_at {
    int32_t block, tok;
    bool group; /* tok is a token of kivi4 group `block`; else an f16 row of the base */
} cuda_kivi_at;

static __device__ __forceinline__ cuda_kivi_at cuda_kivi_locate(const int32_t *table, int32_t bbt,
                                                                int32_t g, int32_t sealed,
                                                                int32_t roff, int32_t p)
{
    cuda_kivi_at a;
    const int32_t lead = sealed == INT32_MAX ? 0 : sealed > 0 ? bbt : 0;
    if (p < lead) {
        a.block = table[0];
        a.tok = p;
        a.group = false;
    } else if (p < sealed) {
        const int32_t i = p - lead;
        a.block = table[(lead ? 1 : 0) + i / g];
        a.tok = i % g;
        a.group = true;
    } else {
        const int32_t q = p - sealed + roff, rstart = sealed > 0 ? 1 + (sealed - bbt) / g : 0;
        a.block = table[rstart + q / bbt];
        a.tok = q % bbt;
        a.group = false;
    }
    return a;
}

static __device__ __forceinline__ float cuda_kivi_half(const uint8_t *p)
{
    CUDA_CHECK_ALIGN(p, 2);
    return __half2float(*(const __half *)p);
}

/* Channel c of token t of one head's K group (kh: its bytes; quant.h
 * layout: d[hd], m[hd], then g / 2 bytes of codes per channel). */
static __device__ __forceinline__ float cuda_kivi_k(const uint8_t *kh, int32_t hd, int32_t g,
                                                    int32_t t, int32_t c)
{
    const uint8_t code = kh[(size_t)hd * 4 + (size_t)c * (size_t)(g / 2) + (size_t)(t / 2)];
    const int q = code >> (4 * (t & 1)) & 15;
    return cuda_kivi_half(kh + (size_t)(hd + c) * 2) +
           (float)q * cuda_kivi_half(kh + (size_t)c * 2);
}

/* Channel c of one V row (vr: its bytes; (d, m) per 64 channels, then the
 * codes, channel 2i in the low nibble of byte i). */
static __device__ __forceinline__ float cuda_kivi_v(const uint8_t *vr, int32_t hd, int32_t c)
{
    const uint8_t *sm = vr + (size_t)(c / KIVI_VGROUP) * 4;
    const int q = vr[(size_t)hd / KIVI_VGROUP * 4 + (size_t)(c / 2)] >> (4 * (c & 1)) & 15;
    return cuda_kivi_half(sm + 2) + (float)q * cuda_kivi_half(sm);
}

/* Eight f32 values as the 16 bytes of eight halves (an f16 row's vector). */
static __device__ __forceinline__ uint4 cuda_pack8(const float *x)
{
    __half2 h[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
        h[j] = __floats2half2_rn(x[2 * j], x[2 * j + 1]);
    uint4 out;
    memcpy(&out, h, sizeof out);
    return out;
}

/* Value c of a row of any per-token type (f16, q8_0, q4_0), in f32. */
static __device__ __forceinline__ float cuda_kv_elt(const uint8_t *row, int32_t type, int32_t c)
{
    const int32_t g = c / CUDA_QK, j = c % CUDA_QK;
    if (type == DP_KV_Q8_0) {
        const uint8_t *b = row + (size_t)g * 34;
        return cuda_kv_scale(b) * (float)((const int8_t *)(b + 2))[j];
    }
    if (type == DP_KV_Q4_0) {
        const uint8_t *b = row + (size_t)g * 18;
        return cuda_kv_scale(b) * (float)(((b[2 + j % 16] >> (j < 16 ? 0 : 4)) & 15) - 8);
    }
    return cuda_kivi_half(row + (size_t)c * 2);
}

/* The f16 minimum and scale of values in [lo, hi] (kernels/quant.c asym4's
 * rounding), and the reciprocal the codes are computed with. */
static __device__ __forceinline__ void cuda_kivi_scale(float lo, float hi, __half *dh, __half *mh,
                                                       float *m, float *id)
{
    *mh = __float2half_rn(lo);
    *m = __half2float(*mh);
    *dh = __float2half_rn((hi - *m) / 15.0f);
    const float d = __half2float(*dh);
    *id = d > 0.0f ? 1.0f / d : 0.0f;
}

/* One code: the CPU's q_round((x - m) * id, 0, 15). */
static __device__ __forceinline__ int cuda_kivi_code(float x, float m, float id)
{
    return cuda_q_round(__fmul_rn(x - m, id), 0, 15);
}

/* Device copies of the step's index arrays (one allocation, see batch_set). */
typedef struct cuda_batch_dev {
    const int32_t *tokens, *pos, *seq, *slot, *block_tables, *out_tokens, *capture_tokens;
    const int32_t *seq_store;
    const int32_t *tile_start; /* [n_tiles + 1] first batch token of each query tile */
    /* [n_seqs] each, always present: the batch's seq_sealed and seq_roff,
     * or INT32_MAX and 0 where it has none (backend.h: a grouped store then
     * reads every slot as groups from table[0]). */
    const int32_t *seq_sealed, *seq_roff;
} cuda_batch_dev;

/* Recorded decode steps (cuda_graph.cu). The key is everything that shapes a
 * step's launches and the offsets of its batch arrays. */
#define CUDA_GRAPH_SLOTS 64
/* Steps of more tokens are prefill-sized: their GEMMs dwarf launch costs. */
#define CUDA_GRAPH_MAX_TOKENS 512
typedef struct cuda_graph_key {
    const void *owner;
    const void *stores[DP_KV_MAX_STORES];
    int32_t n_tokens, n_seqs, n_out, max_blocks, max_slots;
} cuda_graph_key;
enum { CUDA_GRAPH_EMPTY, CUDA_GRAPH_SEEN, CUDA_GRAPH_READY, CUDA_GRAPH_NEVER };
typedef struct cuda_graph_entry {
    cuda_graph_key key;
    int state;
    uint64_t last_used;
    cudaGraphExec_t exec;
} cuda_graph_entry;

typedef struct cuda_backend {
    dp_backend base;
    int device;
    int sm_count;
    size_t max_pitch;   /* the largest pitch a 2-D copy takes (cudaDeviceProp.memPitch) */
    cudaStream_t stream;
    cublasHandle_t blas;
    /* First failure of a void op (launch errors), reported by download:
     * DP_EDEVICE for an error the context cannot survive (lost), which
     * stays; any other fails the step it happened in and is cleared by the
     * next batch_set (recovered counts those). */
    int failed;
    bool lost;
    uint64_t recovered;
    char fail_msg[DP_ERRLEN];

    /* The step's batch: host copies of the sizes that shape launches, and
     * the index arrays packed in pinned memory, copied in one async copy. */
    int32_t n_tokens, n_seqs, max_blocks, n_out, n_capture;
    int32_t n_tiles, max_tile_len, max_slots;
    int32_t *h_arrays;   /* pinned staging */
    int32_t *d_arrays;
    size_t arrays_cap;   /* int32 elements of both */
    cudaEvent_t arrays_copied; /* staging may be rewritten once this fired */
    bool arrays_pending;
    cuda_batch_dev bd;
    /* Sliding-window layers apart (backend.h layer_map, the model's host
     * array; NULL: none): their view of the batch (positions as slots, the
     * w_ tables, every sequence in store 0 of a descriptor of the sliding
     * store alone) and its shape. */
    const int32_t *layer_map;
    int32_t w_store, w_max_blocks, w_max_slots;
    cuda_batch_dev bw;

    /* matmul: activations converted to fp16; and the fp16 slab a quantized
     * weight is dequantized into for a GEMM (cuda_wquant.cu). */
    __half *wdq;
    size_t wdq_cap;      /* elements */
    __half *xh;
    size_t xh_cap;       /* elements */
    /* xh holds the fp16 copy of this f32 buffer (xh_of_n floats): rmsnorm
     * writes it alongside its output, so the matmuls that read the normalized
     * activation (q, k, v; gate, up; the output head) skip their conversion
     * launch. Every op that writes device floats forgets it (cuda_xh_forget)
     * before anything can change the buffer behind the copy's back. */
    const float *xh_of;
    size_t xh_of_n;
    /* attention: split-K partial results. */
    float *part;
    size_t part_cap;     /* floats */
    /* KV-path ops: host tables and index lists copied to the device, and
     * the scratch rows of kv_score_attn. */
    int32_t *kvp_idx;
    size_t kvp_idx_cap;  /* int32 elements */
    int32_t *kvp_host;   /* pinned staging of the same */
    size_t kvp_host_cap;
    cudaEvent_t kvp_copied;
    bool kvp_pending;
    float *kvp_scratch;
    size_t kvp_scratch_cap; /* floats */
    /* Start-up accounting (mem_usage): bytes held by weights, and bytes
     * handed out by alloc (not lowered by free: the runtime does not say how
     * big a freed pointer was, and the plan reads it before any free). */
    size_t weight_bytes, alloc_bytes;
    /* logits_topk: results on the device and their pinned host copy. */
    uint32_t *topk_dev;
    size_t topk_dev_cap;  /* words */
    uint32_t *topk_host;
    size_t topk_host_cap; /* words */
    /* Recorded steps: batch_set decides whether this step may be recorded
     * (decode tokens only, see cuda_batch_set); step_begin/step_end. */
    bool step_graphable;
    int graph_policy;
    uint64_t graph_clock;
    int step_mode;        /* DP_STEP_* of the step being issued */
    cuda_graph_entry *step_entry;
    bool rec_spoiled;     /* a scratch buffer had to grow while recording */
    cuda_graph_entry graphs[CUDA_GRAPH_SLOTS];
    dp_graph_stats gstats;
    void *blas_ws;        /* cuBLAS workspace: no allocation inside a capture */
    /* weight_load: pinned staging for converted rows. */
    uint16_t *wstage;
    size_t wstage_cap;   /* elements */
} cuda_backend;

/* Where a layer's kv_write and attention read: its stores' descriptor, its
 * view of the batch, its layer in those stores and the view's shape (the
 * sliding-window layers' own where the batch maps the layers). */
typedef struct cuda_layer_at {
    cuda_kv_desc kd;
    const cuda_batch_dev *bd;
    int32_t layer, max_blocks, max_slots;
} cuda_layer_at;
bool cuda_layer_at_make(const cuda_backend *c, dp_kv_store *const *stores, int32_t layer,
                        cuda_layer_at *a);

static inline cuda_backend *cuda_of(dp_backend *be) { return (cuda_backend *)be; }

/* The runtime's current device is per host thread, and the engine thread
 * that runs steps is not the one that created the backend: every entry point
 * that may be the first on a thread binds the device (cheap when current). */
static inline void cuda_bind(cuda_backend *c) { cudaSetDevice(c->device); }

static inline void cuda_xh_forget(cuda_backend *c)
{
    c->xh_of = NULL;
    c->xh_of_n = 0;
}

/* Recorded steps (cuda_graph.cu): the ops table entries, and dropping every
 * recording (a buffer they may read moved or was freed; shutdown). */
void cuda_graph_ops(dp_backend_ops *o);
void cuda_graphs_clear(cuda_backend *c);

/* Records the first failure (and logs it once); later ops still run, and
 * the next download reports it. */
void cuda_note_error(cuda_backend *c, const char *what, cudaError_t e);
/* Checks the last launch. */
void cuda_check_launch(cuda_backend *c, const char *what);
/* Grows a device scratch buffer (rare: only when a step is larger than any
 * before it; cudaFree/cudaMalloc synchronize, so never on a steady state). */
int cuda_scratch_grow(cuda_backend *c, void **p, size_t *cap, size_t want, size_t elem);

/* Records a failed cuBLAS call like cuda_note_error. */
void cuda_note_blas(cuda_backend *c, const char *what, cublasStatus_t s);
/* Makes c->xh the fp16 copy of x's n floats (unless rmsnorm left it there);
 * 0, or nonzero when the scratch could not grow (the failure is noted). */
int cuda_x_half(cuda_backend *c, const float *x, size_t n);

/* Quantized weights (cuda_wquant.cu): the block types kept on the device as
 * the file's bytes, their matmul (a GEMV reading the weights once for up to
 * CUDA_WQ_GEMV_MAX activation rows, else fp16 slabs and a cuBLAS GEMM) and
 * their embedding lookup. */
#define CUDA_WQ_GEMV_MAX 8
bool cuda_wq_supported(uint32_t type);
void cuda_wq_matmul(cuda_backend *c, float *y, const float *x, const dp_weight *w, int32_t m);
void cuda_wq_embed(cuda_backend *c, const dp_weight *table, float *out, int32_t n);

/* Element-wise ops (cuda_elementwise.cu). */
void cuda_embed(dp_backend *be, const dp_weight *table, float *out, int32_t n);
void cuda_rmsnorm(dp_backend *be, float *out, const float *x, const dp_weight *w, int32_t n,
                  int32_t dim, float eps);
void cuda_rope(dp_backend *be, float *q, float *k, int32_t n, int32_t n_heads,
               int32_t n_kv_heads, int32_t head_dim, const dp_rope_params *rp);
void cuda_kv_write(dp_backend *be, dp_kv_store *const *stores, int32_t layer, const float *k,
                   const float *v);
void cuda_add(dp_backend *be, float *x, const float *y, int64_t n);
void cuda_add_bias(dp_backend *be, float *y, const dp_weight *b, int32_t n, int32_t cols);
void cuda_swiglu(dp_backend *be, float *out, const float *gate, const float *up, int64_t n);
void cuda_geglu(dp_backend *be, float *out, const float *gate, const float *up, int64_t n);
void cuda_scale(dp_backend *be, float *x, float s, int64_t n);
void cuda_gather_rows(dp_backend *be, float *out, const float *x, int32_t dim);
void cuda_capture_rows(dp_backend *be, float *out, const float *x, int32_t dim);
int cuda_logits_topk(dp_backend *be, float *logits, int32_t n, int32_t vocab, int32_t k,
                     const float *temperature, const int32_t *mask_ids, int32_t n_mask,
                     const uint8_t *mask_rows, int32_t *ids, float *vals, float *row_max,
                     float *row_sum);
/* dst[n] = fp16(src[n]), saturating at the fp16 range so that no inf reaches
 * a GEMM (inf * 0 would turn into NaN). */
void cuda_to_half(cuda_backend *c, __half *dst, const float *src, int64_t n);

/* KV-path ops: importance scores and the compaction copy (cuda_kvpath.cu). */
void cuda_kv_score_knorm(dp_backend *be, const dp_kv_store *kv, const int32_t *table,
                         int32_t n_slots, float *out);
void cuda_kv_score_attn(dp_backend *be, const dp_kv_store *kv, const int32_t *table,
                        int32_t n_slots, const float *q, int64_t q_layer_stride,
                        const int32_t *q_slot, int32_t n_q, int32_t n_heads, float scale, float *out);
int cuda_kv_compact(dp_backend *be, const dp_kv_store *src, dp_kv_store *dst,
                    const dp_compact_seq *seqs, int32_t n_seqs);
/* Host tier: one block's K and V of every layer to and from host memory. */
int cuda_kv_block_read(dp_backend *be, const dp_kv_store *kv, int32_t block, void *host);
int cuda_kv_block_write(dp_backend *be, dp_kv_store *kv, int32_t block, const void *host);

/* Attention (cuda_attention.cu). */
void cuda_attention(dp_backend *be, dp_kv_store *const *stores, int32_t layer, float *out,
                    const float *q, int32_t n_heads, float scale, int32_t window);
/* One-time kernel attributes (shared memory opt-in); 0 or a DP_E* code. */
int cuda_attention_setup(cuda_backend *c, char *err, size_t errsz);

#endif
