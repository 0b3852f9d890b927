/* batch.c: a step's batch arrays (batch.h). */
#include "batch.h"

#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

int batch_buf_init(dp_batch_buf *b, int32_t max_tokens, int32_t max_out, int32_t max_seqs,
                   int32_t max_capture)
{
    memset(b, 0, sizeof *b);
    const size_t T = (size_t)(max_tokens > 0 ? max_tokens : 1);
    const size_t R = (size_t)(max_out > 0 ? max_out : 1);
    const size_t S = (size_t)(max_seqs > 0 ? max_seqs : 1);
    const size_t C = (size_t)(max_capture > 0 ? max_capture : 1);
    b->max_tokens = (int32_t)T;
    b->max_out = (int32_t)R;
    b->max_seqs = (int32_t)S;
    b->max_capture = max_capture > 0 ? max_capture : 0;
    b->tokens = malloc(T * sizeof(int32_t));
    b->pos = malloc(T * sizeof(int32_t));
    b->seq = malloc(T * sizeof(int32_t));
    b->slot = malloc(T * sizeof(int32_t));
    b->x_slot = malloc(T * sizeof(int32_t));
    b->out = malloc(R * sizeof(int32_t));
    b->capture = malloc(C * sizeof(int32_t));
    b->store = calloc(S, 1);
    b->x_store = calloc(S, 1);
    b->sealed = calloc(S, sizeof(int32_t));
    b->roff = calloc(S, sizeof(int32_t));
    if (b->tokens && b->pos && b->seq && b->slot && b->x_slot && b->out && b->capture && b->store &&
        b->x_store && b->sealed && b->roff)
        return 0;
    batch_buf_destroy(b);
    return DP_ENOMEM;
}

void batch_buf_destroy(dp_batch_buf *b)
{
    free(b->tokens);
    free(b->pos);
    free(b->seq);
    free(b->slot);
    free(b->x_slot);
    free(b->out);
    free(b->capture);
    free(b->store);
    free(b->x_store);
    free(b->sealed);
    free(b->roff);
    free(b->tables);
    free(b->x_tables);
    memset(b, 0, sizeof *b);
}

static int grow_i32(int32_t **a, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    int32_t *t = realloc(*a, n * sizeof *t);
    if (!t)
        return DP_ENOMEM;
    *a = t;
    *cap = n;
    return 0;
}

int batch_buf_tables(dp_batch_buf *b, size_t n, size_t nx)
{
    if (grow_i32(&b->tables, &b->tables_cap, n))
        return DP_ENOMEM;
    return grow_i32(&b->x_tables, &b->x_tables_cap, nx);
}

dp_batch batch_buf_view(const dp_batch_buf *b)
{
    return (dp_batch){.tokens = b->tokens, .pos = b->pos, .seq = b->seq, .slot = b->slot,
                      .seq_store = b->store, .block_tables = b->tables,
                      .out_tokens = b->out, .capture_tokens = b->capture,
                      .x_slot = b->x_slot, .x_seq_store = b->x_store,
                      .x_block_tables = b->x_tables, .seq_sealed = b->sealed,
                      .seq_roff = b->roff};
}
