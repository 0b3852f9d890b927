/* test_schema.c: JSON Schema, regex and choice lists to GBNF. Every grammar
 * must compile (sched/grammar.c), and its sentences are checked against
 * documents that a validator accepts and ones it refuses: objects with
 * optional properties in every position, extra properties, enums, arrays
 * with length bounds and tuples, integer and number ranges (every integer of
 * an interval), strings with lengths, patterns and formats, anyOf, $ref
 * recursion. Unsupported keywords must fail with the keyword's path. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/dp.h"
#include "sched/grammar.h"
#include "api/schema.h"
#include "t.h"

static char *last_gbnf;   /* printed when a check fails */

static dp_grammar *compile_gbnf(char *gbnf)
{
    free(last_gbnf);
    last_gbnf = gbnf;
    dp_grammar *g = NULL;
    char err[DP_ERRLEN] = "";
    int rc = grammar_compile(&g, gbnf, strlen(gbnf), err, sizeof err);
    CHECK_MSG(rc == 0, "grammar_compile: %s\n%s", err, gbnf);
    return g;
}

static dp_grammar *from_schema(const char *json)
{
    cJSON *s = cJSON_Parse(json);
    CHECK_MSG(s != NULL, "bad test JSON: %s", json);
    char *out = NULL, perr[256] = "", err[DP_ERRLEN] = "";
    int rc = schema_to_gbnf(s, &out, perr, sizeof perr, err, sizeof err);
    CHECK_MSG(rc == 0, "schema_to_gbnf: %s (%s) for %s", err, perr, json);
    cJSON_Delete(s);
    return compile_gbnf(out);
}

static dp_grammar *from_regex(const char *re)
{
    char *out = NULL, err[DP_ERRLEN] = "";
    int rc = regex_to_gbnf(re, strlen(re), &out, err, sizeof err);
    CHECK_MSG(rc == 0, "regex_to_gbnf: %s for %s", err, re);
    return compile_gbnf(out);
}

static void yes(const dp_grammar *g, const char *s)
{
    CHECK_MSG(grammar_matches(g, s, strlen(s)), "should match: %s\ngrammar:\n%s", s, last_gbnf);
}

static void no(const dp_grammar *g, const char *s)
{
    CHECK_MSG(!grammar_matches(g, s, strlen(s)), "should not match: %s\ngrammar:\n%s", s,
              last_gbnf);
}

/* A schema that must be refused, naming path and keyword. */
static void refused(const char *json, const char *path, const char *kw)
{
    cJSON *s = cJSON_Parse(json);
    CHECK_MSG(s != NULL, "bad test JSON: %s", json);
    char *out = NULL, perr[256] = "", err[DP_ERRLEN] = "";
    int rc = schema_to_gbnf(s, &out, perr, sizeof perr, err, sizeof err);
    CHECK_MSG(rc == DP_EINVAL, "accepted: %s\n%s", json, out ? out : "");
    CHECK(out == NULL);
    CHECK_MSG(!strcmp(perr, path), "path '%s', expected '%s' (%s)", perr, path, err);
    CHECK_MSG(strstr(err, kw) != NULL, "message '%s' lacks '%s'", err, kw);
    cJSON_Delete(s);
}

static void regex_refused(const char *re, const char *needle)
{
    char *out = NULL, err[DP_ERRLEN] = "";
    int rc = regex_to_gbnf(re, strlen(re), &out, err, sizeof err);
    CHECK_MSG(rc == DP_EINVAL, "accepted regex %s:\n%s", re, out ? out : "");
    CHECK(out == NULL);
    CHECK_MSG(strstr(err, needle) != NULL, "message '%s' lacks '%s'", err, needle);
}

static void test_primitives(void)
{
    dp_grammar *g = from_schema("{\"type\": \"string\"}");
    yes(g, "\"\"");
    yes(g, "\"hello world\"");
    yes(g, "\"esc \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9\"");
    yes(g, "\"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80\"");
    no(g, "\"unterminated");
    no(g, "\"bad \\x escape\"");
    no(g, "\"bad \\u12 escape\"");
    yes(g, "\"\\uFFFF \\uCAFE \\uD7FF \\uE000\"");
    no(g, "\"\\uD83D\\uDE00\"");   /* surrogates: one character, or none */
    no(g, "\"\\udc00\"");
    no(g, "\"raw\nnewline\"");
    no(g, "\"a\" ");
    no(g, "hello");
    no(g, "\"\xff\"");   /* not UTF-8 */
    grammar_unref(g);

    g = from_schema("{\"type\": \"integer\"}");
    yes(g, "0");
    yes(g, "-0");
    yes(g, "42");
    yes(g, "-17");
    yes(g, "1234567890123456");   /* 16 digits */
    no(g, "12345678901234567");   /* 17 */
    no(g, "01");
    no(g, "1.0");
    no(g, "+1");
    no(g, "1e3");
    no(g, "");
    no(g, "-");
    grammar_unref(g);

    g = from_schema("{\"type\": \"number\"}");
    yes(g, "0");
    yes(g, "3.25");
    yes(g, "-0.5");
    yes(g, "1e10");
    yes(g, "1.5E-3");
    yes(g, "2e+8");
    no(g, ".5");
    no(g, "1.");
    no(g, "1e");
    no(g, "01.5");
    no(g, "1.2.3");
    no(g, "NaN");
    no(g, "1e1234");   /* exponents stop at 3 digits */
    grammar_unref(g);

    g = from_schema("{\"type\": \"boolean\"}");
    yes(g, "true");
    yes(g, "false");
    no(g, "null");
    no(g, "True");
    grammar_unref(g);

    g = from_schema("{\"type\": \"null\", \"title\": \"Nothing\", \"description\": \"x\"}");
    yes(g, "null");
    no(g, "\"null\"");
    grammar_unref(g);

    g = from_schema("{\"type\": [\"string\", \"null\"]}");
    yes(g, "null");
    yes(g, "\"x\"");
    no(g, "1");
    grammar_unref(g);

    g = from_schema("{\"type\": [\"integer\", \"boolean\"], \"maxLength\": 2}");
    yes(g, "12345");   /* maxLength only applies to strings */
    yes(g, "true");
    no(g, "1.5");
    no(g, "\"ab\"");
    grammar_unref(g);
}

static void test_any(void)
{
    const char *any[] = {"{}", "true", "{\"description\": \"anything\", \"$comment\": \"c\"}"};
    for (int i = 0; i < 3; i++) {
        dp_grammar *g = from_schema(any[i]);
        yes(g, "1");
        yes(g, "\"s\"");
        yes(g, "null");
        yes(g, "[]");
        yes(g, "[1, \"a\", [true, false], {\"k\": {\"n\": null}}]");
        yes(g, "{\"a\": [1, 2, {\"b\": -3.5e2}], \"c\": {}}");
        yes(g, "{\n  \"a\": 1,\n  \"b\": [\n    2\n  ]\n}");
        no(g, "{\"a\" 1}");
        no(g, "[1,]");
        no(g, "{,}");
        no(g, "[1 2]");
        no(g, "{\"a\":1}}");
        no(g, "undefined");
        grammar_unref(g);
    }
    char *out = NULL, err[DP_ERRLEN];
    CHECK(schema_json_object_gbnf(&out, err, sizeof err) == 0);
    dp_grammar *g = compile_gbnf(out);
    yes(g, "{}");
    yes(g, "{\"a\": 1}");
    yes(g, "{\"a\": {\"b\": [1, {\"c\": null}]}, \"d\": \"e\"}");
    no(g, "[]");
    no(g, "1");
    no(g, "\"{}\"");
    no(g, "{\"a\": 1");
    grammar_unref(g);

    /* Whitespace is bounded: one space or tab, or a newline and at most
     * 20 spaces or tabs, between tokens; none around the document. */
    g = from_schema("{}");
    yes(g, "{ \"a\" : 1 }");
    yes(g, "{\n\t\"a\":\t1\n}");
    yes(g, "[\n                    1]");   /* newline + 20 */
    no(g, "[\n                     1]");   /* newline + 21 */
    no(g, "[1,  2]");
    no(g, " [1]");
    no(g, "[1] ");
    grammar_unref(g);
}

/* Objects: three properties, every combination of required ones, every
 * subset present (in schema order): accepted exactly when the required
 * ones are there. */
static void test_object_optional(void)
{
    const char *names[3] = {"a", "b", "c"};
    const char *vals[3] = {"1", "\"x\"", "true"};
    for (int req = 0; req < 8; req++) {
        char schema[512];
        int k = snprintf(schema, sizeof schema,
                         "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, "
                         "\"b\": {\"type\": \"string\"}, \"c\": {\"type\": \"boolean\"}}, "
                         "\"required\": [");
        for (int i = 0, first = 1; i < 3; i++)
            if (req >> i & 1) {
                k += snprintf(schema + k, sizeof schema - (size_t)k, "%s\"%s\"", first ? "" : ", ",
                              names[i]);
                first = 0;
            }
        snprintf(schema + k, sizeof schema - (size_t)k, "]}");
        for (int addl = 0; addl < 2; addl++) {
            if (addl) {   /* same, with additionalProperties false */
                char *end = strrchr(schema, '}');
                snprintf(end, sizeof schema - (size_t)(end - schema),
                         ", \"additionalProperties\": false}");
            }
            dp_grammar *g = from_schema(schema);
            for (int have = 0; have < 8; have++) {
                char doc[256];
                int d = snprintf(doc, sizeof doc, "{");
                for (int i = 0, first = 1; i < 3; i++)
                    if (have >> i & 1) {
                        d += snprintf(doc + d, sizeof doc - (size_t)d, "%s\"%s\": %s",
                                      first ? "" : ", ", names[i], vals[i]);
                        first = 0;
                    }
                snprintf(doc + d, sizeof doc - (size_t)d, "}");
                if ((have & req) == req)
                    yes(g, doc);
                else
                    no(g, doc);
                /* wrong value types and an unknown property never match */
                if (have) {
                    char bad[256];
                    snprintf(bad, sizeof bad, "%s", doc);
                    char *v = strstr(bad, "1");
                    if (v)
                        *v = '7';   /* still an integer: same verdict */
                    if ((have & req) == req)
                        yes(g, bad);
                }
            }
            no(g, "{\"a\": \"x\"}");
            no(g, "{\"b\": 1}");
            no(g, "{\"a\": 1, \"z\": 2}");
            no(g, "{\"a\": 1,}");
            no(g, "{, \"a\": 1}");
            no(g, "{\"a\": 1 \"b\": \"x\"}");
            no(g, "[]");
            grammar_unref(g);
        }
    }
}

static void test_object_more(void)
{
    /* Nested objects and arrays of objects, pretty-printed too. */
    dp_grammar *g = from_schema(
        "{\"title\": \"Order\", \"type\": \"object\", \"properties\": {"
        "\"id\": {\"type\": \"integer\"},"
        "\"customer\": {\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"},"
        "  \"email\": {\"type\": \"string\", \"format\": \"email\"}}, \"required\": [\"name\"]},"
        "\"lines\": {\"type\": \"array\", \"items\": {\"type\": \"object\", \"properties\": {"
        "  \"sku\": {\"type\": \"string\"}, \"qty\": {\"type\": \"integer\", \"minimum\": 1}},"
        "  \"required\": [\"sku\", \"qty\"], \"additionalProperties\": false}}},"
        "\"required\": [\"id\", \"customer\", \"lines\"]}");
    yes(g, "{\"id\": 7, \"customer\": {\"name\": \"Ann\"}, \"lines\": []}");
    yes(g, "{\"id\": 7, \"customer\": {\"name\": \"Ann\", \"email\": \"a@b.c\"}, \"lines\": "
           "[{\"sku\": \"X1\", \"qty\": 2}, {\"sku\": \"Y\", \"qty\": 10}]}");
    yes(g, "{\n  \"id\": 7,\n  \"customer\": {\n    \"name\": \"Ann\"\n  },\n  \"lines\": [\n"
           "    {\n      \"sku\": \"X1\",\n      \"qty\": 2\n    }\n  ]\n}");
    no(g, "{\"id\": 7, \"customer\": {}, \"lines\": []}");
    no(g, "{\"id\": 7, \"customer\": {\"name\": \"Ann\"}, \"lines\": [{\"sku\": \"X1\", \"qty\": 0}]}");
    no(g, "{\"id\": 7, \"customer\": {\"name\": \"Ann\"}, \"lines\": [{\"sku\": \"X1\"}]}");
    no(g, "{\"id\": 7, \"customer\": {\"name\": \"Ann\"}}");
    grammar_unref(g);

    /* additionalProperties true next to declared names: extra keys may be
     * anything but a declared name (a duplicate would be validated as the
     * last one's value). */
    g = from_schema("{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, "
                    "\"nick\": {\"type\": \"string\"}}, \"additionalProperties\": true}");
    yes(g, "{}");
    yes(g, "{\"name\": \"a\"}");
    yes(g, "{\"name\": \"a\", \"age\": 3}");
    yes(g, "{\"age\": 3, \"x\": [1]}");
    yes(g, "{\"nam\": 1}");
    yes(g, "{\"names\": 1}");
    yes(g, "{\"\": 1}");
    yes(g, "{\"n\": 1, \"ni\": 2, \"nicks\": 3, \"nickname\": 4, \"Name\": 5}");
    yes(g, "{\"nick\": \"b\", \"k\xc3\xa9y\": null}");
    no(g, "{\"name\": \"a\", \"name\": 1}");
    no(g, "{\"age\": 1, \"nick\": 2}");
    no(g, "{\"name\": 1}");
    no(g, "{\"na\\u006de\": 1}");   /* extra keys are written without escapes */
    grammar_unref(g);

    /* additionalProperties as a schema, no properties: a map. */
    g = from_schema("{\"type\": \"object\", \"additionalProperties\": {\"type\": \"integer\"}}");
    yes(g, "{}");
    yes(g, "{\"a\": 1, \"b\\n\": -2}");
    no(g, "{\"a\": \"1\"}");
    grammar_unref(g);

    /* {"type": "object"} alone: any object. */
    g = from_schema("{\"type\": \"object\"}");
    yes(g, "{}");
    yes(g, "{\"a\": [1, {}]}");
    no(g, "[]");
    grammar_unref(g);

    /* No properties, additionalProperties false: only {}. */
    g = from_schema("{\"type\": \"object\", \"additionalProperties\": false}");
    yes(g, "{}");
    yes(g, "{ }");
    no(g, "{\"a\": 1}");
    grammar_unref(g);

    /* Names that need escapes, non-ASCII names. */
    g = from_schema("{\"type\": \"object\", \"properties\": {\"say \\\"hi\\\"\": {\"type\": "
                    "\"integer\"}, \"\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87\": {\"type\": \"integer\"}, "
                    "\"tab\\there\": {\"type\": \"integer\"}}, \"required\": [\"say \\\"hi\\\"\"]}");
    yes(g, "{\"say \\\"hi\\\"\": 1}");
    yes(g, "{\"say \\\"hi\\\"\": 1, \"\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87\": 2, \"tab\\there\": 3}");
    no(g, "{\"say \"hi\"\": 1}");
    grammar_unref(g);

    /* Type inferred from properties. */
    g = from_schema("{\"properties\": {\"x\": {\"type\": \"number\"}}, \"required\": [\"x\"]}");
    yes(g, "{\"x\": 1.5}");
    no(g, "{}");
    grammar_unref(g);

    /* Many optional properties: a grammar linear in their number. */
    char big[8192];
    int k = snprintf(big, sizeof big, "{\"type\": \"object\", \"properties\": {");
    for (int i = 0; i < 60; i++)
        k += snprintf(big + k, sizeof big - (size_t)k, "%s\"p%d\": {\"type\": \"integer\"}",
                      i ? ", " : "", i);
    snprintf(big + k, sizeof big - (size_t)k, "}}");
    g = from_schema(big);
    CHECK_MSG(strlen(last_gbnf) < 20000, "grammar of %zu bytes", strlen(last_gbnf));
    yes(g, "{}");
    yes(g, "{\"p59\": 1}");
    yes(g, "{\"p0\": 1, \"p30\": 2, \"p59\": 3}");
    no(g, "{\"p30\": 1, \"p0\": 2}");   /* schema order */
    grammar_unref(g);
}

static void test_enum_const(void)
{
    dp_grammar *g = from_schema("{\"enum\": [\"red\", \"green\", 3, null, true, {\"a\": [1, 2]}, "
                                "[\"x\"], \"quote\\\"d\", \"caf\xc3\xa9\"]}");
    yes(g, "\"red\"");
    yes(g, "\"green\"");
    yes(g, "3");
    yes(g, "null");
    yes(g, "true");
    yes(g, "{\"a\":[1,2]}");
    yes(g, "[\"x\"]");
    yes(g, "\"quote\\\"d\"");
    yes(g, "\"caf\xc3\xa9\"");
    no(g, "\"blue\"");
    no(g, "false");
    no(g, "4");
    no(g, "\"Red\"");
    grammar_unref(g);

    g = from_schema("{\"type\": \"string\", \"enum\": [\"a\", 1, \"b\"]}");
    yes(g, "\"a\"");
    yes(g, "\"b\"");
    no(g, "1");
    grammar_unref(g);

    g = from_schema("{\"type\": \"integer\", \"enum\": [1, 2.5, 3]}");
    yes(g, "1");
    yes(g, "3");
    no(g, "2.5");
    grammar_unref(g);

    g = from_schema("{\"const\": \"fixed\"}");
    yes(g, "\"fixed\"");
    no(g, "\"other\"");
    grammar_unref(g);

    g = from_schema("{\"const\": \"cat\", \"enum\": [\"cat\"], \"type\": \"string\", "
                    "\"title\": \"Kind\"}");
    yes(g, "\"cat\"");
    grammar_unref(g);
}

static void test_arrays(void)
{
    dp_grammar *g = from_schema("{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, "
                                "\"minItems\": 2, \"maxItems\": 4}");
    const char *docs[] = {"[]", "[1]", "[1, 2]", "[1, 2, 3]", "[1,2,3,4]", "[1, 2, 3, 4, 5]"};
    for (int i = 0; i < 6; i++) {
        if (i >= 2 && i <= 4)
            yes(g, docs[i]);
        else
            no(g, docs[i]);
    }
    no(g, "[1, \"2\"]");
    yes(g, "[\n  1,\n  2\n]");
    grammar_unref(g);

    g = from_schema("{\"type\": \"array\", \"items\": {\"type\": \"string\"}}");
    yes(g, "[]");
    yes(g, "[\"a\"]");
    yes(g, "[\"a\", \"b\", \"c\", \"d\", \"e\", \"f\", \"g\", \"h\"]");
    no(g, "[\"a\",]");
    no(g, "[,]");
    no(g, "[1]");
    grammar_unref(g);

    g = from_schema("{\"type\": \"array\", \"minItems\": 1}");
    no(g, "[]");
    yes(g, "[1, \"x\", null]");
    grammar_unref(g);

    g = from_schema("{\"type\": \"array\", \"maxItems\": 0}");
    yes(g, "[]");
    no(g, "[1]");
    grammar_unref(g);

    g = from_schema("{\"type\": \"array\", \"maxItems\": 1, \"items\": {\"type\": \"null\"}}");
    yes(g, "[]");
    yes(g, "[null]");
    no(g, "[null, null]");
    grammar_unref(g);

    /* Tuples: prefixItems, then items (false: no more). */
    g = from_schema("{\"type\": \"array\", \"prefixItems\": [{\"type\": \"string\"}, "
                    "{\"type\": \"integer\"}], \"items\": false}");
    yes(g, "[]");
    yes(g, "[\"a\"]");
    yes(g, "[\"a\", 1]");
    no(g, "[\"a\", 1, 2]");
    no(g, "[1]");
    no(g, "[\"a\", \"b\"]");
    grammar_unref(g);

    g = from_schema("{\"type\": \"array\", \"prefixItems\": [{\"type\": \"string\"}, "
                    "{\"type\": \"integer\"}], \"items\": {\"type\": \"boolean\"}, \"minItems\": 2, "
                    "\"maxItems\": 4}");
    no(g, "[\"a\"]");
    yes(g, "[\"a\", 1]");
    yes(g, "[\"a\", 1, true]");
    yes(g, "[\"a\", 1, true, false]");
    no(g, "[\"a\", 1, true, false, true]");
    no(g, "[\"a\", 1, 2]");
    grammar_unref(g);

    g = from_schema("{\"type\": \"array\", \"prefixItems\": [{\"type\": \"integer\"}, "
                    "{\"type\": \"integer\"}, {\"type\": \"integer\"}], \"minItems\": 3, "
                    "\"items\": false}");
    yes(g, "[1, 2, 3]");
    no(g, "[1, 2]");
    no(g, "[1, 2, 3, 4]");
    grammar_unref(g);

    /* prefix longer than maxItems */
    g = from_schema("{\"type\": \"array\", \"prefixItems\": [{\"type\": \"integer\"}, "
                    "{\"type\": \"string\"}, {\"type\": \"integer\"}], \"maxItems\": 2}");
    yes(g, "[1, \"a\"]");
    yes(g, "[1]");
    no(g, "[1, \"a\", 3]");
    grammar_unref(g);

    /* Draft 7 tuples: items as an array, additionalItems. */
    g = from_schema("{\"type\": \"array\", \"items\": [{\"type\": \"integer\"}, {\"type\": "
                    "\"string\"}], \"additionalItems\": false, \"minItems\": 2}");
    yes(g, "[1, \"a\"]");
    no(g, "[1, \"a\", 2]");
    no(g, "[1]");
    grammar_unref(g);

    /* Arrays of arrays. */
    g = from_schema("{\"type\": \"array\", \"items\": {\"type\": \"array\", \"items\": "
                    "{\"type\": \"number\"}, \"minItems\": 2, \"maxItems\": 2}}");
    yes(g, "[[1, 2], [3.5, -4]]");
    no(g, "[[1, 2], [3]]");
    grammar_unref(g);
}

static char *int_schema(char *buf, size_t n, const char *type, const char *bounds)
{
    snprintf(buf, n, "{\"type\": \"%s\"%s%s}", type, *bounds ? ", " : "", bounds);
    return buf;
}

/* Every integer from -1200 to 1200 against the bounds. */
static void int_range(const char *bounds, long lo, long hi)
{
    char s[256];
    dp_grammar *g = from_schema(int_schema(s, sizeof s, "integer", bounds));
    for (long v = -1200; v <= 1200; v++) {
        char d[32];
        snprintf(d, sizeof d, "%ld", v);
        if (v >= lo && v <= hi)
            yes(g, d);
        else
            no(g, d);
    }
    no(g, "1.0");
    no(g, "007");
    grammar_unref(g);
}

static void test_numbers(void)
{
    const long INF = 1000000;
    int_range("\"minimum\": 0", 0, INF);
    int_range("\"minimum\": 1", 1, INF);
    int_range("\"exclusiveMinimum\": 0", 1, INF);
    int_range("\"minimum\": 0, \"maximum\": 100", 0, 100);
    int_range("\"minimum\": 1, \"maximum\": 5", 1, 5);
    int_range("\"minimum\": 18, \"maximum\": 120", 18, 120);
    int_range("\"minimum\": -50, \"maximum\": 50", -50, 50);
    int_range("\"minimum\": -1000, \"maximum\": -7", -1000, -7);
    int_range("\"minimum\": 37, \"maximum\": 1042", 37, 1042);
    int_range("\"minimum\": 100, \"exclusiveMaximum\": 1000", 100, 999);
    int_range("\"maximum\": 10", -INF, 10);
    int_range("\"exclusiveMaximum\": -3", -INF, -4);
    int_range("\"minimum\": 0.5, \"maximum\": 9.5", 1, 9);
    int_range("\"minimum\": 5, \"exclusiveMinimum\": true", 6, INF);   /* draft 4 */
    int_range("\"minimum\": 199, \"maximum\": 1100", 199, 1100);
    int_range("\"minimum\": 7, \"maximum\": 7", 7, 7);

    char s[256];
    dp_grammar *g = from_schema(int_schema(s, sizeof s, "integer", "\"minimum\": 0"));
    yes(g, "9999999999999999");
    no(g, "-1");
    no(g, "-0");
    grammar_unref(g);

    /* Numbers with integer bounds: fractions, no exponent. */
    g = from_schema(int_schema(s, sizeof s, "number", "\"minimum\": 0, \"maximum\": 1"));
    const char *in01[] = {"0", "1", "0.5", "0.001", "1.0", "1.000", "0.999999", "0.0"};
    const char *out01[] = {"1.5", "-0.1", "2", "1.01", "-1", "1e0", "10"};
    for (size_t i = 0; i < sizeof in01 / sizeof *in01; i++)
        yes(g, in01[i]);
    for (size_t i = 0; i < sizeof out01 / sizeof *out01; i++)
        no(g, out01[i]);
    grammar_unref(g);

    g = from_schema(int_schema(s, sizeof s, "number", "\"exclusiveMinimum\": 0"));
    yes(g, "0.01");
    yes(g, "3");
    yes(g, "1234.5");
    no(g, "0");
    no(g, "0.0");
    no(g, "0.000");
    no(g, "-2");
    grammar_unref(g);

    g = from_schema(int_schema(s, sizeof s, "number", "\"minimum\": 0"));
    yes(g, "0");
    yes(g, "0.0");
    yes(g, "17.25");
    no(g, "-0.5");
    grammar_unref(g);

    /* Quarters from -8 to 8 against [-5, -2) and (-2, 3]. */
    struct {
        const char *bounds;
        double lo, hi;
        bool lx, hx;
    } nr[] = {
        {"\"minimum\": -5, \"exclusiveMaximum\": -2", -5, -2, false, true},
        {"\"exclusiveMinimum\": -2, \"maximum\": 3", -2, 3, true, false},
        {"\"minimum\": -1, \"maximum\": 1", -1, 1, false, false},
        {"\"exclusiveMinimum\": 2, \"exclusiveMaximum\": 3", 2, 3, true, true},
    };
    for (size_t r = 0; r < sizeof nr / sizeof *nr; r++) {
        g = from_schema(int_schema(s, sizeof s, "number", nr[r].bounds));
        for (int q = -32; q <= 32; q++) {
            double v = q / 4.0;
            char d[32];
            snprintf(d, sizeof d, "%g", v);
            if (!strchr(d, '.') && q % 3 == 0)
                snprintf(d, sizeof d, "%g.0", v);   /* some with a zero fraction */
            bool in = (nr[r].lx ? v > nr[r].lo : v >= nr[r].lo) &&
                      (nr[r].hx ? v < nr[r].hi : v <= nr[r].hi);
            if (in)
                yes(g, d);
            else
                no(g, d);
        }
        grammar_unref(g);
    }
}

static void test_strings(void)
{
    dp_grammar *g = from_schema("{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 4}");
    no(g, "\"\"");
    no(g, "\"a\"");
    yes(g, "\"ab\"");
    yes(g, "\"abcd\"");
    yes(g, "\"a\\nb\"");   /* an escape is one character */
    yes(g, "\"h\xc3\xa9\xc3\xa9\"");   /* code points, not bytes */
    yes(g, "\"\\u00e9\\u00e9\"");
    no(g, "\"abcde\"");
    grammar_unref(g);

    g = from_schema("{\"type\": \"string\", \"maxLength\": 0}");
    yes(g, "\"\"");
    no(g, "\"a\"");
    grammar_unref(g);

    g = from_schema("{\"type\": \"string\", \"minLength\": 1}");
    no(g, "\"\"");
    yes(g, "\"a long string indeed\"");
    grammar_unref(g);

    g = from_schema("{\"type\": \"string\", \"pattern\": \"^[A-Z]{3}-\\\\d{3}$\"}");
    yes(g, "\"ABC-123\"");
    no(g, "\"AB-123\"");
    no(g, "\"ABC-1234\"");
    no(g, "\"abc-123\"");
    grammar_unref(g);

    /* Not anchored: still the whole content (documented). */
    g = from_schema("{\"type\": \"string\", \"pattern\": \"ab+c\"}");
    yes(g, "\"abbbc\"");
    no(g, "\"xabc\"");
    grammar_unref(g);

    /* . and negated classes never produce what must be escaped in JSON. */
    g = from_schema("{\"type\": \"string\", \"pattern\": \"^.[^a]\\\\S\\\\W$\"}");
    yes(g, "\"xyz!\"");
    no(g, "\"\"\"\"\"");
    no(g, "\"\\\\bc!\"");
    no(g, "\"a\\\"c!\"");
    grammar_unref(g);

    g = from_schema("{\"type\": \"string\", \"pattern\": \"^[\\\\w.+-]+@[\\\\w-]+\\\\.[a-z]{2,}$\"}");
    yes(g, "\"john.doe+x@mail-host.com\"");
    no(g, "\"john@host\"");
    no(g, "\"@host.com\"");
    grammar_unref(g);

    g = from_schema("{\"type\": \"string\", \"pattern\": \"^(\\\\([0-9]{3}\\\\) )?[0-9]{3}-[0-9]{4}$\"}");
    yes(g, "\"(555) 123-4567\"");
    yes(g, "\"123-4567\"");
    no(g, "\"(555)123-4567\"");
    grammar_unref(g);

    g = from_schema("{\"type\": \"string\", \"pattern\": \"^$\"}");
    yes(g, "\"\"");
    no(g, "\"a\"");
    grammar_unref(g);

    /* Formats. */
    g = from_schema("{\"type\": \"string\", \"format\": \"date\"}");
    const char *dates_ok[] = {"2024-02-29", "2000-02-29", "1999-12-31", "2023-02-28",
                              "0001-01-01", "2023-04-30", "1600-02-29", "2096-02-29"};
    const char *dates_no[] = {"2023-02-29", "1900-02-29", "2024-13-01", "2024-00-10",
                              "2024-04-31", "2024-01-32", "2024-01-00", "0000-01-01",
                              "24-01-01", "2024-1-01", "2024/01/01", "2024-01-01T00:00:00Z"};
    char q[64];
    for (size_t i = 0; i < sizeof dates_ok / sizeof *dates_ok; i++) {
        snprintf(q, sizeof q, "\"%s\"", dates_ok[i]);
        yes(g, q);
    }
    for (size_t i = 0; i < sizeof dates_no / sizeof *dates_no; i++) {
        snprintf(q, sizeof q, "\"%s\"", dates_no[i]);
        no(g, q);
    }
    grammar_unref(g);

    g = from_schema("{\"type\": \"string\", \"format\": \"time\"}");
    yes(g, "\"12:34:56Z\"");
    yes(g, "\"00:00:00.123456+02:00\"");
    yes(g, "\"23:59:59-11:30\"");
    no(g, "\"24:00:00Z\"");
    no(g, "\"12:60:00Z\"");
    no(g, "\"12:34:56\"");   /* RFC 3339 full-time has an offset */
    no(g, "\"12:34Z\"");
    grammar_unref(g);

    g = from_schema("{\"type\": \"string\", \"format\": \"date-time\"}");
    yes(g, "\"2024-05-06T07:08:09Z\"");
    yes(g, "\"2024-05-06T07:08:09.5+01:00\"");
    no(g, "\"2024-05-06 07:08:09Z\"");
    no(g, "\"2024-05-06\"");
    grammar_unref(g);

    g = from_schema("{\"type\": \"string\", \"format\": \"uuid\"}");
    yes(g, "\"123e4567-e89b-12d3-a456-426614174000\"");
    yes(g, "\"ABCDEF01-2345-6789-abcd-ef0123456789\"");
    no(g, "\"123e4567e89b12d3a456426614174000\"");
    no(g, "\"123e4567-e89b-12d3-a456-42661417400g\"");
    grammar_unref(g);

    /* Other formats are plain strings (validators do not check format
     * by default). */
    g = from_schema("{\"type\": \"string\", \"format\": \"email\", \"maxLength\": 5}");
    yes(g, "\"a@b.c\"");
    yes(g, "\"x\"");
    no(g, "\"abcdef\"");
    grammar_unref(g);
}

static void test_combinators(void)
{
    dp_grammar *g = from_schema(
        "{\"anyOf\": [{\"type\": \"integer\", \"minimum\": 0}, {\"type\": \"null\"}], "
        "\"default\": null, \"title\": \"Count\"}");
    yes(g, "3");
    yes(g, "null");
    no(g, "-3");
    no(g, "\"3\"");
    grammar_unref(g);

    g = from_schema(
        "{\"oneOf\": [{\"type\": \"object\", \"properties\": {\"kind\": {\"const\": \"cat\"}, "
        "\"meows\": {\"type\": \"boolean\"}}, \"required\": [\"kind\", \"meows\"]}, "
        "{\"type\": \"object\", \"properties\": {\"kind\": {\"const\": \"dog\"}, \"barks\": "
        "{\"type\": \"integer\"}}, \"required\": [\"kind\"]}], \"discriminator\": "
        "{\"propertyName\": \"kind\"}}");
    yes(g, "{\"kind\": \"cat\", \"meows\": true}");
    yes(g, "{\"kind\": \"dog\"}");
    yes(g, "{\"kind\": \"dog\", \"barks\": 3}");
    no(g, "{\"kind\": \"cat\", \"barks\": 3}");
    no(g, "{\"kind\": \"cat\"}");
    grammar_unref(g);

    g = from_schema("{\"allOf\": [{\"$ref\": \"#/definitions/Pos\"}], \"description\": \"d\", "
                    "\"definitions\": {\"Pos\": {\"type\": \"integer\", \"minimum\": 1}}}");
    yes(g, "1");
    no(g, "0");
    grammar_unref(g);

    g = from_schema("{\"anyOf\": [{\"type\": \"string\", \"maxLength\": 1}]}");
    yes(g, "\"a\"");
    no(g, "\"ab\"");
    grammar_unref(g);
}

static void test_refs(void)
{
    /* A recursive tree. */
    dp_grammar *g = from_schema(
        "{\"$ref\": \"#/$defs/Node\", \"$defs\": {\"Node\": {\"type\": \"object\", "
        "\"properties\": {\"value\": {\"type\": \"integer\"}, \"children\": {\"type\": \"array\", "
        "\"items\": {\"$ref\": \"#/$defs/Node\"}}}, \"required\": [\"value\"], "
        "\"additionalProperties\": false}}}");
    yes(g, "{\"value\": 1}");
    yes(g, "{\"value\": 1, \"children\": []}");
    yes(g, "{\"value\": 1, \"children\": [{\"value\": 2}, {\"value\": 3, \"children\": "
           "[{\"value\": 4, \"children\": [{\"value\": 5}]}]}]}");
    no(g, "{\"value\": 1, \"children\": [{}]}");
    no(g, "{\"children\": []}");
    grammar_unref(g);

    /* Pydantic style: the root with properties, models in $defs, Optional
     * as anyOf with null, an enum model. */
    g = from_schema(
        "{\"$defs\": {\"Color\": {\"enum\": [\"red\", \"green\"], \"title\": \"Color\", "
        "\"type\": \"string\"}, \"Point\": {\"properties\": {\"x\": {\"title\": \"X\", \"type\": "
        "\"number\"}, \"y\": {\"title\": \"Y\", \"type\": \"number\"}}, \"required\": [\"x\", "
        "\"y\"], \"title\": \"Point\", \"type\": \"object\"}}, \"properties\": {\"color\": "
        "{\"$ref\": \"#/$defs/Color\"}, \"at\": {\"anyOf\": [{\"$ref\": \"#/$defs/Point\"}, "
        "{\"type\": \"null\"}], \"default\": null}, \"path\": {\"items\": {\"$ref\": "
        "\"#/$defs/Point\"}, \"title\": \"Path\", \"type\": \"array\"}}, \"required\": "
        "[\"color\", \"path\"], \"title\": \"Shape\", \"type\": \"object\"}");
    yes(g, "{\"color\": \"red\", \"path\": []}");
    yes(g, "{\"color\": \"green\", \"at\": null, \"path\": [{\"x\": 1, \"y\": 2.5}]}");
    yes(g, "{\"color\": \"green\", \"at\": {\"x\": 0, \"y\": 0}, \"path\": []}");
    no(g, "{\"color\": \"blue\", \"path\": []}");
    no(g, "{\"color\": \"red\", \"path\": [{\"x\": 1}]}");
    grammar_unref(g);

    /* "#": the root itself (a linked list). */
    g = from_schema("{\"type\": \"object\", \"properties\": {\"v\": {\"type\": \"integer\"}, "
                    "\"next\": {\"anyOf\": [{\"$ref\": \"#\"}, {\"type\": \"null\"}]}}, "
                    "\"required\": [\"v\", \"next\"]}");
    yes(g, "{\"v\": 1, \"next\": null}");
    yes(g, "{\"v\": 1, \"next\": {\"v\": 2, \"next\": {\"v\": 3, \"next\": null}}}");
    no(g, "{\"v\": 1, \"next\": {\"v\": 2}}");
    grammar_unref(g);

    /* Mutual recursion and an escaped pointer. */
    g = from_schema("{\"$ref\": \"#/$defs/a~1b\", \"$defs\": {\"a/b\": {\"type\": \"array\", "
                    "\"items\": {\"$ref\": \"#/$defs/C\"}}, \"C\": {\"anyOf\": [{\"type\": "
                    "\"integer\"}, {\"$ref\": \"#/$defs/a~1b\"}]}}}");
    yes(g, "[1, [2, [3]], []]");
    no(g, "[1, [\"x\"]]");
    grammar_unref(g);
}

static void test_refusals(void)
{
    refused("{\"type\": \"object\", \"properties\": {\"age\": {\"type\": \"integer\", "
            "\"multipleOf\": 2}}}", "properties.age.multipleOf", "multipleOf");
    refused("{\"type\": \"number\", \"minimum\": 0.5}", "minimum", "minimum");
    refused("{\"properties\": {\"p\": {\"type\": \"number\", \"exclusiveMaximum\": 2.5}}}",
            "properties.p.exclusiveMaximum", "exclusiveMaximum");
    refused("{\"type\": \"string\", \"pattern\": \"a\", \"minLength\": 1}", "minLength",
            "minLength");
    refused("{\"type\": \"string\", \"format\": \"date\", \"maxLength\": 10}", "maxLength",
            "maxLength");
    refused("{\"allOf\": [{}, {}]}", "allOf", "allOf");
    refused("{\"not\": {\"type\": \"null\"}}", "not", "not");
    refused("{\"type\": \"array\", \"uniqueItems\": true}", "uniqueItems", "uniqueItems");
    refused("{\"type\": \"array\", \"contains\": {}}", "contains", "contains");
    refused("{\"type\": \"object\", \"patternProperties\": {\"^x\": {}}}", "patternProperties",
            "patternProperties");
    refused("{\"type\": \"object\", \"minProperties\": 1}", "minProperties", "minProperties");
    refused("{\"type\": \"object\", \"propertyNames\": {\"maxLength\": 3}}", "propertyNames",
            "propertyNames");
    refused("{\"if\": {}, \"then\": {}}", "if", "if");
    refused("{\"type\": \"strange\"}", "type", "type");
    refused("{\"type\": \"string\", \"nullable\": true}", "nullable", "nullable");
    refused("{\"$ref\": \"http://example.com/s.json\"}", "$ref", "$ref");
    refused("{\"$ref\": \"#/$defs/Missing\"}", "$ref", "$ref");
    refused("{\"$ref\": \"#/$defs/A\", \"$defs\": {\"A\": {\"type\": \"object\", "
            "\"minProperties\": 1}}}", "$defs.A.minProperties", "minProperties");
    refused("{\"$ref\": \"#/$defs/A\", \"$defs\": {\"A\": {\"$ref\": \"#/$defs/B\"}, \"B\": "
            "{\"$ref\": \"#/$defs/A\"}}}", "$ref", "circular");
    refused("{\"$ref\": \"#/$defs/A\", \"type\": \"string\", \"$defs\": {\"A\": {}}}", "type",
            "alongside");
    refused("{\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"integer\", \"maximum\": 1.5, "
            "\"minimum\": 2}]}", "anyOf.1.minimum", "no integer");
    refused("{\"type\": \"array\", \"items\": {\"type\": \"string\", \"pattern\": \"a\\\"b\"}}",
            "items.pattern", "escaped inside a JSON string");
    refused("{\"type\": \"string\", \"pattern\": \"^a\\\\\\\\b$\"}", "pattern", "pattern");
    refused("{\"type\": \"string\", \"pattern\": \"(a)\\\\1\"}", "pattern", "backreferences");
    refused("{\"enum\": [\"a\"], \"minLength\": 3}", "minLength", "alongside");
    refused("{\"type\": \"string\", \"enum\": [1, 2]}", "enum", "enum");
    refused("{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": [\"b\"]}",
            "required", "required");
    refused("{\"type\": \"array\", \"minItems\": 3, \"maxItems\": 2}", "minItems", "length");
    refused("{\"type\": \"array\", \"prefixItems\": [{}], \"items\": false, \"minItems\": 2}",
            "minItems", "length");
    refused("{\"type\": \"string\", \"minLength\": -1}", "minLength", "minLength");
    refused("{\"properties\": {\"a\": false}}", "properties.a", "false");
    refused("false", "", "false");
    refused("[1]", "", "schema");
    refused("{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"array\", \"items\": "
            "{\"type\": \"object\", \"properties\": {\"y\": {\"type\": \"integer\", "
            "\"minimum\": 0, \"multipleOf\": 5}}}}}}",
            "properties.x.items.properties.y.multipleOf", "multipleOf");
    refused("{\"unevaluatedProperties\": false}", "unevaluatedProperties", "unevaluatedProperties");
    refused("{\"dependentRequired\": {}}", "dependentRequired", "dependentRequired");

    /* The message names the keyword and where it is. */
    cJSON *s = cJSON_Parse("{\"properties\": {\"age\": {\"type\": \"integer\", \"minimum\": 0, "
                           "\"multipleOf\": 3}}}");
    char *out = NULL, perr[128], err[DP_ERRLEN];
    CHECK(schema_to_gbnf(s, &out, perr, sizeof perr, err, sizeof err) == DP_EINVAL);
    CHECK_MSG(!strcmp(err, "unsupported JSON Schema keyword 'multipleOf' at properties.age"),
              "%s", err);
    cJSON_Delete(s);

    /* Annotations anywhere are fine. */
    dp_grammar *g = from_schema(
        "{\"$schema\": \"https://json-schema.org/draft/2020-12/schema\", \"$id\": \"x\", "
        "\"title\": \"T\", \"description\": \"D\", \"strict\": true, \"name\": \"n\", "
        "\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"examples\": "
        "[\"e\"], \"default\": \"d\", \"deprecated\": false, \"readOnly\": true, "
        "\"writeOnly\": false, \"$comment\": \"c\", \"x-order\": 1}}}");
    yes(g, "{\"a\": \"z\"}");
    grammar_unref(g);
}

static void test_regex(void)
{
    dp_grammar *g = from_regex("^\\d{3}-\\d{4}$");
    yes(g, "555-1234");
    no(g, "5551234");
    no(g, "555-12345");
    grammar_unref(g);

    g = from_regex("(cat|dog)s?");
    yes(g, "cat");
    yes(g, "dogs");
    no(g, "cats!");
    no(g, "bird");
    grammar_unref(g);

    g = from_regex("[a-c]+x*|(?:yes|no)");
    yes(g, "abcabc");
    yes(g, "axx");
    yes(g, "yes");
    yes(g, "no");
    no(g, "x");
    no(g, "yesno");
    grammar_unref(g);

    g = from_regex("a{2}b{1,}c{0,2}d{2,3}");
    yes(g, "aabdd");
    yes(g, "aabbbccddd");
    no(g, "abdd");
    no(g, "aacdd");
    no(g, "aabcccdd");
    no(g, "aabdddd");
    grammar_unref(g);

    g = from_regex("[^a-z]\\.\\*\\\\\\n\\t[\\]\\-^]");
    yes(g, "Z.*\\\n\t]");
    yes(g, "5.*\\\n\t-");
    yes(g, "5.*\\\n\t^");
    no(g, "z.*\\\n\t]");
    grammar_unref(g);

    g = from_regex(".");
    yes(g, "a");
    yes(g, "\"");
    yes(g, "\xe2\x82\xac");
    no(g, "\n");
    no(g, "ab");
    grammar_unref(g);

    g = from_regex("\\w+\\s\\W\\S\\D");
    yes(g, "abc_9 !xy");
    no(g, "abc 9xy");
    grammar_unref(g);

    g = from_regex("[\\d\\s]x[^\\d]");
    yes(g, "1xa");
    yes(g, " xa");
    no(g, "1x1");
    grammar_unref(g);

    g = from_regex("\\x41\\u00e9\\u{1F600}");
    yes(g, "A\xc3\xa9\xf0\x9f\x98\x80");
    grammar_unref(g);

    g = from_regex("x{,2}y{a");   /* {,2} as in Python; "{a" is a literal */
    yes(g, "xxy{a");
    yes(g, "y{a");
    grammar_unref(g);

    g = from_regex("(a|)b|^c$");
    yes(g, "ab");
    yes(g, "b");
    yes(g, "c");
    no(g, "");
    grammar_unref(g);

    g = from_regex("((a|b)c)*d");
    yes(g, "d");
    yes(g, "acbcd");
    no(g, "abcd");
    grammar_unref(g);

    g = from_regex("[\xc3\xa9-\xc3\xbf]\xe2\x82\xac");
    yes(g, "\xc3\xa9\xe2\x82\xac");
    no(g, "e\xe2\x82\xac");
    grammar_unref(g);

    /* Repeating what can match "" (the grammar refuses x* for a nullable x:
     * the converter repeats the non-empty part instead). */
    const char *nullable_rep[] = {"(a|b|)+c", "(a?b?)*c", "(a*)+c", "((a?)(b*))+c", "(()|a|b)*c",
                                  "(a|b?){2,}c", "(a?){0,3}c"};
    for (size_t i = 0; i < sizeof nullable_rep / sizeof *nullable_rep; i++) {
        g = from_regex(nullable_rep[i]);
        yes(g, "c");
        yes(g, i == 2 || i == 6 ? "aac" : "abbac");
        no(g, "ac c");
        no(g, "");
        grammar_unref(g);
    }
    g = from_regex("(a?b?)*c");
    yes(g, "bbbac");
    no(g, "cc");
    grammar_unref(g);

    /* \w \d \s generate only what both ECMA-262 and Python's Unicode-wide
     * classes match; their complements only what neither does. */
    g = from_regex("\\w");
    yes(g, "_");
    no(g, "\xc3\xa9");   /* é: a word character for Python only */
    grammar_unref(g);
    g = from_regex("\\W");
    yes(g, "!");
    no(g, "\xc3\xa9");   /* not \W for Python */
    grammar_unref(g);
    g = from_regex("[^\\d]");
    yes(g, "x");
    yes(g, "\xc3\xa9");
    no(g, "\xd9\xa3");   /* Arabic-Indic 3 */
    no(g, "5");
    grammar_unref(g);
    g = from_regex("\\S");
    yes(g, "x");
    no(g, "\xc2\x85");   /* NEL: white space for Python */
    no(g, "\xef\xbb\xbf");   /* U+FEFF: white space for ECMA */
    grammar_unref(g);
    g = from_regex("\\s");
    yes(g, " ");
    yes(g, "\t");
    no(g, "\xef\xbb\xbf");
    grammar_unref(g);

    regex_refused("(a)\\1", "backreference");
    regex_refused("(?P<x>a)(?P=x)", "named");
    regex_refused("(?<x>a)", "named");
    regex_refused("a(?=b)", "lookahead");
    regex_refused("a(?!b)", "lookahead");
    regex_refused("(?<=a)b", "lookbehind");
    regex_refused("(?<!a)b", "lookbehind");
    regex_refused("\\bword\\b", "boundar");
    regex_refused("(?i)abc", "inline flags");
    regex_refused("\\p{L}+", "property");
    regex_refused("a*?", "lazy");
    regex_refused("a+?", "lazy");
    regex_refused("a{2,3}?", "lazy");
    regex_refused("a*+", "possessive");
    regex_refused("a^b", "^");
    regex_refused("a$b", "$");
    regex_refused("(a$)b", "$");
    regex_refused("*a", "nothing to repeat");
    regex_refused("a**", "multiple repeat");
    regex_refused("(ab", "missing )");
    regex_refused("ab)", "unbalanced");
    regex_refused("[abc", "unterminated");
    regex_refused("[z-a]", "range");
    regex_refused("a{3,2}", "bounds");
    regex_refused("\\q", "unknown escape");
    regex_refused("", "empty");
    regex_refused("a{100001}", "repetition");
}

static void test_choice(void)
{
    const char *c1[] = {"yes", "no", "maybe so", "say \"hi\"", "back\\slash", "caf\xc3\xa9",
                        "line\nbreak"};
    char *out = NULL, err[DP_ERRLEN];
    CHECK(choice_to_gbnf(c1, 7, &out, err, sizeof err) == 0);
    dp_grammar *g = compile_gbnf(out);
    for (int i = 0; i < 7; i++)
        yes(g, c1[i]);
    no(g, "");
    no(g, "yesno");
    no(g, "ye");
    no(g, "Yes");
    no(g, "maybe");
    grammar_unref(g);

    const char *c2[] = {"", "x"};
    CHECK(choice_to_gbnf(c2, 2, &out, err, sizeof err) == 0);
    g = compile_gbnf(out);
    yes(g, "");
    yes(g, "x");
    no(g, "xx");
    grammar_unref(g);

    CHECK(choice_to_gbnf(c1, 0, &out, err, sizeof err) == DP_EINVAL);
    const char *c3[] = {"ok", "\xff"};
    CHECK(choice_to_gbnf(c3, 2, &out, err, sizeof err) == DP_EINVAL);
    CHECK(strstr(err, "UTF-8") != NULL);
}

int main(void)
{
    test_primitives();
    test_any();
    test_object_optional();
    test_object_more();
    test_enum_const();
    test_arrays();
    test_numbers();
    test_strings();
    test_combinators();
    test_refs();
    test_refusals();
    test_regex();
    test_choice();
    free(last_gbnf);
    T_DONE("schema");
}
