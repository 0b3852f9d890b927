/* check_common.h: the helpers the GPU checks share (check_kernels.c, the
 * op and generation checks; check_bench.c, the benchmark and its memory plan). */
#ifndef DP_TESTS_GPU_CHECK_COMMON_H
#define DP_TESTS_GPU_CHECK_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dp.h"
#include "kernels/backend.h"
#include "model/gguf.h"
#include "tools/synth_gguf.h"

#define EXIT_CHECK 1
#define EXIT_SETUP 2
#define EXIT_NO_DEVICE 3

/* Tolerances: relative L2 error of the CUDA result against the CPU's. fp16
 * storage of weights, activations fed to GEMMs and KV rounds at 2^-11
 * relative; these leave a few times that. */
#define TOL_GEMM 2e-3
#define TOL_ATT 2e-3
#define TOL_EW 1e-3

/* The seed when none is given: the same checks on every run, so that a
 * failure is reproduced by running again (--seed N draws other data). */
#define CHECK_DEFAULT_SEED 1

/* The random stream (xorshift64), the checks run and those that failed. */
extern uint64_t g_rs;
extern int g_failed;
extern int g_checks;

uint64_t rnd64(void);
float frand(void); /* uniform in [-1, 1) */
void fill(float *p, size_t n, float amp);
/* Prints "check_kernels: " fmt (with msg) and exits with code. */
void die(int code, const char *fmt, const char *msg) __attribute__((noreturn));
void *xmalloc(size_t n);
/* a[0 .. n) in a random order (block ids: tables that are not in order). */
void shuffle_ids(int32_t *a, int32_t n);

/* Buffers of n floats on a backend; dev_poison fills one with NaN, so an
 * element an op forgets to write shows. */
float *dev_alloc(dp_backend *be, size_t n);
void dev_put(dp_backend *be, float *d, const float *h, size_t n);
void dev_get(dp_backend *be, float *h, const float *d, size_t n);
void dev_poison(dp_backend *be, float *d, size_t n);
float *dev_from(dp_backend *be, const float *h, size_t n);
/* Waits for the backend's queued work (a download orders after it). */
void dev_wait(dp_backend *be);
/* kv_write of host K and V (nkv floats each) at the batch set last. */
void kv_write_host(dp_backend *be, dp_kv_store *const *st, int32_t layer, const float *k,
                   const float *v, size_t nkv);

/* A new rows x cols weight of type (rows of its row size; the caller frees
 * it): quantized from random values of amplitude amp (synth_quantize_row),
 * or for IQ4_NL and IQ4_XS random bytes under a small f16 scale per block.
 * A shape the type cannot hold ends the run (EXIT_SETUP). */
uint8_t *weight_make(uint32_t type, int64_t rows, int64_t cols, float amp);

/* One comparison: relative L2 error of got against ref, within tol. */
void report(const char *op, const char *what, const float *ref, const float *got, size_t n,
            double tol);

/* One block of kv read to the host: a copy of its bytes (the backend's own
 * image, through pinned memory where the backend has it), *bytes long. */
uint8_t *block_image(dp_backend *be, dp_kv_store *kv, int32_t block, size_t *bytes);
/* One comparison: a and b hold the same n bytes. */
void report_same_bytes(const char *op, const char *what, const void *a, const void *b, size_t n);

/* A batch's host arrays. seq_sealed, seq_roff: NULL (hbatch_alloc) unless
 * the caller points them at [n_seqs] arrays of its own (grouped stores). */
typedef struct hbatch {
    int32_t n_tokens, n_seqs, max_blocks, n_out;
    int32_t *tokens, *pos, *seq, *slot, *tables, *out_tokens;
    uint8_t *seq_store;
    int32_t *seq_sealed, *seq_roff;
} hbatch;

void hbatch_alloc(hbatch *b, int32_t n_tokens, int32_t n_seqs, int32_t max_blocks);
void hbatch_free(hbatch *b);
void hbatch_set(dp_backend *be, const hbatch *h);

/* A LLaMA of a preset shape with seeded random weights, written to memory
 * and opened: every check and the benchmark use one, nothing is downloaded. */
typedef struct synth_model {
    dp_synth_shape sh;
    void *buf;
    dp_gguf g;
} synth_model;

void synth_open(synth_model *sm, const char *preset, uint64_t seed, uint32_t type);
void synth_close(synth_model *sm);

/* A model of g on be (max_tokens per step, max_out logit rows) and, in
 * stores[0], a KV store of n_blocks blocks of bt tokens in its layout (the
 * other stores NULL); model_kv_close frees both. */
typedef struct dp_llama dp_llama;
void model_kv_open(dp_backend *be, const dp_gguf *g, int32_t max_tokens, int32_t max_out, int32_t bt,
                   int32_t n_blocks, dp_llama **m, dp_kv_store **stores);
void model_kv_close(dp_backend *be, dp_llama *m, dp_kv_store **stores);

/* The KV cache's ops (check_kvpath.c): CUDA (be[1]) against the CPU (be[0]). */
void check_attention(dp_backend *be[2]);
void check_capture(dp_backend *be[2]);
void check_kv_saturate(dp_backend *be[2]);
void check_kvpath(dp_backend *be[2], dp_kv_type dtype);
/* The kivi4 decode path (check_kivi.c): groups, residual and attention. */
void check_kivi(dp_backend *be[2]);
/* Sliding-window layers in a store of their own (check_swa.c). */
void check_swa(dp_backend *be[2]);
/* Whole decode runs (check_generate.c): greedy tokens of a synthetic model
 * of weight type with the CPU's tokens fed to both (required: a
 * disagreement at a decisive step fails; else it is reported; the model
 * and prompts come from seed alone), and recorded decode steps against
 * eager issue on fresh CUDA backends (cpu: the reference for the model). */
int check_generation(dp_backend *be[2], const char *preset, uint64_t seed, uint32_t type,
                     bool required);
void check_graphs(dp_backend *cpu);

/* The 7B-shaped benchmark (check_bench.c): runs it on gpu, sized from the
 * device's free memory; small: a miniature that runs the same code in
 * seconds (its figures mean nothing). */
int bench_run(dp_backend *gpu, bool small);
/* The benchmark's memory plan for a device of total_bytes, computed without
 * one (--plan): prints it; 0 when every case fits, 1 when one is skipped. */
int bench_plan_dry(size_t total_bytes, bool small);

#endif
