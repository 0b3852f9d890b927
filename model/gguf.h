/* gguf.h: a validating reader for GGUF v2/v3 model files (mmap'd, read-only).
 * Every count, length and offset is checked against the file size at open, so
 * a truncated or hostile file yields an error message and never a stray read. */
#ifndef DP_MODEL_GGUF_H
#define DP_MODEL_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

/* Metadata value types, numbered as in the file. */
typedef enum dp_gguf_vtype {
    DP_GGUF_U8 = 0,
    DP_GGUF_I8 = 1,
    DP_GGUF_U16 = 2,
    DP_GGUF_I16 = 3,
    DP_GGUF_U32 = 4,
    DP_GGUF_I32 = 5,
    DP_GGUF_F32 = 6,
    DP_GGUF_BOOL = 7,
    DP_GGUF_STRING = 8,
    DP_GGUF_ARRAY = 9,
    DP_GGUF_U64 = 10,
    DP_GGUF_I64 = 11,
    DP_GGUF_F64 = 12,
} dp_gguf_vtype;

/* A string inside the mapping: not NUL-terminated. */
typedef struct dp_gguf_str {
    const char *ptr;
    uint64_t len;
} dp_gguf_str;

typedef struct dp_gguf_kv {
    dp_gguf_str key;
    uint32_t type;          /* dp_gguf_vtype */
    uint32_t arr_type;      /* element type when type == ARRAY */
    uint64_t arr_n;         /* element count when type == ARRAY */
    const uint8_t *value;   /* start of the value (for arrays: the first element) */
    /* For arrays of strings: the start of each element, built at open so that
     * element i is found in O(1). NULL for other kinds. */
    const uint8_t **str_elems;
} dp_gguf_kv;

#define DP_GGUF_MAX_DIMS 4

typedef struct dp_gguf_tensor {
    dp_gguf_str name;
    uint32_t n_dims;
    uint64_t ne[DP_GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
    uint32_t type;                 /* dp_dtype id */
    uint64_t offset;               /* relative to the data section */
    uint64_t n_elems;
    uint64_t nbytes;
    const void *data;              /* inside the mapping, bounds-checked */
} dp_gguf_tensor;

typedef struct dp_gguf {
    const uint8_t *base;   /* mapping or caller's buffer */
    size_t size;
    bool mapped;           /* true when base must be munmap'd */
    uint32_t version;
    uint64_t n_kv;
    dp_gguf_kv *kv;
    uint64_t n_tensors;
    dp_gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_offset;  /* aligned start of the tensor data section */
} dp_gguf;

/* Opens and validates a file. On error returns a negative DP_E* code and
 * writes a one-line message naming what is wrong into err. */
int gguf_open(dp_gguf *g, const char *path, char *err, size_t errsz);

/* Same, over a buffer the caller keeps alive (used by tests and fuzzers). */
int gguf_open_mem(dp_gguf *g, const void *data, size_t size, char *err, size_t errsz);

void gguf_close(dp_gguf *g);

/* Gives back the resident pages of a mapped file's tensor data once a
 * backend has its own copy of every weight (llama_init): they are file
 * pages, dropped from the process, read again from the file should
 * anything touch them (the metadata before them stays). A buffer the
 * caller owns is left as it is. */
void gguf_drop_tensor_pages(const dp_gguf *g);

const dp_gguf_kv *gguf_find_kv(const dp_gguf *g, const char *key);
const dp_gguf_tensor *gguf_find_tensor(const dp_gguf *g, const char *name);

/* Typed getters. They return 0, DP_ENOTFOUND when the key is absent, or
 * DP_EFORMAT when the value's type does not convert (integers convert between
 * widths when the value fits; f32/f64 convert to each other and from ints). */
int gguf_get_u32(const dp_gguf *g, const char *key, uint32_t *out);
int gguf_get_i64(const dp_gguf *g, const char *key, int64_t *out);
int gguf_get_f32(const dp_gguf *g, const char *key, float *out);
int gguf_get_bool(const dp_gguf *g, const char *key, bool *out);
int gguf_get_str(const dp_gguf *g, const char *key, dp_gguf_str *out);

/* Array element access (i < kv->arr_n is the caller's check). */
dp_gguf_str gguf_arr_str(const dp_gguf_kv *kv, uint64_t i);
/* Reads element i of a numeric array as double / int64. */
double gguf_arr_f64(const dp_gguf_kv *kv, uint64_t i);
int64_t gguf_arr_i64(const dp_gguf_kv *kv, uint64_t i);

/* True when s equals the NUL-terminated c string. */
bool gguf_str_eq(dp_gguf_str s, const char *c);

#endif
