/* loader.c: a model opened whole (loader.h). */
#include "loader.h"

#include <stdio.h>
#include <string.h>

#include "common/dp.h"

int model_open(dp_model_files *mf, const dp_model_open_opts *o, char *err, size_t errsz)
{
    memset(mf, 0, sizeof *mf);
    char e2[DP_ERRLEN];
    int rc = gguf_open(&mf->g, o->path, e2, sizeof e2);
    if (rc) {
        dp_err(err, errsz, rc, "cannot load model %s: %s", o->path, e2);
        return rc;
    }
    mf->g_open = true;
    if (o->tokenizer && (rc = tokenizer_init_gguf(&mf->tok, &mf->g, e2, sizeof e2))) {
        dp_err(err, errsz, rc, "model %s: tokenizer: %s", o->path, e2);
        goto fail;
    }
    if ((rc = backend_create(&mf->be, o->device, o->threads, err, errsz)))
        goto fail;
    if (mf->be->ops->set_exact && o->exact_matmul)
        mf->be->ops->set_exact(mf->be, true);
    if (mf->be->ops->step_graphs && o->no_graphs)
        mf->be->ops->step_graphs(mf->be, DP_GRAPHS_OFF, NULL);
    if ((rc = llama_init(&mf->m, &mf->g, mf->be, o->max_tokens, o->max_out, e2, sizeof e2))) {
        dp_err(err, errsz, rc, "cannot load model %s: %s", o->path, e2);
        goto fail;
    }
    if (o->drop_pages) /* the backend holds its own copy of every weight */
        gguf_drop_tensor_pages(&mf->g);
    return 0;
fail:
    model_close(mf);
    return rc;
}

void model_close(dp_model_files *mf)
{
    llama_destroy(mf->m);
    backend_destroy(mf->be);
    tokenizer_destroy(mf->tok);
    if (mf->g_open)
        gguf_close(&mf->g);
    memset(mf, 0, sizeof *mf);
}
