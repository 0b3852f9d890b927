/* batch.h: the memory a step's dp_batch points into. One dp_batch_buf holds
 * the arrays of the largest step (per token, per output row, per captured
 * query, per sequence), allocated once, and the block tables, grown as a
 * step's sequences need. The engine and every tool that drives the forward
 * pass fill one and hand the backend its view (batch_buf_view). */
#ifndef DP_KERNELS_BATCH_H
#define DP_KERNELS_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

typedef struct dp_batch_buf {
    /* read-only: capacities */
    int32_t max_tokens, max_out, max_seqs, max_capture;
    size_t tables_cap, x_tables_cap; /* entries */
    /* the caller's to fill */
    int32_t *tokens, *pos, *seq, *slot; /* [max_tokens] */
    int32_t *x_slot;                    /* [max_tokens] exempt layers' slots */
    int32_t *out;                       /* [max_out] token indices with logits */
    int32_t *capture;                   /* [max_capture] token indices whose queries are kept */
    uint8_t *store, *x_store;           /* [max_seqs] */
    int32_t *sealed, *roff;             /* [max_seqs] grouped stores' (dp_batch seq_sealed) */
    int32_t *tables, *x_tables;         /* block tables (batch_buf_tables) */
} dp_batch_buf;

/* Zeroed per-sequence arrays; max_capture may be 0 (no captures). */
int batch_buf_init(dp_batch_buf *b, int32_t max_tokens, int32_t max_out, int32_t max_seqs,
                   int32_t max_capture);
void batch_buf_destroy(dp_batch_buf *b);
/* Room for n block-table entries, and nx of the exempt layers' tables. */
int batch_buf_tables(dp_batch_buf *b, size_t n, size_t nx);
/* A batch whose arrays are b's (every count and stride 0: the caller's). */
dp_batch batch_buf_view(const dp_batch_buf *b);

#endif
