/* cuda_graph.cu: recorded decode steps (CUDA graphs). A decode step of a
 * LLaMA model is ~16 launches per layer, each a few microseconds of CPU and
 * launch latency, against GEMMs that at small batch take about as long: so a
 * step of a given shape is captured once and then replayed with one
 * cudaGraphLaunch. Correctness rests on three rules (kernels/cuda/README.md):
 *
 * 1. A replay reads this step's data through the recorded pointers: the
 *    batch arrays are copied by batch_set into the same device buffer (before
 *    the launch, outside the graph), and the shape that decides their offsets
 *    and every launch size is the key of the recorded step.
 * 2. No pointer a recorded step uses may move: every reallocation of a
 *    scratch buffer and every free drops all of them (cuda_graphs_clear).
 * 3. Nothing inside a recording may synchronize or allocate: a scratch buffer
 *    that would have to grow spoils the recording instead (cuda_scratch_grow),
 *    the step is issued again eagerly, and its shape is never recorded. */
#include <string.h>

#include "cuda_internal.h"

static bool key_eq(const cuda_graph_key *a, const cuda_graph_key *b)
{
    return memcmp(a, b, sizeof *a) == 0;
}

static void entry_drop(cuda_backend *c, cuda_graph_entry *g)
{
    if (g->exec) {
        /* An exec still in flight is freed when it completes. */
        cudaGraphExecDestroy(g->exec);
        c->gstats.evicted++;
        c->gstats.cached--;
    }
    memset(g, 0, sizeof *g);
}

/* Never called between step_begin and step_end of a recording: the only
 * callers inside a step are scratch reallocations, which a recording turns
 * into an abandoned recording instead (cuda_scratch_grow). */
void cuda_graphs_clear(cuda_backend *c)
{
    for (int i = 0; i < CUDA_GRAPH_SLOTS; i++)
        entry_drop(c, &c->graphs[i]);
}

/* The entry for key, or a free / least recently used one reset for it. */
static cuda_graph_entry *entry_for(cuda_backend *c, const cuda_graph_key *key, bool *found)
{
    cuda_graph_entry *victim = NULL;
    for (int i = 0; i < CUDA_GRAPH_SLOTS; i++) {
        cuda_graph_entry *g = &c->graphs[i];
        if (g->state != CUDA_GRAPH_EMPTY && key_eq(&g->key, key)) {
            *found = true;
            return g;
        }
        if (!victim || g->state == CUDA_GRAPH_EMPTY ||
            (victim->state != CUDA_GRAPH_EMPTY && g->last_used < victim->last_used))
            victim = g;
    }
    *found = false;
    entry_drop(c, victim);
    victim->key = *key;
    return victim;
}

static int cuda_step_begin(dp_backend *be, const void *owner, dp_kv_store *const *stores)
{
    cuda_backend *c = cuda_of(be);
    cuda_bind(c);
    cuda_xh_forget(c); /* a replay leaves the fp16 copy in an unknown state */
    c->step_mode = DP_STEP_EAGER;
    c->step_entry = NULL;
    if (c->graph_policy == DP_GRAPHS_OFF || !c->step_graphable || c->failed)
        return DP_STEP_EAGER;
    cuda_graph_key key;
    memset(&key, 0, sizeof key); /* compared with memcmp: no stray padding */
    key.owner = owner;
    for (int i = 0; i < DP_KV_MAX_STORES; i++)
        key.stores[i] = stores[i];
    key.n_tokens = c->n_tokens;
    key.n_seqs = c->n_seqs;
    key.n_out = c->n_out;
    key.max_blocks = c->max_blocks;
    key.max_slots = c->max_slots;
    bool found;
    cuda_graph_entry *g = entry_for(c, &key, &found);
    g->last_used = ++c->graph_clock;
    if (found && g->state == CUDA_GRAPH_READY) {
        cudaError_t e = cudaGraphLaunch(g->exec, c->stream);
        if (e == cudaSuccess) {
            c->gstats.replayed++;
            c->step_mode = DP_STEP_REPLAYED;
            return DP_STEP_REPLAYED;
        }
        /* Not sticky for a launch refused up front: run this step eagerly
         * and never record the shape again. */
        cudaGetLastError();
        cudaGraphExecDestroy(g->exec);
        g->exec = NULL;
        g->state = CUDA_GRAPH_NEVER;
        c->gstats.evicted++;
        c->gstats.cached--;
        dp_log(DP_LOG_WARN, "cuda: graph launch failed (%s); this step shape runs eagerly",
               cudaGetErrorString(e));
        return DP_STEP_EAGER;
    }
    if (found && g->state == CUDA_GRAPH_NEVER)
        return DP_STEP_EAGER;
    if (!found && c->graph_policy == DP_GRAPHS_ON) {
        /* First sighting: an eager run sizes every scratch buffer. */
        g->state = CUDA_GRAPH_SEEN;
        return DP_STEP_EAGER;
    }
    /* Thread-local mode: this thread may not make unsafe calls (sync,
     * allocation) while capturing, other threads are unaffected. */
    cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        cudaGetLastError();
        g->state = CUDA_GRAPH_NEVER;
        return DP_STEP_EAGER;
    }
    g->state = CUDA_GRAPH_SEEN;
    c->step_mode = DP_STEP_RECORD;
    c->step_entry = g;
    c->rec_spoiled = false;
    return DP_STEP_RECORD;
}

static int cuda_step_end(dp_backend *be)
{
    cuda_backend *c = cuda_of(be);
    cuda_xh_forget(c);
    const int mode = c->step_mode;
    c->step_mode = DP_STEP_EAGER;
    if (mode != DP_STEP_RECORD)
        return 0;
    cuda_graph_entry *g = c->step_entry;
    c->step_entry = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    if (e == cudaSuccess && !c->rec_spoiled && graph)
        e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph)
        cudaGraphDestroy(graph);
    if (e != cudaSuccess || c->rec_spoiled || !exec) {
        /* Nothing of the step ran: the caller issues it again. */
        if (e != cudaSuccess) {
            cudaGetLastError();
            dp_log(DP_LOG_WARN, "cuda: recording a decode step failed (%s); it runs eagerly",
                   cudaGetErrorString(e));
        }
        if (exec)
            cudaGraphExecDestroy(exec);
        g->state = CUDA_GRAPH_NEVER;
        c->rec_spoiled = false;
        c->gstats.abandoned++;
        return DP_STEP_RETRY;
    }
    g->exec = exec;
    g->state = CUDA_GRAPH_READY;
    c->gstats.recorded++;
    c->gstats.cached++;
    /* Captured work is only recorded: this step runs now, as a replay. */
    e = cudaGraphLaunch(exec, c->stream);
    if (e != cudaSuccess) {
        cuda_note_error(c, "graph launch", e);
        return c->failed;
    }
    return 0;
}

/* Decode batches are padded to 1, 2, 4 and then multiples of 8 tokens: at
 * most 7 padding rows (GEMMs of a few more rows cost the same weight
 * traffic), and 3 + max_seqs / 8 recordings cover every batch size. Padded
 * whether or not recording is on, so that both give the same bits (cuBLAS
 * may pick another kernel for another row count). */
static int32_t cuda_step_pad(dp_backend *be, int32_t n)
{
    (void)be;
    if (n < 1 || n > CUDA_GRAPH_MAX_TOKENS)
        return n;
    if (n <= 4)
        return n == 3 ? 4 : n;
    return (n + 7) / 8 * 8;
}

static void cuda_step_graphs(dp_backend *be, int policy, dp_graph_stats *st)
{
    cuda_backend *c = cuda_of(be);
    if (policy >= 0 && policy != c->graph_policy) {
        c->graph_policy = policy;
        cuda_graphs_clear(c);
    }
    if (st) {
        *st = c->gstats;
        st->policy = c->graph_policy;
    }
}

void cuda_graph_ops(dp_backend_ops *o)
{
    o->step_begin = cuda_step_begin;
    o->step_end = cuda_step_end;
    o->step_pad = cuda_step_pad;
    o->step_graphs = cuda_step_graphs;
}
