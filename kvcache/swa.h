/* swa.h: the sliding-window layers' cache. A model whose layers alternate
 * between a sliding window and global attention (Gemma 3: five window
 * layers of 512 tokens to each global one) keeps those layers in a store
 * and pool of their own. A sequence's table there is indexed by position
 * (entry j: positions [j * bt, (j + 1) * bt)), and a block goes back to the
 * pool as soon as every later token's window has passed it, as llama.cpp's
 * sliding-window cache and vLLM's sliding-window manager do. So a sequence
 * holds at most its window and one step's tokens of those layers however
 * long it runs, and the global layers alone grow with its length.
 *
 * The pool is accounted as the decode path's is: admission promises a
 * sequence what its prompt needs (its window and a chunk at most), taken
 * as its chunks come; once its prompt is done it takes a block as its
 * tokens need one, or waits (DP_ENOSPC) where none is free beyond the
 * others' promises. The KV manager owns it (manager.h). */
#ifndef DP_KVCACHE_SWA_H
#define DP_KVCACHE_SWA_H

#include <stdint.h>

#include "kernels/backend.h"
#include "pool.h"

typedef struct dp_kv_swa {
    dp_kv_pool pool;       /* its blocks, the prefill pool's tokens each */
    dp_kv_store *store;    /* the sliding-window layers only */
    int32_t window;        /* tokens a sliding layer attends to */
    int32_t chunk;         /* a step's tokens of one sequence, at most */
    int32_t reserved;      /* blocks promised to prompts, not yet taken */
} dp_kv_swa;

/* A sequence's table of the sliding layers. Only the manager writes it. */
typedef struct dp_kv_wtab {
    int32_t *blocks;       /* [n] block ids; -1 before lo (given back) */
    int32_t n, cap;
    int32_t lo;            /* entries given back */
    int32_t pos;           /* positions computed (kv_mgr_commit) */
    int32_t prompt;        /* positions its promise covers (its prompt at admission) */
    int32_t promise;       /* blocks promised, not yet taken */
    int32_t peak;          /* ... while the prompt runs, promise + held stays this (the
                            * most it holds at once): blocks the window gives back
                            * return to its promise */
} dp_kv_wtab;

/* The store (layout l, n_blocks of them) and its pool. */
int swa_init(dp_kv_swa *w, dp_backend *be, const dp_kv_layout *l, int32_t window, int32_t chunk);
void swa_destroy(dp_kv_swa *w, dp_backend *be);

/* Blocks of bt tokens a sequence holds at most while its steps add n
 * tokens each: a window's and the step's tokens, over block boundaries
 * (the step's first token reads from its window's first slot on). */
static inline int32_t swa_span_blocks(int32_t window, int32_t bt, int32_t n)
{
    return (window + n - 2) / bt + 2;
}
static inline int32_t swa_blocks_at(const dp_kv_swa *w, int32_t n)
{
    return swa_span_blocks(w->window, w->pool.block_tokens, n);
}
/* The most a sequence holds over its life: a prompt of n_prompt tokens in
 * chunks, then n_more tokens one at a time (never more than its tokens'
 * blocks). */
int32_t swa_need(const dp_kv_swa *w, int64_t n_prompt, int64_t n_more);
/* What a prompt of n_prompt tokens is promised at its admission. */
int32_t swa_prompt_need(const dp_kv_swa *w, int64_t n_prompt);
/* Promises a prompt of n_prompt tokens its blocks and takes those of its
 * first chunk, which runs without a growth (DP_ENOSPC: not now). */
int swa_admit(dp_kv_swa *w, dp_kv_wtab *t, int32_t n_prompt);
/* A parked turn's table continued by a prompt of n_prompt tokens whose
 * first c are its positions: whether the window of position c is still
 * held (else its history is computed again), and the blocks beyond what it
 * holds up to c that the rest of the prompt needs. swa_cut gives back its
 * entries past position c (its parked cache cut to what a prompt matched);
 * swa_resume then promises it that need and takes its first chunk's
 * blocks (DP_ENOSPC: no room, nothing changed). */
bool swa_can_resume(const dp_kv_swa *w, const dp_kv_wtab *t, int32_t c);
int32_t swa_resume_need(const dp_kv_swa *w, const dp_kv_wtab *t, int32_t c, int32_t n_prompt);
void swa_cut(dp_kv_swa *w, dp_kv_wtab *t, int32_t c);
int swa_resume(dp_kv_swa *w, dp_kv_wtab *t, int32_t n_prompt);
/* Blocks for positions [pos, end): from its promise, else from what no one
 * was promised (DP_ENOSPC: none; nothing taken). */
int swa_grow(dp_kv_swa *w, dp_kv_wtab *t, int64_t end);
/* n more positions computed: the blocks no later window reads go back,
 * and a prompt done gives back what it was promised and did not take. */
void swa_commit(dp_kv_swa *w, dp_kv_wtab *t, int32_t n);
/* Gives back what a table was promised and did not take (a turn parked:
 * it takes no more). */
void swa_settle(dp_kv_swa *w, dp_kv_wtab *t);
/* Blocks a table holds. */
static inline int32_t swa_held(const dp_kv_wtab *t) { return t->n - t->lo; }
/* Every block and promise back (the array stays for the next admission). */
void swa_release(dp_kv_swa *w, dp_kv_wtab *t);
/* Frees the array of a released table. */
void swa_tab_destroy(dp_kv_wtab *t);

#endif
