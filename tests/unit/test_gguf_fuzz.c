/* test_gguf_fuzz.c: the GGUF reader against broken and hostile files: every
 * truncation, targeted field corruptions and seeded random mutations. Each
 * must fail with a one-line message or open with all data in bounds. */
#include <stdint.h>
#include <string.h>

#include "common/dp.h"
#include "kernels/quant.h"
#include "model/gguf.h"
#include "t.h"
#include "tools/synth_gguf.h"

static uint8_t *g_file;
static size_t g_size;

/* The valid base file. Names are unique byte strings so fields can be found
 * by searching for them. The last tensor's size is a multiple of the
 * alignment, so every truncation removes needed bytes. */
static void build_base(void)
{
    gguf_writer w;
    gguf_writer_init(&w);
    gguf_writer_set_alignment(&w, 32);
    gguf_writer_add_u32(&w, "k.u32", 7);
    gguf_writer_add_str(&w, "k.str", "value");
    static const char *const strs[] = {"s0", "s1!", "s2??"};
    gguf_writer_add_arr_str(&w, "k.arrstr", strs, 3);
    static const uint32_t u[] = {1, 2, 3, 4};
    gguf_writer_add_arr(&w, "k.arru32", DP_GGUF_U32, 4, u);
    uint8_t nested[4 + 8 + 4 + 8 + 8];
    uint32_t t = DP_GGUF_ARRAY, it = DP_GGUF_I64;
    uint64_t n = 1, in = 1;
    int64_t v = -9;
    memcpy(nested, &t, 4);
    memcpy(nested + 4, &n, 8);
    memcpy(nested + 12, &it, 4);
    memcpy(nested + 16, &in, 8);
    memcpy(nested + 24, &v, 8);
    gguf_writer_add_raw(&w, "k.nested", DP_GGUF_ARRAY, nested, sizeof nested);
    gguf_writer_add_f32(&w, "k.f32", 0.5f);
    float f[6] = {1, 2, 3, 4, 5, 6};
    uint8_t q8[2 * 34] = {0}, q41[20] = {0};
    float row[64];
    for (int i = 0; i < 64; i++)
        row[i] = (float)i / 10.0f - 3.0f;
    CHECK_EQ_INT(synth_quantize_row(DP_TYPE_Q8_0, row, q8, 64), 0);
    CHECK_EQ_INT(synth_quantize_row(DP_TYPE_Q4_1, row, q41, 32), 0);
    const uint64_t ne_a[2] = {3, 2}, ne_b[1] = {64}, ne_c[2] = {32, 1}, ne_d[1] = {8};
    gguf_writer_add_tensor(&w, "t.aa", DP_TYPE_F32, 2, ne_a, f);
    gguf_writer_add_tensor(&w, "t.bb", DP_TYPE_Q8_0, 1, ne_b, q8);
    gguf_writer_add_tensor(&w, "t.cc", DP_TYPE_Q4_1, 2, ne_c, q41);
    gguf_writer_add_tensor(&w, "t.dd", DP_TYPE_F32, 1, ne_d, row);
    void *buf;
    CHECK_EQ_INT(gguf_writer_finish_mem(&w, &buf, &g_size), 0);
    g_file = buf;
    gguf_writer_destroy(&w);
}

/* Opens an exact-size copy (so ASan sees any overread) and checks the
 * outcome. want_sub: substring the error must contain, or NULL. */
static int try_open(const uint8_t *data, size_t size, char *err, size_t errsz)
{
    uint8_t *copy = malloc(size ? size : 1);
    CHECK(copy != NULL);
    if (size)
        memcpy(copy, data, size);
    dp_gguf g;
    err[0] = '\0';
    int rc = gguf_open_mem(&g, copy, size, err, errsz);
    if (rc == 0) {
        /* Everything the reader hands out must lie inside the buffer. */
        volatile uint8_t sink = 0;
        for (uint64_t i = 0; i < g.n_tensors; i++) {
            const dp_gguf_tensor *t = &g.tensors[i];
            const uint8_t *p = t->data;
            CHECK(p >= copy && t->nbytes <= size && (size_t)(p - copy) <= size - t->nbytes);
            for (uint64_t k = 0; k < t->nbytes; k++)
                sink ^= p[k];
            CHECK(t->n_dims >= 1 && t->n_dims <= 4 && quant_type_known(t->type));
        }
        for (uint64_t i = 0; i < g.n_kv; i++) {
            const dp_gguf_kv *kv = &g.kv[i];
            CHECK((const uint8_t *)kv->key.ptr >= copy && kv->key.len <= size);
            if (kv->type == DP_GGUF_ARRAY && kv->arr_type == DP_GGUF_STRING) {
                for (uint64_t k = 0; k < kv->arr_n; k++) {
                    dp_gguf_str s = gguf_arr_str(kv, k);
                    CHECK((const uint8_t *)s.ptr >= copy && s.len <= size &&
                          (size_t)((const uint8_t *)s.ptr - copy) <= size - s.len);
                    for (uint64_t j = 0; j < s.len; j++)
                        sink ^= (uint8_t)s.ptr[j];
                }
            } else if (kv->type == DP_GGUF_ARRAY) {
                for (uint64_t k = 0; k < kv->arr_n && k < 4096; k++)
                    sink ^= (uint8_t)gguf_arr_i64(kv, k) ^ (uint8_t)(gguf_arr_f64(kv, k) != 0);
            }
            dp_gguf_str s;
            char key[64];
            size_t kl = kv->key.len < sizeof key - 1 ? (size_t)kv->key.len : sizeof key - 1;
            memcpy(key, kv->key.ptr, kl);
            key[kl] = '\0';
            if (gguf_get_str(&g, key, &s) == 0)
                for (uint64_t j = 0; j < s.len; j++)
                    sink ^= (uint8_t)s.ptr[j];
        }
        (void)sink;
        gguf_close(&g);
    } else {
        CHECK(rc < 0);
        CHECK_MSG(err[0] != '\0', "empty message (rc %d)", rc);
        CHECK_MSG(strchr(err, '\n') == NULL, "multi-line message: %s", err);
        CHECK_MSG(strncmp(err, "gguf: ", 6) == 0, "message without prefix: %s", err);
        CHECK(g.kv == NULL && g.tensors == NULL);
        gguf_close(&g); /* harmless after a failed open */
    }
    free(copy);
    return rc;
}

static void expect_fail(const uint8_t *data, size_t size, const char *want_sub, const char *what)
{
    char err[DP_ERRLEN];
    int rc = try_open(data, size, err, sizeof err);
    CHECK_MSG(rc != 0, "%s: opened", what);
    CHECK_MSG(!want_sub || strstr(err, want_sub), "%s: message '%s' lacks '%s'", what, err, want_sub);
    printf("  %-28s -> %s\n", what, err);
}

/* Position of the bytes of a name in the base file (names are unique). */
static size_t find(const char *name)
{
    const uint8_t *p = memmem(g_file, g_size, name, strlen(name));
    CHECK_MSG(p != NULL, "%s", name);
    return (size_t)(p - g_file);
}

static uint8_t *mut(void)
{
    uint8_t *m = malloc(g_size);
    CHECK(m != NULL);
    memcpy(m, g_file, g_size);
    return m;
}

static void set32(uint8_t *m, size_t at, uint32_t v) { memcpy(m + at, &v, 4); }
static void set64(uint8_t *m, size_t at, uint64_t v) { memcpy(m + at, &v, 8); }

/* Patches a u32 / u64 at pos and expects failure mentioning want. */
static void case32(size_t at, uint32_t v, const char *want, const char *what)
{
    uint8_t *m = mut();
    set32(m, at, v);
    expect_fail(m, g_size, want, what);
    free(m);
}

static void case64(size_t at, uint64_t v, const char *want, const char *what)
{
    uint8_t *m = mut();
    set64(m, at, v);
    expect_fail(m, g_size, want, what);
    free(m);
}

static void test_truncations(void)
{
    char err[DP_ERRLEN];
    for (size_t n = 0; n < g_size; n++) {
        int rc = try_open(g_file, n, err, sizeof err);
        CHECK_MSG(rc != 0, "truncation to %zu bytes opened", n);
    }
    CHECK_EQ_INT(try_open(g_file, g_size, err, sizeof err), 0);
    printf("  %zu truncations fail cleanly, e.g. %s\n", g_size, err[0] ? err : "");
}

static void test_targeted(void)
{
    /* Header. */
    case32(0, 0x46554748u, "magic", "bad magic");
    case32(4, 0, "version 0", "version 0");
    case32(4, 1, "version 1", "version 1");
    case32(4, 4, "version 4", "version 4");
    case32(4, 0x03000000u, "big-endian", "big-endian");
    case64(8, 1ull << 62, "tensors", "n_tensors 2^62");
    case64(8, UINT64_MAX, "tensors", "n_tensors 2^64-1");
    case64(16, 1ull << 62, "metadata", "n_kv 2^62");
    case64(16, UINT64_MAX, "metadata", "n_kv 2^64-1");
    case64(16, 50, NULL, "n_kv too large by a bit");

    /* Metadata: key lengths, value types, string lengths, array counts. */
    size_t k = find("k.u32");
    case64(k - 8, 1ull << 60, "length", "key length 2^60");
    case64(k - 8, UINT64_MAX, "length", "key length 2^64-1");
    case32(k + 5, 13, "unknown value type 13", "unknown value type");
    case32(k + 5, UINT32_MAX, "unknown value type", "value type 2^32-1");
    size_t s = find("k.str");
    case64(s + 5 + 4, 1ull << 60, "k.str", "string length 2^60");
    case64(s + 5 + 4, UINT64_MAX, "k.str", "string length 2^64-1");
    size_t as = find("k.arrstr");
    case64(as + 8 + 4 + 4, 1ull << 60, "k.arrstr", "string array count 2^60");
    case64(as + 8 + 4 + 4, UINT64_MAX, "k.arrstr", "string array count 2^64-1");
    case64(as + 8 + 4 + 4 + 8, 1ull << 61, "k.arrstr", "string element length");
    case32(as + 8 + 4, 99, "unknown element type", "array elem type 99");
    size_t au = find("k.arru32");
    case64(au + 8 + 4 + 4, 1ull << 62, "k.arru32", "u32 array count 2^62");
    case64(au + 8 + 4 + 4, UINT64_MAX / 2, "k.arru32", "u32 array count 2^63");
    size_t an = find("k.nested");
    case64(an + 8 + 4 + 4, 1ull << 60, "k.nested", "nested outer count");
    case64(an + 8 + 4 + 4 + 8 + 4, 1ull << 60, "k.nested", "nested inner count");
    case32(an + 8 + 4 + 4 + 8, 42, "nested array has unknown type 42", "nested inner type");
    /* Duplicate key: rename k.f32 to k.u32. */
    {
        uint8_t *m = mut();
        memcpy(m + find("k.f32"), "k.u32", 5);
        expect_fail(m, g_size, "duplicate metadata key 'k.u32'", "duplicate key");
        free(m);
    }
    /* Alignment. */
    size_t al = find("general.alignment") + 17 + 4;
    case32(al, 0, "alignment", "alignment 0");
    case32(al, 3, "alignment", "alignment 3");
    case32(al, 1u << 31, "alignment", "alignment 2^31");
    case32(al - 4, DP_GGUF_F32, "alignment", "alignment as f32");
    {
        /* 16 is a valid alignment but tensor offsets no longer start at an
         * aligned data section the way the writer laid them out: the file may
         * open or fail, but never read out of bounds. */
        uint8_t *m = mut();
        set32(m, al, 16);
        char err[DP_ERRLEN];
        try_open(m, g_size, err, sizeof err);
        set32(m, al, 64);
        try_open(m, g_size, err, sizeof err);
        free(m);
    }

    /* Tensor infos: t.bb is Q8_0, 1 dim (ne 64), then type and offset. */
    size_t tb = find("t.bb") + 4;
    case32(tb, 0, "0 dimensions", "n_dims 0");
    case32(tb, 5, "5 dimensions", "n_dims 5");
    case32(tb, UINT32_MAX, "dimensions", "n_dims 2^32-1");
    case64(tb + 4, 0, "dimension 0 of size 0", "dim of 0");
    case64(tb + 4, 33, "not a multiple", "row not a block multiple");
    case32(tb + 12, 4, "unknown type 4", "tensor type 4 (removed)");
    case32(tb + 12, 40, "unknown type 40", "tensor type 40");
    case32(tb + 12, UINT32_MAX, "unknown type", "tensor type 2^32-1");
    case64(tb + 16, 1, "not a multiple of the alignment", "offset unaligned");
    case64(tb + 16, 1ull << 40, "runs past end of file", "offset past end");
    case64(tb + 16, UINT64_MAX - 31, "runs past end of file", "offset near 2^64");
    case64(tb + 16, g_size - g_size % 32, "t.bb", "offset at end of file");
    case64(tb + 4, 64ull << 30, "runs past end", "tensor too large");
    size_t ta = find("t.aa") + 4; /* F32, 2 dims */
    case64(ta + 4, 1ull << 32, NULL, "dims 2^32 x 2");
    {
        uint8_t *m = mut();
        set64(m, ta + 4, 1ull << 32);
        set64(m, ta + 12, 1ull << 32);
        expect_fail(m, g_size, "element count overflows", "dims product overflow");
        set64(m, ta + 4, 1ull << 62);
        set64(m, ta + 12, 1);
        expect_fail(m, g_size, "byte size overflows", "byte size overflow");
        set64(m, ta + 4, 1ull << 61);
        set64(m, ta + 12, 1);
        expect_fail(m, g_size, NULL, "byte size 2^63");
        free(m);
    }
    case64(find("t.cc") - 8, 1ull << 62, "length", "tensor name length");
    {
        uint8_t *m = mut();
        memcpy(m + find("t.cc"), "t.bb", 4);
        expect_fail(m, g_size, "duplicate tensor name 't.bb'", "duplicate tensor");
        free(m);
    }
    {
        /* A name with a newline and control bytes: the message stays one line. */
        uint8_t *m = mut();
        memcpy(m + find("t.cc"), "\n\x01\xff", 3);
        set32(m, find("t.cc") + 4 + 4 + 16, 77);
        expect_fail(m, g_size, "\\x0a", "name with newline");
        free(m);
    }
    /* Deeply nested arrays are refused, not recursed into. */
    {
        gguf_writer w;
        gguf_writer_init(&w);
        uint8_t raw[12 * 40 + 12];
        size_t n = 0;
        for (int d = 0; d < 40; d++) {
            uint32_t t = DP_GGUF_ARRAY;
            uint64_t c = 1;
            memcpy(raw + n, &t, 4);
            memcpy(raw + n + 4, &c, 8);
            n += 12;
        }
        uint32_t t = DP_GGUF_U8;
        uint64_t c = 0;
        memcpy(raw + n, &t, 4);
        memcpy(raw + n + 4, &c, 8);
        n += 12;
        gguf_writer_add_raw(&w, "deep", DP_GGUF_ARRAY, raw, n);
        void *buf;
        size_t size;
        CHECK_EQ_INT(gguf_writer_finish_mem(&w, &buf, &size), 0);
        expect_fail(buf, size, "nested deeper", "nesting 40 deep");
        free(buf);
        gguf_writer_destroy(&w);
    }
    expect_fail((const uint8_t *)"", 0, NULL, "empty buffer");
    expect_fail((const uint8_t *)"GGUF", 4, NULL, "magic only");
}

static uint64_t rng(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t z = *s;
    z ^= z >> 33;
    z *= 0xff51afd7ed558ccdull;
    return z ^ (z >> 33);
}

static void test_mutations(int count)
{
    uint64_t s = 0x5eed;
    int opened = 0, failed = 0;
    char err[DP_ERRLEN];
    uint8_t *m = malloc(g_size);
    CHECK(m != NULL);
    static const uint8_t interesting[] = {0x00, 0x01, 0x02, 0x04, 0x05, 0x08, 0x09, 0x10, 0x1f, 0x20,
                                          0x3f, 0x40, 0x7f, 0x80, 0xfe, 0xff};
    for (int it = 0; it < count; it++) {
        memcpy(m, g_file, g_size);
        int nm = 1 + (int)(rng(&s) % 6);
        for (int k = 0; k < nm; k++) {
            size_t at = (size_t)(rng(&s) % g_size);
            switch (rng(&s) % 4) {
            case 0: m[at] = (uint8_t)rng(&s); break;
            case 1: m[at] = interesting[rng(&s) % sizeof interesting]; break;
            case 2: m[at] ^= (uint8_t)(1u << (rng(&s) % 8)); break;
            default:
                /* Mostly aimed at the header/metadata, where counts live. */
                at = (size_t)(rng(&s) % (g_size < 400 ? g_size : 400));
                m[at] = interesting[rng(&s) % sizeof interesting];
                break;
            }
        }
        size_t size = g_size;
        if (rng(&s) % 8 == 0)
            size = (size_t)(rng(&s) % g_size);
        if (try_open(m, size, err, sizeof err) == 0)
            opened++;
        else
            failed++;
    }
    free(m);
    printf("  %d mutations: %d opened (in bounds), %d failed cleanly\n", count, opened, failed);
    CHECK(opened > 0 && failed > 0);
}

int main(void)
{
    build_base();
    char err[DP_ERRLEN];
    CHECK_MSG(try_open(g_file, g_size, err, sizeof err) == 0, "base file: %s", err);
    test_truncations();
    test_targeted();
    test_mutations(5000);
    free(g_file);
    T_DONE("gguf_fuzz");
}
