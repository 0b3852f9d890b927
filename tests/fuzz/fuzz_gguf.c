/* fuzz_gguf.c: libFuzzer entry point for the GGUF reader: any input must open
 * cleanly (every tensor and string in bounds) or fail with a one-line message.
 *
 * Built by tests/fuzz/meson.build; tests/fuzz/run.sh fuzzes it, adding a
 * dp-synth model to the seeds: a corpus of small valid files finds the deep
 * paths much faster than starting from nothing. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "model/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dp_gguf g;
    char err[DP_ERRLEN];
    err[0] = '\0';
    if (gguf_open_mem(&g, data, size, err, sizeof err) != 0) {
        if (err[0] == '\0' || strchr(err, '\n'))
            abort();
        return 0;
    }
    volatile uint8_t sink = 0;
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const dp_gguf_tensor *t = &g.tensors[i];
        const uint8_t *p = t->data;
        if (p < data || t->nbytes > size || (size_t)(p - data) > size - t->nbytes)
            abort();
        if (t->nbytes) {
            sink ^= p[0];
            sink ^= p[t->nbytes - 1];
        }
    }
    for (uint64_t i = 0; i < g.n_kv; i++) {
        const dp_gguf_kv *kv = &g.kv[i];
        if (kv->type != DP_GGUF_ARRAY)
            continue;
        for (uint64_t k = 0; k < kv->arr_n && k < 1024; k++) {
            if (kv->arr_type == DP_GGUF_STRING) {
                dp_gguf_str s = gguf_arr_str(kv, k);
                if (s.len)
                    sink ^= (uint8_t)s.ptr[s.len - 1];
            } else {
                sink ^= (uint8_t)gguf_arr_i64(kv, k);
                sink ^= (uint8_t)(gguf_arr_f64(kv, k) > 0);
            }
        }
    }
    (void)sink;
    gguf_close(&g);
    return 0;
}
