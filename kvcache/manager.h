/* manager.h: the KV manager, the one owner of the two-path KV cache: both
 * pools and their stores, the prefix cache and host tier of the prefill pool,
 * the decode pool's swap space, every reservation, growth, migration and
 * swap. The scheduler decides who runs and asks the manager; the engine runs
 * the forward pass over the tables the manager hands out. The manager knows
 * neither: it works on a dp_kv_seq (a sequence's KV state, embedded in the
 * scheduler's sequence), token arrays and counts.
 *
 * Dualpath off: one pool holds every sequence whole. On: a prompt is
 * prefilled whole in the prefill pool, migrated (compressed) into the decode
 * pool when it ends, and decodes there; decode blocks are taken as tokens
 * are produced, never promised for a whole max_tokens. */
#ifndef DP_KVCACHE_MANAGER_H
#define DP_KVCACHE_MANAGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compress.h"
#include "dprefix.h"
#include "gshare.h"
#include "host.h"
#include "kernels/backend.h"
#include "migrate.h"
#include "pool.h"
#include "prefix.h"
#include "swa.h"
#include "swap.h"

/* Which KV path (and pool) a sequence's cache is on. */
typedef enum dp_path { DP_PATH_PREFILL = 0, DP_PATH_DECODE = 1 } dp_path;

/* A sequence's KV state. Only the manager writes it. */
typedef struct dp_kv_seq {
    bool dual;                /* migrates to the decode path when its prompt ends */
    bool whole_if_room;       /* ... unless, at its admission, one arena holds it whole
                               * beside what others hold and were promised (a later chat
                               * turn, whose whole prompt the next turn asks for) */
    dp_compress_opts copts;   /* its scorer, keep ratio, sinks and window */
    dp_path path;             /* which pool the table lives in */
    dp_block_table table;
    int32_t n_slots;          /* filled entries (== tokens computed on the prefill path,
                               * fewer once compacted on the decode path) */
    int32_t decode_reserve;   /* decode blocks promised at admission, not yet taken */
    int32_t hashed_blocks;    /* prefill blocks named in the prefix cache so far */
    uint64_t chain;           /* name of the last of them */
    dp_swapped swapped;       /* preempted on the decode path: its compact cache */
    int32_t mig_pos;          /* positions migrated to the decode path (0: none) */
    int32_t mig_keep;         /* slots they were compacted to */
    int32_t exact_from;       /* from this position on, position p is at slot
                               * p + mig_keep - mig_pos in every head (the window's) */
    int32_t hist_slots;       /* a turn that continued a parked cache: the slots of that
                               * history, kept as they are at its prompt's end (only
                               * its new text is compacted: 0 for none) */
    int32_t ref_blocks;       /* leading decode-table blocks held by reference: to the
                               * prefill path's (a prefix kept whole; kv_mgr_migrate), or
                               * to a decode-pool share (dshare, kshare) */
    dp_share dshare;          /* the decode-pool share it holds (dprefix.h); on the
                               * prefill path, the one admission joined: slots its
                               * migration will not take */
    dp_share kshare;          /* the kept share (dprefix.h) it named or took at its
                               * migration */
    bool recompressed;        /* compacted again on the decode path since */
    /* A predicted early switch (the path detector switches a repetitive
     * prompt at its first chunk end past the manager's early_min): early_end
     * is its prompt's length (0: none predicted), early_at where the switch
     * happens at the latest, set at admission (0: at the prompt's end). The
     * prompt then holds prefill blocks up to early_at only, and its decode
     * promise the whole prompt in the decode type (the early switch keeps
     * every token; the prompt's end chooses what stays). */
    int32_t early_end, early_at;
    dp_attn_acc attn;         /* SnapKV under a decode budget: what its decode
                               * queries since the last compaction attended to */
    /* Exempt layers (dp_kv_mgr.n_exempt): on the decode path the first
     * layers keep every position, p at x slot p, in x_n slots of xtable
     * (decode-pool blocks of xbt slots each, kv_mgr_x_row); the compact
     * table stays complete in every layer. exempt false: none for this
     * sequence (a request that asked for none). */
    bool exempt;
    /* Its decode type: dp_kv_mgr.dt[dt] (0: the server's decode_kv_type;
     * a request may ask for another, kv_mgr_dtype). */
    uint8_t dt;
    dp_block_table xtable;
    int32_t x_n;
    /* A grouped decode type (kivi4, dp_kv_dtype.group): slots [0, sealed)
     * are whole groups, one decode block each, at the front of the table;
     * slot p >= sealed is entry p - sealed + roff of the residual, the
     * arena blocks (bt slots each) that follow them (backend.h
     * seq_sealed). Both 0 for any other type. */
    int32_t sealed, roff;
    int32_t swapped_x;        /* of swapped.n_blocks, the last ones are xtable's */
    /* The named prompt blocks it left at its migration, protected from
     * eviction until it ends: the next turn of its conversation asks for
     * them (block ids and generations, kvcache/pool.h). */
    struct dp_kv_warm {
        int32_t block;
        uint32_t gen;
    } *warm;
    int32_t n_warm;
    /* The sliding-window layers' table (swa.h), on either path; empty where
     * the manager keeps none apart. */
    dp_kv_wtab w;
} dp_kv_seq;

void kv_seq_init(dp_kv_seq *kv, bool dual, const dp_compress_opts *co);
/* What a request asks of the KV manager, fixed when it is submitted: the
 * one description from which both the submit check ("can it ever fit":
 * kv_mgr_need, kv_mgr_can_fit) and admission build its sequence. */
typedef struct dp_kv_request {
    bool dual;                /* migrates to the decode path when its prompt ends */
    bool whole_if_room;       /* dp_kv_seq.whole_if_room */
    bool exempt;              /* keeps the server's exempt layers (false: none) */
    uint8_t dt;               /* its decode type (kv_mgr_dtype; 0: the server's) */
    int32_t early_end;        /* dp_kv_seq.early_end: a predicted early switch (0: none) */
    dp_compress_opts copts;
} dp_kv_request;
/* kv_seq_init with every field of a request (r NULL: not dual, defaults). */
void kv_seq_init_request(dp_kv_seq *kv, const dp_kv_request *r);
/* Whether two sequences with the same tokens would compact them alike (a
 * kept share of one serves the other; the random scorer is seeded per
 * request and never shares; kept shares are in the server's decode type). */
static inline bool kv_seq_same_compaction(const dp_kv_seq *a, const dp_kv_seq *b)
{
    const dp_compress_opts *x = &a->copts, *y = &b->copts;
    return a->dual && b->dual && x->scorer == y->scorer && x->scorer != DP_SCORER_RANDOM &&
           x->keep_ratio == y->keep_ratio && x->sinks == y->sinks && x->window == y->window &&
           x->prefix == y->prefix && a->dt == 0 && b->dt == 0;
}
/* The sequence must have been freed by kv_mgr_free. */
void kv_seq_destroy(dp_kv_seq *kv);

typedef struct dp_kv_mgr_opts {
    dp_kv_layout prefill;        /* the prefill (or only) pool's layout; n_blocks 0: from kv_bytes */
    dp_kv_layout decode;         /* the decode pool's (dual only); n_blocks 0: from kv_bytes */
    int64_t kv_bytes;            /* both pools, where a block count is 0 */
    bool dual;
    double prefill_fraction;     /* split pools only: the prefill pool's share of kv_bytes ... */
    int32_t ctx_len;             /* ... raised so that it holds one prompt of this many tokens */
    int32_t decode_budget;       /* decode-path slots before recompression (0: off) */
    int32_t budget_floor;        /* slots a recompression never goes below (sinks + window) */
    bool prefix_cache;
    int64_t host_tier_bytes;     /* host copies of evicted prefill blocks (0: none) */
    int64_t swap_bytes;          /* the swap space of preempted decode-path caches (0: none;
                                  * a preempted sequence is then recomputed) */
    bool reuse_replies;          /* kv_mgr_keep_reply writes replies back (needs the prefix cache) */
    int32_t n_layers, n_kv_heads, n_heads, head_dim; /* the model, for scoring */
    /* A predicted early switch (kv_seq.early_end) comes at the first chunk
     * end past early_min prompt tokens; a chunk has early_chunk at most. */
    int32_t early_min, early_chunk;
    /* Finished decode-path caches kept for the next turn (kv_mgr_park; 0:
     * none kept). */
    int32_t max_parked;
    /* Layers [0, exempt_layers) keep every token on the decode path (in the
     * decode type, in tables of their own); needs a shared arena and a
     * backend with kv_view. 0: none. */
    int32_t exempt_layers;
    /* Sliding-window layers kept at their window in a store of their own
     * (swa.h; a model's sliding layers, llama_kv_layer_map): its layout
     * (the prefill type and block tokens, those layers only; n_layers 0:
     * none, every layer in the stores above), their window, and a step's
     * tokens of one sequence at most. Not with exempt layers, the prefix
     * cache or a swap space (parked turns carry the sliding table). */
    dp_kv_layout swa;
    int32_t swa_window, swa_chunk;
} dp_kv_mgr_opts;

/* A type the decode path keeps tokens in: the server's decode_kv_type
 * (dp_kv_mgr.dt[0]) and, in one arena on a backend with KV views, each
 * other type a request may ask for ("dualpath": {"decode_kv_type"}). Each
 * is the arena read as that type (a view; the prefill type's is the arena
 * itself): its blocks are arena blocks, so one free list, one accounting
 * and one swap space serve every type, and a block holds bt tokens of it. */
#define DP_KV_DTYPES DP_KV_TYPE_COUNT
typedef struct dp_kv_dtype {
    dp_kv_type type;
    int32_t bt;                  /* tokens per decode block */
    dp_kv_layout layout;         /* n_blocks: the decode pool's */
    dp_kv_store *store;          /* the decode pool read as this type */
    bool by_ref;                 /* the prefill type in one arena: a decode table can hold
                                  * prefill blocks (a prefix kept whole stays shared) */
    dp_kv_store *xstore;         /* its exempt layers (a folded view), NULL: none */
    int32_t xbt;                 /* slots per exempt-table block */
    dp_kv_store *rscratch;       /* a staged recompression's kept rows (rscratch_blocks) */
    int32_t rscratch_blocks;
    /* Grouped (kivi4): tokens per group, one block of store each; bt is
     * then the arena's (the residual's and the migration's unit: a
     * migration writes the arena's type, by reference where it keeps a
     * prompt's blocks as they are, and whole groups are sealed from it).
     * 0: not grouped. */
    int32_t group;
} dp_kv_dtype;

/* A finished turn's compact cache, kept (held, evicted first when memory
 * is short) for the conversation's next turn: kv_mgr_park. */
typedef struct dp_kv_parked {
    dp_kv_seq kv;      /* on the decode path: its table, shares and mapping */
    int32_t *tokens;   /* [n] the tokens its slots were computed from */
    int32_t n;
    uint64_t stamp;    /* when parked: the oldest goes first */
} dp_kv_parked;

/* The manager. Every field is private: only kvcache/manager.c and mgr_*.c
 * (and the manager's white-box tests) read or write them. Everyone else
 * uses the functions below: the read-only accessors of its geometry,
 * kv_mgr_stats() for its gauges and counters, and its operations. */
typedef struct dp_kv_mgr {
    dp_backend *be;              /* NULL: bookkeeping only (scheduler tests) */
    bool dual;
    dp_kv_pool pool;             /* the prefill path's pool (the only one without dualpath) */
    dp_kv_store *store;
    dp_kv_pool *dpool;           /* the decode path's: &pool when shared, else &dpool_own */
    dp_kv_store *dstore;         /* the server's decode type's (dt[0].store): store when
                                  * shared in the prefill type */
    bool shared;                 /* both paths draw on one arena */
    bool by_ref;                 /* ... in one type: a decode table can hold prefill blocks,
                                  * so a prefix kept whole stays shared (kv_mgr_migrate) */
    int32_t dbt;                 /* tokens per decode-path block of the server's type (more
                                  * than the prefill path's when a shared arena's decode
                                  * type is smaller); dt[kv->dt].bt is a sequence's */
    bool share_front;            /* ... otherwise such a prefix is shared in decode blocks of
                                  * its own, copied once (dpx; the server's type only) */
    dp_dprefix dpx;
    dp_kv_pool dpool_own;
    bool has_pc, has_host, has_swap;
    dp_prefix_cache pc;
    dp_gshare gs;                /* a grouped type's groups sealed from named prefill
                                  * blocks, shared (with the prefix cache only) */
    dp_host_tier host;
    dp_kv_swap swap;
    dp_kv_migrator mig;
    int32_t decode_budget, budget_keep;
    int32_t early_min, early_chunk; /* dp_kv_mgr_opts' */
    dp_kv_dtype dt[DP_KV_DTYPES]; /* the decode types (dt[0]: the server's) */
    int32_t n_dt;
    int32_t decode_reserved;     /* decode blocks promised to sequences, not yet taken */
    size_t prefill_block_bytes, decode_block_bytes;
    /* Counters. */
    int64_t rebuilds;            /* admissions that took back a cached prefix */
    int64_t reused_tokens;       /* tokens so taken */
    int64_t restored_blocks;     /* of which blocks restored from the host tier */
    int64_t decode_recomputes;   /* decode-path preemptions recomputed (swap space full) */
    int64_t reply_blocks;        /* blocks kv_mgr_keep_reply wrote back */
    int64_t staged_recompressions; /* recompressions that found no free blocks (through rscratch) */
    int64_t kept_shared;         /* migrations that took a kept share */
    int64_t sealed_groups;       /* groups written to a grouped decode type */
    bool reuse_replies;
    /* Parked turns (kv_mgr_park), oldest anywhere (stamps order them). */
    dp_kv_parked *parked;
    int32_t n_parked, max_parked;
    int32_t parked_blocks;       /* table blocks the parked caches hold */
    uint32_t *park_cnt;          /* [decode pool blocks] kv_mgr_parked_blocks' scratch (zeros) */
    uint32_t *held_stamp;        /* [decode pool blocks] kv_mgr_held_blocks' marks, where
                                  * groups are shared (gs.name) */
    uint32_t held_epoch;         /* ... the current count's mark */
    uint64_t park_clock;
    int64_t parks;               /* caches parked */
    int64_t resumes;             /* admissions that continued a parked cache */
    int64_t resumed_tokens;      /* tokens they did not compute again */
    int64_t park_evictions;      /* parked caches dropped for room (or by a newer one) */
    int64_t park_spills;         /* parked caches moved to the swap space for room */
    int64_t park_restores;       /* ... and copied back by their next turn */
    /* Exempt layers: n_exempt layers, each decode-pool block holding xfold
     * blocks of them (dt[].xbt slots), through each type's xstore (a folded
     * view of the arena, backend.h kv_view). */
    int32_t n_exempt, xfold;
    /* Sliding-window layers apart (dp_kv_mgr_opts.swa). */
    bool has_swa;
    dp_kv_swa swa;
    size_t swa_block_bytes;
} dp_kv_mgr;

/* The tokens of a group of a grouped KV type (layout l's type and geometry)
 * whose block fits in `bytes`, an arena block: the largest even count up to
 * 256, 0 when none fits. */
int32_t kv_mgr_group_tokens(dp_backend *be, const dp_kv_layout *l, size_t bytes);
/* Whether kv_mgr_init keeps o's grouped decode type (o->decode.type): its
 * groups live in one arena with the prefill path, without a decode budget
 * or exempt layers, a group to an arena block. 0, or the error kv_mgr_init
 * would return, with its message in err (which may be NULL). */
int kv_mgr_check_grouped(dp_backend *be, const dp_kv_mgr_opts *o, char *err, size_t errsz);
/* A grouped sequence seals a group only while its residual keeps at least
 * this many of its newest tokens whole, past the group: the tokens a step
 * attends to most (KIVI's full-precision window). One arena block's worth
 * (bt) cut KL at P = 2048 on the default model from 0.0104 to 0.0082
 * nats/token (docs/dualpath.md). */
static inline int32_t kv_mgr_group_recent(int32_t bt) { return bt; }
/* The slots a grouped sequence of n slots has sealed once every group that
 * may be is (arena blocks of bt tokens, groups of g): 0, or its lead and
 * whole groups short of the recent window. */
static inline int32_t kv_mgr_group_sealed(int32_t bt, int32_t g, int64_t n)
{
    const int64_t w = (int64_t)g + kv_mgr_group_recent(bt);
    return n < bt + w ? 0 : (int32_t)(bt + (n - bt - kv_mgr_group_recent(bt)) / g * g);
}
/* Tokens a decode-path block of the server's type holds (a grouped type's:
 * its group; its residual is in the arena's blocks). */
static inline int32_t kv_mgr_decode_block_tokens(const dp_kv_mgr *m)
{
    return m->dt[0].group ? m->dt[0].group : m->dbt;
}

/* ---- read-only: the manager's geometry, fixed at kv_mgr_init ------------- */

/* Tokens per prefill-path block (the prefix cache's unit). */
static inline int32_t kv_mgr_block_tokens(const dp_kv_mgr *m) { return m->pool.block_tokens; }
/* Blocks of the prefill pool (with dualpath off, or one arena: all of them). */
static inline int32_t kv_mgr_blocks(const dp_kv_mgr *m) { return m->pool.n_blocks; }
/* Whether both paths draw on one arena. */
static inline bool kv_mgr_shared(const dp_kv_mgr *m) { return m->shared; }
/* Whether the manager runs the dual path (a decode pool or view). */
static inline bool kv_mgr_dual(const dp_kv_mgr *m) { return m->dual; }
/* Whether prefill blocks are named and taken back (the prefix cache). */
static inline bool kv_mgr_prefix_cache(const dp_kv_mgr *m) { return m->has_pc; }
/* Decode-path layers kept whole (0: none). */
static inline int32_t kv_mgr_exempt_layers(const dp_kv_mgr *m) { return m->n_exempt; }
/* The decode types this server keeps, as "f16, kivi4" (kv_mgr_dtype's). */
void kv_mgr_dtype_names(const dp_kv_mgr *m, char *buf, size_t size);

/* usage.dualpath's bytes of a sequence on the decode path that kept `kept`
 * of `all` prompt tokens: *bytes, its KV (kept tokens in its decode type,
 * at the arena's bytes per decode token, and every token of its exempt
 * layers), and *bytes_full, the same tokens whole on the prefill path. */
void kv_mgr_seq_bytes(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t kept, int32_t all,
                      int64_t *bytes, int64_t *bytes_full);
/* The kept set a compaction of kv's prefill-path cache to k slots would
 * choose now, by its scorer (compressor_select's arguments and output),
 * without moving anything: the path detector's stability signal. */
int kv_mgr_select(dp_kv_mgr *m, const dp_kv_seq *kv, const dp_compress_opts *co, const float *q,
                  int64_t q_stride, const int32_t *q_slot, int32_t n_q, int32_t k, int32_t *keep);

/* ---- statistics ------------------------------------------------------------ */

/* What the manager reports: its gauges (now) and counters (since start), the
 * one view of its state for the engine's statistics and the metrics. One
 * shared arena: each path's gauge counts the blocks its tables hold, and
 * both totals are the arena's size. */
typedef struct dp_kv_mgr_stats {
    int32_t blocks_total;        /* prefill pool (the only pool without dualpath) */
    int32_t blocks_used;
    int32_t decode_blocks_total; /* decode pool (0 without dualpath) */
    int32_t decode_blocks_used;  /* (parked turns' blocks apart: parked_blocks) */
    int32_t block_tokens, decode_block_tokens;
    bool shared;                 /* both paths in one arena */
    int32_t seqs_on_decode_path; /* of the sequences counted, those decoding on the decode path */
    int32_t exempt_layers;       /* decode-path layers kept whole */
    int32_t exempt_blocks;       /* decode blocks their tables hold now (in decode_blocks_used) */
    int32_t parked_turns;        /* finished turns' compact caches kept now (kv_mgr_park) */
    int32_t parked_blocks;       /* blocks only they hold (not in the blocks_used gauges) */
    int64_t host_tier_blocks;    /* capacity in blocks (0: no host tier) */
    int64_t host_spilled_blocks;
    int64_t swap_bytes;          /* host memory swapped-out caches hold now */
    int64_t swap_space_bytes;    /* the swap space, allocated at start-up (0: none) */
    int64_t parked_host_bytes;   /* ... and the parked turns spilled there */
    int64_t rebuilds;            /* admissions that took back a cached prefix */
    int64_t rebuild_prefix_tokens; /* tokens taken from blocks still in the pool */
    int64_t rebuild_host_tokens; /* tokens restored from the host tier */
    int64_t reply_blocks_kept;   /* decode-path blocks written back for the next turn */
    int64_t kept_shares;         /* migrations that took a kept share */
    int64_t turns_parked;        /* turns parked so far */
    int64_t turns_resumed;       /* admissions that continued one */
    int64_t resumed_tokens;      /* tokens of history those did not compute again */
    int64_t parked_evictions;    /* parked caches dropped for room */
    int64_t parked_spills;       /* ... moved to the swap space for room */
    int64_t parked_restores;     /* ... and copied back by their next turn */
    int64_t swap_outs, swap_ins; /* decode-path preemptions: compact caches to host and back */
    int64_t decode_recomputes;   /* decode-path preemptions recomputed (swap space full) */
    int64_t recompressions_staged; /* recompressions without free blocks (staged) */
    int64_t groups_sealed;       /* groups written to a grouped decode type (kivi4) */
    int32_t swa_blocks_total;    /* the sliding-window layers' blocks (0: none apart) */
    int32_t swa_blocks_used;     /* ... held by sequences */
    int64_t groups_shared;       /* ... of them, another sequence's taken (gshare.h) */
} dp_kv_mgr_stats;

/* Fills s. The manager keeps no list of the sequences it serves: next(it)
 * names them one at a time (every live sequence, running or not; NULL at
 * the end), for the gauges that count what they hold. */
void kv_mgr_stats(dp_kv_mgr *m, const dp_kv_seq *(*next)(void *it), void *it, dp_kv_mgr_stats *s);

/* be NULL: pools only (no stores, no swap, no migration). The arena is
 * shared unless the layouts differ or the decode pool's size is given
 * (decode.n_blocks > 0). */
int kv_mgr_init(dp_kv_mgr *m, dp_backend *be, const dp_kv_mgr_opts *o, char *err, size_t errsz);
void kv_mgr_destroy(dp_kv_mgr *m);
/* Logs the memory plan: the pools (their blocks, tokens and types), and the
 * host memory beside them (the swap space, the host tier), which counts in
 * the machine's memory (on the CPU, the same RAM as the arena). */
void kv_mgr_log_plan(const dp_kv_mgr *m);
/* The index in m->dt of a decode type (a request's decode_kv_type), or -1
 * where this server cannot keep it (split pools, a backend without KV
 * views, a head size the type cannot hold). */
int kv_mgr_dtype(const dp_kv_mgr *m, dp_kv_type type);

/* What a sequence needs, in blocks of each pool (swa: of the sliding
 * layers', at most at once). */
typedef struct dp_kv_need {
    int32_t prefill;
    int32_t decode;
    int32_t swa;
} dp_kv_need;

/* The one formula for a sequence's need, used by submit ("can this ever
 * fit": n_cached = the prompt, n_more = max_tokens), admission (n_cached =
 * its tokens, n_more = the headroom kv_mgr_admit adds) and the context cap:
 * its cache holds n_cached tokens whole on the prefill path, or compressed
 * on the decode path, and n_more tokens will be appended where it decodes. */
dp_kv_need kv_mgr_need(const dp_kv_mgr *m, const dp_kv_seq *kv, int64_t n_cached, int64_t n_more);
/* Whether a need fits the pools at all (when nothing else runs). */
static inline bool kv_mgr_fits(const dp_kv_mgr *m, dp_kv_need n)
{
    if (m->has_swa && n.swa > m->swa.pool.n_blocks)
        return false;
    if (m->shared) /* at the migration it holds both for a moment */
        return (int64_t)n.prefill + n.decode <= m->pool.n_blocks;
    return n.prefill <= m->pool.n_blocks && (!m->dual || n.decode <= m->dpool->n_blocks);
}

/* Whether a sequence can ever run alone: compressed, or else whole (a
 * sequence whose prompt and compressed copy cannot both fit runs whole on
 * the prefill path, as with dualpath off: correctness never depends on a
 * migration). */
bool kv_mgr_can_fit(const dp_kv_mgr *m, const dp_kv_seq *kv, int64_t n_cached, int64_t n_more);
/* Whether an early switch of a prefill-path sequence finds its decode
 * blocks now (the prompt so far, whole): from its promise, planned at
 * admission (early_at), or else from what no one was promised. One that
 * does not stays on the prefill path and switches at its prompt's end. */
bool kv_mgr_can_switch_early(const dp_kv_mgr *m, const dp_kv_seq *kv);

/* Admits a sequence holding tokens[0..n_tokens) (a swapped-out one comes
 * back through kv_mgr_swap_in instead: DP_EINVAL here); one whose tokens continue a parked turn
 * takes that cache (kv_mgr_park) and is on the decode path, with room for
 * the rest of its prompt there; otherwise the longest cached prefix of
 * tokens[0..n_tokens - tail) is taken back (tail >= 1 leaves the last tokens
 * to compute) and the prefill pool reserves the rest, and the decode pool
 * its compressed size plus a block (less a decode-pool share of its prefix
 * that others hold now). While others run or are about to (busy, the
 * scheduler's: others running or queued, or a burst's last step) a
 * watermark of decode blocks stays free and a later chat turn is not run
 * whole (whole_if_room). Returns 0 and sets *reused (the tokens already
 * in the cache), or DP_ENOSPC: nothing changed. */
int kv_mgr_admit(dp_kv_mgr *m, dp_kv_seq *kv, const int32_t *tokens, int32_t n_tokens,
                 int32_t tail, bool busy, int32_t *reused);
/* Grows the sequence's table by n slots in its pool (on the decode path its
 * admission promise first). DP_ENOSPC when the pool is short. */
int kv_mgr_grow(dp_kv_mgr *m, dp_kv_seq *kv, int32_t n);
/* n more slots of the sequence were filled by a step: full prefill blocks
 * are named in the prefix cache (tokens: the sequence's, from the start). */
void kv_mgr_commit(dp_kv_mgr *m, dp_kv_seq *kv, const int32_t *tokens, int32_t n);

/* One sequence of kv_mgr_migrate. */
typedef struct dp_kv_migration {
    dp_kv_seq *kv;            /* on the prefill path (a migration) or the decode path (a recompression) */
    const int32_t *tokens;    /* its tokens from the start (a migration shares the prefix it
                               * keeps whole with other sequences through them; NULL: no) */
    int32_t n_keep;           /* slots kept */
    const float *q;           /* SnapKV: captured queries of its last n_q slots (dp_kv_move) */
    int64_t q_stride;
    int32_t n_q;
    bool share_kept;          /* a migration: others with the same tokens may migrate while
                               * this one decodes, so its compaction is named for them */
    int32_t pos;              /* a compaction on the decode path at a prompt's end: the
                               * prompt's length (positions its slots then stand for, the
                               * reply's following in order); 0: a recompression */
    int rc;                   /* out: 0 when kv now holds n_keep slots on the decode path */
    dp_scorer scorer;         /* out: the scorer that ran */
    int32_t n_ref;            /* out: of n_keep, slots kept by reference (not copied) */
    bool lost;                /* out: a failed staged recompression lost its cache (the
                               * sequence must fail; cannot happen short of a device error) */
} dp_kv_migration;

/* Moves each sequence's kept slots into new decode-pool tables (one backend
 * call per source pool) and frees what they held. In one arena of one type
 * (by_ref) the whole blocks of a prefix kept whole (dp_compress_opts.prefix)
 * are not copied: the new table starts with the same blocks, so sequences
 * whose prompts share a system prompt through the prefix cache keep sharing
 * it on the decode path, as they would with dualpath off. Elsewhere (a
 * quantized decode type, or pools of different block sizes) the first
 * sequence's copy of the prefix, in whole decode blocks, is shared by the
 * next ones whose tokens start the same (dprefix.h): the rest of the prefix
 * is copied (the same kept tokens, the same output). A sequence the decode pool
 * has no room for keeps its cache as it was (rc DP_ENOSPC); correctness never
 * depends on a migration. Returns how many moved. */
int32_t kv_mgr_migrate(dp_kv_mgr *m, dp_kv_migration *mg, int32_t n);

/* Preemption of a running sequence: a decode-path cache goes to the swap
 * space (returns 0; it comes back as it was at the next admission); any
 * other (or one the swap space cannot take) is freed, DP_ENOSPC, and the
 * sequence must be recomputed from its tokens. */
int kv_mgr_swap_out(dp_kv_mgr *m, dp_kv_seq *kv);
/* Restores a swapped-out cache with room for its next token. */
int kv_mgr_swap_in(dp_kv_mgr *m, dp_kv_seq *kv, bool busy);
/* A decode-path sequence ends: the K/V of its last tokens (its prompt's
 * tail, which the window keeps whole, and its reply) are copied into new
 * prefill blocks named in the prefix cache, so that the next turn of the
 * conversation (prompt + reply + new text) takes them back instead of
 * recomputing the reply. They are the K/V the sequence computed over its
 * compressed cache, the ones its reply was written with, not those a full
 * recompute would give, and with a quantized decode path they are its
 * dequantized rows (reuse_replies = false keeps every turn exact).
 * tokens[0..n_computed): the sequence's tokens. Best effort: without free
 * blocks, or after a recompression, nothing is kept. Call before kv_mgr_free. */
void kv_mgr_keep_reply(dp_kv_mgr *m, dp_kv_seq *kv, const int32_t *tokens, int32_t n_computed);
/* A decode-path sequence ends (tokens[0..n_computed) computed): its
 * compact cache is parked, whole, for the next turn of its conversation
 * instead of freed. kv_mgr_admit continues it for a prompt that starts with
 * the tokens it holds past its last compaction's prompt (the previous
 * prompt and the reply, as the chat template renders them again): the
 * history is not computed again and stays compressed (in the decode type);
 * only the new text runs, on the decode path, and the prompt's end
 * compacts that new text to its keep ratio, the history kept as it was
 * (hist_slots, kv_seq_prompt_end_opts; DP_COMPACT_PROMPT_END in the
 * engine). Parked caches hold their blocks until an admission, a growth or
 * a migration needs them: the oldest are dropped first, before anyone
 * running is preempted. Returns true when parked (kv is left empty; free it
 * as usual). Not parked: a cache recompressed under a decode budget, one
 * swapped out, one whose slots do not hold its tokens in order past its
 * compaction. */
bool kv_mgr_park(dp_kv_mgr *m, dp_kv_seq *kv, const int32_t *tokens, int32_t n_computed);
/* Blocks that only parked turns hold (what dropping them all would free,
 * shares of theirs included). */
int32_t kv_mgr_parked_blocks(dp_kv_mgr *m);
/* Decode-path blocks that running sequences hold, for the gauges: call
 * kv_mgr_held_begin, then kv_mgr_held_blocks for each sequence on the
 * decode path; the sum counts each block once, though a kivi4 group sealed
 * from a shared prompt sits in several tables (gshare.h), and leaves out
 * blocks held by reference (the prefill path's or a share's). */
void kv_mgr_held_begin(dp_kv_mgr *m);
int32_t kv_mgr_held_blocks(dp_kv_mgr *m, const dp_kv_seq *kv);
/* Host memory of the swap space that parked turns' spills hold. */
size_t kv_mgr_parked_host_bytes(const dp_kv_mgr *m);
/* Whether kv_mgr_admit would continue a parked cache for tokens[0..n) (a
 * waiting sequence then needs no one's prompt blocks). */
bool kv_mgr_can_resume(const dp_kv_mgr *m, const dp_kv_seq *kv, const int32_t *tokens, int32_t n,
                       int32_t tail);
/* The sequence's cache is not to be trusted (a failed step): nothing of it
 * is kept for a next turn. */
static inline void kv_seq_forget_reply(dp_kv_seq *kv) { kv->mig_pos = 0; }
/* Frees everything the sequence holds or was promised (finished, cancelled). */
void kv_mgr_free(dp_kv_mgr *m, dp_kv_seq *kv);

/* Decode-pool blocks kept free at admission while sequences run. */
int32_t kv_mgr_watermark(const dp_kv_mgr *m);
static inline dp_kv_pool *kv_mgr_pool_of(dp_kv_mgr *m, const dp_kv_seq *kv)
{
    return kv->path == DP_PATH_DECODE ? m->dpool : &m->pool;
}
/* The stores as a batch indexes them: the prefill path's, then for each
 * decode type its decode pool's and its exempt layers' (the server's at
 * DP_PATH_DECODE and DP_KV_STORE_EXEMPT). */
#define DP_KV_STORE_EXEMPT 2
/* The sliding-window layers' store, after every decode type's. */
#define DP_KV_STORE_SWA (DP_KV_MAX_STORES - 1)
static inline void kv_mgr_stores(const dp_kv_mgr *m, dp_kv_store **stores)
{
    for (int i = 0; i < DP_KV_MAX_STORES; i++)
        stores[i] = NULL;
    stores[DP_PATH_PREFILL] = m->store;
    for (int i = 0; i < m->n_dt; i++) {
        stores[DP_PATH_DECODE + 2 * i] = m->dt[i].store;
        stores[DP_KV_STORE_EXEMPT + 2 * i] = m->dt[i].xstore;
    }
    if (m->has_swa)
        stores[DP_KV_STORE_SWA] = m->swa.store;
}
/* Whether the sliding-window layers are apart (a batch then maps the
 * layers, backend.h layer_map), and a sequence's table of them: entries
 * [0, n) by position, -1 where given back. */
static inline bool kv_mgr_has_swa(const dp_kv_mgr *m) { return m->has_swa; }
static inline const dp_kv_wtab *kv_seq_wtab(const dp_kv_seq *kv) { return &kv->w; }
/* The store index a batch gives a sequence on a path, and its exempt layers'. */
static inline uint8_t kv_seq_store(const dp_kv_seq *kv, dp_path path)
{
    return path == DP_PATH_PREFILL ? (uint8_t)DP_PATH_PREFILL : (uint8_t)(DP_PATH_DECODE + 2 * kv->dt);
}
static inline uint8_t kv_seq_xstore(const dp_kv_seq *kv)
{
    return (uint8_t)(DP_KV_STORE_EXEMPT + 2 * kv->dt);
}
/* Whether the sequence reads its exempt layers from an exempt table. */
static inline bool kv_seq_has_x(const dp_kv_seq *kv)
{
    return kv->path == DP_PATH_DECODE && kv->xtable.n_blocks > 0;
}
/* The sequence's exempt table as a batch row (block ids in xstore): writes
 * up to cap entries, returns how many it has. */
int32_t kv_mgr_x_row(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t *row, int32_t cap);
/* The decode budget counts the slots after a sequence's prefix (a prefix
 * kept whole is never recompressed). */
static inline int32_t kv_seq_prefix(const dp_kv_seq *kv)
{
    return kv->copts.prefix > kv->copts.sinks ? kv->copts.prefix : 0;
}
/* Whether a decode-path sequence is over the budget ... */
static inline bool kv_mgr_over_budget(const dp_kv_mgr *m, const dp_kv_seq *kv)
{
    return m->decode_budget > 0 && kv->path == DP_PATH_DECODE && !m->dt[kv->dt].group &&
           kv->n_slots - kv_seq_prefix(kv) >= m->decode_budget;
}
/* ... and the slots its recompression keeps (the budget less a quarter). */
static inline int32_t kv_mgr_budget_keep(const dp_kv_mgr *m, const dp_kv_seq *kv)
{
    return kv_seq_prefix(kv) + m->budget_keep;
}
/* k slots kept of n, under a decode budget no more than a recompression
 * would keep (else the first decode step would recompress it again, before
 * any decode query). */
static inline int32_t kv_mgr_budget_cap(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t k, int32_t n)
{
    if (m->decode_budget > 0 && k > kv_mgr_budget_keep(m, kv)) {
        int32_t b = kv_mgr_budget_keep(m, kv);
        k = b < n ? b : n;
    }
    return k;
}
/* Slots a prompt of n tokens keeps at its migration: its compressed size,
 * capped under a decode budget. */
static inline int32_t kv_mgr_migration_keep(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t n)
{
    return kv_mgr_budget_cap(m, kv, compress_n_keep(&kv->copts, n), n);
}
/* The options a compaction at a prompt's end on the decode path runs with:
 * the sequence's, with the parked history of a resumed turn (hist_slots)
 * kept whole at the front. That history was chosen when its own turn
 * ended; scored again by a new turn's queries, which do not ask about it,
 * it lost what the user had said, turn after turn (multi-turn recall,
 * docs/dualpath.md). */
static inline dp_compress_opts kv_seq_prompt_end_opts(const dp_kv_seq *kv)
{
    dp_compress_opts co = kv->copts;
    if (kv->hist_slots > co.prefix && kv->hist_slots > co.sinks)
        co.prefix = kv->hist_slots;
    return co;
}
/* Slots a resumed turn keeps at its prompt's end (n_slots now): its history,
 * and its new text compressed as a prompt of its own; as a migration, no
 * more than a recompression under a decode budget would keep. */
static inline int32_t kv_mgr_prompt_end_keep(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t n_prompt)
{
    if (kv->hist_slots <= 0)
        return kv_mgr_migration_keep(m, kv, n_prompt);
    const dp_compress_opts co = kv_seq_prompt_end_opts(kv);
    return kv_mgr_budget_cap(m, kv, compress_n_keep(&co, kv->n_slots), kv->n_slots);
}
/* SnapKV under a decode budget scores its recompression with the sequence's
 * last `window` decode queries: whether the query of its next token is one
 * of them (it is on the decode path, within `window` tokens of the budget). */
static inline bool kv_mgr_wants_query(const dp_kv_mgr *m, const dp_kv_seq *kv)
{
    return m->decode_budget > 0 && kv->path == DP_PATH_DECODE && kv->dual && !m->dt[kv->dt].group &&
           kv->copts.scorer == DP_SCORER_SNAPKV && kv->copts.window > 0 &&
           kv->n_slots - kv_seq_prefix(kv) + kv->copts.window >= m->decode_budget;
}
/* Adds the attention of the query of the token just computed at `slot` (backend
 * memory, layer l's at q + l * q_stride, as llama_captured_queries lays them
 * out) to the sums its next recompression scores with. */
int kv_mgr_note_query(dp_kv_mgr *m, dp_kv_seq *kv, const float *q, int64_t q_stride, int32_t slot);

#endif
