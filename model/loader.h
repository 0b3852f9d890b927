/* loader.h: a model opened whole, for the tools and one-shot mode: the GGUF
 * file, its tokenizer, a backend and the forward pass over it, in that
 * order, and closed in reverse. (The daemon's serving start-up does the
 * same steps on its loader thread, with progress said to systemd between
 * them.) */
#ifndef DP_MODEL_LOADER_H
#define DP_MODEL_LOADER_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf.h"
#include "kernels/backend.h"
#include "llama.h"
#include "tokenizer.h"

typedef struct dp_model_open_opts {
    const char *path;         /* the GGUF file */
    const char *device;       /* backend_create's: "cpu", "cuda", "auto" ... */
    int threads;              /* CPU threads (0: the machine's) */
    int32_t max_tokens;       /* llama_init's: tokens per forward pass at most */
    int32_t max_out;          /* ... and output rows */
    bool tokenizer;           /* open the tokenizer too */
    bool exact_matmul;        /* the CPU's exact f32 matmul (backend set_exact) */
    bool no_graphs;           /* record no CUDA graphs (the daemon's cuda_graphs = false) */
    bool drop_pages;          /* drop the file's tensor pages once the backend holds its
                               * copy of every weight (as the daemon does) */
} dp_model_open_opts;

typedef struct dp_model_files {
    dp_gguf g;
    dp_tokenizer *tok;        /* NULL unless asked for */
    dp_backend *be;
    dp_llama *m;
    bool g_open;
} dp_model_files;

/* Opens o->path whole. On failure everything opened is closed again and
 * err says which step failed ("cannot load model PATH: ...", "tokenizer:
 * ...", or the backend's message). */
int model_open(dp_model_files *mf, const dp_model_open_opts *o, char *err, size_t errsz);
void model_close(dp_model_files *mf);

#endif
