/* test_gguf.c: round trips through the GGUF writer and reader (every value
 * type, nested arrays, several tensor types, v2/v3, alignments), the getters'
 * conversions, the synthetic LLaMA file, and the real SmolLM2 file if present. */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "common/dp.h"
#include "kernels/quant.h"
#include "model/gguf.h"
#include "t.h"
#include "tools/synth_gguf.h"

#define REAL_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

/* A little byte builder for hand-serialized (nested array) values. */
typedef struct bytes {
    uint8_t b[512];
    size_t n;
} bytes;

static void put(bytes *x, const void *p, size_t n)
{
    CHECK(x->n + n <= sizeof x->b);
    memcpy(x->b + x->n, p, n);
    x->n += n;
}
static void put32(bytes *x, uint32_t v) { put(x, &v, 4); }
static void put64(bytes *x, uint64_t v) { put(x, &v, 8); }
static void putstr(bytes *x, const char *s)
{
    put64(x, strlen(s));
    put(x, s, strlen(s));
}

static const char *const STRS[] = {"alpha", "", "gamma \xc4\xa0 utf8", "delta"};
static const uint8_t A_U8[] = {0, 1, 255};
static const int8_t A_I8[] = {-128, 0, 127};
static const uint16_t A_U16[] = {0, 65535};
static const int16_t A_I16[] = {-32768, 32767, -1};
static const uint32_t A_U32[] = {0, 4000000000u};
static const int32_t A_I32[] = {-5, 0, 2147483647, -2147483647 - 1};
static const uint64_t A_U64[] = {0, UINT64_MAX};
static const int64_t A_I64[] = {INT64_MIN, -1, INT64_MAX};
static const float A_F32[] = {1.5f, -0.25f, 1e30f};
static const double A_F64[] = {3.141592653589793, -1e300};
static const uint8_t A_BOOL[] = {1, 0, 1};

#define N_TENSORS 7
static float g_f32[21];
static uint16_t g_f16[16];
static uint8_t g_q8[2 * 34], g_q41[4 * 20], g_q4k[144], g_iq2[66];
static uint16_t g_bf16[10];

static void fill_data(void)
{
    for (int i = 0; i < 21; i++)
        g_f32[i] = (float)i * 0.5f - 3.0f;
    for (int i = 0; i < 16; i++)
        g_f16[i] = dp_f32_to_fp16((float)i / 8.0f);
    for (size_t i = 0; i < sizeof g_q8; i++)
        g_q8[i] = (uint8_t)(i * 7 + 1);
    g_q8[0] = 0x00, g_q8[1] = 0x3c; /* d = 1 */
    g_q8[34] = 0x00, g_q8[35] = 0x38;
    for (size_t i = 0; i < sizeof g_q41; i++)
        g_q41[i] = (uint8_t)(i * 13 + 3);
    for (size_t i = 0; i < sizeof g_q4k; i++)
        g_q4k[i] = (uint8_t)(i * 5);
    for (size_t i = 0; i < sizeof g_iq2; i++)
        g_iq2[i] = (uint8_t)(i + 9);
    for (int i = 0; i < 10; i++)
        g_bf16[i] = dp_f32_to_bf16((float)i - 4.0f);
}

static void build(gguf_writer *w, uint32_t version, uint32_t alignment)
{
    CHECK_EQ_INT(gguf_writer_init(w), 0);
    gguf_writer_set_version(w, version);
    if (alignment)
        CHECK_EQ_INT(gguf_writer_set_alignment(w, alignment), 0);
    gguf_writer_add_u8(w, "v.u8", 200);
    gguf_writer_add_i8(w, "v.i8", -100);
    gguf_writer_add_u16(w, "v.u16", 60000);
    gguf_writer_add_i16(w, "v.i16", -30000);
    gguf_writer_add_u32(w, "v.u32", 4000000000u);
    gguf_writer_add_i32(w, "v.i32", -2000000000);
    gguf_writer_add_i32(w, "v.i32pos", 123456);
    gguf_writer_add_u64(w, "v.u64", 0xfedcba9876543210ull);
    gguf_writer_add_u64(w, "v.u64small", 77);
    gguf_writer_add_i64(w, "v.i64", -1234567890123ll);
    gguf_writer_add_f32(w, "v.f32", 0.1f);
    gguf_writer_add_f64(w, "v.f64", 2.718281828459045);
    gguf_writer_add_bool(w, "v.true", true);
    gguf_writer_add_bool(w, "v.false", false);
    gguf_writer_add_str(w, "v.str", "hello, gguf");
    gguf_writer_add_str(w, "v.empty", "");
    gguf_writer_add_str_n(w, "v.nul", "a\0b", 3);
    gguf_writer_add_arr(w, "a.u8", DP_GGUF_U8, 3, A_U8);
    gguf_writer_add_arr(w, "a.i8", DP_GGUF_I8, 3, A_I8);
    gguf_writer_add_arr(w, "a.u16", DP_GGUF_U16, 2, A_U16);
    gguf_writer_add_arr(w, "a.i16", DP_GGUF_I16, 3, A_I16);
    gguf_writer_add_arr(w, "a.u32", DP_GGUF_U32, 2, A_U32);
    gguf_writer_add_arr_i32(w, "a.i32", A_I32, 4);
    gguf_writer_add_arr(w, "a.u64", DP_GGUF_U64, 2, A_U64);
    gguf_writer_add_arr(w, "a.i64", DP_GGUF_I64, 3, A_I64);
    gguf_writer_add_arr_f32(w, "a.f32", A_F32, 3);
    gguf_writer_add_arr(w, "a.f64", DP_GGUF_F64, 2, A_F64);
    gguf_writer_add_arr(w, "a.bool", DP_GGUF_BOOL, 3, A_BOOL);
    gguf_writer_add_arr_str(w, "a.str", STRS, 4);
    gguf_writer_add_arr_str(w, "a.str_empty", NULL, 0);
    gguf_writer_add_arr_i32(w, "a.i32_empty", NULL, 0);
    /* [[1, 2], [], [3]] as arrays of i32. */
    bytes x = {.n = 0};
    put32(&x, DP_GGUF_ARRAY);
    put64(&x, 3);
    put32(&x, DP_GGUF_I32), put64(&x, 2), put32(&x, 1), put32(&x, 2);
    put32(&x, DP_GGUF_I32), put64(&x, 0);
    put32(&x, DP_GGUF_I32), put64(&x, 1), put32(&x, 3);
    gguf_writer_add_raw(w, "a.nested_i32", DP_GGUF_ARRAY, x.b, x.n);
    /* [["x", "yz"], [[true]]]: strings and a third level. */
    x.n = 0;
    put32(&x, DP_GGUF_ARRAY);
    put64(&x, 2);
    put32(&x, DP_GGUF_STRING), put64(&x, 2), putstr(&x, "x"), putstr(&x, "yz");
    put32(&x, DP_GGUF_ARRAY), put64(&x, 1);
    put32(&x, DP_GGUF_BOOL), put64(&x, 1);
    uint8_t one = 1;
    put(&x, &one, 1);
    gguf_writer_add_raw(w, "a.nested_mixed", DP_GGUF_ARRAY, x.b, x.n);
    gguf_writer_add_str(w, "z.last", "end");

    const uint64_t ne_f32[2] = {7, 3}, ne_f16[1] = {16}, ne_q8[2] = {64, 1}, ne_q41[3] = {32, 2, 2},
                   ne_q4k[1] = {256}, ne_bf16[4] = {5, 1, 1, 2}, ne_iq2[1] = {256};
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t.f32", DP_TYPE_F32, 2, ne_f32, g_f32), 0);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t.f16", DP_TYPE_F16, 1, ne_f16, g_f16), 0);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t.q8_0", DP_TYPE_Q8_0, 2, ne_q8, g_q8), 0);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t.q4_1", DP_TYPE_Q4_1, 3, ne_q41, g_q41), 0);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t.q4_k", DP_TYPE_Q4_K, 1, ne_q4k, g_q4k), 0);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t.bf16", DP_TYPE_BF16, 4, ne_bf16, g_bf16), 0);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t.iq2_xxs", DP_TYPE_IQ2_XXS, 1, ne_iq2, g_iq2), 0);
    CHECK_EQ_INT(w->err, 0);
}

static const dp_gguf_kv *kv_of(const dp_gguf *g, const char *key, uint32_t type)
{
    const dp_gguf_kv *kv = gguf_find_kv(g, key);
    CHECK_MSG(kv != NULL, "missing %s", key);
    CHECK_MSG(kv->type == type, "%s: type %u", key, kv->type);
    return kv;
}

static void check_arr(const dp_gguf *g, const char *key, uint32_t et, uint64_t n)
{
    const dp_gguf_kv *kv = kv_of(g, key, DP_GGUF_ARRAY);
    CHECK_MSG(kv->arr_type == et && kv->arr_n == n, "%s", key);
}

static void check_file(const dp_gguf *g, uint32_t version, uint32_t alignment)
{
    CHECK_EQ_INT(g->version, version);
    CHECK_EQ_INT(g->alignment, alignment ? alignment : 32);
    CHECK_EQ_INT(g->n_kv, 34 + (alignment ? 1 : 0));
    CHECK_EQ_INT(g->n_tensors, N_TENSORS);
    CHECK(g->data_offset % g->alignment == 0);

    uint32_t u32;
    int64_t i64;
    float f32;
    bool b;
    dp_gguf_str s;
    /* Raw values. */
    CHECK_EQ_INT(kv_of(g, "v.u8", DP_GGUF_U8)->value[0], 200);
    CHECK_EQ_INT((int8_t)kv_of(g, "v.i8", DP_GGUF_I8)->value[0], -100);
    kv_of(g, "v.u16", DP_GGUF_U16);
    kv_of(g, "v.i16", DP_GGUF_I16);
    kv_of(g, "v.u64", DP_GGUF_U64);
    double f64;
    memcpy(&f64, kv_of(g, "v.f64", DP_GGUF_F64)->value, 8);
    CHECK(f64 == 2.718281828459045);
    /* Getters and their conversions. */
    CHECK(gguf_get_u32(g, "v.u8", &u32) == 0 && u32 == 200);
    CHECK(gguf_get_u32(g, "v.u16", &u32) == 0 && u32 == 60000);
    CHECK(gguf_get_u32(g, "v.u32", &u32) == 0 && u32 == 4000000000u);
    CHECK(gguf_get_u32(g, "v.i32pos", &u32) == 0 && u32 == 123456);
    CHECK(gguf_get_u32(g, "v.u64small", &u32) == 0 && u32 == 77);
    CHECK_EQ_INT(gguf_get_u32(g, "v.i8", &u32), DP_EFORMAT);
    CHECK_EQ_INT(gguf_get_u32(g, "v.i32", &u32), DP_EFORMAT);
    CHECK_EQ_INT(gguf_get_u32(g, "v.u64", &u32), DP_EFORMAT);
    CHECK_EQ_INT(gguf_get_u32(g, "v.f32", &u32), DP_EFORMAT);
    CHECK_EQ_INT(gguf_get_u32(g, "v.str", &u32), DP_EFORMAT);
    CHECK_EQ_INT(gguf_get_u32(g, "a.u32", &u32), DP_EFORMAT);
    CHECK_EQ_INT(gguf_get_u32(g, "no.such.key", &u32), DP_ENOTFOUND);
    CHECK(gguf_get_i64(g, "v.i8", &i64) == 0 && i64 == -100);
    CHECK(gguf_get_i64(g, "v.i16", &i64) == 0 && i64 == -30000);
    CHECK(gguf_get_i64(g, "v.i32", &i64) == 0 && i64 == -2000000000);
    CHECK(gguf_get_i64(g, "v.u32", &i64) == 0 && i64 == 4000000000ll);
    CHECK(gguf_get_i64(g, "v.i64", &i64) == 0 && i64 == -1234567890123ll);
    CHECK_EQ_INT(gguf_get_i64(g, "v.u64", &i64), DP_EFORMAT);
    CHECK_EQ_INT(gguf_get_i64(g, "v.true", &i64), DP_EFORMAT);
    CHECK_EQ_INT(gguf_get_i64(g, "nope", &i64), DP_ENOTFOUND);
    CHECK(gguf_get_f32(g, "v.f32", &f32) == 0 && f32 == 0.1f);
    CHECK(gguf_get_f32(g, "v.f64", &f32) == 0 && f32 == (float)2.718281828459045);
    CHECK(gguf_get_f32(g, "v.i32", &f32) == 0 && f32 == -2000000000.0f);
    CHECK(gguf_get_f32(g, "v.u8", &f32) == 0 && f32 == 200.0f);
    CHECK_EQ_INT(gguf_get_f32(g, "v.str", &f32), DP_EFORMAT);
    CHECK_EQ_INT(gguf_get_f32(g, "nope", &f32), DP_ENOTFOUND);
    CHECK(gguf_get_bool(g, "v.true", &b) == 0 && b);
    CHECK(gguf_get_bool(g, "v.false", &b) == 0 && !b);
    CHECK_EQ_INT(gguf_get_bool(g, "v.u8", &b), DP_EFORMAT);
    CHECK_EQ_INT(gguf_get_bool(g, "nope", &b), DP_ENOTFOUND);
    CHECK(gguf_get_str(g, "v.str", &s) == 0 && gguf_str_eq(s, "hello, gguf"));
    CHECK(gguf_get_str(g, "v.empty", &s) == 0 && s.len == 0 && gguf_str_eq(s, ""));
    CHECK(gguf_get_str(g, "v.nul", &s) == 0 && s.len == 3 && memcmp(s.ptr, "a\0b", 3) == 0);
    CHECK(!gguf_str_eq(s, "a"));
    CHECK(gguf_get_str(g, "z.last", &s) == 0 && gguf_str_eq(s, "end"));
    CHECK_EQ_INT(gguf_get_str(g, "v.u32", &s), DP_EFORMAT);
    CHECK_EQ_INT(gguf_get_str(g, "a.str", &s), DP_EFORMAT);
    CHECK_EQ_INT(gguf_get_str(g, "nope", &s), DP_ENOTFOUND);
    if (alignment)
        CHECK(gguf_get_u32(g, "general.alignment", &u32) == 0 && u32 == alignment);

    /* Arrays. */
    const dp_gguf_kv *kv;
    check_arr(g, "a.u8", DP_GGUF_U8, 3);
    kv = gguf_find_kv(g, "a.u8");
    for (int i = 0; i < 3; i++)
        CHECK(gguf_arr_i64(kv, (uint64_t)i) == A_U8[i] && gguf_arr_f64(kv, (uint64_t)i) == A_U8[i]);
    check_arr(g, "a.i8", DP_GGUF_I8, 3);
    kv = gguf_find_kv(g, "a.i8");
    for (int i = 0; i < 3; i++)
        CHECK(gguf_arr_i64(kv, (uint64_t)i) == A_I8[i]);
    kv = gguf_find_kv(g, "a.u16");
    for (int i = 0; i < 2; i++)
        CHECK(gguf_arr_i64(kv, (uint64_t)i) == A_U16[i]);
    kv = gguf_find_kv(g, "a.i16");
    for (int i = 0; i < 3; i++)
        CHECK(gguf_arr_i64(kv, (uint64_t)i) == A_I16[i]);
    kv = gguf_find_kv(g, "a.u32");
    for (int i = 0; i < 2; i++)
        CHECK(gguf_arr_i64(kv, (uint64_t)i) == A_U32[i]);
    check_arr(g, "a.i32", DP_GGUF_I32, 4);
    kv = gguf_find_kv(g, "a.i32");
    for (int i = 0; i < 4; i++)
        CHECK(gguf_arr_i64(kv, (uint64_t)i) == A_I32[i] && gguf_arr_f64(kv, (uint64_t)i) == A_I32[i]);
    kv = gguf_find_kv(g, "a.u64");
    CHECK(gguf_arr_f64(kv, 1) == (double)UINT64_MAX);
    kv = gguf_find_kv(g, "a.i64");
    for (int i = 0; i < 3; i++)
        CHECK(gguf_arr_i64(kv, (uint64_t)i) == A_I64[i]);
    kv = gguf_find_kv(g, "a.f32");
    for (int i = 0; i < 3; i++)
        CHECK(gguf_arr_f64(kv, (uint64_t)i) == (double)A_F32[i]);
    CHECK(gguf_arr_i64(kv, 0) == 1 && gguf_arr_i64(kv, 2) == INT64_MAX);
    kv = gguf_find_kv(g, "a.f64");
    for (int i = 0; i < 2; i++)
        CHECK(gguf_arr_f64(kv, (uint64_t)i) == A_F64[i]);
    check_arr(g, "a.bool", DP_GGUF_BOOL, 3);
    kv = gguf_find_kv(g, "a.bool");
    for (int i = 0; i < 3; i++)
        CHECK(gguf_arr_i64(kv, (uint64_t)i) == A_BOOL[i]);
    check_arr(g, "a.str", DP_GGUF_STRING, 4);
    kv = gguf_find_kv(g, "a.str");
    CHECK(kv->str_elems != NULL);
    for (int i = 0; i < 4; i++)
        CHECK_MSG(gguf_str_eq(gguf_arr_str(kv, (uint64_t)i), STRS[i]), "a.str[%d]", i);
    CHECK(gguf_arr_str(kv, 4).ptr == NULL); /* out of range is safe */
    CHECK(gguf_arr_str(gguf_find_kv(g, "a.i32"), 0).ptr == NULL);
    CHECK(gguf_find_kv(g, "a.i32")->str_elems == NULL);
    check_arr(g, "a.str_empty", DP_GGUF_STRING, 0);
    check_arr(g, "a.i32_empty", DP_GGUF_I32, 0);
    check_arr(g, "a.nested_i32", DP_GGUF_ARRAY, 3);
    check_arr(g, "a.nested_mixed", DP_GGUF_ARRAY, 2);
    CHECK(gguf_arr_i64(gguf_find_kv(g, "a.nested_i32"), 0) == 0);

    /* Tensors. */
    static const struct {
        const char *name;
        uint32_t type, n_dims;
        uint64_t ne[4];
        const void *data;
        uint64_t nbytes;
    } T[N_TENSORS] = {
        {"t.f32", DP_TYPE_F32, 2, {7, 3, 1, 1}, g_f32, sizeof g_f32},
        {"t.f16", DP_TYPE_F16, 1, {16, 1, 1, 1}, g_f16, sizeof g_f16},
        {"t.q8_0", DP_TYPE_Q8_0, 2, {64, 1, 1, 1}, g_q8, sizeof g_q8},
        {"t.q4_1", DP_TYPE_Q4_1, 3, {32, 2, 2, 1}, g_q41, sizeof g_q41},
        {"t.q4_k", DP_TYPE_Q4_K, 1, {256, 1, 1, 1}, g_q4k, sizeof g_q4k},
        {"t.bf16", DP_TYPE_BF16, 4, {5, 1, 1, 2}, g_bf16, sizeof g_bf16},
        {"t.iq2_xxs", DP_TYPE_IQ2_XXS, 1, {256, 1, 1, 1}, g_iq2, sizeof g_iq2},
    };
    for (int i = 0; i < N_TENSORS; i++) {
        const dp_gguf_tensor *t = gguf_find_tensor(g, T[i].name);
        CHECK_MSG(t != NULL, "%s", T[i].name);
        CHECK(t == &g->tensors[i]);
        CHECK_EQ_INT(t->type, T[i].type);
        CHECK_EQ_INT(t->n_dims, T[i].n_dims);
        uint64_t n = 1;
        for (int d = 0; d < 4; d++) {
            CHECK_EQ_INT(t->ne[d], T[i].ne[d]);
            n *= T[i].ne[d];
        }
        CHECK_EQ_INT(t->n_elems, n);
        CHECK_EQ_INT(t->nbytes, T[i].nbytes);
        CHECK(t->offset % g->alignment == 0);
        CHECK((const uint8_t *)t->data == g->base + g->data_offset + t->offset);
        CHECK(g->data_offset + t->offset + t->nbytes <= g->size);
        CHECK(memcmp(t->data, T[i].data, (size_t)T[i].nbytes) == 0);
    }
    CHECK(gguf_find_tensor(g, "t.nope") == NULL);
    CHECK(gguf_find_tensor(g, "t.f3") == NULL);
    /* The tensor data dequantizes (Q8_0 block 0 has d = 1). */
    float q8[64];
    const dp_gguf_tensor *t = gguf_find_tensor(g, "t.q8_0");
    CHECK_EQ_INT(quant_dequant_row(t->type, t->data, q8, 64), 0);
    CHECK(q8[0] == (float)(int8_t)g_q8[2] && q8[31] == (float)(int8_t)g_q8[33]);
}

static void roundtrip(uint32_t version, uint32_t alignment)
{
    gguf_writer w;
    build(&w, version, alignment);
    void *buf;
    size_t size;
    CHECK_EQ_INT(gguf_writer_finish_mem(&w, &buf, &size), 0);
    char err[DP_ERRLEN] = "";
    dp_gguf g;
    int rc = gguf_open_mem(&g, buf, size, err, sizeof err);
    CHECK_MSG(rc == 0, "open_mem: %s", err);
    CHECK(!g.mapped);
    check_file(&g, version, alignment);
    gguf_close(&g);

    /* The same through a file and mmap; the file bytes equal the buffer's. */
    char path[] = "/tmp/dp_test_gguf_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    CHECK_EQ_INT(gguf_writer_write_file(&w, path), 0);
    rc = gguf_open(&g, path, err, sizeof err);
    CHECK_MSG(rc == 0, "open: %s", err);
    CHECK(g.mapped && g.size == size && memcmp(g.base, buf, size) == 0);
    check_file(&g, version, alignment);
    /* Dropped pages come back from the file, byte for byte. */
    gguf_drop_tensor_pages(&g);
    CHECK(memcmp(g.base, buf, size) == 0);
    check_file(&g, version, alignment);
    gguf_close(&g);
    unlink(path);
    CHECK_EQ_INT(gguf_open(&g, path, err, sizeof err), DP_EIO);
    CHECK(strstr(err, path) != NULL && strchr(err, '\n') == NULL);
    free(buf);
    gguf_writer_destroy(&w);
}

static void test_synth(void)
{
    dp_synth_shape sh;
    CHECK_EQ_INT(synth_shape_preset("tiny", &sh), 0);
    CHECK_EQ_INT(synth_shape_preset("nope", &sh), DP_EINVAL);
    char err[DP_ERRLEN];
    const uint32_t types[] = {DP_TYPE_F32, DP_TYPE_F16, DP_TYPE_Q8_0, DP_TYPE_Q4_1};
    for (int ti = 0; ti < 4; ti++) {
        for (int tied = 0; tied < 2; tied++) {
            synth_shape_preset("tiny", &sh);
            sh.tied = tied;
            gguf_writer w;
            gguf_writer_init(&w);
            int rc = synth_llama_build(&w, &sh, 42, types[ti], err, sizeof err);
            CHECK_MSG(rc == 0, "%s", err);
            void *buf;
            size_t size;
            CHECK_EQ_INT(gguf_writer_finish_mem(&w, &buf, &size), 0);
            gguf_writer_destroy(&w);
            dp_gguf g;
            rc = gguf_open_mem(&g, buf, size, err, sizeof err);
            CHECK_MSG(rc == 0, "%s", err);
            CHECK_EQ_INT(g.n_tensors, 2 + 9 * sh.n_layers + (tied ? 0 : 1));
            uint32_t u;
            float f;
            dp_gguf_str s;
            CHECK(gguf_get_str(&g, "general.architecture", &s) == 0 && gguf_str_eq(s, "llama"));
            CHECK(gguf_get_u32(&g, "llama.block_count", &u) == 0 && u == sh.n_layers);
            CHECK(gguf_get_u32(&g, "llama.embedding_length", &u) == 0 && u == sh.dim);
            CHECK(gguf_get_u32(&g, "llama.feed_forward_length", &u) == 0 && u == sh.ffn);
            CHECK(gguf_get_u32(&g, "llama.attention.head_count", &u) == 0 && u == sh.n_heads);
            CHECK(gguf_get_u32(&g, "llama.attention.head_count_kv", &u) == 0 && u == sh.n_kv_heads);
            CHECK(gguf_get_u32(&g, "llama.context_length", &u) == 0 && u == sh.ctx);
            CHECK(gguf_get_u32(&g, "llama.vocab_size", &u) == 0 && u == sh.vocab);
            CHECK(gguf_get_u32(&g, "llama.rope.dimension_count", &u) == 0 && u == sh.dim / sh.n_heads);
            CHECK(gguf_get_f32(&g, "llama.rope.freq_base", &f) == 0 && f == sh.rope_base);
            CHECK(gguf_get_f32(&g, "llama.attention.layer_norm_rms_epsilon", &f) == 0 && f > 0 && f < 1e-3f);
            CHECK(gguf_get_str(&g, "tokenizer.ggml.model", &s) == 0 && gguf_str_eq(s, "gpt2"));
            CHECK(gguf_get_u32(&g, "tokenizer.ggml.bos_token_id", &u) == 0 && u == SYNTH_TOK_ENDOFTEXT(sh.vocab));
            CHECK(gguf_get_u32(&g, "tokenizer.ggml.eos_token_id", &u) == 0 && u == SYNTH_TOK_IM_END(sh.vocab));
            const dp_gguf_kv *tok = gguf_find_kv(&g, "tokenizer.ggml.tokens");
            const dp_gguf_kv *mer = gguf_find_kv(&g, "tokenizer.ggml.merges");
            const dp_gguf_kv *tty = gguf_find_kv(&g, "tokenizer.ggml.token_type");
            CHECK(tok && tok->arr_n == sh.vocab && mer && mer->arr_n == sh.vocab - 259 && tty &&
                  tty->arr_n == sh.vocab);
            CHECK(gguf_str_eq(gguf_arr_str(tok, 'A'), "A"));
            CHECK(gguf_str_eq(gguf_arr_str(tok, ' '), "\xc4\xa0"));  /* U+0120 */
            CHECK(gguf_str_eq(gguf_arr_str(tok, 0), "\xc4\x80"));    /* U+0100 */
            CHECK(gguf_str_eq(gguf_arr_str(tok, 256), "\xc4\xa0\xc4\xa0"));
            CHECK(gguf_str_eq(gguf_arr_str(mer, 0), "\xc4\xa0 \xc4\xa0"));
            CHECK(gguf_str_eq(gguf_arr_str(tok, sh.vocab - 1), "<|im_end|>"));
            CHECK(gguf_str_eq(gguf_arr_str(tok, sh.vocab - 2), "<|im_start|>"));
            CHECK(gguf_str_eq(gguf_arr_str(tok, sh.vocab - 3), "<|endoftext|>"));
            CHECK(gguf_arr_i64(tty, sh.vocab - 1) == 3 && gguf_arr_i64(tty, 5) == 1);
            const dp_gguf_tensor *t = gguf_find_tensor(&g, "token_embd.weight");
            CHECK(t && t->type == types[ti] && t->ne[0] == sh.dim && t->ne[1] == sh.vocab);
            t = gguf_find_tensor(&g, "blk.1.attn_k.weight");
            CHECK(t && t->ne[0] == sh.dim && t->ne[1] == sh.n_kv_heads * (sh.dim / sh.n_heads));
            t = gguf_find_tensor(&g, "blk.0.ffn_down.weight");
            CHECK(t && t->ne[0] == sh.ffn && t->ne[1] == sh.dim);
            CHECK((gguf_find_tensor(&g, "output.weight") != NULL) == !tied);
            /* Weights are finite, of the intended scale; norms are near 1. */
            t = gguf_find_tensor(&g, "blk.1.ffn_up.weight");
            CHECK(t && t->ne[0] == sh.dim && t->ne[1] == sh.ffn);
            float row[64];
            CHECK_EQ_INT(quant_dequant_row(t->type, t->data, row, (int64_t)sh.dim), 0);
            double ss = 0, a = sqrt(3.0 / sh.dim); /* uniform(-a, a), variance a^2/3 */
            for (uint32_t i = 0; i < sh.dim; i++) {
                CHECK(isfinite(row[i]) && fabs(row[i]) < a * 1.05);
                ss += row[i] * row[i];
            }
            CHECK(ss / sh.dim > 0.5 * a * a / 3 && ss / sh.dim < 1.5 * a * a / 3);
            t = gguf_find_tensor(&g, "output_norm.weight");
            CHECK(t && t->type == DP_TYPE_F32 && t->n_dims == 1);
            for (uint32_t i = 0; i < sh.dim; i++)
                CHECK(((const float *)t->data)[i] > 0.85f && ((const float *)t->data)[i] < 1.15f);
            gguf_close(&g);

            /* Streaming to a file gives the same bytes. */
            if (tied == 0) {
                char path[] = "/tmp/dp_test_synth_XXXXXX";
                int fd = mkstemp(path);
                CHECK(fd >= 0);
                close(fd);
                CHECK_EQ_INT(synth_llama_write(path, &sh, 42, types[ti], err, sizeof err), 0);
                rc = gguf_open(&g, path, err, sizeof err);
                CHECK_MSG(rc == 0, "%s", err);
                CHECK(g.size == size && memcmp(g.base, buf, size) == 0);
                gguf_close(&g);
                unlink(path);
            }
            free(buf);
        }
    }
    /* Bad shapes are refused with a message. */
    synth_shape_preset("tiny", &sh);
    sh.dim = 65;
    CHECK(synth_llama_write("/tmp/never", &sh, 1, DP_TYPE_F32, err, sizeof err) == DP_EINVAL && err[0]);
    synth_shape_preset("tiny", &sh);
    sh.ffn = 100;
    CHECK(synth_llama_write("/tmp/never", &sh, 1, DP_TYPE_Q8_0, err, sizeof err) == DP_EINVAL && err[0]);
    synth_shape_preset("tiny", &sh);
    CHECK(synth_llama_write("/tmp/never", &sh, 1, DP_TYPE_IQ4_XS, err, sizeof err) == DP_EUNSUPPORTED && err[0]);
    /* A K type on rows shorter than its 256-value blocks. */
    CHECK(synth_llama_write("/tmp/never", &sh, 1, DP_TYPE_Q6_K, err, sizeof err) == DP_EINVAL && err[0]);
    CHECK(access("/tmp/never", F_OK) != 0);
}

static void test_real_model(void)
{
    if (access(REAL_MODEL, R_OK) != 0) {
        printf("note: %s absent, real-model checks skipped\n", REAL_MODEL);
        return;
    }
    dp_gguf g;
    char err[DP_ERRLEN];
    int rc = gguf_open(&g, REAL_MODEL, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_EQ_INT(g.version, 3);
    CHECK_EQ_INT(g.n_tensors, 272);
    CHECK_EQ_INT(g.n_kv, 33);
    uint32_t u;
    CHECK(gguf_get_u32(&g, "llama.block_count", &u) == 0 && u == 30);
    CHECK(gguf_get_u32(&g, "llama.embedding_length", &u) == 0 && u == 576);
    const dp_gguf_tensor *t = gguf_find_tensor(&g, "token_embd.weight");
    CHECK(t && t->type == DP_TYPE_Q8_0 && t->n_dims == 2 && t->ne[0] == 576 && t->ne[1] == 49152);
    CHECK(gguf_find_tensor(&g, "output.weight") == NULL);
    const dp_gguf_kv *tok = gguf_find_kv(&g, "tokenizer.ggml.tokens");
    CHECK(tok && tok->arr_type == DP_GGUF_STRING && tok->arr_n == 49152 && tok->str_elems);
    float row[576];
    CHECK_EQ_INT(quant_dequant_row(t->type, t->data, row, 576), 0);
    for (int i = 0; i < 576; i++)
        CHECK(isfinite(row[i]));
    /* Every tensor of the file dequantizes (Q4_1, Q8_0, F32 here). */
    for (uint64_t i = 0; i < g.n_tensors; i++)
        CHECK_MSG(quant_type_supported(g.tensors[i].type), "%s", quant_type_name(g.tensors[i].type));
    printf("real model: %llu tensors, %llu kv, data at %llu\n", (unsigned long long)g.n_tensors,
           (unsigned long long)g.n_kv, (unsigned long long)g.data_offset);
    gguf_close(&g);
}

int main(void)
{
    fill_data();
    roundtrip(3, 0);
    roundtrip(2, 0);
    roundtrip(3, 64);
    roundtrip(2, 128);
    roundtrip(3, 1);
    test_synth();
    test_real_model();
    T_DONE("gguf");
}
