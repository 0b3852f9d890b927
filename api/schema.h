/* schema.h: converters to GBNF (the dialect sched/grammar.h compiles) for the
 * structured-output request fields: OpenAI's response_format (json_schema and
 * json_object) and vLLM's guided_json, guided_regex and guided_choice.
 *
 * Every converter returns 0 with a malloc'd NUL-terminated grammar in *out
 * (start rule `root`, one rule per line), or DP_EINVAL with a message in err
 * naming what is not supported, or DP_ENOMEM. Nothing a client sends that
 * constrains values is ignored: a keyword or construct that cannot be turned
 * into a grammar is an error, so a grammar never admits a document that the
 * client's validator would refuse. The converse does not always hold: where
 * an exact grammar is impractical the grammar admits a subset of the valid
 * documents (each such choice is documented in schema.c). */
#ifndef DP_API_SCHEMA_H
#define DP_API_SCHEMA_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* A JSON Schema (an object or a boolean) to a grammar whose sentences are
 * JSON texts valid against it, with a few whitespace characters at most
 * between tokens. On DP_EINVAL, path_err (when not NULL) receives the dotted
 * path of the offending keyword, e.g. "properties.age.minimum". */
int schema_to_gbnf(const cJSON *schema, char **out, char *path_err, size_t perrsz, char *err,
                   size_t errsz);

/* response_format {"type": "json_object"}: any JSON object. */
int schema_json_object_gbnf(char **out, char *err, size_t errsz);

/* A regular expression (len bytes of UTF-8; the ECMA-262 subset described in
 * schema.c) to a grammar whose sentences are the strings it matches whole. */
int regex_to_gbnf(const char *re, size_t len, char **out, char *err, size_t errsz);

/* Exactly one of n strings (UTF-8). */
int choice_to_gbnf(const char *const *choices, int n, char **out, char *err, size_t errsz);

#endif
