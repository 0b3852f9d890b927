/* cuda_attention.cu: causal attention over paged fp16 KV for any mix of
 * prefill chunks and decode tokens: the launches (kernels in cuda_attention_kernels.cuh). */
#include "cuda_attention_kernels.cuh"

int cuda_attention_setup(cuda_backend *c, char *err, size_t errsz)
{
    cudaError_t e = cudaFuncSetAttribute(cuda_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)cuda_att_smem(CUDA_MAX_HEAD_DIM));
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dp_err(err, errsz, DP_EIO, "attention kernel setup: %s", cudaGetErrorString(e));
    }
    return 0;
}

void cuda_attention(dp_backend *be, dp_kv_store *const *stores, int32_t layer, float *out,
                    const float *q, int32_t n_heads, float scale)
{
    cuda_backend *c = cuda_of(be);
    cuda_kv_desc kd;
    if (!cuda_kv_desc_make(stores, &kd) || c->n_tokens <= 0 || c->n_tiles <= 0)
        return;
    const int32_t n_kv = kd.n_kv, hd = kd.head_dim;
    if (n_heads < n_kv || n_heads % n_kv) {
        cuda_note_error(c, "attention: heads not a multiple of KV heads", cudaErrorInvalidValue);
        return;
    }
    const int32_t group = n_heads / n_kv;
    const int32_t n_rchunks = (c->max_tile_len * group + ROWS - 1) / ROWS;
    const int64_t blocks = (int64_t)c->n_tiles * n_kv * n_rchunks;
    const int32_t max_slots = c->max_slots;
    const size_t n_rows = (size_t)c->n_tokens * (size_t)n_heads;

    /* Split only when the grid leaves SMs idle and the context is long; about
     * four resident blocks per SM is what the shared memory allows. */
    int64_t splits = 1;
    const int64_t target = 4 * (int64_t)c->sm_count;
    if (blocks < target && max_slots >= 2 * MIN_SPLIT) {
        splits = (target + blocks - 1) / blocks;
        if (splits > max_slots / MIN_SPLIT)
            splits = max_slots / MIN_SPLIT;
        if (splits > MAX_SPLITS)
            splits = MAX_SPLITS;
        while (splits > 1 && (size_t)splits * n_rows * (size_t)(hd + 2) > MAX_PART_FLOATS)
            splits--;
    }
    int32_t split_len = (int32_t)((max_slots + splits - 1) / splits);
    split_len = (split_len + KT - 1) / KT * KT;
    splits = (max_slots + split_len - 1) / split_len;
    if (splits > 1 &&
        cuda_scratch_grow(c, (void **)&c->part, &c->part_cap, (size_t)splits * n_rows * (size_t)(hd + 2),
                          sizeof(float)))
        splits = 1, split_len = (max_slots + KT - 1) / KT * KT;

    dim3 grid((unsigned)c->n_tiles, (unsigned)(n_kv * n_rchunks), (unsigned)splits);
    cuda_attn_kernel<<<grid, NT, cuda_att_smem(hd), c->stream>>>(
        kd, layer, c->bd, c->max_blocks, c->n_tokens, n_heads, n_rchunks, scale, q, out, c->part,
        split_len, (int32_t)splits);
    cuda_check_launch(c, "attention");
    if (splits > 1) {
        cuda_attn_combine<<<(unsigned)n_rows, 128, 0, c->stream>>>(c->part, out, (int32_t)n_rows, hd,
                                                                    (int32_t)splits);
        cuda_check_launch(c, "attention merge");
    }
}
