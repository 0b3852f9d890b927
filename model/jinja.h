/* jinja.h: a Jinja2-subset template engine (parse once, render many) and the
 * values a template is rendered with, for chat templates. */
#ifndef DP_MODEL_JINJA_H
#define DP_MODEL_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* ---- values ----
 * Reference-counted; a constructor returns one reference, jv_unref drops it.
 * Containers take over the reference they are given (also on failure), so a
 * caller builds a tree without unref'ing the parts. Constructors return NULL
 * when out of memory; every function taking a jv accepts NULL as "failed"
 * and reports it, so a tree can be built without checking each step. */
typedef enum jv_kind {
    JV_UNDEFINED = 0, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STRING, JV_LIST, JV_DICT,
    JV_NAMESPACE, JV_CALLABLE, /* made by templates only */
} jv_kind;

typedef struct jv jv;

jv *jv_undefined(void);
jv *jv_none(void);
jv *jv_bool(bool b);
jv *jv_int(int64_t i);
jv *jv_float(double f);
jv *jv_str(const char *s);          /* NULL s: NULL */
jv *jv_strn(const char *s, size_t n);
jv *jv_list(void);
jv *jv_dict(void);                  /* keeps insertion order */
jv *jv_ref(jv *v);
void jv_unref(jv *v);

/* 0, or DP_ENOMEM / DP_EINVAL (not a list or dict, or item NULL). */
int jv_list_push(jv *list, jv *item);
int jv_dict_set(jv *dict, const char *key, jv *val);   /* replaces an existing key */
int jv_dict_merge(jv *dst, const jv *src);             /* src's items set into dst */

jv_kind jv_kind_of(const jv *v);
jv *jv_dict_get(const jv *dict, const char *key);       /* borrowed; NULL if absent */
size_t jv_len(const jv *v);                             /* list/dict items, string bytes */
const char *jv_string(const jv *v, size_t *len);        /* NULL unless a string */
jv *jv_list_get(const jv *list, size_t i);              /* borrowed; NULL if out of range */
size_t jv_string_bytes(const jv *v);                    /* bytes of all strings in a tree */

/* ---- templates ---- */
typedef struct jinja_tmpl jinja_tmpl;

/* Parses with Hugging Face's settings (trim_blocks, lstrip_blocks,
 * loopcontrols). Anything the engine does not implement (statement, filter,
 * test, method, global) is an error naming it and its line. */
int jinja_parse(const char *src, size_t len, jinja_tmpl **out, char *err, size_t errsz);
void jinja_free(jinja_tmpl *t);

/* Bounds on one rendering, so that a hostile template fails instead of
 * hanging or exhausting memory. Zero fields take the defaults. */
typedef struct jinja_opts {
    size_t max_output;   /* bytes of output and of any one string (default 1 MiB) */
    long max_iters;      /* loop iterations in all (default 100000) */
    int max_depth;       /* macro call nesting (default 64) */
    long max_ms;         /* wall-clock limit of the rendering (default 0: none) */
    time_t now;          /* strftime_now's time; 0: the clock */
} jinja_opts;

/* Renders with ctx (a dict: messages, add_generation_prompt ...). *out is
 * malloc'd and NUL-terminated, *out_len its length. raise_exception and
 * any error in the template give DP_EINVAL with the message; a limit hit,
 * DP_ERANGE. */
int jinja_render_opts(const jinja_tmpl *t, const jv *ctx, const jinja_opts *o, char **out,
                      size_t *out_len, char *err, size_t errsz);
int jinja_render(const jinja_tmpl *t, const jv *ctx, char **out, char *err, size_t errsz);

#endif
