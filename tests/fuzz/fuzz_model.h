/* fuzz_model.h: the tokenizer and chat template of a tiny synthetic model
 * (tools/synth_gguf: byte-level BPE, ChatML), built once in memory for the
 * fuzz targets that need a vocabulary. */
#ifndef DP_TESTS_FUZZ_MODEL_H
#define DP_TESTS_FUZZ_MODEL_H

#include <stdio.h>
#include <stdlib.h>

#include "common/dp.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tools/synth_gguf.h"

static dp_tokenizer *fuzz_tok;
static dp_chat_template fuzz_tmpl;

static void fuzz_model_init(void)
{
    static dp_gguf g;
    static void *buf;
    size_t size = 0;
    dp_synth_shape shape;
    gguf_writer w;
    char err[DP_ERRLEN];
    dp_log_set_level(DP_LOG_ERROR);
    if (synth_shape_preset("tiny", &shape) || gguf_writer_init(&w) ||
        synth_llama_build(&w, &shape, 1, DP_TYPE_F32, err, sizeof err) ||
        gguf_writer_finish_mem(&w, &buf, &size) || gguf_open_mem(&g, buf, size, err, sizeof err) ||
        tokenizer_init_gguf(&fuzz_tok, &g, err, sizeof err)) {
        fprintf(stderr, "fuzz: cannot build the synthetic model\n");
        abort();
    }
    gguf_writer_destroy(&w);
    if (chat_template_init_model(&fuzz_tmpl, NULL, 0, &g, fuzz_tok, err, sizeof err))
        abort();
}

#endif
