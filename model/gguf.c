/* gguf.c: the GGUF v2/v3 reader: mapping, header/metadata/tensor-info parsing
 * with every count checked against the bytes left, and the typed getters. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dp.h"
#include "kernels/quant.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" read as little-endian u32 */
#define GGUF_DEFAULT_ALIGNMENT 32
/* Arrays of arrays are legal but no real file nests deeply; a cap keeps a
 * hostile file from recursing the stack away. */
#define GGUF_MAX_NEST 8

typedef struct cursor {
    const uint8_t *base;
    size_t size;
    size_t pos;
    char *err;
    size_t errsz;
} cursor;

static size_t cur_left(const cursor *c) { return c->size - c->pos; }

/* Formats a name from the file for an error message: printable ASCII kept,
 * anything else escaped, long names cut, so the message stays one line. */
static const char *show(dp_gguf_str s, char *buf, size_t bufsz)
{
    size_t o = 0;
    uint64_t n = s.len > 80 ? 80 : s.len;
    for (uint64_t i = 0; i < n && o + 5 < bufsz; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        if (ch >= 0x20 && ch < 0x7f && ch != '\\' && ch != '\'')
            buf[o++] = (char)ch;
        else
            o += (size_t)snprintf(buf + o, bufsz - o, "\\x%02x", ch);
    }
    if (s.len > n && o + 4 < bufsz) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o < bufsz ? o : bufsz - 1] = '\0';
    return buf;
}

static int rd_u32(cursor *c, uint32_t *v, const char *what)
{
    *v = 0; /* defined even on error, which keeps gcc's flow analysis quiet */
    if (cur_left(c) < 4)
        return dp_err(c->err, c->errsz, DP_EFORMAT, "gguf: file truncated reading %s at byte %zu (%zu bytes)",
                      what, c->pos, c->size);
    memcpy(v, c->base + c->pos, 4);
    c->pos += 4;
    return 0;
}

static int rd_u64(cursor *c, uint64_t *v, const char *what)
{
    *v = 0;
    if (cur_left(c) < 8)
        return dp_err(c->err, c->errsz, DP_EFORMAT, "gguf: file truncated reading %s at byte %zu (%zu bytes)",
                      what, c->pos, c->size);
    memcpy(v, c->base + c->pos, 8);
    c->pos += 8;
    return 0;
}

static int rd_str(cursor *c, dp_gguf_str *s, const char *what)
{
    uint64_t len;
    s->ptr = NULL;
    s->len = 0;
    int rc = rd_u64(c, &len, what);
    if (rc)
        return rc;
    if (len > cur_left(c))
        return dp_err(c->err, c->errsz, DP_EFORMAT,
                      "gguf: %s at byte %zu has length %llu but only %zu bytes remain", what, c->pos - 8,
                      (unsigned long long)len, cur_left(c));
    s->ptr = (const char *)c->base + c->pos;
    s->len = len;
    c->pos += (size_t)len;
    return 0;
}

/* Size of a fixed-size value type; 0 for string, array and unknown types. */
static size_t vtype_size(uint32_t t)
{
    switch (t) {
    case DP_GGUF_U8: case DP_GGUF_I8: case DP_GGUF_BOOL: return 1;
    case DP_GGUF_U16: case DP_GGUF_I16: return 2;
    case DP_GGUF_U32: case DP_GGUF_I32: case DP_GGUF_F32: return 4;
    case DP_GGUF_U64: case DP_GGUF_I64: case DP_GGUF_F64: return 8;
    default: return 0;
    }
}

static bool vtype_known(uint32_t t) { return t <= DP_GGUF_F64; }

/* Skips (and validates) the elements of an array of type t, count n. When
 * str_elems is non-NULL (strings only), records where each element starts. */
static int skip_array(cursor *c, uint32_t t, uint64_t n, int depth, const uint8_t **str_elems, const char *key)
{
    size_t fixed = vtype_size(t);
    if (fixed) {
        if (n > cur_left(c) / fixed)
            return dp_err(c->err, c->errsz, DP_EFORMAT,
                          "gguf: key '%s': array of %llu elements of %zu bytes runs past end of file", key,
                          (unsigned long long)n, fixed);
        c->pos += (size_t)(n * fixed);
        return 0;
    }
    if (t == DP_GGUF_STRING) {
        if (n > cur_left(c) / 8)
            return dp_err(c->err, c->errsz, DP_EFORMAT,
                          "gguf: key '%s': array of %llu strings cannot fit in the %zu bytes left", key,
                          (unsigned long long)n, cur_left(c));
        for (uint64_t i = 0; i < n; i++) {
            dp_gguf_str s;
            if (str_elems)
                str_elems[i] = c->base + c->pos;
            if (cur_left(c) < 8)
                return dp_err(c->err, c->errsz, DP_EFORMAT,
                              "gguf: key '%s': file truncated in string element %llu", key, (unsigned long long)i);
            uint64_t len;
            memcpy(&len, c->base + c->pos, 8);
            if (len > cur_left(c) - 8)
                return dp_err(c->err, c->errsz, DP_EFORMAT,
                              "gguf: key '%s': string element %llu has length %llu but only %zu bytes remain", key,
                              (unsigned long long)i, (unsigned long long)len, cur_left(c) - 8);
            int rc = rd_str(c, &s, "string");
            if (rc)
                return rc;
        }
        return 0;
    }
    if (t == DP_GGUF_ARRAY) {
        if (depth >= GGUF_MAX_NEST)
            return dp_err(c->err, c->errsz, DP_EFORMAT, "gguf: key '%s': arrays nested deeper than %d levels", key,
                          GGUF_MAX_NEST);
        if (n > cur_left(c) / 12)
            return dp_err(c->err, c->errsz, DP_EFORMAT,
                          "gguf: key '%s': array of %llu arrays cannot fit in the %zu bytes left", key,
                          (unsigned long long)n, cur_left(c));
        for (uint64_t i = 0; i < n; i++) {
            uint32_t et;
            uint64_t en;
            int rc = rd_u32(c, &et, "nested array type");
            if (!rc)
                rc = rd_u64(c, &en, "nested array count");
            if (rc)
                return rc;
            if (!vtype_known(et))
                return dp_err(c->err, c->errsz, DP_EFORMAT, "gguf: key '%s': nested array has unknown type %u", key,
                              et);
            rc = skip_array(c, et, en, depth + 1, NULL, key);
            if (rc)
                return rc;
        }
        return 0;
    }
    return dp_err(c->err, c->errsz, DP_EFORMAT, "gguf: key '%s': array has unknown element type %u", key, t);
}

/* ---- a small open-addressing set of names, for duplicate detection ---- */

typedef struct name_set {
    const dp_gguf_str **slots;
    size_t cap; /* power of two */
} name_set;

static uint64_t hash_bytes(const char *p, uint64_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int name_set_init(name_set *s, uint64_t n)
{
    size_t cap = 16;
    while (cap < n * 2)
        cap <<= 1;
    s->slots = calloc(cap, sizeof *s->slots);
    s->cap = cap;
    return s->slots ? 0 : DP_ENOMEM;
}

/* Returns false when the name was already present. */
static bool name_set_add(name_set *s, const dp_gguf_str *name)
{
    size_t i = (size_t)hash_bytes(name->ptr, name->len) & (s->cap - 1);
    while (s->slots[i]) {
        const dp_gguf_str *o = s->slots[i];
        if (o->len == name->len && memcmp(o->ptr, name->ptr, (size_t)name->len) == 0)
            return false;
        i = (i + 1) & (s->cap - 1);
    }
    s->slots[i] = name;
    return true;
}

static void name_set_destroy(name_set *s) { free(s->slots); }

/* ---- integer conversion for the getters and general.alignment ---- */

/* Reads a scalar integer value; false when the type is not an integer. */
static bool kv_int(uint32_t type, const uint8_t *v, int64_t *si, uint64_t *ui, bool *is_unsigned)
{
    switch (type) {
    case DP_GGUF_U8: *ui = v[0]; *is_unsigned = true; return true;
    case DP_GGUF_I8: *si = (int8_t)v[0]; *is_unsigned = false; return true;
    case DP_GGUF_U16: { uint16_t x; memcpy(&x, v, 2); *ui = x; *is_unsigned = true; return true; }
    case DP_GGUF_I16: { int16_t x; memcpy(&x, v, 2); *si = x; *is_unsigned = false; return true; }
    case DP_GGUF_U32: { uint32_t x; memcpy(&x, v, 4); *ui = x; *is_unsigned = true; return true; }
    case DP_GGUF_I32: { int32_t x; memcpy(&x, v, 4); *si = x; *is_unsigned = false; return true; }
    case DP_GGUF_U64: { uint64_t x; memcpy(&x, v, 8); *ui = x; *is_unsigned = true; return true; }
    case DP_GGUF_I64: { int64_t x; memcpy(&x, v, 8); *si = x; *is_unsigned = false; return true; }
    default: return false;
    }
}

/* ---- parsing ---- */

/* The start of a table of n entries of sz bytes (the metadata, the tensor
 * infos): n is checked against the bytes left, each entry taking at least
 * min_bytes, then the entries are allocated zeroed (*out, set even when a
 * later step fails) and seen is made ready for their names. */
static int table_begin(cursor *c, uint64_t n, size_t min_bytes, size_t sz, const char *what,
                       void **out, name_set *seen)
{
    *out = NULL;
    if (n > cur_left(c) / min_bytes)
        return dp_err(c->err, c->errsz, DP_EFORMAT, "gguf: header claims %llu %s but only %zu bytes follow",
                      (unsigned long long)n, what, cur_left(c));
    if (n && !(*out = calloc((size_t)n, sz)))
        return dp_err(c->err, c->errsz, DP_ENOMEM, "gguf: out of memory for %llu %s",
                      (unsigned long long)n, what);
    if (name_set_init(seen, n))
        return dp_err(c->err, c->errsz, DP_ENOMEM, "gguf: out of memory");
    return 0;
}

/* Entry i's name (what: "key of metadata entry"), printable in nb; a name
 * already in seen is an error naming kind ("metadata key"). */
static int read_name(cursor *c, name_set *seen, uint64_t i, const char *what, const char *kind,
                     dp_gguf_str *name, char *nb, size_t nbsz)
{
    char w[64];
    snprintf(w, sizeof w, "%s %llu", what, (unsigned long long)i);
    int rc = rd_str(c, name, w);
    if (rc)
        return rc;
    show(*name, nb, nbsz);
    if (!name_set_add(seen, name))
        return dp_err(c->err, c->errsz, DP_EFORMAT, "gguf: duplicate %s '%s'", kind, nb);
    return 0;
}

static int parse_kvs(dp_gguf *g, cursor *c)
{
    char nb[400];
    name_set seen;
    void *tab;
    /* Smallest kv: empty key (8) + type (4) + one byte of value. */
    int rc = table_begin(c, g->n_kv, 13, sizeof *g->kv, "metadata entries", &tab, &seen);
    g->kv = tab;
    if (rc)
        return rc;
    for (uint64_t i = 0; i < g->n_kv && !rc; i++) {
        dp_gguf_kv *kv = &g->kv[i];
        if ((rc = read_name(c, &seen, i, "key of metadata entry", "metadata key", &kv->key, nb,
                            sizeof nb)))
            break;
        if ((rc = rd_u32(c, &kv->type, "metadata value type")))
            break;
        if (!vtype_known(kv->type)) {
            rc = dp_err(c->err, c->errsz, DP_EFORMAT, "gguf: key '%s' has unknown value type %u", nb, kv->type);
            break;
        }
        if (kv->type == DP_GGUF_ARRAY) {
            if ((rc = rd_u32(c, &kv->arr_type, "array element type")) || (rc = rd_u64(c, &kv->arr_n, "array count")))
                break;
            if (!vtype_known(kv->arr_type)) {
                rc = dp_err(c->err, c->errsz, DP_EFORMAT, "gguf: key '%s': array has unknown element type %u", nb,
                            kv->arr_type);
                break;
            }
            kv->value = c->base + c->pos;
            if (kv->arr_type == DP_GGUF_STRING) {
                if (kv->arr_n > cur_left(c) / 8) {
                    rc = dp_err(c->err, c->errsz, DP_EFORMAT,
                                "gguf: key '%s': array of %llu strings cannot fit in the %zu bytes left", nb,
                                (unsigned long long)kv->arr_n, cur_left(c));
                    break;
                }
                if (kv->arr_n) {
                    kv->str_elems = malloc((size_t)kv->arr_n * sizeof *kv->str_elems);
                    if (!kv->str_elems) {
                        rc = dp_err(c->err, c->errsz, DP_ENOMEM, "gguf: key '%s': out of memory for %llu strings",
                                    nb, (unsigned long long)kv->arr_n);
                        break;
                    }
                }
            }
            rc = skip_array(c, kv->arr_type, kv->arr_n, 0, kv->str_elems, nb);
        } else if (kv->type == DP_GGUF_STRING) {
            kv->value = c->base + c->pos;
            dp_gguf_str s;
            char w2[480];
            snprintf(w2, sizeof w2, "value of key '%s'", nb);
            rc = rd_str(c, &s, w2);
        } else {
            size_t sz = vtype_size(kv->type);
            if (cur_left(c) < sz) {
                rc = dp_err(c->err, c->errsz, DP_EFORMAT, "gguf: file truncated in the value of key '%s'", nb);
                break;
            }
            kv->value = c->base + c->pos;
            c->pos += sz;
        }
    }
    name_set_destroy(&seen);
    return rc;
}

static int parse_alignment(dp_gguf *g, char *err, size_t errsz)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const dp_gguf_kv *kv = gguf_find_kv(g, "general.alignment");
    if (!kv)
        return 0;
    int64_t si = 0;
    uint64_t ui = 0;
    bool uns = false;
    if (!kv_int(kv->type, kv->value, &si, &ui, &uns))
        return dp_err(err, errsz, DP_EFORMAT, "gguf: general.alignment must be an integer (has value type %u)",
                      kv->type);
    if (!uns) {
        if (si < 0)
            return dp_err(err, errsz, DP_EFORMAT, "gguf: general.alignment is negative (%lld)", (long long)si);
        ui = (uint64_t)si;
    }
    if (ui == 0 || (ui & (ui - 1)) != 0 || ui > (1u << 30))
        return dp_err(err, errsz, DP_EFORMAT, "gguf: general.alignment %llu is not a power of two in [1, 2^30]",
                      (unsigned long long)ui);
    g->alignment = ui;
    return 0;
}

static int parse_tensor_infos(dp_gguf *g, cursor *c)
{
    char nb[400];
    name_set seen;
    void *tab;
    /* Smallest info: empty name (8) + n_dims (4) + one dim (8) + type (4) + offset (8). */
    int rc = table_begin(c, g->n_tensors, 32, sizeof *g->tensors, "tensors", &tab, &seen);
    g->tensors = tab;
    if (rc)
        return rc;
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++) {
        dp_gguf_tensor *t = &g->tensors[i];
        if ((rc = read_name(c, &seen, i, "name of tensor", "tensor name", &t->name, nb, sizeof nb)))
            break;
        if ((rc = rd_u32(c, &t->n_dims, "tensor n_dims")))
            break;
        if (t->n_dims == 0 || t->n_dims > DP_GGUF_MAX_DIMS) {
            rc = dp_err(c->err, c->errsz, DP_EFORMAT, "gguf: tensor '%s' has %u dimensions (must be 1..%d)", nb,
                        t->n_dims, DP_GGUF_MAX_DIMS);
            break;
        }
        for (int d = 0; d < DP_GGUF_MAX_DIMS; d++)
            t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims && !rc; d++)
            rc = rd_u64(c, &t->ne[d], "tensor dimension");
        if (rc || (rc = rd_u32(c, &t->type, "tensor type")) || (rc = rd_u64(c, &t->offset, "tensor offset")))
            break;
        /* Checks that need no data section come now, so the first problem
         * reported is the one nearest the start of the file. */
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            if (t->ne[d] == 0) {
                rc = dp_err(c->err, c->errsz, DP_EFORMAT, "gguf: tensor '%s' has dimension %u of size 0", nb, d);
                break;
            }
            if (t->ne[d] > (uint64_t)INT64_MAX / n) {
                rc = dp_err(c->err, c->errsz, DP_EFORMAT, "gguf: tensor '%s': element count overflows", nb);
                break;
            }
            n *= t->ne[d];
        }
        if (rc)
            break;
        t->n_elems = n;
        if (!quant_type_known(t->type)) {
            rc = dp_err(c->err, c->errsz, DP_EFORMAT, "gguf: tensor '%s' has unknown type %u", nb, t->type);
            break;
        }
        uint32_t be = quant_block_elems(t->type);
        if (t->ne[0] % be != 0) {
            rc = dp_err(c->err, c->errsz, DP_EFORMAT,
                        "gguf: tensor '%s': row length %llu is not a multiple of the %s block size %u", nb,
                        (unsigned long long)t->ne[0], quant_type_name(t->type), be);
            break;
        }
        uint64_t row;
        if (quant_row_bytes(t->type, t->ne[0], &row) != 0 || (row && n / t->ne[0] > UINT64_MAX / row)) {
            rc = dp_err(c->err, c->errsz, DP_EFORMAT, "gguf: tensor '%s': byte size overflows", nb);
            break;
        }
        t->nbytes = row * (n / t->ne[0]);
        if (t->offset % g->alignment != 0) {
            rc = dp_err(c->err, c->errsz, DP_EFORMAT,
                        "gguf: tensor '%s': data offset %llu is not a multiple of the alignment %llu", nb,
                        (unsigned long long)t->offset, (unsigned long long)g->alignment);
            break;
        }
    }
    name_set_destroy(&seen);
    return rc;
}

static int place_tensors(dp_gguf *g, size_t info_end, char *err, size_t errsz)
{
    char nb[400];
    /* info_end < size, and alignment <= 2^30, so this cannot wrap. */
    uint64_t a = g->alignment;
    g->data_offset = ((uint64_t)info_end + a - 1) / a * a;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        dp_gguf_tensor *t = &g->tensors[i];
        show(t->name, nb, sizeof nb);
        uint64_t start = g->data_offset + t->offset;
        if (t->offset > UINT64_MAX - g->data_offset || start > g->size || t->nbytes > g->size - start)
            return dp_err(err, errsz, DP_EFORMAT,
                          "gguf: tensor '%s': data [offset %llu, %llu bytes] runs past end of file (%zu bytes)", nb,
                          (unsigned long long)t->offset, (unsigned long long)t->nbytes, g->size);
        t->data = g->base + start;
    }
    return 0;
}

static int parse(dp_gguf *g, char *err, size_t errsz)
{
    cursor c = {.base = g->base, .size = g->size, .pos = 0, .err = err, .errsz = errsz};
    uint32_t magic;
    if (g->size < 4)
        return dp_err(err, errsz, DP_EFORMAT, "gguf: file too short (%zu bytes) to be GGUF", g->size);
    memcpy(&magic, g->base, 4);
    if (magic != GGUF_MAGIC)
        return dp_err(err, errsz, DP_EFORMAT, "gguf: bad magic 0x%08x (not a GGUF file)", magic);
    c.pos = 4;
    int rc = rd_u32(&c, &g->version, "version");
    if (rc)
        return rc;
    if (g->version == 1)
        return dp_err(err, errsz, DP_EUNSUPPORTED,
                      "gguf: version 1 files (32-bit counts) are not supported; convert to GGUF v3");
    if (g->version != 2 && g->version != 3) {
        if (g->version == 0x02000000u || g->version == 0x03000000u)
            return dp_err(err, errsz, DP_EUNSUPPORTED, "gguf: big-endian GGUF files are not supported");
        return dp_err(err, errsz, DP_EUNSUPPORTED, "gguf: unsupported version %u (supported: 2, 3)", g->version);
    }
    if ((rc = rd_u64(&c, &g->n_tensors, "tensor count")) || (rc = rd_u64(&c, &g->n_kv, "metadata count")))
        return rc;
    /* The kv parser compares n_kv with the bytes left; the tensor count is
     * compared again after the kvs, but reject absurd values early too. */
    if (g->n_tensors > cur_left(&c) / 32)
        return dp_err(err, errsz, DP_EFORMAT, "gguf: header claims %llu tensors but the file has only %zu bytes",
                      (unsigned long long)g->n_tensors, g->size);
    if ((rc = parse_kvs(g, &c)))
        return rc;
    if ((rc = parse_alignment(g, err, errsz)))
        return rc;
    if ((rc = parse_tensor_infos(g, &c)))
        return rc;
    return place_tensors(g, c.pos, err, errsz);
}

static void free_parsed(dp_gguf *g)
{
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++)
            free(g->kv[i].str_elems);
    free(g->kv);
    free(g->tensors);
    g->kv = NULL;
    g->tensors = NULL;
}

int gguf_open_mem(dp_gguf *g, const void *data, size_t size, char *err, size_t errsz)
{
    memset(g, 0, sizeof *g);
    if (!data && size)
        return dp_err(err, errsz, DP_EINVAL, "gguf: NULL buffer");
    g->base = data;
    g->size = size;
    int rc = parse(g, err, errsz);
    if (rc) {
        free_parsed(g);
        memset(g, 0, sizeof *g);
    }
    return rc;
}

int gguf_open(dp_gguf *g, const char *path, char *err, size_t errsz)
{
    memset(g, 0, sizeof *g);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dp_err(err, errsz, DP_EIO, "gguf: cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return dp_err(err, errsz, DP_EIO, "gguf: cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return dp_err(err, errsz, DP_EIO, "gguf: '%s' is not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return dp_err(err, errsz, DP_EFORMAT, "gguf: '%s' is empty", path);
    }
    size_t size = (size_t)st.st_size;
    void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED)
        return dp_err(err, errsz, DP_EIO, "gguf: cannot map '%s': %s", path, strerror(e));
    int rc = gguf_open_mem(g, p, size, err, errsz);
    if (rc) {
        munmap(p, size);
        return rc;
    }
    g->mapped = true;
    return 0;
}

void gguf_close(dp_gguf *g)
{
    if (!g)
        return;
    free_parsed(g);
    if (g->mapped && g->base)
        munmap((void *)g->base, g->size);
    memset(g, 0, sizeof *g);
}

void gguf_drop_tensor_pages(const dp_gguf *g)
{
    if (!g || !g->mapped || !g->base)
        return;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t from = ((size_t)g->data_offset + page - 1) / page * page;
    if (from < g->size)
        (void)madvise((void *)(g->base + from), g->size - from, MADV_DONTNEED);
}

bool gguf_str_eq(dp_gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

const dp_gguf_kv *gguf_find_kv(const dp_gguf *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (gguf_str_eq(g->kv[i].key, key))
            return &g->kv[i];
    return NULL;
}

const dp_gguf_tensor *gguf_find_tensor(const dp_gguf *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (gguf_str_eq(g->tensors[i].name, name))
            return &g->tensors[i];
    return NULL;
}

static int get_int(const dp_gguf *g, const char *key, int64_t *si, uint64_t *ui, bool *uns)
{
    const dp_gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv)
        return DP_ENOTFOUND;
    return kv_int(kv->type, kv->value, si, ui, uns) ? 0 : DP_EFORMAT;
}

int gguf_get_u32(const dp_gguf *g, const char *key, uint32_t *out)
{
    int64_t si = 0;
    uint64_t ui = 0;
    bool uns = false;
    int rc = get_int(g, key, &si, &ui, &uns);
    if (rc)
        return rc;
    if (uns ? ui > UINT32_MAX : (si < 0 || si > (int64_t)UINT32_MAX))
        return DP_EFORMAT;
    *out = uns ? (uint32_t)ui : (uint32_t)si;
    return 0;
}

int gguf_get_i64(const dp_gguf *g, const char *key, int64_t *out)
{
    int64_t si = 0;
    uint64_t ui = 0;
    bool uns = false;
    int rc = get_int(g, key, &si, &ui, &uns);
    if (rc)
        return rc;
    if (uns && ui > (uint64_t)INT64_MAX)
        return DP_EFORMAT;
    *out = uns ? (int64_t)ui : si;
    return 0;
}

int gguf_get_f32(const dp_gguf *g, const char *key, float *out)
{
    const dp_gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv)
        return DP_ENOTFOUND;
    if (kv->type == DP_GGUF_F32) {
        memcpy(out, kv->value, 4);
        return 0;
    }
    if (kv->type == DP_GGUF_F64) {
        double d;
        memcpy(&d, kv->value, 8);
        *out = (float)d;
        return 0;
    }
    int64_t si = 0;
    uint64_t ui = 0;
    bool uns = false;
    if (!kv_int(kv->type, kv->value, &si, &ui, &uns))
        return DP_EFORMAT;
    *out = uns ? (float)ui : (float)si;
    return 0;
}

int gguf_get_bool(const dp_gguf *g, const char *key, bool *out)
{
    const dp_gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv)
        return DP_ENOTFOUND;
    if (kv->type != DP_GGUF_BOOL)
        return DP_EFORMAT;
    *out = kv->value[0] != 0;
    return 0;
}

int gguf_get_str(const dp_gguf *g, const char *key, dp_gguf_str *out)
{
    const dp_gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv)
        return DP_ENOTFOUND;
    if (kv->type != DP_GGUF_STRING)
        return DP_EFORMAT;
    uint64_t len;
    memcpy(&len, kv->value, 8);
    out->ptr = (const char *)kv->value + 8;
    out->len = len;
    return 0;
}

dp_gguf_str gguf_arr_str(const dp_gguf_kv *kv, uint64_t i)
{
    dp_gguf_str s = {NULL, 0};
    if (!kv || kv->type != DP_GGUF_ARRAY || kv->arr_type != DP_GGUF_STRING || !kv->str_elems || i >= kv->arr_n)
        return s;
    memcpy(&s.len, kv->str_elems[i], 8);
    s.ptr = (const char *)kv->str_elems[i] + 8;
    return s;
}

int64_t gguf_arr_i64(const dp_gguf_kv *kv, uint64_t i)
{
    if (!kv || kv->type != DP_GGUF_ARRAY || i >= kv->arr_n)
        return 0;
    size_t sz = vtype_size(kv->arr_type);
    if (!sz)
        return 0;
    const uint8_t *v = kv->value + i * sz;
    int64_t si = 0;
    uint64_t ui = 0;
    bool uns = false;
    if (kv_int(kv->arr_type, v, &si, &ui, &uns))
        return uns ? (int64_t)ui : si;
    if (kv->arr_type == DP_GGUF_BOOL)
        return v[0] != 0;
    double d;
    if (kv->arr_type == DP_GGUF_F32) {
        float f;
        memcpy(&f, v, 4);
        d = f;
    } else {
        memcpy(&d, v, 8);
    }
    /* Out-of-range float to int conversion is undefined: clamp first. */
    if (!(d == d))
        return 0;
    if (d >= 9223372036854775807.0)
        return INT64_MAX;
    if (d <= -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)d;
}

double gguf_arr_f64(const dp_gguf_kv *kv, uint64_t i)
{
    if (!kv || kv->type != DP_GGUF_ARRAY || i >= kv->arr_n)
        return 0;
    size_t sz = vtype_size(kv->arr_type);
    if (!sz)
        return 0;
    const uint8_t *v = kv->value + i * sz;
    if (kv->arr_type == DP_GGUF_F32) {
        float f;
        memcpy(&f, v, 4);
        return f;
    }
    if (kv->arr_type == DP_GGUF_F64) {
        double d;
        memcpy(&d, v, 8);
        return d;
    }
    if (kv->arr_type == DP_GGUF_BOOL)
        return v[0] != 0;
    int64_t si = 0;
    uint64_t ui = 0;
    bool uns = false;
    kv_int(kv->arr_type, v, &si, &ui, &uns);
    return uns ? (double)ui : (double)si;
}
