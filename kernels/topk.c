/* topk.c: the public host-side top-k entry points (topk.h). The work is in
 * topk_impl.h, compiled with the CPU kernels of each instruction-set level
 * (kernels/cpu/cpu_kern.c); these call the level the process runs. */
#include "topk.h"

#include "kernels/cpu/cpu_internal.h"

void dp_topk_row(const float *x, int32_t vocab, int32_t k, float inv_t, int32_t *ids,
                 float *vals, float *max, float *sum)
{
    cpu_kern_get()->topk_row(x, vocab, k, inv_t, ids, vals, max, sum);
}

int32_t dp_topk_argmax(const float *x, int32_t vocab)
{
    return cpu_kern_get()->topk_argmax(x, vocab);
}

int32_t dp_topk_weights(const float *x, int32_t vocab, float m, float inv_t, int32_t *ids,
                        uint64_t *w, float *t)
{
    return cpu_kern_get()->topk_weights(x, vocab, m, inv_t, ids, w, t);
}
