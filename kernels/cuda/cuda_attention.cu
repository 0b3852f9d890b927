/* cuda_attention.cu: the attention op's launches (kernel, then the split-K
 * merge when the plan splits); the kernels are in cuda_attention_kernels.cuh. */
#include "cuda_attention_kernels.cuh"

int cuda_attention_setup(cuda_backend *c, char *err, size_t errsz)
{
    /* The C entry point (const void *): the template overload exists only
     * under nvcc, and the host emulator builds this file too. */
    cudaError_t e = cudaFuncSetAttribute((const void *)cuda_attn_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)cuda_att_smem(CUDA_MAX_HEAD_DIM));
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dp_err(err, errsz, DP_EIO, "attention kernel setup: %s", cudaGetErrorString(e));
    }
    return 0;
}

void cuda_attention(dp_backend *be, dp_kv_store *const *stores, int32_t layer, float *out,
                    const float *q, int32_t n_heads, float scale, int32_t window)
{
    cuda_xh_forget(cuda_of(be)); /* it writes device floats */
    cuda_backend *c = cuda_of(be);
    cuda_layer_at a;
    if (!cuda_layer_at_make(c, stores, layer, &a) || c->n_tokens <= 0 || c->n_tiles <= 0)
        return;
    const cuda_kv_desc kd = a.kd;
    const int32_t n_kv = kd.n_kv, hd = kd.head_dim;
    if (n_heads < n_kv || n_heads % n_kv) {
        cuda_note_error(c, "attention: heads not a multiple of KV heads", cudaErrorInvalidValue);
        return;
    }
    cuda_att_plan p = cuda_att_make_plan(c->n_tiles, c->max_tile_len, a.max_slots, c->n_tokens,
                                         n_heads, n_kv, hd, c->sm_count);
    if (p.splits > 1 && cuda_scratch_grow(c, (void **)&c->part, &c->part_cap,
                                          cuda_att_part_floats(&p, c->n_tokens, n_heads, hd),
                                          sizeof(float))) {
        p.splits = 1; /* no memory for partials: one pass still gives the answer */
        p.split_len = (a.max_slots + KT - 1) / KT * KT;
    }
    dim3 grid((unsigned)c->n_tiles, (unsigned)(n_kv * p.n_rchunks), (unsigned)p.splits);
    CUDA_LAUNCH(cuda_attn_kernel, grid, NT, cuda_att_smem(hd), c->stream, kd, a.layer, *a.bd,
                a.max_blocks, c->n_tokens, n_heads, p.n_rchunks, scale, window, q, out, c->part,
                p.split_len, p.splits);
    cuda_check_launch(c, "attention");
    if (p.splits > 1) {
        const int32_t n_rows = c->n_tokens * n_heads;
        CUDA_LAUNCH(cuda_attn_combine, (unsigned)n_rows, 128, 0, c->stream, c->part, out, n_rows,
                    hd, p.splits);
        cuda_check_launch(c, "attention merge");
    }
}
