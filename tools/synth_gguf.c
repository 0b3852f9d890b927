/* synth_gguf.c: the GGUF writer (metadata serialization, data layout, streamed
 * output) and the seeded synthetic LLaMA model built with it. */
#include "synth_gguf.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

/* ====================================================================== */
/* writer                                                                 */
/* ====================================================================== */

#define GGUF_MAGIC_BYTES "GGUF"

static int w_fail(gguf_writer *w, int code)
{
    if (!w->err)
        w->err = code;
    return code;
}

int gguf_writer_init(gguf_writer *w)
{
    memset(w, 0, sizeof *w);
    w->version = 3;
    w->alignment = 32;
    return 0;
}

void gguf_writer_destroy(gguf_writer *w)
{
    if (!w)
        return;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
        free(w->tensors[i].fill_ctx);
    }
    free(w->tensors);
    free(w->kv);
    memset(w, 0, sizeof *w);
}

void gguf_writer_set_version(gguf_writer *w, uint32_t version) { w->version = version; }

static int kv_reserve(gguf_writer *w, size_t more)
{
    if (w->err)
        return w->err;
    if (more > SIZE_MAX / 2 - w->kv_len)
        return w_fail(w, DP_ERANGE);
    if (w->kv_len + more <= w->kv_cap)
        return 0;
    size_t cap = w->kv_cap ? w->kv_cap : 256;
    while (cap < w->kv_len + more)
        cap *= 2;
    uint8_t *p = realloc(w->kv, cap);
    if (!p)
        return w_fail(w, DP_ENOMEM);
    w->kv = p;
    w->kv_cap = cap;
    return 0;
}

static int kv_put(gguf_writer *w, const void *p, size_t n)
{
    int rc = kv_reserve(w, n);
    if (rc)
        return rc;
    if (n)
        memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return 0;
}

static int kv_put_u32(gguf_writer *w, uint32_t v) { return kv_put(w, &v, 4); }
static int kv_put_u64(gguf_writer *w, uint64_t v) { return kv_put(w, &v, 8); }

static int kv_put_str(gguf_writer *w, const char *s, size_t len)
{
    int rc = kv_put_u64(w, len);
    return rc ? rc : kv_put(w, s, len);
}

/* Key and type; the caller appends the value. */
static int kv_begin(gguf_writer *w, const char *key, uint32_t type)
{
    if (!key)
        return w_fail(w, DP_EINVAL);
    int rc = kv_put_str(w, key, strlen(key));
    if (!rc)
        rc = kv_put_u32(w, type);
    if (!rc)
        w->n_kv++;
    return rc;
}

static int add_scalar(gguf_writer *w, const char *key, uint32_t type, const void *v, size_t n)
{
    int rc = kv_begin(w, key, type);
    return rc ? rc : kv_put(w, v, n);
}

int gguf_writer_add_u8(gguf_writer *w, const char *key, uint8_t v) { return add_scalar(w, key, DP_GGUF_U8, &v, 1); }
int gguf_writer_add_i8(gguf_writer *w, const char *key, int8_t v) { return add_scalar(w, key, DP_GGUF_I8, &v, 1); }
int gguf_writer_add_u16(gguf_writer *w, const char *key, uint16_t v) { return add_scalar(w, key, DP_GGUF_U16, &v, 2); }
int gguf_writer_add_i16(gguf_writer *w, const char *key, int16_t v) { return add_scalar(w, key, DP_GGUF_I16, &v, 2); }
int gguf_writer_add_i32(gguf_writer *w, const char *key, int32_t v) { return add_scalar(w, key, DP_GGUF_I32, &v, 4); }
int gguf_writer_add_u64(gguf_writer *w, const char *key, uint64_t v) { return add_scalar(w, key, DP_GGUF_U64, &v, 8); }
int gguf_writer_add_i64(gguf_writer *w, const char *key, int64_t v) { return add_scalar(w, key, DP_GGUF_I64, &v, 8); }
int gguf_writer_add_f32(gguf_writer *w, const char *key, float v) { return add_scalar(w, key, DP_GGUF_F32, &v, 4); }
int gguf_writer_add_f64(gguf_writer *w, const char *key, double v) { return add_scalar(w, key, DP_GGUF_F64, &v, 8); }

int gguf_writer_add_u32(gguf_writer *w, const char *key, uint32_t v)
{
    /* The layout follows the key so that a file written with it is valid. */
    if (key && strcmp(key, "general.alignment") == 0 && v && (v & (v - 1)) == 0)
        w->alignment = v;
    return add_scalar(w, key, DP_GGUF_U32, &v, 4);
}

int gguf_writer_add_bool(gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v ? 1 : 0;
    return add_scalar(w, key, DP_GGUF_BOOL, &b, 1);
}

int gguf_writer_set_alignment(gguf_writer *w, uint32_t alignment)
{
    if (!alignment || (alignment & (alignment - 1)))
        return w_fail(w, DP_EINVAL);
    return gguf_writer_add_u32(w, "general.alignment", alignment);
}

int gguf_writer_add_str_n(gguf_writer *w, const char *key, const char *v, size_t len)
{
    int rc = kv_begin(w, key, DP_GGUF_STRING);
    return rc ? rc : kv_put_str(w, v, len);
}

int gguf_writer_add_str(gguf_writer *w, const char *key, const char *v)
{
    return gguf_writer_add_str_n(w, key, v ? v : "", v ? strlen(v) : 0);
}

static size_t elem_size(uint32_t t)
{
    switch (t) {
    case DP_GGUF_U8: case DP_GGUF_I8: case DP_GGUF_BOOL: return 1;
    case DP_GGUF_U16: case DP_GGUF_I16: return 2;
    case DP_GGUF_U32: case DP_GGUF_I32: case DP_GGUF_F32: return 4;
    case DP_GGUF_U64: case DP_GGUF_I64: case DP_GGUF_F64: return 8;
    default: return 0;
    }
}

int gguf_writer_add_arr(gguf_writer *w, const char *key, uint32_t elem_type, uint64_t n, const void *elems)
{
    size_t es = elem_size(elem_type);
    if (!es || (n && !elems) || n > SIZE_MAX / es)
        return w_fail(w, DP_EINVAL);
    int rc = kv_begin(w, key, DP_GGUF_ARRAY);
    if (!rc)
        rc = kv_put_u32(w, elem_type);
    if (!rc)
        rc = kv_put_u64(w, n);
    if (!rc)
        rc = kv_put(w, elems, (size_t)n * es);
    return rc;
}

int gguf_writer_add_arr_i32(gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
    return gguf_writer_add_arr(w, key, DP_GGUF_I32, n, v);
}

int gguf_writer_add_arr_f32(gguf_writer *w, const char *key, const float *v, uint64_t n)
{
    return gguf_writer_add_arr(w, key, DP_GGUF_F32, n, v);
}

int gguf_writer_add_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n)
{
    if (n && !strs)
        return w_fail(w, DP_EINVAL);
    int rc = kv_begin(w, key, DP_GGUF_ARRAY);
    if (!rc)
        rc = kv_put_u32(w, DP_GGUF_STRING);
    if (!rc)
        rc = kv_put_u64(w, n);
    for (uint64_t i = 0; i < n && !rc; i++)
        rc = kv_put_str(w, strs[i] ? strs[i] : "", strs[i] ? strlen(strs[i]) : 0);
    return rc;
}

int gguf_writer_add_raw(gguf_writer *w, const char *key, uint32_t type, const void *value, size_t len)
{
    int rc = kv_begin(w, key, type);
    return rc ? rc : kv_put(w, value, len);
}

static int tensor_new(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *ne,
                      gguf_writer_tensor **out)
{
    if (w->err)
        return w->err;
    if (!name || !ne || n_dims == 0 || n_dims > DP_GGUF_MAX_DIMS)
        return w_fail(w, DP_EINVAL);
    gguf_writer_tensor t = {0};
    t.type = type;
    t.n_dims = n_dims;
    uint64_t rows = 1;
    for (uint32_t d = 0; d < DP_GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (d > 0) {
            if (t.ne[d] && rows > UINT64_MAX / t.ne[d])
                return w_fail(w, DP_ERANGE);
            rows *= t.ne[d];
        }
    }
    int rc = quant_row_bytes(type, t.ne[0], &t.row_bytes);
    if (rc)
        return w_fail(w, rc);
    if (t.row_bytes && rows > UINT64_MAX / t.row_bytes)
        return w_fail(w, DP_ERANGE);
    t.n_rows = rows;
    t.nbytes = rows * t.row_bytes;
    if (w->n_tensors == w->tensors_cap) {
        uint64_t cap = w->tensors_cap ? w->tensors_cap * 2 : 16;
        gguf_writer_tensor *p = realloc(w->tensors, (size_t)cap * sizeof *p);
        if (!p)
            return w_fail(w, DP_ENOMEM);
        w->tensors = p;
        w->tensors_cap = cap;
    }
    t.name = strdup(name);
    if (!t.name)
        return w_fail(w, DP_ENOMEM);
    w->tensors[w->n_tensors] = t;
    *out = &w->tensors[w->n_tensors++];
    return 0;
}

int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *ne,
                           const void *data)
{
    gguf_writer_tensor *t;
    int rc = tensor_new(w, name, type, n_dims, ne, &t);
    if (rc)
        return rc;
    if (t->nbytes > SIZE_MAX)
        return w_fail(w, DP_ERANGE);
    t->data = data ? malloc(t->nbytes ? (size_t)t->nbytes : 1) : calloc(1, t->nbytes ? (size_t)t->nbytes : 1);
    if (!t->data)
        return w_fail(w, DP_ENOMEM);
    if (data && t->nbytes)
        memcpy(t->data, data, (size_t)t->nbytes);
    return 0;
}

int gguf_writer_add_tensor_fill(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                const uint64_t *ne, gguf_fill_fn fill, const void *ctx, size_t ctx_size)
{
    if (!fill)
        return w_fail(w, DP_EINVAL);
    gguf_writer_tensor *t;
    int rc = tensor_new(w, name, type, n_dims, ne, &t);
    if (rc)
        return rc;
    t->fill = fill;
    t->fill_ctx = malloc(ctx_size ? ctx_size : 1);
    if (!t->fill_ctx)
        return w_fail(w, DP_ENOMEM);
    if (ctx_size)
        memcpy(t->fill_ctx, ctx, ctx_size);
    return 0;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Assigns offsets and returns the header size (magic .. padding) and the data
 * size (all tensors, each padded to the alignment). */
static int layout(gguf_writer *w, uint64_t *header, uint64_t *data)
{
    if (w->err)
        return w->err;
    uint64_t h = 4 + 4 + 8 + 8 + w->kv_len;
    uint64_t off = 0;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        gguf_writer_tensor *t = &w->tensors[i];
        h += 8 + strlen(t->name) + 4 + 8ull * t->n_dims + 4 + 8;
        t->offset = off;
        if (t->nbytes > UINT64_MAX - off - w->alignment)
            return w_fail(w, DP_ERANGE);
        off = align_up(off + t->nbytes, w->alignment);
    }
    *header = align_up(h, w->alignment);
    *data = off;
    return 0;
}

/* Output sink: a memory buffer or a FILE. */
typedef struct sink {
    uint8_t *mem;
    size_t pos;
    FILE *f;
} sink;

static int sink_put(sink *s, const void *p, size_t n)
{
    if (s->f)
        return fwrite(p, 1, n, s->f) == n ? 0 : DP_EIO;
    memcpy(s->mem + s->pos, p, n);
    s->pos += n;
    return 0;
}

static int sink_zeros(sink *s, uint64_t n)
{
    static const uint8_t z[64];
    while (n) {
        size_t k = n > sizeof z ? sizeof z : (size_t)n;
        int rc = sink_put(s, z, k);
        if (rc)
            return rc;
        n -= k;
    }
    return 0;
}

static int emit(gguf_writer *w, sink *s, uint64_t header)
{
    uint64_t n_t = w->n_tensors, n_kv = w->n_kv;
    int rc = sink_put(s, GGUF_MAGIC_BYTES, 4);
    if (!rc) rc = sink_put(s, &w->version, 4);
    if (!rc) rc = sink_put(s, &n_t, 8);
    if (!rc) rc = sink_put(s, &n_kv, 8);
    if (!rc && w->kv_len) rc = sink_put(s, w->kv, w->kv_len);
    uint64_t h = 24 + w->kv_len;
    for (uint64_t i = 0; i < n_t && !rc; i++) {
        const gguf_writer_tensor *t = &w->tensors[i];
        uint64_t len = strlen(t->name);
        rc = sink_put(s, &len, 8);
        if (!rc) rc = sink_put(s, t->name, (size_t)len);
        if (!rc) rc = sink_put(s, &t->n_dims, 4);
        if (!rc) rc = sink_put(s, t->ne, 8 * (size_t)t->n_dims);
        if (!rc) rc = sink_put(s, &t->type, 4);
        if (!rc) rc = sink_put(s, &t->offset, 8);
        h += 8 + len + 4 + 8ull * t->n_dims + 4 + 8;
    }
    if (!rc)
        rc = sink_zeros(s, header - h);
    /* Data: fill-backed tensors are produced in chunks of about 8 MB. */
    uint8_t *chunk = NULL;
    size_t chunk_cap = 0;
    for (uint64_t i = 0; i < n_t && !rc; i++) {
        const gguf_writer_tensor *t = &w->tensors[i];
        if (t->data) {
            rc = sink_put(s, t->data, (size_t)t->nbytes);
        } else {
            uint64_t per = t->row_bytes ? (8u << 20) / t->row_bytes : 1;
            if (per == 0)
                per = 1;
            if (per > t->n_rows)
                per = t->n_rows;
            if (per * t->row_bytes > SIZE_MAX) {
                rc = DP_ERANGE;
                break;
            }
            size_t need = (size_t)(per * t->row_bytes);
            if (need > chunk_cap) {
                uint8_t *p = realloc(chunk, need);
                if (!p) {
                    rc = DP_ENOMEM;
                    break;
                }
                chunk = p;
                chunk_cap = need;
            }
            for (uint64_t r = 0; r < t->n_rows && !rc; r += per) {
                uint64_t nr = t->n_rows - r < per ? t->n_rows - r : per;
                rc = t->fill(t->fill_ctx, r, nr, chunk);
                if (!rc)
                    rc = sink_put(s, chunk, (size_t)(nr * t->row_bytes));
            }
        }
        if (!rc)
            rc = sink_zeros(s, align_up(t->nbytes, w->alignment) - t->nbytes);
    }
    free(chunk);
    return rc;
}

int gguf_writer_finish_mem(gguf_writer *w, void **buf, size_t *size)
{
    uint64_t header, data;
    int rc = layout(w, &header, &data);
    if (rc)
        return rc;
    if (header > SIZE_MAX - data)
        return DP_ERANGE;
    size_t total = (size_t)(header + data);
    sink s = {.mem = malloc(total ? total : 1)};
    if (!s.mem)
        return DP_ENOMEM;
    rc = emit(w, &s, header);
    if (rc) {
        free(s.mem);
        return rc;
    }
    *buf = s.mem;
    *size = total;
    return 0;
}

int gguf_writer_write_file(gguf_writer *w, const char *path)
{
    uint64_t header, data;
    int rc = layout(w, &header, &data);
    if (rc)
        return rc;
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp)
        return DP_ENOMEM;
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    sink s = {.f = fopen(tmp, "wb")};
    if (!s.f) {
        free(tmp);
        return DP_EIO;
    }
    rc = emit(w, &s, header);
    if (fclose(s.f) != 0 && !rc)
        rc = DP_EIO;
    if (!rc && rename(tmp, path) != 0)
        rc = DP_EIO;
    if (rc)
        remove(tmp);
    free(tmp);
    return rc;
}

/* ====================================================================== */
/* synthetic LLaMA                                                        */
/* ====================================================================== */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

/* How a tensor's values are drawn: center + uniform(-scale, scale). */
typedef struct fill_ctx {
    uint64_t seed; /* per tensor */
    uint32_t type;
    uint64_t ne0;
    float center;
    float scale;
} fill_ctx;

static int fill_random(void *vctx, uint64_t row0, uint64_t n_rows, void *dst)
{
    const fill_ctx *c = vctx;
    uint64_t rb;
    int rc = quant_row_bytes(c->type, c->ne0, &rb);
    if (rc)
        return rc;
    float *row = malloc((size_t)c->ne0 * sizeof *row);
    if (!row)
        return DP_ENOMEM;
    uint8_t *out = dst;
    for (uint64_t r = 0; r < n_rows && !rc; r++) {
        /* Seeded per row: the values do not depend on how rows are chunked. */
        uint64_t s = c->seed ^ ((row0 + r) * 0xd1b54a32d192ed03ull);
        /* Two 24-bit uniforms per 64-bit draw: generation speed matters for
         * the 7B shape (billions of values). */
        for (uint64_t j = 0; j < c->ne0; j += 2) {
            uint64_t z = splitmix64(&s);
            float u0 = (float)(z >> 40) * 0x1p-23f - 1.0f; /* [-1, 1) */
            float u1 = (float)((z >> 8) & 0xffffff) * 0x1p-23f - 1.0f;
            row[j] = c->center + c->scale * u0;
            if (j + 1 < c->ne0)
                row[j + 1] = c->center + c->scale * u1;
        }
        rc = synth_quantize_row(c->type, row, out + r * rb, (int64_t)c->ne0);
    }
    free(row);
    return rc;
}

static int add_rand(gguf_writer *w, uint64_t seed, const char *name, uint32_t type, uint64_t ne0, uint64_t ne1,
                    float center, float scale)
{
    fill_ctx c = {.seed = seed ^ hash_str(name), .type = type, .ne0 = ne0, .center = center, .scale = scale};
    uint64_t ne[2] = {ne0, ne1};
    uint32_t n_dims = ne1 ? 2 : 1;
    if (!ne1)
        ne[1] = 1;
    return gguf_writer_add_tensor_fill(w, name, type, n_dims, ne, fill_random, &c, sizeof c);
}

/* A LLaMA shape: layers, dim, heads, KV heads, ffn, vocab, context, RoPE
 * base, tied. */
#define SHAPE(l, d, h, kv, f, v, c, rb, t)                                                   \
    (dp_synth_shape){.n_layers = l, .dim = d, .n_heads = h, .n_kv_heads = kv, .ffn = f,     \
                     .vocab = v, .ctx = c, .rope_base = rb, .tied = t}

int synth_shape_preset(const char *name, dp_synth_shape *out)
{
    dp_synth_shape s = {0};
    if (strcmp(name, "tiny") == 0)
        s = SHAPE(2, 64, 4, 2, 128, 512, 256, 10000.0f, false);
    else if (strcmp(name, "tiny32") == 0) /* heads of 32: a quantized KV type's block */
        s = SHAPE(2, 64, 2, 1, 128, 512, 256, 10000.0f, false);
    else if (strcmp(name, "tiny64") == 0) /* a head of 64: a kivi4 group's values */
        s = SHAPE(2, 64, 1, 1, 128, 512, 256, 10000.0f, false);
    else if (strcmp(name, "smollm") == 0)
        s = SHAPE(30, 576, 9, 3, 1536, 49152, 8192, 100000.0f, true);
    else if (strcmp(name, "7b") == 0)
        s = SHAPE(32, 4096, 32, 32, 11008, 32000, 4096, 10000.0f, false);
    else if (strcmp(name, "tiny-llama3") == 0) { /* tiny with Llama 3's RoPE factors */
        s = SHAPE(2, 64, 4, 2, 128, 512, 256, 500000.0f, false);
        s.rope_freqs = true;
    } else if (strcmp(name, "tiny-qwen2") == 0) { /* tiny with Q/K/V biases, NeoX RoPE */
        s = SHAPE(2, 64, 4, 2, 128, 512, 256, 1000000.0f, true);
        s.arch = "qwen2";
    } else if (strcmp(name, "tiny-qwen3") == 0) { /* Q/K norms, heads of 32 at dim 64 */
        s = SHAPE(2, 64, 4, 2, 128, 512, 256, 1000000.0f, true);
        s.arch = "qwen3";
        s.head_dim = 32;
    } else if (strcmp(name, "tiny-phi3") == 0) { /* fused QKV and gate/up, NeoX RoPE */
        s = SHAPE(2, 64, 4, 2, 128, 512, 256, 10000.0f, false);
        s.arch = "phi3";
    } else if (strcmp(name, "tiny-gemma3") == 0) { /* 5 window layers, 1 global, 1 window */
        s = SHAPE(7, 64, 4, 1, 128, 512, 256, 1000000.0f, true);
        s.arch = "gemma3";
        s.head_dim = 32;
        s.sliding_window = 8;
    } else
        return DP_EINVAL;
    *out = s;
    return 0;
}
#undef SHAPE

/* GPT-2's byte-to-unicode table: printable bytes stand for themselves, the
 * others take code points from U+0100 on, in byte order. Writes UTF-8. */
static void byte_char(unsigned b, char out[3])
{
    unsigned cp;
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)) {
        cp = b;
    } else {
        unsigned n = 0;
        for (unsigned x = 0; x < b; x++)
            if (!((x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff)))
                n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = 0;
    }
}

static const char *const CHATML_TEMPLATE =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* The merged token a + b and its merge rule "a b" (both malloc'd). */
static int merge_pair(const char *a, const char *b, char **tok, char **merge)
{
    size_t la = strlen(a), lb = strlen(b);
    char *t = malloc(la + lb + 1), *mg = malloc(la + lb + 2);
    if (!t || !mg) {
        free(t);
        free(mg);
        return DP_ENOMEM;
    }
    memcpy(t, a, la);
    memcpy(t + la, b, lb + 1);
    memcpy(mg, a, la);
    mg[la] = ' ';
    memcpy(mg + la + 1, b, lb + 1);
    *tok = t;
    *merge = mg;
    return 0;
}

/* Tokens, merges and types for the synthetic vocabulary. Merges pair bytes in
 * a rough English-frequency order (diagonally, so common pairs get low ranks),
 * then, for very large vocabularies, pair those two-character tokens with one
 * more byte. */
static int build_tokenizer(gguf_writer *w, uint32_t vocab, char *err, size_t errsz)
{
    static const char prio[] = " etaoinsrhldcumfpgwybvkxjqzETAOINSRHLDCUMFPGWYBVKXJQZ0123456789.,'-\n!?:;\"()";
    unsigned perm[256];
    bool used[256] = {false};
    unsigned np = 0;
    for (const char *p = prio; *p; p++) {
        unsigned b = (unsigned char)*p;
        if (!used[b]) {
            used[b] = true;
            perm[np++] = b;
        }
    }
    for (unsigned b = 0; b < 256; b++)
        if (!used[b])
            perm[np++] = b;

    uint32_t n_merges = vocab - 259;
    char **toks = calloc(vocab, sizeof *toks);
    char **merges = calloc(n_merges ? n_merges : 1, sizeof *merges);
    int32_t *types = malloc(vocab * sizeof *types);
    int rc = 0;
    if (!toks || !merges || !types) {
        rc = dp_err(err, errsz, DP_ENOMEM, "synth: out of memory for the vocabulary");
        goto out;
    }
    char bc[256][3];
    for (unsigned b = 0; b < 256; b++)
        byte_char(b, bc[b]);
    for (unsigned b = 0; b < 256 && !rc; b++) {
        toks[b] = strdup(bc[b]);
        types[b] = 1;
        if (!toks[b])
            rc = DP_ENOMEM;
    }
    /* Level 1: byte pairs (i, j) over perm ranks, by diagonal i + j. */
    uint32_t m = 0;
    for (unsigned sdiag = 0; sdiag <= 510 && m < n_merges && !rc; sdiag++) {
        for (unsigned i = 0; i <= sdiag && m < n_merges && !rc; i++) {
            unsigned j = sdiag - i;
            if (i > 255 || j > 255)
                continue;
            const char *a = bc[perm[i]], *b = bc[perm[j]];
            if ((rc = merge_pair(a, b, &toks[256 + m], &merges[m])))
                break;
            types[256 + m++] = 1;
        }
    }
    /* Level 2: (level-1 token k, byte perm[j]), diagonally again. */
    for (uint64_t sdiag = 0; m < n_merges && !rc; sdiag++) {
        if (sdiag >= 65536ull + 256) {
            rc = dp_err(err, errsz, DP_EINVAL, "synth: vocab %u is too large for the synthetic tokenizer", vocab);
            break;
        }
        uint64_t k0 = sdiag > 255 ? sdiag - 255 : 0, k1 = sdiag < 65535 ? sdiag : 65535;
        for (uint64_t k = k0; k <= k1 && m < n_merges && !rc; k++) {
            uint64_t j = sdiag - k;
            const char *a = toks[256 + k], *b = bc[perm[j]];
            if ((rc = merge_pair(a, b, &toks[256 + m], &merges[m])))
                break;
            types[256 + m++] = 1;
        }
    }
    if (rc) {
        if (rc == DP_ENOMEM)
            dp_err(err, errsz, rc, "synth: out of memory for the vocabulary");
        goto out;
    }
    static const char *const specials[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (int k = 0; k < 3 && !rc; k++) {
        toks[vocab - 3 + (uint32_t)k] = strdup(specials[k]);
        types[vocab - 3 + (uint32_t)k] = 3;
        if (!toks[vocab - 3 + (uint32_t)k])
            rc = dp_err(err, errsz, DP_ENOMEM, "synth: out of memory for the vocabulary");
    }
    if (rc)
        goto out;
    gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_add_str(w, "tokenizer.ggml.pre", "default");
    gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, vocab);
    gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types, vocab);
    gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, n_merges);
    gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", SYNTH_TOK_ENDOFTEXT(vocab));
    gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", SYNTH_TOK_IM_END(vocab));
    gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", SYNTH_TOK_ENDOFTEXT(vocab));
    gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", false);
    gguf_writer_add_str(w, "tokenizer.chat_template", CHATML_TEMPLATE);
    if (w->err)
        rc = dp_err(err, errsz, w->err, "synth: writing tokenizer metadata: %s", dp_strerror(w->err));
out:
    if (toks)
        for (uint32_t i = 0; i < vocab; i++)
            free(toks[i]);
    if (merges)
        for (uint32_t i = 0; i < n_merges; i++)
            free(merges[i]);
    free(toks);
    free(merges);
    free(types);
    return rc;
}

/* llama.cpp's general.file_type numbering for the types we write. */
static int32_t file_type_of(uint32_t t)
{
    switch (t) {
    case DP_TYPE_F32: return 0;
    case DP_TYPE_F16: return 1;
    case DP_TYPE_Q4_0: return 2;
    case DP_TYPE_Q4_1: return 3;
    case DP_TYPE_Q8_0: return 7;
    case DP_TYPE_Q5_0: return 8;
    case DP_TYPE_Q5_1: return 9;
    case DP_TYPE_Q2_K: return 10;
    case DP_TYPE_Q3_K: return 12; /* "mostly Q3_K_M" */
    case DP_TYPE_Q4_K: return 15; /* "mostly Q4_K_M": the nearest file type */
    case DP_TYPE_Q5_K: return 17;
    case DP_TYPE_Q6_K: return 18;
    case DP_TYPE_BF16: return 32;
    default: return -1;
    }
}

int synth_llama_build(gguf_writer *w, const dp_synth_shape *sh, uint64_t seed, uint32_t wt, char *err, size_t errsz)
{
    if (file_type_of(wt) < 0)
        return dp_err(err, errsz, DP_EUNSUPPORTED, "synth: weight type %s not supported (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
                      "q2_k, q3_k, q4_k, q5_k, q6_k)",
                      quant_type_name(wt));
    if (!sh->n_layers || !sh->dim || !sh->n_heads || !sh->n_kv_heads || !sh->ffn || !sh->ctx)
        return dp_err(err, errsz, DP_EINVAL, "synth: every shape field must be non-zero");
    const char *arch = sh->arch ? sh->arch : "llama";
    if (strcmp(arch, "llama") && strcmp(arch, "qwen2") && strcmp(arch, "qwen3") &&
        strcmp(arch, "phi3") && strcmp(arch, "gemma3"))
        return dp_err(err, errsz, DP_EINVAL,
                      "synth: architecture '%s' (llama, qwen2, qwen3, phi3, gemma3)", arch);
    const bool fused = !strcmp(arch, "phi3"), gemma = !strcmp(arch, "gemma3");
    if (gemma && !sh->sliding_window)
        return dp_err(err, errsz, DP_EINVAL, "synth: gemma3 needs a sliding window");
    if (!sh->head_dim && (sh->dim % sh->n_heads || (sh->dim / sh->n_heads) % 2))
        return dp_err(err, errsz, DP_EINVAL, "synth: dim %u must be n_heads (%u) times an even head size", sh->dim,
                      sh->n_heads);
    if (sh->head_dim % 2)
        return dp_err(err, errsz, DP_EINVAL, "synth: head_dim %u must be even", sh->head_dim);
    if (sh->n_heads % sh->n_kv_heads)
        return dp_err(err, errsz, DP_EINVAL, "synth: n_heads %u is not a multiple of n_kv_heads %u", sh->n_heads,
                      sh->n_kv_heads);
    uint32_t be = quant_block_elems(wt);
    if (sh->dim % be || sh->ffn % be)
        return dp_err(err, errsz, DP_EINVAL, "synth: dim %u and ffn %u must be multiples of %u for %s", sh->dim,
                      sh->ffn, be, quant_type_name(wt));
    if (sh->vocab < 260 || sh->vocab > 16000000)
        return dp_err(err, errsz, DP_EINVAL, "synth: vocab %u out of range [260, 16000000]", sh->vocab);

    const uint32_t hd = sh->head_dim ? sh->head_dim : sh->dim / sh->n_heads;
    const uint64_t q_out = (uint64_t)sh->n_heads * hd, kv_out = (uint64_t)sh->n_kv_heads * hd;
    char key[96], name[64];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    /* (Not "phi3" in the name: llama.cpp keys Phi-3's special-token
     * attributes on general.name and then wants SentencePiece's </s>, <unk>
     * and <s>, which this BPE vocabulary does not have.) */
    snprintf(name, sizeof name, "dp-synth %s", fused ? "fused-qkv" : arch);
    gguf_writer_add_str(w, "general.architecture", arch);
    gguf_writer_add_str(w, "general.name", name);
    gguf_writer_add_u32(w, "general.file_type", (uint32_t)file_type_of(wt));
    gguf_writer_add_u32(w, KEY("block_count"), sh->n_layers);
    gguf_writer_add_u32(w, KEY("context_length"), sh->ctx);
    gguf_writer_add_u32(w, KEY("embedding_length"), sh->dim);
    gguf_writer_add_u32(w, KEY("feed_forward_length"), sh->ffn);
    gguf_writer_add_u32(w, KEY("attention.head_count"), sh->n_heads);
    gguf_writer_add_u32(w, KEY("attention.head_count_kv"), sh->n_kv_heads);
    gguf_writer_add_f32(w, KEY("rope.freq_base"), sh->rope_base);
    gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    gguf_writer_add_u32(w, KEY("vocab_size"), sh->vocab);
    gguf_writer_add_u32(w, KEY("rope.dimension_count"), hd);
    if (sh->head_dim) {
        gguf_writer_add_u32(w, KEY("attention.key_length"), hd);
        gguf_writer_add_u32(w, KEY("attention.value_length"), hd);
    }
    if (sh->sliding_window)
        gguf_writer_add_u32(w, KEY("attention.sliding_window"), sh->sliding_window);
    if (sh->yarn_orig) {
        gguf_writer_add_str(w, KEY("rope.scaling.type"), "yarn");
        gguf_writer_add_f32(w, KEY("rope.scaling.factor"), (float)sh->ctx / (float)sh->yarn_orig);
        gguf_writer_add_u32(w, KEY("rope.scaling.original_context_length"), sh->yarn_orig);
    }
    if (sh->longrope_orig) {
        const double r = (double)sh->ctx / sh->longrope_orig;
        gguf_writer_add_u32(w, KEY("rope.scaling.original_context_length"), sh->longrope_orig);
        gguf_writer_add_f32(w, KEY("rope.scaling.attn_factor"),
                            r > 1.0 && sh->longrope_orig > 1
                                ? (float)sqrt(1.0 + log(r) / log((double)sh->longrope_orig))
                                : 1.0f);
    }
#undef KEY
    if (w->err)
        return dp_err(err, errsz, w->err, "synth: writing metadata: %s", dp_strerror(w->err));
    int rc = build_tokenizer(w, sh->vocab, err, errsz);
    if (rc)
        return rc;

    /* Uniform(-a, a) with a = sqrt(3 / fan_in) keeps each projection's output
     * at its input's scale. A separate output matrix is scaled so logits have
     * a standard deviation near 3. A tied embedding gets 1.5 instead: its
     * logit for the current token includes |e_t|^2, and with a larger scale
     * that self term wins and greedy decoding repeats one token forever
     * (checked with a reference forward pass on the tiny and smollm shapes).
     * The attention and FFN output projections get a gain of 3 for the same
     * reason: the blocks, not the current token's embedding, must dominate
     * the residual stream, or most seeds decode one token over and over. */
    const float a_dim = sqrtf(3.0f / (float)sh->dim), a_ffn = sqrtf(3.0f / (float)sh->ffn);
    const float a_q = sqrtf(3.0f / (float)q_out);
    const float a_emb = (sh->tied ? 1.5f : 3.0f) * a_dim;
    const float g_out = 3.0f;
    seed = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
    add_rand(w, seed, "token_embd.weight", wt, sh->dim, sh->vocab, 0.0f, a_emb);
    for (uint32_t l = 0; l < sh->n_layers; l++) {
        char nm[64];
#define NM(suffix) (snprintf(nm, sizeof nm, "blk.%u." suffix, l), nm)
        add_rand(w, seed, NM("attn_norm.weight"), DP_TYPE_F32, sh->dim, 0, 1.0f, 0.1f);
        if (fused) { /* Phi-3: Q, K and V in one tensor, in that order */
            add_rand(w, seed, NM("attn_qkv.weight"), wt, sh->dim, q_out + 2 * kv_out, 0.0f, a_dim);
        } else {
            add_rand(w, seed, NM("attn_q.weight"), wt, sh->dim, q_out, 0.0f, a_dim);
            add_rand(w, seed, NM("attn_k.weight"), wt, sh->dim, kv_out, 0.0f, a_dim);
            add_rand(w, seed, NM("attn_v.weight"), wt, sh->dim, kv_out, 0.0f, a_dim);
        }
        add_rand(w, seed, NM("attn_output.weight"), wt, q_out, sh->dim, 0.0f, a_q * g_out);
        if (!strcmp(arch, "qwen2")) {
            add_rand(w, seed, NM("attn_q.bias"), DP_TYPE_F32, q_out, 0, 0.0f, 0.5f);
            add_rand(w, seed, NM("attn_k.bias"), DP_TYPE_F32, kv_out, 0, 0.0f, 0.5f);
            add_rand(w, seed, NM("attn_v.bias"), DP_TYPE_F32, kv_out, 0, 0.0f, 0.5f);
        }
        if (!strcmp(arch, "qwen3") || gemma) {
            add_rand(w, seed, NM("attn_q_norm.weight"), DP_TYPE_F32, hd, 0, 1.0f, 0.1f);
            add_rand(w, seed, NM("attn_k_norm.weight"), DP_TYPE_F32, hd, 0, 1.0f, 0.1f);
        }
        add_rand(w, seed, NM("ffn_norm.weight"), DP_TYPE_F32, sh->dim, 0, 1.0f, 0.1f);
        if (fused) { /* Phi-3: the gate's rows, then the up projection's */
            add_rand(w, seed, NM("ffn_up.weight"), wt, sh->dim, 2 * (uint64_t)sh->ffn, 0.0f, a_dim);
        } else {
            add_rand(w, seed, NM("ffn_gate.weight"), wt, sh->dim, sh->ffn, 0.0f, a_dim);
            add_rand(w, seed, NM("ffn_up.weight"), wt, sh->dim, sh->ffn, 0.0f, a_dim);
        }
        add_rand(w, seed, NM("ffn_down.weight"), wt, sh->ffn, sh->dim, 0.0f, a_ffn * g_out);
        if (gemma) { /* (1 + w) already, as the files carry Gemma's norms */
            add_rand(w, seed, NM("post_attention_norm.weight"), DP_TYPE_F32, sh->dim, 0, 1.0f, 0.1f);
            add_rand(w, seed, NM("post_ffw_norm.weight"), DP_TYPE_F32, sh->dim, 0, 1.0f, 0.1f);
        }
#undef NM
    }
    add_rand(w, seed, "output_norm.weight", DP_TYPE_F32, sh->dim, 0, 1.0f, 0.1f);
    if (sh->rope_freqs) /* uniform in [1, 8], as Llama 3's range */
        add_rand(w, seed, "rope_freqs.weight", DP_TYPE_F32, hd / 2, 0, 4.5f, 3.5f);
    if (sh->longrope_orig) { /* Phi-3.5's ranges: long up to ~60, short near 1 */
        add_rand(w, seed, "rope_factors_long.weight", DP_TYPE_F32, hd / 2, 0, 30.5f, 29.5f);
        add_rand(w, seed, "rope_factors_short.weight", DP_TYPE_F32, hd / 2, 0, 1.5f, 0.5f);
    }
    if (!sh->tied)
        add_rand(w, seed, "output.weight", wt, sh->dim, sh->vocab, 0.0f, 3.0f * a_dim);
    if (w->err)
        return dp_err(err, errsz, w->err, "synth: adding tensors: %s", dp_strerror(w->err));
    return 0;
}

int synth_llama_write(const char *path, const dp_synth_shape *shape, uint64_t seed, uint32_t weight_type, char *err,
                      size_t errsz)
{
    gguf_writer w;
    gguf_writer_init(&w);
    int rc = synth_llama_build(&w, shape, seed, weight_type, err, errsz);
    if (!rc) {
        rc = gguf_writer_write_file(&w, path);
        if (rc)
            dp_err(err, errsz, rc, "synth: writing '%s': %s", path,
                   rc == DP_EIO ? strerror(errno) : dp_strerror(rc));
    }
    gguf_writer_destroy(&w);
    return rc;
}
